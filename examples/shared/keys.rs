//! The fixed shuffled order of keys that the keyed benchmarks visit, shared by
//! `benches/keyed.rs` and `examples/decision_cost/` so both measure the same walk.

/// A fixed permutation of `0..n` (a Fisher-Yates shuffle driven by a linear
/// congruential generator with a fixed seed).
pub fn shuffled(n: u64) -> Vec<u64> {
    let mut keys: Vec<u64> = (0..n).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..keys.len()).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        keys.swap(i, (state >> 33) as usize % (i + 1));
    }
    keys
}
