//! The contract between a rate-limiting algorithm and the cell that runs it.

use core::time::Duration;

use crate::decision::Decision;

pub(crate) mod divide;
pub(crate) mod fixed_window;
pub(crate) mod form;
pub(crate) mod gcra;
pub(crate) mod live;
pub(crate) mod not_yet;
pub(crate) mod sliding_window;
pub(crate) mod switch;
pub(crate) mod token_bucket;
pub(crate) mod warm_up;
pub(crate) mod window;

/// How long after its decision's clock reading an admission can be refunded,
/// or a reservation cancelled, in nanoseconds: `2^45` µs (1.1 years). Every
/// built-in word but GCRA's keeps its time modulo a span of at least `2^47`
/// µs ([`Clock`](crate::Clock#readings-years-off)) (a warm-up's may be
/// shorter: it then declines every refund), and a refund or a cancel
/// recognizes its word by that time (or by the whole word): once the clock
/// has come round the span, a later word can look the same. A refund asked
/// this long after its admission declines instead.
pub(crate) const REFUND_HORIZON_NANOS: u64 = (1 << 45) * 1_000;

/// Whether a refund or a cancel asked at clock reading `now`, for a decision
/// made at reading `at`, is within [`REFUND_HORIZON_NANOS`]. A reading behind
/// `at` (a clock set back) is.
#[inline]
pub(crate) fn within_refund_horizon(at: u64, now: u64) -> bool {
    now.saturating_sub(at) < REFUND_HORIZON_NANOS
}

/// A rate-limiting algorithm as a pure function over one 64-bit word.
///
/// An implementation owns its parameters and nothing else: no atomics, no clock.
/// Given a word, the time and a request, it says what to answer and, when the word
/// must change, the next word. The compare-and-swap cell that runs it holds no rate
/// logic, so the concurrency argument is made once, for every algorithm.
///
/// Times are the clock's nanoseconds ([`Clock::now`](crate::Clock::now)); a time
/// may be *behind* one the word has already seen, and must then never create
/// permits (within half the span of the word's time field, as
/// [`Clock`](crate::Clock#readings-years-off) says; for a [`WarmUp`](crate::WarmUp)
/// of a nonzero warm-up, within its stretch behind, the larger of its cold fill
/// time plus warm-up period and `2^32` time units, 71.6 minutes at 1 µs: a time
/// further behind is taken as one after a long idle, and finds the bucket fresh).
pub trait Algorithm {
    /// The word of a bucket that has never been used.
    fn fresh(&self) -> u64;

    /// The most permits one request can ever get.
    fn capacity(&self) -> u32;

