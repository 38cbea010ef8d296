//! What an algorithm gives the live forms' mechanism
//! ([`switch`](crate::algorithm::switch)): its parameters as words, and its
//! conversion rule.

use core::fmt;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::QuotaError;

/// One quota's parameters as words: what a parameter slot holds.
pub(crate) type Raw = [u64; 7];

/// The generation bit of a live word: the top bit. The algorithm's own word
/// takes the 63 below it.
pub(crate) const GENERATION: u64 = 1 << 63;

/// What an algorithm gives the live mechanism: its parameters as a few
/// words, a layout of its word in 63 bits that every quota up to a ceiling
/// shares, and the rule that turns a word of one quota into a word of
/// another.
pub(crate) trait Form: Algorithm + Copy {
    /// What a change is given.
    type Quota: Copy + PartialEq + fmt::Debug;

    /// The parameters of `quota`, laid out in the low 63 bits of a word so
    /// that every quota up to `ceiling` shares the layout.
    fn build(quota: Self::Quota, ceiling: u32) -> Result<Self, QuotaError>;

    /// The quota these parameters enforce.
    fn quota(&self) -> Self::Quota;

    /// The parameters as words.
    fn to_raw(&self) -> Raw;

    /// The parameters from words [`to_raw`](Self::to_raw) gave. Never
    /// panics, whatever the words (a slot is read whole under its sequence
    /// number, so only words one quota gave reach this, but the arithmetic
    /// must not depend on that to be panic-free).
    fn from_raw(raw: &Raw) -> Self;

    /// [`decide`](Algorithm::decide) on a word of 63 bits, whose next word
    /// must fit 63 bits.
    #[inline(always)]
    fn decide_low(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        self.decide(word, now, n)
    }

    /// A loan on a word of 63 bits, whose next word must fit 63 bits
    /// ([`Lend`](crate::Lend)'s, at most `max_ahead` nanoseconds and one
    /// fill time of these parameters ahead): `None` for a form that does
    /// not lend.
    #[inline]
    fn lend_low(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Option<Result<(Decision, u64, u64), u64>> {
        let _ = (word, now, n, max_ahead);
        None
    }

    /// `word` (63 bits) of these parameters, at clock reading `now`, as a
    /// word of `to`'s: the conversion rule, stated on each live form.
    fn convert(&self, to: &Self, word: u64, now: u64) -> u64;
}
