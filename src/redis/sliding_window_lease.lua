-- A lease from the sliding window counter, after prelude.lua, on
-- sliding_window.lua's key and state ('current:previous:window').
-- ARGV[4..5]: limit, window (us); ARGV[6]: want, n (ARGV[2]) <= want.
--
-- A decision admits k permits when current + k + previous - faded <= limit
-- (faded = floor(previous * e / w), the part of the previous count that has
-- slid out e into the window). The lease counts the most that fit,
-- min(want, limit - current - previous + faded), in the current count when
-- at least n fit, and nothing otherwise, with sliding_window.lua's wait. The
-- permits may be spent only in this window: the reply says when it ends, and
-- which window it is (for the give-back). Spent later in the window they
-- still pass the check they were counted by: `faded` only grows through a
-- window.
--
-- The reply is {granted, left, wait_us, wait_ns, valid_us, window}.
local limit, w = ARGV[4] + 0, ARGV[5] + 0
local want = ARGV[6] + 0
local index, into = idiv(now, w)
local current, previous, stored = load_state(3)
if not current then
    current, previous, stored = 0, 0, index
end
local window, ahead, at = index, 0, into
if current + previous == 0 or stored < index - 1 then
    current, previous = 0, 0
elseif stored == index - 1 then
    current, previous = 0, current
elseif stored > index then
    window, ahead, at = stored, stored - index, 0
end
local faded = idiv(previous * at, w)
local room = limit - current - previous + faded
if room >= n then
    local grant = want
    if room < grant then
        grant = room
    end
    store_state((window + 2) * w - now, current + grant, previous, window)
    return {grant, room - grant, 0, 0, (window + 1) * w - now, window}
end
-- The wait for n, as sliding_window.lua computes it.
local function fits(a, d)
    local q, r = idiv(a * w, d)
    local f = idiv(r * 1000, d)
    return q, f
end
local q, f
if current + n <= limit then
    q, f = fits(limit - current - n, previous)
else
    q, f = fits(limit - n, current)
    ahead = ahead + 1
end
if room < 0 then
    room = 0
end
if q >= w then
    return {0, room, ahead * w - into, 0}
end
return {0, room, ahead * w + (w - q) - into, -f}
