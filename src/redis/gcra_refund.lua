-- GCRA's refund, after refund.lua. ARGV[4]: the emission interval T in ns.
--
-- Exact only while the key holds the very TAT the admission wrote,
-- max(TAT, now) + n * T: no decision has moved it since (once one has, time
-- may have drained the meter through this admission's cost, and one number
-- cannot tell). Moving it back by n * T gives max(TAT, now) at the
-- admission's reading, which decides as the TAT before it at that reading and
-- every later one: GCRA reads max(TAT, now).
local interval = ARGV[4] + 0
local written_tat, written_ns = receipt(2)
local stored_tat, stored_ns = load_state(2)
if stored_tat ~= written_tat or stored_ns ~= written_ns then
    return 0
end
-- n * T <= the horizon <= 2^50 ns, so exact; subtracted as us and ns.
local cost_us, cost_ns = idiv(interval * n, 1000)
local tat, ns = written_tat - cost_us, written_ns - cost_ns
if ns < 0 then
    tat, ns = tat - 1, ns + 1000
end
if tat < 0 then
    -- Not an admission of this limiter's (no TAT below 0 is ever written).
    return 0
end
-- Fresh again once the TAT is not after the reading, as a decision writes it.
store_state(tat - now + (ns > 0 and 1 or 0), tat, ns)
return 1
