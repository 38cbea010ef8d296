-- A refund's shared part, after prelude.lua: give back the n (ARGV[2])
-- permits of one admission, whose receipt (the state it wrote, whole numbers
-- joined by ':', checked before the call) is the last argument. The
-- algorithm's part follows, with ARGV[4..] its parameters as for a decision.
--
-- The reply is 1 when the permits went back, so that the key's state is the
-- one it would hold without the admission; 0 when the refund declines, having
-- written nothing. A key that holds something that is not the limiter's state
-- fails the call, as it fails a decision.

-- The receipt's state as numbers, `fields` (2 or 3) of them, as values.
local function receipt(fields)
    local a, b, c
    if fields == 2 then
        a, b = string.match(ARGV[#ARGV], '^(%d+):(%d+)$')
    else
        a, b, c = string.match(ARGV[#ARGV], '^(%d+):(%d+):(%d+)$')
    end
    if not a then
        error({err = 'turnstile: a refund receipt that is not this limiter\'s state'})
    end
    if fields == 2 then
        return a + 0, b + 0
    end
    return a + 0, b + 0, c + 0
end
