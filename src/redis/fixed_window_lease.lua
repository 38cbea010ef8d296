-- A lease from the fixed window counter, after prelude.lua, on
-- fixed_window.lua's key and state ('count:window'). ARGV[4..5]: limit,
-- window (us); ARGV[6]: want, n (ARGV[2]) <= want.
--
-- It counts min(want, limit - count) permits in the window when at least n
-- fit, and nothing otherwise, with fixed_window.lua's wait. The permits are
-- counted in this window, so they may be spent only in it: the reply says
-- when it ends, and which window it is (for the give-back).
--
-- The reply is {granted, left, wait_us, wait_ns, valid_us, window}:
-- valid_us the microseconds from this reading to the window's end.
local limit, w = ARGV[4] + 0, ARGV[5] + 0
local want = ARGV[6] + 0
local index, into = idiv(now, w)
local count, stored = load_state(2)
if not count then
    count, stored = 0, index
end
local window, ahead = index, 0
if count == 0 or stored < index then
    count = 0
elseif stored > index then
    -- A reading behind the stored window counts against it, as a decision.
    window, ahead = stored, stored - index
end
local room = limit - count
if room >= n then
    local grant = want
    if room < grant then
        grant = room
    end
    local valid = (window + 1) * w - now
    store_state(valid, count + grant, window)
    return {grant, room - grant, 0, 0, valid, window}
end
return {0, room, (ahead + 1) * w - into, 0}
