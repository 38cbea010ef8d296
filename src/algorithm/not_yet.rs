//! A denial whose wait is worked out only when asked ([`NotYet`]): it holds
//! the algorithm and the word it was decided on, so it lives with the
//! algorithms, above the plain decisions.

use core::fmt;

use crate::algorithm::Algorithm;
use crate::decision::{Decision, RateLimited, RetryAfter};

/// A denial whose wait is worked out only when asked: what
/// [`RateLimiter::check`](crate::RateLimiter::check) and
/// [`KeyedLimiter::check`](crate::KeyedLimiter::check) return instead of a
/// [`Decision`], for callers that often deny without answering with a wait
/// (dropping packets, shedding load) and want the denial as cheap as possible.
///
/// [`retry_after`](Self::retry_after) is exactly the wait the same request
/// would have got from `try_acquire` at the same moment: it is computed from
/// the word the denial was decided on and the same clock reading. (On a
/// [`LiveTokenBucket`](crate::LiveTokenBucket) it is computed at the denial:
/// a later quota change may rewrite the parameters that word names.)
#[derive(Clone, Copy)]
pub struct NotYet<'a, A> {
    algorithm: &'a A,
    word: u64,
    now: u64,
    n: u32,
    /// A wait already worked out (on a cold path, or a keyed limiter's
    /// refusal of a new key).
    known: Option<RetryAfter>,
    key_limit: bool,
}

impl<'a, A: Algorithm> NotYet<'a, A> {
    #[inline(always)]
    pub(crate) fn rate(algorithm: &'a A, word: u64, now: u64, n: u32) -> Self {
        let denial = NotYet {
            algorithm,
            word,
            now,
            n,
            known: None,
            key_limit: false,
        };
        if A::DEFERRED_WAIT {
            return denial;
        }
        NotYet::known(algorithm, denial.retry_after(), false)
    }

    /// A denial whose wait is already known.
    pub(crate) const fn known(algorithm: &'a A, retry_after: RetryAfter, key_limit: bool) -> Self {
        NotYet {
            algorithm,
            word: 0,
            now: 0,
            n: 0,
            known: Some(retry_after),
            key_limit,
        }
    }

    /// The wait until the request would be admitted, if nobody else takes the
    /// permits first (for a key refused at a keyed limiter's bound, the time
    /// after which idle keys can be swept).
    pub fn retry_after(&self) -> RetryAfter {
        if let Some(retry_after) = self.known {
            return retry_after;
        }
        match self.algorithm.decide(self.word, self.now, self.n).0 {
            Decision::Denied { retry_after } => retry_after,
            // The word was decided as a denial at this reading, and deciding
            // is a function of the word and the reading alone.
            Decision::Allowed { .. } => RetryAfter::from_nanos(0),
        }
    }

    /// `true` when a keyed limiter refused a new key because it holds as many
    /// keys as it may, rather than for the key's rate.
    pub const fn is_key_limit(&self) -> bool {
        self.key_limit
    }
}

impl<A> fmt::Debug for NotYet<'_, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotYet")
            .field("word", &self.word)
            .field("now", &self.now)
            .field("n", &self.n)
            .field("known", &self.known)
            .field("key_limit", &self.key_limit)
            .finish_non_exhaustive()
    }
}

impl<A: Algorithm> From<NotYet<'_, A>> for RateLimited {
    fn from(denial: NotYet<'_, A>) -> RateLimited {
        RateLimited::new(denial.retry_after(), denial.is_key_limit())
    }
}
