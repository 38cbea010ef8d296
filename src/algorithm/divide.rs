//! Division by a divisor fixed when a limiter is built (a window, an emission
//! interval), as a multiply and a shift.
//!
//! A 64-bit `div` takes tens of cycles; the window algorithms and GCRA divide by
//! the same number on every decision. With `l = ceil(log2 d)` and
//! `m = ceil(2^(63 + l) / d)`, `floor(x / d) = (x * m) >> (63 + l)` for every
//! `x < 2^63` (Granlund and Montgomery, "Division by invariant integers using
//! multiplication", 1994): writing `m * d = 2^(63 + l) + e` with `0 <= e < d`,
//! `x * m / 2^(63 + l) = x / d + x * e / (d * 2^(63 + l))`, and the second term is
//! below `2^-l <= 1 / d`, too small to carry `x / d` past an integer. `m` fits
//! in 64 bits, the product in 128. Readings at or above `2^63` ns (292 years)
//! take the hardware division.

use core::num::NonZeroU64;

/// A divisor with its multiply-and-shift reciprocal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Divisor {
    d: NonZeroU64,
    magic: u64,
    shift: u32,
}

impl Divisor {
    pub(crate) const fn new(d: NonZeroU64) -> Divisor {
        // `ceil(log2 d)`: 0 for 1, else the bits of `d - 1`.
        let l = u64::BITS - (d.get() - 1).leading_zeros();
        let shift = 63 + l;
        // `d > 2^(l-1)`, so `2^(63+l) / d < 2^64`, and the ceiling stays below.
        let magic = (1u128 << shift).div_ceil(d.get() as u128) as u64;
        Divisor { d, magic, shift }
    }

    pub(crate) const fn get(self) -> u64 {
        self.d.get()
    }

    /// The divisor, its multiplier and its shift, as three words (a live
    /// form's parameter slot keeps them so).
    pub(crate) const fn to_raw(self) -> [u64; 3] {
        [self.d.get(), self.magic, self.shift as u64]
    }

    /// A divisor from the words [`to_raw`](Self::to_raw) gave. Words that no
    /// divisor gave make a divisor that divides wrongly, never one that
    /// panics: a zero divisor is 1, and the shift is kept below 128.
    pub(crate) const fn from_raw(raw: [u64; 3]) -> Divisor {
        let d = match NonZeroU64::new(raw[0]) {
            Some(d) => d,
            None => NonZeroU64::MIN,
        };
        Divisor {
            d,
            magic: raw[1],
            shift: (raw[2] & 127) as u32,
        }
    }

    /// `floor(x / d)`.
    #[inline(always)]
    pub(crate) const fn div(self, x: u64) -> u64 {
        if x < 1 << 63 {
            ((x as u128 * self.magic as u128) >> self.shift) as u64
        } else {
            x / self.d.get()
        }
    }

    /// `(floor(x / d), x mod d)`.
    #[inline(always)]
    pub(crate) const fn div_rem(self, x: u64) -> (u64, u64) {
        let q = self.div(x);
        (q, x - q * self.d.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(d: u64, x: u64) {
        let divisor = Divisor::new(NonZeroU64::new(d).unwrap());
        assert_eq!(divisor.div(x), x / d, "{x} / {d}");
        assert_eq!(divisor.div_rem(x), (x / d, x % d), "{x} % {d}");
    }

    #[test]
    fn exact_at_the_edges() {
        let ds = [
            1,
            2,
            3,
            5,
            7,
            10,
            1_000,
            1_000_000_007,
            (1 << 32) - 1,
            1 << 32,
            (1 << 32) + 1,
            (1 << 62) - 1,
            1 << 62,
            (1 << 62) + 1,
            (1 << 63) - 1,
            1 << 63,
            (1 << 63) + 1,
            u64::MAX - 1,
            u64::MAX,
        ];
        for d in ds {
            for x in [
                0,
                1,
                d - 1,
                d,
                d.wrapping_add(1),
                (1 << 63) - 1,
                1 << 63,
                u64::MAX,
            ] {
                check(d, x);
                // Just below and above every multiple near the top of the fast range.
                let top = ((1u64 << 63) - 1) / d * d;
                check(d, top);
                check(d, top.saturating_sub(1));
            }
        }
    }

    #[test]
    fn exact_over_a_pseudo_random_sweep() {
        // xorshift: deterministic, no dependency.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..200_000 {
            let d = next() >> (next() % 64);
            let x = next() >> (next() % 64);
            if d > 0 {
                check(d, x);
                check(d, x % (1 << 63));
            }
        }
    }
}
