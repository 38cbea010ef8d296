-- A give-back from GCRA, after prelude.lua: n (ARGV[2]) permits of a lease
-- that were never spent go back, the TAT moving back by n * T, but never
-- before the reading: a TAT at or before now is a fresh key (the whole burst
-- conforms), and the key is deleted. ARGV[4..5]: T and the horizon, in ns.
--
-- This is the token bucket's give-back (its tokens added back, capped at the
-- capacity) in GCRA's terms: the meter gets at most the n permits the lease
-- took, and never more room than the burst. Leases other processes took
-- after this one stay counted: their permits moved the TAT after this
-- lease's did, and taking n * T off the sum leaves theirs in it.
--
-- The reply is {1, 0, 0, 0}.
local interval = ARGV[4] + 0
local tat, ns = load_state(2)
if tat == nil or tat < now or (tat == now and ns == 0) then
    -- Nothing counted: nothing to give back to.
    return {1, 0, 0, 0}
end
-- n * T <= 1.5 * horizon < 2^51 ns, so exact; subtracted as us and ns.
local cost_us, cost_ns = idiv(interval * n, 1000)
tat, ns = tat - cost_us, ns - cost_ns
if ns < 0 then
    tat, ns = tat - 1, ns + 1000
end
if tat < now or (tat == now and ns == 0) then
    redis.call('DEL', KEYS[1])
    return {1, 0, 0, 0}
end
store_state(tat - now + (ns > 0 and 1 or 0), tat, ns)
return {1, 0, 0, 0}
