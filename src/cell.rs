//! The one compare-and-swap loop that runs every algorithm.

use core::fmt;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::sync::{AtomicU64, Ordering};

/// One limiter's whole state: a 64-bit word, changed only by compare-and-swap.
///
/// # Orderings
///
/// Every access is `Relaxed`. The word publishes no other data: a thread that reads
/// it learns nothing about any other memory location, and no other memory is
/// written on the strength of what it holds. What must hold is that no two
/// decisions spend the same tokens, and that is a property of the word's single
/// modification order: a compare-and-swap succeeds only against the value it
/// decided on, whatever the ordering. loom checks this (`loom-tests/`).
pub(crate) struct Cell {
    word: AtomicU64,
}

impl Cell {
    pub(crate) fn new(word: u64) -> Cell {
        Cell {
            word: AtomicU64::new(word),
        }
    }

    /// Set the word of a cell that no other thread can reach yet (a keyed
    /// key's slot before its control byte publishes it).
    #[cfg(feature = "std")]
    pub(crate) fn set(&self, word: u64) {
        // Relaxed: the slot is published by a Release store of its control byte,
        // after this.
        self.word.store(word, Ordering::Relaxed);
    }

    /// The current word.
    #[inline]
    pub(crate) fn load(&self) -> u64 {
        // Relaxed: see the type's documentation; a peek needs only some value of
        // the modification order.
        self.word.load(Ordering::Relaxed)
    }

