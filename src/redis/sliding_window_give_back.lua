-- A give-back to the sliding window counter, after prelude.lua: n (ARGV[2])
-- permits of a lease that were never spent leave the current count of the
-- window the lease was counted in, ARGV[6], and only while the key's window
-- is still that one. Later, the permits weigh in the previous count or not
-- at all, and stay there: nothing goes back. ARGV[4..5]: limit, window (us).
--
-- The reply is {1, 0, 0, 0} when the permits went back, {0, 0, 0, 0} when
-- not.
local w = ARGV[5] + 0
local leased = ARGV[6] + 0
local current, previous, stored = load_state(3)
if not current or stored ~= leased or current < n then
    return {0, 0, 0, 0}
end
current = current - n
if current + previous == 0 then
    redis.call('DEL', KEYS[1])
    return {1, 0, 0, 0}
end
store_state((stored + 2) * w - now, current, previous, stored)
return {1, 0, 0, 0}
