-- The token bucket's decision, after token_bucket_level.lua: all or nothing
-- for n tokens.
if level < n then
    -- The exact wait until n tokens exist: whole periods from `base`,
    -- counted from the reading's place in its time unit. Nothing is written.
    local periods = idiv(n - level + amount - 1, amount)
    local ahead = base + periods * period - t
    return {0, 0, ahead * unit - (now - t * unit), 0}
end
local left = level - n
-- Full again, and so fresh-equivalent, once the missing tokens are refilled.
local missing = capacity - left
if amount ~= 1 then
    missing = idiv(missing + amount - 1, amount)
end
local full = base + missing * period
store_state(full * unit - now, left, base * unit)
return {1, left, 0, 0}
