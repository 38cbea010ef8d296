-- A give-back, after token_bucket_level.lua: n (ARGV[2]) tokens of a lease
-- that were never spent go back to the bucket, capped at its capacity. A
-- bucket full again is a fresh one: its key is deleted.
--
-- The reply is {level, 0, 0, 0}: the bucket's tokens after the give-back.
local back = level + n
if back >= capacity then
    redis.call('DEL', KEYS[1])
    return {capacity, 0, 0, 0}
end
local full = base + idiv(capacity - back + amount - 1, amount) * period
store_state(full * unit - now, back, base * unit)
return {back, 0, 0, 0}
