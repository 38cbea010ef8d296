-- GCRA (turnstile's `Gcra`), state 'tat:ns': the theoretical arrival time as
-- whole microseconds plus 0 ..= 999 nanoseconds, because the emission
-- interval is kept to the nanosecond, as in process.
-- ARGV[4..5]: the emission interval T and the horizon capacity * T, in ns,
-- the horizon at most 2^50 ns.
local interval, horizon = ARGV[4] + 0, ARGV[5] + 0
local tat, ns = load_state(2)
if not tat then
    ns = 0
end
-- How far max(TAT, now) is ahead of now: d us + ns.
local d
if tat == nil or tat < now or (tat == now and ns == 0) then
    d, ns = 0, 0
else
    d = tat - now
end
local cost = interval * n
if d <= idiv(horizon, 1000) + 1 then
    local ahead = d * 1000 + ns + cost
    if ahead <= horizon then
        local whole, rest = idiv(ahead, 1000)
        -- Fresh again once the TAT is not after the reading.
        store_state(whole + (rest > 0 and 1 or 0), now + whole, rest)
        return {1, idiv(horizon - ahead, interval), 0, 0}
    end
end
-- Conforms once now has moved up by the excess, d us + (ns + cost - horizon)
-- ns: whole microseconds and 0 ..= 999 ns (idiv floors negative numbers too).
local us, rest = idiv(ns + cost - horizon, 1000)
return {0, 0, d + us, rest}
