//! What the keyed map of leased mode runs on: the lease word as its
//! algorithm ([`LeaseWord`]), [`Link`], which links a key without changing
//! its word, and the clock the words count in ([`Since`]).

use core::time::Duration;

use super::word;
use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::decision::{Decision, RetryAfter};

/// The lease word as an algorithm for the keyed map: spend from a valid lease,
/// and say "ask Redis" (a denial with no wait) otherwise.
#[derive(Clone, Copy, Debug)]
pub(super) struct LeaseWord {
    pub(super) capacity: u32,
    pub(super) lifetime: Duration,
}

impl LeaseWord {
    /// The tokens of `word` spendable at `now` (ns): none past the lease's
    /// expiry or during a denial.
    pub(super) fn usable(word: u64, now: u64) -> u32 {
        if word & word::DENIED == 0 && word::units_down(now) < word::time(word) {
            word::tokens(word)
        } else {
            0
        }
    }

    /// The wait left of a denial kept in `word`, if one is running at `now`.
    pub(super) fn denial(word: u64, now: u64) -> Option<RetryAfter> {
        let until = word::nanos(word::time(word));
        (word & word::DENIED != 0 && now < until).then(|| RetryAfter::from_nanos(until - now))
    }

    /// The wait left of a denial kept in `word` that answers a request for
    /// `n` permits: Redis' wait was for the tokens kept in the word's token
    /// field (what that request needed), which is when `n` are there too if
    /// `n` is no more. A larger request is not answered by it.
    fn denial_for(word: u64, now: u64, n: u32) -> Option<RetryAfter> {
        Self::denial(word, now).filter(|_| n <= word::tokens(word))
    }
}

impl Algorithm for LeaseWord {
    fn fresh(&self) -> u64 {
        0
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    #[inline]
    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        let tokens = Self::usable(word, now);
        if n <= tokens {
            let remaining = tokens - n;
            return (
                Decision::Allowed { remaining },
                Some(word::with_tokens(word, remaining)),
            );
        }
        // A denial Redis gave, kept, for as many permits or more; or a wait
        // of 0: not decided here.
        let retry_after = Self::denial_for(word, now, n).unwrap_or(RetryAfter::from_nanos(0));
        (Decision::Denied { retry_after }, None)
    }

    fn remaining(&self, word: u64, now: u64) -> u32 {
        Self::usable(word, now)
    }

    fn refund(&self, _word: u64, _written: u64, _n: u32) -> Option<u64> {
        None
    }

    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        // Expired tokens are worth nothing; a fetch in flight or a running
        // denial must stay.
        word & word::FETCHING == 0
            && Self::usable(word, now) == 0
            && Self::denial(word, now).is_none()
    }

    fn fresh_after_idle(&self) -> Duration {
        self.lifetime
    }
}

/// Links a key into the map without changing its word (a miss on a new key
/// writes nothing by itself).
#[derive(Clone, Copy, Debug)]
pub(super) struct Link;

impl Algorithm for Link {
    fn fresh(&self) -> u64 {
        0
    }

    fn capacity(&self) -> u32 {
        u32::MAX
    }

    fn decide(&self, word: u64, _now: u64, _n: u32) -> (Decision, Option<u64>) {
        (Decision::Allowed { remaining: 0 }, Some(word))
    }

    fn remaining(&self, _word: u64, _now: u64) -> u32 {
        0
    }

    fn refund(&self, _word: u64, _written: u64, _n: u32) -> Option<u64> {
        None
    }

    fn is_fresh_equivalent(&self, word: u64, _now: u64) -> bool {
        word == 0
    }

    fn fresh_after_idle(&self) -> Duration {
        Duration::ZERO
    }
}

/// A clock's readings since `start`: what the lease words count in.
#[derive(Clone, Debug)]
pub(super) struct Since<C> {
    pub(super) clock: C,
    pub(super) start: u64,
}

impl<C: Clock> Clock for Since<C> {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.now().saturating_sub(self.start)
    }

    fn skip(&self, duration: Duration) -> bool {
        self.clock.skip(duration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_spent_while_valid_and_never_after() {
        let algorithm = LeaseWord {
            capacity: 10,
            lifetime: Duration::from_secs(1),
        };
        let expiry = word::units_down(1_000_000_000);
        let w = word::pack(3, 2, expiry, 0);
        assert_eq!(
            algorithm.decide(w, 0, 2),
            (
                Decision::Allowed { remaining: 1 },
                Some(word::pack(1, 2, expiry, 0))
            )
        );
        // Too few: not decided here (a wait of 0), nothing written.
        let (d, next) = algorithm.decide(w, 0, 4);
        assert_eq!(d.retry_after().map(|r| r.as_nanos()), Some(0));
        assert!(next.is_none());
        // Expired: nothing spendable, and the word is as good as fresh.
        let late = word::nanos(expiry);
        assert_eq!(algorithm.remaining(w, late), 0);
        assert!(algorithm.is_fresh_equivalent(w, late));
        assert!(!algorithm.is_fresh_equivalent(w | word::FETCHING, late));
        // A denial kept, its wait for two tokens: its wait for requests of
        // up to two, until it ends; a larger request is not decided here.
        let denied = word::pack(2, 0, expiry, word::DENIED);
        for n in [1, 2] {
            let (d, _) = algorithm.decide(denied, 0, n);
            assert_eq!(
                d.retry_after().map(|r| r.as_nanos()),
                Some(word::nanos(expiry))
            );
        }
        let (d, next) = algorithm.decide(denied, 0, 3);
        assert_eq!(d.retry_after().map(|r| r.as_nanos()), Some(0));
        assert!(next.is_none());
        assert!(!algorithm.is_fresh_equivalent(denied, 0));
        assert!(algorithm.is_fresh_equivalent(denied, late));
    }
}
