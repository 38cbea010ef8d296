-- The fixed window's refund, after refund.lua. ARGV[4..5]: limit, window (us).
--
-- The permits were counted in the window the receipt names. While the key
-- still counts that window, later admissions in it included, its count less n
-- is the count without this admission: every other admission still counted,
-- this one not, the window's end (the expiry) unchanged. Once the key counts
-- a later window (or has expired with its window), the permits no longer
-- count and nothing is owed: the refund declines.
local w = ARGV[5] + 0
local _, written = receipt(2)
local count, window = load_state(2)
if not count or window ~= written or count < n then
    return 0
end
count = count - n
if count == 0 then
    -- A count of 0 reads as a fresh state.
    redis.call('DEL', KEYS[1])
    return 1
end
store_state((window + 1) * w - now, count, window)
return 1