    /// Decide a request for `n` permits at `now` against `word`.
    ///
    /// Returns the decision and, when the word must change, the next word. A denial
    /// must return `None`: it changes nothing, so it writes nothing. The cell checks
    /// `1 <= n <= capacity()` before calling; outside that range an implementation
    /// must still not panic.
    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>);

    /// [`decide`](Self::decide), where a denial's wait is not needed: the
    /// same admission and next word, and a denial whose `retry_after` may be
    /// anything (the caller works the wait out again with `decide` if asked,
    /// as [`NotYet`](crate::NotYet) does). The default decides in full; an
    /// algorithm whose wait is costly to find and kept out of line, where the
    /// compiler cannot drop it unused, skips it.
    #[doc(hidden)]
    #[inline(always)]
    fn decide_untimed(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        self.decide(word, now, n)
    }

    /// The permits a request could get at `now`, without taking any.
    fn remaining(&self, word: u64, now: u64) -> u32;

    /// Give back `n` permits that an earlier admission took: the inverse of its
    /// spend, as one more transition on the word. A [chain](crate::chain) calls
    /// it when a later stage denies, and [`Admission::refund`](crate::Admission::refund)
    /// when the caller gives an admission back.
    ///
    /// `written` is the word that admission wrote and `word` the current word,
    /// which other decisions may have changed since. Returns the next word, or `None` when nothing is owed any
    /// more (the permits were counted in a window that has passed) or when the
    /// algorithm cannot be sure what is owed (a refill or a drain since may
    /// already have returned them). The result must never admit more than if
    /// the admission had not happened: when in doubt, keep the permits spent.
    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64>;

    /// Whether `word` now behaves exactly like [`fresh`](Algorithm::fresh): every
    /// future decision would be the same. Such a word can be dropped and recreated
    /// later without losing anything.
    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool;

    /// The longest a word can take, with no requests, to become fresh-equivalent
    /// (for a token bucket, the time to refill from empty). A keyed limiter that
    /// is full tells a new key to retry after this long: by then every bucket left
    /// idle can be swept.
    fn fresh_after_idle(&self) -> Duration;

    /// The longest a word decided at a reading up to `now` can take from
    /// `now`, with no requests, to become fresh-equivalent: at most
    /// [`fresh_after_idle`](Self::fresh_after_idle), which it is by
    /// default. A window knows sooner: its words are fresh once the window
    /// of `now` (a sliding window: the one after it) has ended. A keyed
    /// limiter at its key bound tells a new key to retry after this.
    #[doc(hidden)]
    fn fresh_by(&self, now: u64) -> Duration {
        let _ = now;
        self.fresh_after_idle()
    }

    /// What the `RateLimit-Policy` header field may promise for this
    /// algorithm: `(q, w)`, the permits a client may send at once and the time
    /// after which it may always do so again, or `None` when nothing can be
    /// promised (the default, for an algorithm of your own). The crate's
    /// algorithms advertise their capacity over the shortest window after
    /// which that burst is certain to be available again (see
    /// [`AdvertisedQuota`](crate::AdvertisedQuota) for each rule).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, FixedWindow};
    ///
    /// let window = FixedWindow::new(50, Duration::from_secs(60))?;
    /// assert_eq!(window.advertise(), Some((50, Duration::from_secs(60))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn advertise(&self) -> Option<(u32, Duration)> {
        None
    }

    /// How many times the parameters have changed (a live bucket's quota
    /// changes); 0 for parameters that never change. An admission that may be
    /// refunded notes it before it decides.
    #[doc(hidden)]
    fn epoch(&self) -> u64 {
        0
    }

    /// Run `refund` with changes of the parameters held off, if none has
    /// happened since [`epoch`](Self::epoch) returned `epoch`; `false`
    /// without running it otherwise. A refund's test of the word against the
    /// one its admission wrote proves nothing across changes: two can convert
    /// a word away and back to the same generation.
    #[doc(hidden)]
    fn refund_unless_changed(&self, _epoch: u64, refund: &mut dyn FnMut() -> bool) -> bool {
        refund()
    }

    /// Take `n` permits from `word` at `now` even where they are not there
    /// yet, as a loan the next decisions wait behind (a reservation's word):
    /// the word after it and how far ahead of `now` it reaches (nanoseconds),
    /// or `None` when this algorithm does not lend (the token buckets and
    /// GCRA do) or the loan would reach past one fill time. For bytes a shaped
    /// reader delivered before it could pay them.
    #[doc(hidden)]
    fn owe(&self, word: u64, now: u64, n: u32) -> Option<(u64, u64)> {
        let _ = (word, now, n);
        None
    }

    /// Whether a denial's wait may be worked out later, from the word and the
    /// reading it was decided on ([`NotYet`](crate::NotYet)): true unless the
    /// parameters a word names can be rewritten meanwhile (a live bucket's).
    #[doc(hidden)]
    const DEFERRED_WAIT: bool = true;

    /// Whether a denial must be checked against the word once more before it
    /// stands: true for an algorithm that reads, after the word, parameters
    /// a change can rewrite (the live forms of GCRA and the windows), where
    /// only the word unchanged proves they were the word's.
    #[doc(hidden)]
    const RECHECK_DENIAL: bool = false;
}
