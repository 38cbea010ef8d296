-- The token bucket (turnstile's `TokenBucket`), state 'tokens:time': the
-- tokens at the last refill and its time, in whole time units.
-- ARGV[4..8]: capacity, amount, period (units), fill time (units), unit (us).
local capacity, amount = tonumber(ARGV[4]), tonumber(ARGV[5])
local period, fill, unit = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local t = idiv(now, unit)
local state = load_state(2) or {capacity, 0}
local tokens, last = state[1], state[2]
-- The bucket now: `level` tokens, refilled at `base`.
local level, base
if tokens >= capacity then
    -- Full (or never used): any elapsed time leaves it full, and the fraction
    -- of a period is dropped: the grid restarts now.
    level, base = capacity, t
else
    local elapsed = t - last
    if elapsed < period then
        -- Not a whole period yet, or a reading behind the stored time:
        -- refill nothing, move nothing.
        level, base = tokens, last
    elseif elapsed >= fill then
        level, base = capacity, t
    else
        local periods = idiv(elapsed, period)
        level = tokens + periods * amount
        if level >= capacity then
            level, base = capacity, t
        else
            -- Not full: keep the fraction of a period (the grid stays).
            base = last + periods * period
        end
    end
end
if level < n then
    -- The exact wait until n tokens exist: whole periods from `base`,
    -- counted from the reading's place in its time unit. Nothing is written.
    local periods = idiv(n - level + amount - 1, amount)
    local ahead = base + periods * period - t
    return {0, 0, ahead * unit - (now - t * unit), 0}
end
local left = level - n
-- Full again, and so fresh-equivalent, once the missing tokens are refilled.
local full = base + idiv(capacity - left + amount - 1, amount) * period
store_state({left, base}, full * unit - now)
return {1, left, 0, 0}
