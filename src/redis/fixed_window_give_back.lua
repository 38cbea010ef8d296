-- A give-back to the fixed window counter, after prelude.lua: n (ARGV[2])
-- permits of a lease that were never spent leave the count of the window the
-- lease was counted in, ARGV[6], and only while the key still counts that
-- window. Once it counts a later one (or expired with it) the permits count
-- nowhere and nothing is owed. ARGV[4..5]: limit, window (us).
--
-- The reply is {1, 0, 0, 0} when the permits went back, {0, 0, 0, 0} when
-- not.
local w = ARGV[5] + 0
local leased = ARGV[6] + 0
local count, window = load_state(2)
if not count or window ~= leased or count < n then
    return {0, 0, 0, 0}
end
count = count - n
if count == 0 then
    redis.call('DEL', KEYS[1])
    return {1, 0, 0, 0}
end
store_state((window + 1) * w - now, count, window)
return {1, 0, 0, 0}
