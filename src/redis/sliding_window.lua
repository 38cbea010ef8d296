-- The sliding window counter (turnstile's `SlidingWindow`), state
-- 'current:previous:window': the counts of window `window` and of the one
-- before it. The previous count weighs `(w - e) / w` at `e` into the window.
-- ARGV[4..5]: limit, window (us); `limit * window < 2^53`.
local limit, w = ARGV[4] + 0, ARGV[5] + 0
local index, into = idiv(now, w)
local current, previous, stored = load_state(3)
if not current then
    current, previous, stored = 0, 0, index
end
-- Where the counts apply: the window written, how many windows ahead of the
-- reading's that is, and the microseconds into it at which to weigh them.
local window, ahead, at = index, 0, into
if current + previous == 0 or stored < index - 1 then
    current, previous = 0, 0
elseif stored == index - 1 then
    current, previous = 0, current
elseif stored > index then
    -- Behind the stored window: decided at that window's start, where the
    -- estimate is largest.
    window, ahead, at = stored, stored - index, 0
end

-- floor(a * w_ns / d) for w_ns = w * 1000, as q * 1000 + f (0 <= f < 1000):
-- the in-process limiter's nanosecond arithmetic, exactly.
local function fits(a, d)
    local q, r = idiv(a * w, d)
    local f = idiv(r * 1000, d)
    return q, f
end

local q, f
if current + n <= limit then
    local room = limit - current - n
    -- floor(p * e / w): the part of the previous count that has slid out.
    local faded = idiv(previous * at, w)
    if previous <= room + faded then
        -- Counts in window k weigh nothing from the start of window k + 2.
        store_state((window + 2) * w - now, current + n, previous, window)
        return {1, room + faded - previous, 0, 0}
    end
    -- Within this window, once p * (w - e') <= room * w.
    q, f = fits(room, previous)
else
    -- In the next window, where the current count becomes the previous one.
    q, f = fits(limit - n, current)
    ahead = ahead + 1
end
-- The wait: to `w_ns - fits` (at least 0) into the window `ahead` windows on,
-- from the reading.
if q >= w then
    return {0, 0, ahead * w - into, 0}
end
return {0, 0, ahead * w + (w - q) - into, -f}
