-- A lease from GCRA, after gcra.lua's reading of the same key and state
-- ('tat:ns'), so exact and leased processes share one limit. ARGV[4..5]: the
-- emission interval T and the horizon capacity * T, in ns; ARGV[6]: want,
-- n (ARGV[2]) <= want.
--
-- A lease of k permits is k admissions at this reading: it moves the TAT
-- from max(TAT, now) by k * T, as k calls of gcra.lua in a row would. The
-- permits that fit are room = floor((horizon - ahead) / T), ahead being how
-- far max(TAT, now) is past now: it takes min(want, room) when room >= n,
-- and nothing otherwise, with gcra.lua's exact wait until n conform.
--
-- The reply is {granted, room left, wait_us, wait_ns}, as lease.lua's.
local interval, horizon = ARGV[4] + 0, ARGV[5] + 0
local want = ARGV[6] + 0
local tat, ns = load_state(2)
local d
if tat == nil or tat < now or (tat == now and ns == 0) then
    d, ns = 0, 0
else
    d = tat - now
end
-- Past the horizon by more than a microsecond: no room (and d * 1000 could
-- leave the exact range).
local room = -1
if d <= idiv(horizon, 1000) + 1 then
    local used = d * 1000 + ns
    if used <= horizon then
        room = idiv(horizon - used, interval)
    end
end
if room >= n then
    local grant = want
    if room < grant then
        grant = room
    end
    local ahead = d * 1000 + ns + grant * interval
    local whole, rest = idiv(ahead, 1000)
    -- Fresh again once the TAT is not after the reading.
    store_state(whole + (rest > 0 and 1 or 0), now + whole, rest)
    return {grant, room - grant, 0, 0}
end
local us, rest = idiv(ns + interval * n - horizon, 1000)
if room < 0 then
    room = 0
end
return {0, room, d + us, rest}