    /// Run one decision of `algorithm` at `now` for `n` permits.
    ///
    /// `1 <= n <= algorithm.capacity()` is the caller's to check.
    ///
    /// Not `self.take(..).0`: returning the written word too kept the pair on the
    /// stack, and reading the decision back across two smaller stores cost a
    /// failed store forward, 3 ns on every denial.
    #[inline(always)]
    pub(crate) fn apply<A: Algorithm>(&self, algorithm: &A, now: u64, n: u32) -> Decision {
        // Relaxed: see the type's documentation.
        let current = self.word.load(Ordering::Relaxed);
        let (decision, next) = algorithm.decide(current, now, n);
        let Some(next) = next else {
            // A denial changes nothing, so it writes nothing.
            if A::RECHECK_DENIAL
                && let Some(actual) = self.moved(current)
            {
                return self.apply_contended(algorithm, now, n, actual).0;
            }
            return decision;
        };
        // Relaxed on success and failure: the word publishes nothing else; the
        // failure value is only the input to the next attempt.
        match self
            .word
            .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => decision,
            Err(actual) => self.apply_contended(algorithm, now, n, actual).0,
        }
    }

    /// As [`apply`](Self::apply), also returning the word an admission wrote
    /// (what [`refund`](Self::refund) needs to give the permits back).
    #[inline(always)]
    pub(crate) fn take<A: Algorithm>(
        &self,
        algorithm: &A,
        now: u64,
        n: u32,
    ) -> (Decision, Option<u64>) {
        // Relaxed: see the type's documentation.
        let current = self.word.load(Ordering::Relaxed);
        let (decision, next) = algorithm.decide(current, now, n);
        let Some(next) = next else {
            // A denial changes nothing, so it writes nothing.
            if A::RECHECK_DENIAL
                && let Some(actual) = self.moved(current)
            {
                return self.apply_contended(algorithm, now, n, actual);
            }
            return (decision, None);
        };
        // Relaxed on success and failure: the word publishes nothing else; the
        // failure value is only the input to the next attempt.
        match self
            .word
            .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => (decision, Some(next)),
            Err(actual) => self.apply_contended(algorithm, now, n, actual),
        }
    }

    /// As [`apply`](Self::apply), but a denial returns the word it was decided
    /// on instead of the wait: the caller computes the wait only if it needs
    /// it (the algorithm's wait arithmetic is inlined here and, unused, dropped).
    #[inline(always)]
    pub(crate) fn admit<A: Algorithm>(&self, algorithm: &A, now: u64, n: u32) -> Result<u32, u64> {
        // Relaxed: see the type's documentation.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            // The denial's wait is left to the caller: `decide_untimed`.
            let (decision, next) = algorithm.decide_untimed(current, now, n);
            let (Decision::Allowed { remaining }, Some(next)) = (decision, next) else {
                if A::RECHECK_DENIAL
                    && let Some(actual) = self.moved(current)
                {
                    current = actual;
                    continue;
                }
                return match decision {
                    Decision::Allowed { remaining } => Ok(remaining),
                    Decision::Denied { .. } => Err(current),
                };
            };
            // Relaxed on success and failure: as in `apply`.
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(remaining),
                Err(actual) => current = actual,
            }
        }
    }

    /// Replace the word by `next(word)` unless it returns `None`; returns the
    /// word replaced and the word written, or `None` with the word left as
    /// it was. One compare-and-swap loop, as every transition of the word.
    #[cfg(feature = "std")]
    pub(crate) fn transform(&self, mut next: impl FnMut(u64) -> Option<u64>) -> Option<(u64, u64)> {
        // Relaxed: see the type's documentation.
        let mut current = self.word.load(Ordering::Relaxed);
        while let Some(written) = next(current) {
            // Relaxed on success and failure: as in `apply`.
            match self.word.compare_exchange_weak(
                current,
                written,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some((current, written)),
                Err(actual) => {
                    current = actual;
                    crate::sync::lost_race();
                }
            }
        }
        None
    }

    /// Give back `n` permits taken by an admission that wrote `written`: the
    /// algorithm's refund, in the same compare-and-swap loop. `true` when the
    /// word took the refund; `false` when the algorithm declined it (nothing
    /// owed any more, or not known exactly), leaving the word as it was.
    pub(crate) fn refund<A: Algorithm>(&self, algorithm: &A, written: u64, n: u32) -> bool {
        // Relaxed: see the type's documentation; a refund is one more transition
        // of the same word.
        let mut current = self.word.load(Ordering::Relaxed);
        while let Some(next) = algorithm.refund(current, written, n) {
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => {
                    current = actual;
                    crate::sync::lost_race();
                }
            }
        }
        false
    }

    /// Replace the word by `convert(word)` until it returns `None` (a change of
    /// quota: [`LiveTokenBucket`](crate::LiveTokenBucket)).
    pub(crate) fn convert(&self, convert: impl Fn(u64) -> Option<u64>) {
        // Relaxed: the input to the first attempt.
        let mut current = self.word.load(Ordering::Relaxed);
        while let Some(next) = convert(current) {
            // Release on success: a decision that reads the converted word
            // fences (Acquire) before it reads the parameters the word names,
            // so it sees the ones the change stored before this. Relaxed on
            // failure: the value is only the input to the next attempt.
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => {
                    current = actual;
                    crate::sync::lost_race();
                }
            }
        }
    }

    /// The word, if it is no longer `decided` (an algorithm whose denial
    /// must be checked against the word: [`Algorithm::RECHECK_DENIAL`]).
    ///
    /// A live form reads the parameters its word names after loading the
    /// word; a denial writes nothing, so no compare-and-swap proves the word
    /// was still of those parameters' quota. If the parameter slot the
    /// denial read had been rewritten by a change (the change after next),
    /// the conversion of this word by the change before it happened before
    /// that rewrite, whose sequence number the denial read with Acquire: so
    /// this load, after it, sees that conversion or a later word, never
    /// `decided` again (unless conversions brought back the very bits, a
    /// word of the slot's generation, which the denial then rightly decided).
    #[inline(always)]
    fn moved(&self, decided: u64) -> Option<u64> {
        // Relaxed: ordered after the slot's Acquire reads by program order
        // and the happens-before they establish (see above).
        let now = self.word.load(Ordering::Relaxed);
        (now != decided).then_some(now)
    }

    /// The retry loop, out of line: another thread changed the word between our
    /// load and our compare-and-swap.
    ///
    /// `now` is not read again. Deciding with a reading older than the word's is
    /// safe (the algorithm treats it as behind the stored time and creates no
    /// permits), and it keeps the loop free of clock reads. A reading still
    /// ahead of the word's is a decision at that reading, as a thread delayed
    /// between its clock read and its decision makes anyway: an algorithm's
    /// bound holds over the readings its decisions were made at.
    #[cold]
    #[inline(never)]
    fn apply_contended<A: Algorithm>(
        &self,
        algorithm: &A,
        now: u64,
        n: u32,
        mut current: u64,
    ) -> (Decision, Option<u64>) {
        loop {
            let (decision, next) = algorithm.decide(current, now, n);
            let Some(next) = next else {
                if A::RECHECK_DENIAL
                    && let Some(actual) = self.moved(current)
                {
                    current = actual;
                    crate::sync::lost_race();
                    continue;
                }
                return (decision, None);
            };
            // Relaxed: as in `apply`.
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return (decision, Some(next)),
                Err(actual) => {
                    current = actual;
                    crate::sync::lost_race();
                }
            }
        }
    }
}

impl fmt::Debug for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cell({:#018x})", self.load())
    }
}
