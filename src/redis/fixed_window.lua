-- The fixed window counter (turnstile's `FixedWindow`), state 'count:window':
-- the count in the window with that number (windows of `w` us from 0).
-- ARGV[4..5]: limit, window (us).
local limit, w = ARGV[4] + 0, ARGV[5] + 0
local index, into = idiv(now, w)
local count, stored = load_state(2)
if not count then
    count, stored = 0, index
end
-- The window the count belongs to, and how far ahead of the reading's it is.
local window, ahead = index, 0
if count == 0 or stored < index then
    count = 0
elseif stored > index then
    -- A reading behind the stored window counts against it: it never resets.
    window, ahead = stored, stored - index
end
if count + n <= limit then
    -- Fresh again when the counted window ends.
    store_state((window + 1) * w - now, count + n, window)
    return {1, limit - count - n, 0, 0}
end
return {0, 0, (ahead + 1) * w - into, 0}
