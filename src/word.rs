//! The token bucket's packed word: where the token count and the last refill
//! time sit in one `u64`, for a given capacity. Below both the quota, which
//! checks a fill time against the word's span when it is built, and the
//! token-bucket algorithms, which read and write words through it.

const NANOS_PER_MICRO: u64 = 1_000;

/// Token-field width up to which the time unit is one microsecond. Wider token
/// fields coarsen the unit instead of shortening the time field's span.
pub(crate) const TOKEN_BITS_AT_MICROSECOND: u32 = 16;

/// Where the two fields sit in a token bucket's word, for one capacity, and the
/// time field's unit.
///
/// The token field is exactly as wide as the capacity needs; time gets the rest.
/// Up to 16 token bits the time unit is 1 µs; each token bit beyond doubles it, so
/// the time field always spans at least `2^48` µs. The shift and mask are
/// computed once, here, and every read or write of a word goes through
/// [`pack`](Layout::pack), [`tokens`](Layout::tokens) and [`time`](Layout::time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The shift of the token field: `64 - token bits`. Also the width of the
    /// time field, except in a [`with_spare_bit`](Self::with_spare_bit) layout.
    pub(crate) time_bits: u32,
    /// The time field's bits: `2^time_bits - 1`, or `2^(time_bits - 1) - 1`
    /// with a spare bit.
    pub(crate) time_mask: u64,
    /// The time unit is `2^unit_shift` microseconds.
    pub(crate) unit_shift: u32,
}

impl Layout {
    /// The layout for a bucket of `capacity` tokens (`capacity >= 1`).
    pub(crate) const fn for_capacity(capacity: u32) -> Layout {
        // 1..=32 bits of tokens; `capacity | 1` gives capacity 0 one bit instead of none.
        let token_bits = u32::BITS - (capacity | 1).leading_zeros();
        let time_bits = u64::BITS - token_bits;
        Layout {
            time_bits,
            time_mask: (1 << time_bits) - 1,
            unit_shift: token_bits.saturating_sub(TOKEN_BITS_AT_MICROSECOND),
        }
    }

    /// The layout of a [`LiveTokenBucket`](crate::LiveTokenBucket): tokens up
    /// to `ceiling` at the top of the word, as [`for_capacity`](Self::for_capacity)
    /// places them, and a time field one bit narrower, so that the bit between
    /// the two ([`spare_bit`](Self::spare_bit)) is free to name the quota's
    /// generation. Reading the tokens or the time, and spending, leave that
    /// bit alone; only [`pack`](Self::pack) writes it as 0. The unit is the one
    /// `ceiling` has alone, so the half span is at least `2^46` µs.
    pub(crate) const fn with_spare_bit(ceiling: u32) -> Layout {
        let token_bits = u32::BITS - (ceiling | 1).leading_zeros();
        let time_bits = u64::BITS - token_bits;
        Layout {
            time_bits,
            time_mask: (1 << (time_bits - 1)) - 1,
            unit_shift: token_bits.saturating_sub(TOKEN_BITS_AT_MICROSECOND),
        }
    }

    /// The bit just above the time field: in a [`with_spare_bit`](Self::with_spare_bit)
    /// layout, below the token field and free; in any other, the token
    /// field's lowest bit.
    pub(crate) const fn spare_bit(self) -> u64 {
        self.time_mask + 1
    }

    /// The time unit in microseconds: 1, or a larger power of two for capacities
    /// above 65,535.
    pub(crate) const fn unit_micros(self) -> u64 {
        1 << self.unit_shift
    }

    /// Half the time field's range, in time units: elapsed times below it are read
    /// forwards, at or above it as a reading behind the stored time.
    pub(crate) const fn half_range(self) -> u64 {
        (self.time_mask >> 1) + 1
    }

    /// Half the time field's range, in microseconds; at least `2^47`.
    pub(crate) const fn half_range_micros(self) -> u64 {
        self.half_range() << self.unit_shift
    }

    /// A clock reading in nanoseconds as the word's time: whole units, wrapped.
    #[inline(always)]
    pub(crate) const fn time_of(self, now: u64) -> u64 {
        self.wrap((now / NANOS_PER_MICRO) >> self.unit_shift)
    }

    /// The nanoseconds from `now` (a clock reading) to the start of the time unit
    /// `ahead >= 1` units after `now`'s own: the exact wait for a refill that lands
    /// there. Saturates at `u64::MAX` (584 years).
    #[inline(always)]
    pub(crate) const fn nanos_until(self, ahead: u64, now: u64) -> u64 {
        let unit_start_micros = ((now / NANOS_PER_MICRO) >> self.unit_shift) << self.unit_shift;
        let into_unit = now - unit_start_micros * NANOS_PER_MICRO;
        match (ahead << self.unit_shift).checked_mul(NANOS_PER_MICRO) {
            // `ahead >= 1` unit and `into_unit` is less than one: no underflow.
            Some(ahead) => ahead - into_unit,
            None => u64::MAX,
        }
    }

    /// `time` wrapped to the time field.
    #[inline(always)]
    pub(crate) const fn wrap(self, time: u64) -> u64 {
        time & self.time_mask
    }

    #[inline(always)]
    pub(crate) const fn pack(self, tokens: u64, time: u64) -> u64 {
        (tokens << self.time_bits) | self.wrap(time)
    }

    /// `word` with `n` fewer tokens and the same time; `n` must not exceed its
    /// tokens.
    #[inline(always)]
    pub(crate) const fn spend(self, word: u64, n: u64) -> u64 {
        word - (n << self.time_bits)
    }

    #[inline(always)]
    pub(crate) const fn tokens(self, word: u64) -> u64 {
        word >> self.time_bits
    }

    #[inline(always)]
    pub(crate) const fn time(self, word: u64) -> u64 {
        self.wrap(word)
    }
}
