//! The operations the live-quota property tests run against their models.

use proptest::prelude::*;

#[derive(Clone, Debug)]
pub enum Op {
    /// Ask key `key` for `1 + n % capacity` permits, or for `n` itself when
    /// `raw` (to check the capacity in force refuses the rest).
    Acquire { key: usize, n: u32, raw: bool },
    /// Peek at a key.
    Remaining { key: usize },
    /// Move the clock forward.
    Advance { micros: u64 },
    /// Change to quota `i % quotas().len()`.
    SetQuota { i: usize },
    /// Sweep (keyed only).
    Sweep,
}

pub const KEYS: usize = 3;

/// Up to 150 operations; with `long_advances`, the clock also moves by up
/// to 3 s at once (windows of a second pass whole).
pub fn ops(long_advances: bool) -> impl Strategy<Value = Vec<Op>> {
    let micros = if long_advances {
        prop_oneof![Just(0u64), Just(1), 0..8_000u64, 0..3_000_000u64].boxed()
    } else {
        prop_oneof![Just(0u64), Just(1), 0..8_000u64].boxed()
    };
    let op = prop_oneof![
        8 => (0..KEYS, any::<u32>(), prop::bool::weighted(0.1))
            .prop_map(|(key, n, raw)| Op::Acquire { key, n: if raw { n % 50 } else { n }, raw }),
        2 => (0..KEYS).prop_map(|key| Op::Remaining { key }),
        5 => micros.prop_map(|micros| Op::Advance { micros }),
        2 => any::<usize>().prop_map(|i| Op::SetQuota { i }),
        1 => Just(Op::Sweep),
    ];
    prop::collection::vec(op, 1..150)
}
