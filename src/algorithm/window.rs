//! What the window algorithms share: windows at fixed boundaries from the clock's
//! epoch, numbered, with the number wrapped into the bits of a word that the
//! counts leave over.

use core::num::NonZeroU64;
use core::time::Duration;

use crate::algorithm::divide::Divisor;
use crate::error::QuotaError;

/// The longest window: `2^47` µs (4.46 years), the same bound as the longest
/// fill time of a token bucket.
pub(crate) const MAX_WINDOW_NANOS: u64 = (1 << 47) * 1_000;

/// The span the window number must cover, in nanoseconds: `2^48` µs (8.9 years),
/// so that a word idle for half of it is still read exactly.
const MIN_SPAN_NANOS: u128 = (1 << 48) * 1_000;

/// Where a reading falls relative to the window a word was last written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Position {
    /// The same window.
    Same,
    /// `d >= 1` windows later.
    Later(u64),
    /// Behind the stored window by `k >= 1` windows: a clock read before the
    /// word was written, or one that went backwards.
    Behind(u64),
}

/// The window geometry of one limit and window length, with `counts` count
/// fields of `count_bits` each above the window number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Windows {
    /// The window in nanoseconds, with its reciprocal.
    window: Divisor,
    /// Width of one count field: as many bits as the limit needs.
    count_bits: u32,
    /// Width of the window number, the low field.
    index_bits: u32,
    /// `2^index_bits - 1`.
    index_mask: u64,
    /// `2^(index_bits - 1)`: a distance below it reads forwards, at or above it
    /// backwards.
    half: u64,
}

impl Windows {
    /// Validate `limit` and `window` for a word of `counts` count fields.
    pub(crate) fn new(limit: u32, window: Duration, counts: u32) -> Result<Windows, QuotaError> {
        Windows::within(limit, limit, window, counts, u64::BITS)
    }

