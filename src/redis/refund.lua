-- A refund's shared part, after prelude.lua: give back the n (ARGV[2])
-- permits of one admission, whose receipt (the state it wrote, whole numbers
-- joined by ':', checked before the call) is the last argument. The
-- algorithm's part follows, with ARGV[4..] its parameters as for a decision.
--
-- The reply is 1 when the permits went back, so that the key's state is the
-- one it would hold without the admission; 0 when the refund declines, having
-- written nothing. A key that holds something that is not the limiter's state
-- fails the call, as it fails a decision.

-- The receipt's state as numbers, `fields` of them.
local function receipt(fields)
    local state, i = {}, 0
    for field in string.gmatch(ARGV[#ARGV], '[^:]+') do
        i = i + 1
        state[i] = tonumber(field)
    end
    if i ~= fields then
        error({err = 'turnstile: a refund receipt that is not this limiter\'s state'})
    end
    return state
end

-- Whether two states are the same numbers (the same state, however written).
local function same(a, b)
    if #a ~= #b then
        return false
    end
    for i = 1, #a do
        if a[i] ~= b[i] then
            return false
        end
    end
    return true
end
