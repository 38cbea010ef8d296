-- The token bucket's refill (turnstile's `TokenBucket`), shared by its decision,
-- its lease and its give-back scripts. State 'tokens:time': the
-- tokens at the last refill and its time, in microseconds (a whole number
-- of the time units of the quota that wrote it).
-- ARGV[4..8]: capacity, amount, period (units), fill time (units), unit (us).
local capacity, amount = ARGV[4] + 0, ARGV[5] + 0
local period, fill, unit = ARGV[6] + 0, ARGV[7] + 0, ARGV[8] + 0
-- The reading in whole units (a unit of 1 µs, that of every capacity up to
-- 65,535, needs no division).
local t = now
if unit ~= 1 then
    t = idiv(now, unit)
end
local tokens, last = load_state(2)
if not tokens then
    tokens, last = capacity, 0
elseif unit ~= 1 then
    -- In this quota's units, rounded up: written by a quota with another
    -- unit (a burst changed across 65,535), it is the same instant or a
    -- later one, never an earlier (which would refill early).
    local whole, part = idiv(last, unit)
    if part > 0 then
        whole = whole + 1
    end
    last = whole
end
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
-- `level` and `base` are the bucket now; what follows decides.
