-- The token bucket's refund, after refund.lua. ARGV[4..8] as in
-- token_bucket_level.lua: capacity, amount, period, fill time (units), unit.
--
-- Exact only while the key holds the very state the admission wrote,
-- `left:base`: no decision, lease or give-back has changed it since. The
-- admission had found `level = left + n` tokens on the grid `base` (its
-- refill of the stored state, if any, already applied: the same bucket at
-- every reading from the admission's on, refilling on the same grid), so
-- `level:base` is the state as if it had never been asked. A bucket full
-- again (the admission found it full, and restarted the grid at its own
-- reading) is a fresh one: the key is deleted.
local capacity, amount = ARGV[4] + 0, ARGV[5] + 0
local period, unit = ARGV[6] + 0, ARGV[8] + 0
local left, base = receipt(2)
local tokens, last = load_state(2)
if tokens ~= left or last ~= base then
    return 0
end
local level = left + n
if level >= capacity then
    redis.call('DEL', KEYS[1])
    return 1
end
-- The expiry the state without the admission had: when it is full again.
-- `base` is stored in microseconds, a whole number of this quota's units
-- (a receipt of another quota's is declined before the call).
local full = idiv(base, unit) + idiv(capacity - level + amount - 1, amount) * period
store_state(full * unit - now, level, base)
return 1