    /// Validate `limit` and `window` for `counts` count fields as wide as
    /// `ceiling` needs (at least `limit`), in the low `bits` bits of a word:
    /// a live form keeps one bit above them, and a layout that any limit up
    /// to its ceiling can share.
    pub(crate) fn within(
        limit: u32,
        ceiling: u32,
        window: Duration,
        counts: u32,
        bits: u32,
    ) -> Result<Windows, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if window.is_zero() {
            return Err(QuotaError::ZeroWindow);
        }
        let nanos = window.as_nanos();
        if nanos > u128::from(MAX_WINDOW_NANOS) {
            return Err(QuotaError::WindowTooLong {
                window,
                max: Duration::from_nanos(MAX_WINDOW_NANOS),
            });
        }
        let count_bits = u32::BITS - limit.max(ceiling).leading_zeros();
        // At most 64 bits of counts: `counts <= 2`, `count_bits <= 32`.
        let index_bits = bits.min(u64::BITS).saturating_sub(counts * count_bits);
        if index_bits < 2 {
            // No window number at all, whatever the window: not a window too
            // short (which named a shortest window that was then too long).
            // And one bit is none: a number wrapped at 2 cannot tell the
            // next window from the one before, so the counted window is
            // never left behind.
            let widest = bits.min(u64::BITS).saturating_sub(2) / counts.max(1);
            return Err(QuotaError::LimitTooLarge {
                limit: limit.max(ceiling),
                max: u32::try_from((1u64 << widest.min(32)) - 1).unwrap_or(u32::MAX),
            });
        }
        // The shortest window whose numbers, wrapped at `2^index_bits`, still span
        // `MIN_SPAN_NANOS`.
        let min = MIN_SPAN_NANOS.div_ceil(1u128 << index_bits.min(127));
        if nanos < min {
            let min = u64::try_from(min).unwrap_or(u64::MAX);
            // The counts are as wide as the larger of the limit and the
            // ceiling (a live window's), and so the window number as narrow:
            // name that, as `LimitTooLarge` does.
            return Err(QuotaError::WindowTooShort {
                limit: limit.max(ceiling),
                window,
                min: Duration::from_nanos(min),
            });
        }
        // `nanos <= MAX_WINDOW_NANOS` and `nanos >= min >= 1`.
        let window = NonZeroU64::new(nanos as u64).unwrap_or(NonZeroU64::MIN);
        Ok(Windows {
            window: Divisor::new(window),
            count_bits,
            index_bits,
            index_mask: u64::MAX >> (64 - index_bits),
            half: 1 << (index_bits - 1),
        })
    }

    /// The geometry as words, for a live form's parameter slot: the window's
    /// divisor, the two field widths, the index mask and half.
    pub(crate) const fn to_raw(self) -> [u64; 5] {
        let [d, magic, shift] = self.window.to_raw();
        [
            d,
            magic,
            shift | (self.count_bits as u64) << 8 | (self.index_bits as u64) << 16,
            self.index_mask,
            self.half,
        ]
    }

    /// The geometry from the words [`to_raw`](Self::to_raw) gave (others make
    /// a geometry that computes wrongly, never one that panics: widths are
    /// kept below 64, so every shift by them is in range).
    #[inline(always)]
    pub(crate) const fn from_raw(raw: [u64; 5]) -> Windows {
        Windows {
            window: Divisor::from_raw([raw[0], raw[1], raw[2] & 0xff]),
            count_bits: ((raw[2] >> 8) & 63) as u32,
            index_bits: ((raw[2] >> 16) & 63) as u32,
            index_mask: raw[3],
            half: raw[4],
        }
    }

    /// The window in nanoseconds.
    #[inline(always)]
    pub(crate) const fn nanos(&self) -> u64 {
        self.window.get()
    }

    pub(crate) const fn duration(&self) -> Duration {
        Duration::from_nanos(self.window.get())
    }

    /// Width of one count field.
    #[inline(always)]
    pub(crate) const fn count_bits(&self) -> u32 {
        self.count_bits
    }

    /// Width of the window number; the shift of the lowest count field.
    #[inline(always)]
    pub(crate) const fn index_bits(&self) -> u32 {
        self.index_bits
    }

    /// `floor(x / window)`, without a division instruction.
    #[inline(always)]
    pub(crate) const fn divide(&self, x: u64) -> u64 {
        self.window.div(x)
    }

    /// The wrapped window number of a reading, and the nanoseconds into it.
    #[inline(always)]
    pub(crate) const fn locate(&self, now: u64) -> (u64, u64) {
        let (index, into) = self.window.div_rem(now);
        (index & self.index_mask, into)
    }

    /// The window number stored in `word`.
    #[inline(always)]
    pub(crate) const fn stored(&self, word: u64) -> u64 {
        word & self.index_mask
    }

    /// Where the window `index` (wrapped) falls relative to the window `stored`.
    #[inline(always)]
    pub(crate) const fn position(&self, stored: u64, index: u64) -> Position {
        let d = index.wrapping_sub(stored) & self.index_mask;
        if d == 0 {
            Position::Same
        } else if d < self.half {
            Position::Later(d)
        } else {
            Position::Behind((self.index_mask - d) + 1)
        }
    }

    /// The nanoseconds from a reading `into` nanoseconds into its window to
    /// `offset` nanoseconds into the window `ahead` windows later; saturating.
    #[inline]
    pub(crate) fn wait(&self, ahead: u64, into: u64, offset: u128) -> u64 {
        let target = u128::from(ahead) * u128::from(self.window.get()) + offset;
        u64::try_from(target.saturating_sub(u128::from(into))).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimum_window_grows_with_the_limit() {
        // One count field: up to 16 bits of limit leave 48 window bits, and any
        // window of 1 µs or more spans 2^48 µs.
        let w = Windows::new(65_535, Duration::from_micros(1), 1).unwrap();
        assert_eq!(w.index_bits(), 48);
        assert!(Windows::new(65_535, Duration::from_nanos(999), 1).is_err());
        assert!(Windows::new(255, Duration::from_nanos(4), 1).is_ok());
        // Two fields of 16 bits leave 32: windows of 2^16 µs at least.
        assert_eq!(
            Windows::new(65_535, Duration::from_micros(65_535), 2),
            Err(QuotaError::WindowTooShort {
                limit: 65_535,
                window: Duration::from_micros(65_535),
                min: Duration::from_micros(65_536),
            })
        );
        assert!(Windows::new(65_535, Duration::from_micros(65_536), 2).is_ok());
        // Two fields of 32 bits leave nothing, for any window.
        assert_eq!(
            Windows::new(u32::MAX, Duration::from_secs(3_600), 2).map(|_| ()),
            Err(QuotaError::LimitTooLarge {
                limit: u32::MAX,
                max: (1 << 31) - 1
            })
        );
    }

    #[test]
    fn positions_wrap_both_ways() {
        let w = Windows::new(1, Duration::from_secs(1), 1).unwrap();
        let mask = w.index_mask;
        assert_eq!(w.position(5, 5), Position::Same);
        assert_eq!(w.position(5, 6), Position::Later(1));
        assert_eq!(w.position(5, 4), Position::Behind(1));
        assert_eq!(w.position(mask, 0), Position::Later(1));
        assert_eq!(w.position(0, mask), Position::Behind(1));
        assert_eq!(w.position(0, w.half - 1), Position::Later(w.half - 1));
        assert_eq!(w.position(0, w.half), Position::Behind(w.half));
    }

    #[test]
    fn waits_saturate() {
        let w = Windows::new(1, Duration::from_secs(1), 1).unwrap();
        assert_eq!(w.wait(1, 300, 0), 1_000_000_000 - 300);
        assert_eq!(w.wait(0, 300, 700), 400);
        assert_eq!(w.wait(u64::MAX, 0, 0), u64::MAX);
    }
}
