-- The sliding window's refund, after refund.lua. ARGV[4..5]: limit, window
-- (us).
--
-- The permits were counted in window k, the one the receipt names. While the
-- key's window is still k they are in its current count; once it is k + 1
-- they are in its previous count (a decision in k + 1 moved the count there
-- whole). Either count less n is the count without this admission, the other
-- admissions still counted, and the window (so the expiry) is unchanged. From
-- window k + 2 on they weigh nothing, and nothing is owed: the refund
-- declines, as it does for a key that expired.
local w = ARGV[5] + 0
local _, _, written = receipt(3)
local current, previous, stored = load_state(3)
if not current then
    return 0
end
if stored == written and current >= n then
    current = current - n
elseif stored == written + 1 and previous >= n then
    previous = previous - n
else
    return 0
end
if current + previous == 0 then
    -- Counts of 0 read as a fresh state.
    redis.call('DEL', KEYS[1])
    return 1
end
store_state((stored + 2) * w - now, current, previous, stored)
return 1
