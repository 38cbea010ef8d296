//! The lease word of one key: its fields, and packing and reading them.
//!
//! # The word of one key
//!
//! | bits    | field                                                      |
//! |---------|------------------------------------------------------------|
//! | 0..24   | tokens of the lease held here; with `DENIED`, the tokens the denial's wait is for |
//! | 24..29  | size code `e`: lease size `min(2^e, L)`, low water a quarter of it |
//! | 29..61  | time, in units of `2^22` ns (4.19 ms): the lease's expiry, or with `DENIED` the end of a denial |
//! | 61      | `DRY`: the last prefetch found the bucket dry; none until this lease runs out |
//! | 62      | `DENIED`: Redis had no tokens until the time field          |
//! | 63      | `FETCHING`: a request is taking the next lease              |
//!
//! The fresh word is 0: no tokens, size code 0, no flags. The time field
//! counts the local clock's nanoseconds since the limiter was built and
//! saturates after `2^54` ns (208 days); from then on every lease reads as
//! expired, and each request takes a lease of its own: a call per decision,
//! never more than the bucket grants, but each lease's tokens beyond the one
//! spent are stranded (not given back), so the process admits less than its
//! share. Rebuild a leased limiter that serves longer than that.

pub(super) const TOKENS_MASK: u64 = (1 << 24) - 1;
pub(super) const SIZE_SHIFT: u32 = 24;
pub(super) const SIZE_MASK: u64 = 0x1f;
pub(super) const TIME_SHIFT: u32 = 29;
pub(super) const TIME_MASK: u64 = (1 << 32) - 1;
pub(super) const DRY: u64 = 1 << 61;
pub(super) const DENIED: u64 = 1 << 62;
pub(super) const FETCHING: u64 = 1 << 63;
/// Nanoseconds per time unit, as a shift.
pub(super) const UNIT_SHIFT: u32 = 22;

pub(super) fn tokens(word: u64) -> u32 {
    (word & TOKENS_MASK) as u32
}

pub(super) fn size_code(word: u64) -> u32 {
    ((word >> SIZE_SHIFT) & SIZE_MASK) as u32
}

pub(super) fn time(word: u64) -> u64 {
    (word >> TIME_SHIFT) & TIME_MASK
}

pub(super) fn pack(tokens: u32, size_code: u32, time: u64, flags: u64) -> u64 {
    (u64::from(tokens) & TOKENS_MASK)
        | ((u64::from(size_code) & SIZE_MASK) << SIZE_SHIFT)
        | ((time & TIME_MASK) << TIME_SHIFT)
        | (flags & (DRY | DENIED | FETCHING))
}

pub(super) fn with_tokens(word: u64, tokens: u32) -> u64 {
    (word & !TOKENS_MASK) | (u64::from(tokens) & TOKENS_MASK)
}

/// Nanoseconds as whole units, rounded down; saturated at the field.
pub(super) fn units_down(nanos: u64) -> u64 {
    (nanos >> UNIT_SHIFT).min(TIME_MASK)
}

/// Nanoseconds as whole units, rounded up; saturated at the field.
pub(super) fn units_up(nanos: u64) -> u64 {
    nanos
        .saturating_add((1 << UNIT_SHIFT) - 1)
        .checked_shr(UNIT_SHIFT)
        .unwrap_or(0)
        .min(TIME_MASK)
}

pub(super) fn nanos(units: u64) -> u64 {
    units << UNIT_SHIFT
}

#[cfg(test)]
mod tests {
    use crate::redis::MAX_LEASE;
    use crate::redis::leased::word;

    #[test]
    fn the_word_packs_and_unpacks_at_every_edge() {
        let all = word::DRY | word::DENIED | word::FETCHING;
        let w = word::pack(MAX_LEASE + MAX_LEASE / 2, 31, word::TIME_MASK, all);
        assert_eq!(word::tokens(w), MAX_LEASE + MAX_LEASE / 2);
        assert_eq!(word::size_code(w), 31);
        assert_eq!(word::time(w), word::TIME_MASK);
        assert_eq!(w & all, all);
        let w = word::pack(0, 0, 0, 0);
        assert_eq!(w, 0);
        let w = word::pack(5, 3, 77, 0);
        assert_eq!(
            (word::tokens(w), word::size_code(w), word::time(w)),
            (5, 3, 77)
        );
        assert_eq!(word::tokens(word::with_tokens(w, 9)), 9);
        assert_eq!(word::time(word::with_tokens(w, 9)), 77);
        assert_eq!(word::units_down(u64::MAX), word::TIME_MASK);
        assert_eq!(word::units_up(u64::MAX), word::TIME_MASK);
        assert_eq!(word::units_up(1), 1);
        assert_eq!(word::units_down((1 << 22) - 1), 0);
    }
}
