-- A lease, after token_bucket_level.lua, on the token bucket's own key and
-- state (so exact and leased processes share one limit): take
-- min(want, level) tokens when at least n (ARGV[2]) are there, else nothing.
-- ARGV[9]: want, n <= want.
--
-- The reply is {granted, left, wait_us, wait_ns}: {granted, left, 0, 0} when
-- granted >= n, {0, level, us, ns} with the exact wait until n tokens exist.
local want = ARGV[9] + 0
if level < n then
    local periods = idiv(n - level + amount - 1, amount)
    local ahead = base + periods * period - t
    return {0, level, ahead * unit - (now - t * unit), 0}
end
local grant = want
if level < grant then
    grant = level
end
local left = level - grant
local full = base + idiv(capacity - left + amount - 1, amount) * period
store_state(full * unit - now, left, base * unit)
return {grant, left, 0, 0}
