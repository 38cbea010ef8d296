-- turnstile: the part every script shares.
--
-- KEYS[1]  the limiter's key for one client
-- ARGV[1]  the time in microseconds, or '' to read Redis' own clock (TIME)
-- ARGV[2]  the permits asked for, 1 ..= capacity (checked before the call)
-- ARGV[3]  milliseconds added to every expiry (0 by default)
-- ARGV[4..] the algorithm's parameters, whole numbers
--
-- Lua numbers are doubles: every value here is a whole number below 2^53,
-- which the limiter's validation guarantees (microseconds since 1970 stay
-- below 2^52 until 2112), so `+ - *` are exact and `idiv` divides exactly.
--
-- Strings of digits become numbers by arithmetic (`ARGV[4] + 0`), not by
-- `tonumber`: the same conversion (Lua's own, on decimal text), once, where
-- Lua 5.1's `tonumber` converts twice (it checks, then converts) behind a
-- function call. In a script of a dozen conversions that is a tenth of
-- Redis' time.
--
-- The reply is {allowed, remaining, wait_us, wait_ns}: {1, remaining, 0, 0}
-- for an admission, {0, 0, us, ns} for a denial whose exact wait is
-- `us * 1000 + ns` nanoseconds (ns may be negative, above -1000). A
-- refundable decision adds the state an admission wrote as a fifth element;
-- a refund (refund.lua) takes the permits given back as ARGV[2] and answers
-- 1 or 0.

-- floor(x / d) and x mod d, exact for whole 0 <= x < 2^53 and d >= 1: the
-- double quotient can be one off near a whole number, the remainder says so.
local function idiv(x, d)
    local q = math.floor(x / d)
    local r = x - q * d
    if r < 0 then
        q, r = q - 1, r + d
    elseif r >= d then
        q, r = q + 1, r - d
    end
    return q, r
end

-- The key's state: `fields` (2 or 3) whole numbers, stored joined by ':',
-- returned as that many values; nothing for none (a fresh state). A value
-- that is not such a state (written by something else) fails the call and
-- stays as it is: taking it as fresh could admit a whole burst more than the
-- limit. One anchored pattern takes decimal digits only, in fields joined by
-- single ':' (no sign, space, exponent, hex, 'inf' or empty field, which
-- tonumber would take), and each must be below 2^53 so that it is the exact
-- number written.
local function load_state(fields)
    local value = redis.call('GET', KEYS[1])
    if not value then
        return
    end
    if fields == 2 then
        local a, b = string.match(value, '^(%d+):(%d+)$')
        if a then
            a, b = a + 0, b + 0
            if a < 9007199254740992 and b < 9007199254740992 then
                return a, b
            end
        end
    else
        local a, b, c = string.match(value, '^(%d+):(%d+):(%d+)$')
        if a then
            a, b, c = a + 0, b + 0, c + 0
            if a < 9007199254740992 and b < 9007199254740992 and c < 9007199254740992 then
                return a, b, c
            end
        end
    end
    error({err = 'turnstile: ' .. KEYS[1] ..
        ' holds a value that is not this limiter\'s state; delete it or choose another prefix'})
end

-- The state this script wrote, as stored: what a refundable admission
-- returns as its receipt (nil until `store_state`).
local wrote

-- Store the state `a:b` (or `a:b:c`), to expire `us` microseconds from now
-- rounded up to whole milliseconds (never before it is as good as fresh),
-- plus the slack: one SET with PX, where a hash would need HSET and PEXPIRE.
-- Whole numbers below 2^53 are written exactly by '%.0f' (tostring's 14
-- significant digits are not) and by '%d' where Lua's '%d' is a 64-bit C
-- long, the same text in half the time: the check picks '%d' only there
-- (Lua 5.1 formats '%d' as a C long, whose size `struct.pack('l', 0)`
-- tells without formatting anything).
local function store_state(us, a, b, c)
    local ms, rest = idiv(us, 1000)
    if rest > 0 then
        ms = ms + 1
    end
    if ms < 1 then
        ms = 1
    end
    local long = #struct.pack('l', 0) == 8
    if c then
        wrote = string.format(long and '%d:%d:%d' or '%.0f:%.0f:%.0f', a, b, c)
    else
        wrote = string.format(long and '%d:%d' or '%.0f:%.0f', a, b)
    end
    if ARGV[3] ~= '0' then
        ms = ms + ARGV[3]
    end
    redis.call('SET', KEYS[1], wrote, 'PX', string.format(long and '%d' or '%.0f', ms))
end

local now
if ARGV[1] == '' then
    -- Redis 3.2 to 4 replicate a script by running it again on each replica,
    -- whose TIME differs: replicating its writes instead makes TIME allowed
    -- before a write. Redis 5 and later do this always; 7 (the first to
    -- name its version to scripts) keeps the call as a no-op, skipped.
    if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
        redis.replicate_commands()
    end
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
else
    now = ARGV[1] + 0
end
local n = ARGV[2] + 0
