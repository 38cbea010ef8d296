//! Live forms of GCRA and of the two windows: [`LiveGcra`],
//! [`LiveFixedWindow`] and [`LiveSlidingWindow`], one mechanism for the
//! three ([`Live`]), and the trait every live form gives the limiters'
//! `set_quota` ([`Reconfigure`]).

use core::fmt;
use core::marker::PhantomData;
use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::form::{Form, GENERATION, Raw};
use crate::algorithm::gcra::Gcra;
use crate::algorithm::sliding_window::SlidingWindow;
use crate::decision::Decision;
use crate::error::QuotaError;
use crate::quota::Quota;
use crate::sync::{AtomicU64, Ordering, WriterGuard, WriterLock, fence};

/// The rule of a change under way, as the limiters' walk over their words
/// gets it: a word at a clock reading, as a word of the new quota, or `None`
/// for a word already converted.
pub(crate) type Rule<'a> = &'a dyn Fn(u64, u64) -> Option<u64>;

/// One quota's parameters, read as a whole under a sequence number (a
/// sequence lock); aligned to a cache line, which it fills.
#[repr(align(64))]
struct Slot {
    /// Even while the slot is stable, odd while a change writes it.
    seq: AtomicU64,
    raw: [AtomicU64; 7],
}

impl Slot {
    fn new(raw: Raw) -> Slot {
        Slot {
            seq: AtomicU64::new(0),
            raw: raw.map(AtomicU64::new),
        }
    }
}

/// The mechanism of the live forms: two parameter slots, and a generation
/// bit in each word naming the one it belongs to. See [`LiveGcra`] for the
/// protocol.
pub(crate) struct Live<F: Form> {
    ceiling: u32,
    slots: [Slot; 2],
    /// How many changes have been made. Its low bit is the parity of the
    /// words a new key gets; written only under `writer`.
    generation: AtomicU64,
    /// Held by a change from writing its slot until every word is converted.
    writer: WriterLock,
    form: PhantomData<F>,
}

impl<F: Form> Live<F> {
    fn new(quota: F::Quota, ceiling: u32) -> Result<Live<F>, QuotaError> {
        Ok(Live::from_form(F::build(quota, ceiling)?, ceiling))
    }

    fn from_form(form: F, ceiling: u32) -> Live<F> {
        Live {
            ceiling,
            slots: [Slot::new(form.to_raw()), Slot::new(form.to_raw())],
            generation: AtomicU64::new(0),
            writer: WriterLock::new(),
            form: PhantomData,
        }
    }

    fn changes(&self) -> u64 {
        // Relaxed: a count; nothing is read on the strength of it.
        self.generation.load(Ordering::Relaxed)
    }

    /// The parameters of the current generation.
    fn current(&self) -> F {
        // Acquire: pairs with the Release store in `begin`, so the slot read
        // next holds the generation's quota, not the one before it.
        let generation = self.generation.load(Ordering::Acquire);
        self.params::<0>((generation & 1) as usize)
    }

    /// The parameters in slot `parity` (or `P`, when `parity` is not 0 or
    /// 1: the decisions name their slot as a constant), read whole: the
    /// sequence number, then the words, then the number again, until it is
    /// even and unchanged.
    ///
    /// A slot is written only by a change, while no word of its parity
    /// remains (every word has been converted to the other). So a decision
    /// finds its slot mid-write only if its word is already stale, and then
    /// its compare-and-swap fails anyway; it waits here for the few stores of
    /// that write, and no decision on a current word ever does.
    #[inline(always)]
    fn params<const P: usize>(&self, parity: usize) -> F {
        let slot = if parity <= 1 {
            &self.slots[parity]
        } else {
            &self.slots[P & 1]
        };
        loop {
            // Acquire: the word loads below stay after this one.
            let seq = slot.seq.load(Ordering::Acquire);
            // Relaxed: a word read during a write is caught by the check
            // below, and the result discarded.
            let raw = [
                slot.raw[0].load(Ordering::Relaxed),
                slot.raw[1].load(Ordering::Relaxed),
                slot.raw[2].load(Ordering::Relaxed),
                slot.raw[3].load(Ordering::Relaxed),
                slot.raw[4].load(Ordering::Relaxed),
                slot.raw[5].load(Ordering::Relaxed),
                slot.raw[6].load(Ordering::Relaxed),
            ];
            // Acquire fence: the word loads above stay before the sequence
            // load after it. If a word load read a change's store, the
            // change's odd number (stored, then a Release fence, then the
            // words) is visible to that load.
            fence(Ordering::Acquire);
            // Relaxed: ordered by the fence above.
            let again = slot.seq.load(Ordering::Relaxed);
            if again == seq && seq & 1 == 0 {
                return F::from_raw(&raw);
            }
            crate::sync::lost_race();
        }
    }

    /// The parameters `word`'s generation bit names, after a fence that
    /// makes them as fresh as the word.
    #[inline(always)]
    fn params_of(&self, word: u64) -> F {
        // Acquire fence (no instruction on x86-64): the cell read `word` with
        // a Relaxed load; if a conversion's Release compare-and-swap wrote
        // it, this fence makes the new quota's slot, written before that,
        // visible.
        fence(Ordering::Acquire);
        self.params::<0>((word >> 63) as usize)
    }

    /// [`decide`](Algorithm::decide) for a word of generation parity `P`:
    /// one copy per slot, so that the slot's address is a constant.
    #[inline(always)]
    fn decide_in<const P: usize>(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        // Acquire fence: as in `params_of`.
        fence(Ordering::Acquire);
        let params = self.params::<P>(usize::MAX);
        let (decision, next) = params.decide_low(word & !GENERATION, now, n);
        (decision, next.map(|next| next | (word & GENERATION)))
    }

    /// Start a change to `quota`: hold the writer's lock, write the slot not
    /// in force, and move the generation on, so that a key created from now
    /// on starts in the new quota. The caller converts every word with the
    /// returned [`Change`] while it lives.
    fn begin(&self, quota: F::Quota) -> Result<Change<'_, F>, QuotaError> {
        let guard = self.writer.lock();
        let new = F::build(quota, self.ceiling)?;
        // Relaxed: only changes store it, and they hold `writer`.
        let generation = self.generation.load(Ordering::Relaxed);
        let old = self.params::<0>((generation & 1) as usize);
        let next = generation + 1;
        self.write((next & 1) as usize, &new.to_raw());
        // Release: a new key's word, made after an Acquire load of this, is
        // decided on the slot written above.
        self.generation.store(next, Ordering::Release);
        Ok(Change {
            old,
            new,
            to: (next & 1) << 63,
            _writer: guard,
        })
    }

    /// Write `raw` into slot `parity` (the writer's lock held).
    fn write(&self, parity: usize, raw: &Raw) {
        let slot = &self.slots[parity & 1];
        // Relaxed: only writers store the sequence, under the lock.
        let seq = slot.seq.load(Ordering::Relaxed);
        // Relaxed, then a Release fence: the odd number is ordered before
        // each word's store, so a reader that sees any new word sees the odd
        // number (or a later one) when it reads the sequence again (after an
        // Acquire fence, in `params`).
        slot.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (field, value) in slot.raw.iter().zip(raw) {
            // Relaxed: ordered by the fence above and the Release store below.
            field.store(*value, Ordering::Relaxed);
        }
        // Release: a reader that sees the even number sees every word above.
        slot.seq.store(seq + 2, Ordering::Release);
    }

    /// A loan ([`Lend`](crate::Lend)) decided on the parameters `word`'s
    /// generation bit names; `None` for a form that does not lend. Written
    /// by a compare-and-swap, which proves the word unchanged, as an
    /// admission's is.
    fn lend(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Option<Result<(Decision, u64, u64), u64>> {
        let generation = word & GENERATION;
        self.params_of(word)
            .lend_low(word & !GENERATION, now, n, max_ahead)
            .map(|lent| lent.map(|(decision, next, wait)| (decision, next | generation, wait)))
    }

    fn unless_changed<R>(&self, since: u64, f: impl FnOnce() -> R) -> Option<R> {
        let _writer = self.writer.lock();
        // Relaxed: only changes store it, under `writer`, which this holds.
        (self.generation.load(Ordering::Relaxed) == since).then(f)
    }
}

impl<F: Form> Algorithm for Live<F> {
    #[inline]
    fn fresh(&self) -> u64 {
        // Acquire: as in `current`.
        let generation = self.generation.load(Ordering::Acquire);
        let params = self.params::<0>((generation & 1) as usize);
        ((generation & 1) << 63) | params.fresh()
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.current().capacity()
    }

    #[inline(always)]
    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        // The generation bit tested in place; each branch reads its slot at a
        // fixed address (predictable: the bit changes only with a change).
        if word & GENERATION == 0 {
            self.decide_in::<0>(word, now, n)
        } else {
            self.decide_in::<1>(word, now, n)
        }
    }

    #[inline]
    fn remaining(&self, word: u64, now: u64) -> u32 {
        self.params_of(word).remaining(word & !GENERATION, now)
    }

    #[inline]
    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
        if (word ^ written) & GENERATION != 0 {
            // The quota changed since: the conversion settled the word with
            // the permits spent. (Two changes bring the bit back; a refund
            // runs only through `refund_unless_changed`, which declines after
            // any change.)
            return None;
        }
        self.params_of(word)
            .refund(word & !GENERATION, written & !GENERATION, n)
            .map(|next| next | (word & GENERATION))
    }

    #[inline]
    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        self.params_of(word)
            .is_fresh_equivalent(word & !GENERATION, now)
    }

    fn fresh_after_idle(&self) -> Duration {
        // Either slot's words may still be held while a change runs.
        let a = self.params::<0>(0).fresh_after_idle();
        let b = self.params::<0>(1).fresh_after_idle();
        a.max(b)
    }

    fn fresh_by(&self, now: u64) -> Duration {
        // As `fresh_after_idle`: either slot's words.
        let a = self.params::<0>(0).fresh_by(now);
        let b = self.params::<0>(1).fresh_by(now);
        a.max(b)
    }

    fn advertise(&self) -> Option<(u32, Duration)> {
        self.current().advertise()
    }

    fn owe(&self, word: u64, now: u64, n: u32) -> Option<(u64, u64)> {
        // One fill time ahead at most: `lend_low`'s own bound.
        self.lend(word, now, n, u64::MAX)?
            .ok()
            .map(|(_, next, wait)| (next, wait))
    }

    fn epoch(&self) -> u64 {
        self.changes()
    }

    fn refund_unless_changed(&self, epoch: u64, refund: &mut dyn FnMut() -> bool) -> bool {
        self.unless_changed(epoch, refund).unwrap_or(false)
    }

    // A change rewrites the slot of the parity it leaves behind, which a word
    // decided on before two changes still names: its wait must be worked out
    // at the denial.
    const DEFERRED_WAIT: bool = false;

    // A denial writes nothing: the cell checks the word is still the one
    // decided on, or the parameters read may be a later quota's.
    const RECHECK_DENIAL: bool = true;
}

/// A change of quota under way: the writer's lock, and the rule that turns a
/// word of the old quota into one of the new.
pub(crate) struct Change<'a, F: Form> {
    old: F,
    new: F,
    /// The generation bit of converted words.
    to: u64,
    _writer: WriterGuard<'a>,
}

impl<F: Form> Change<'_, F> {
    /// `word` converted at clock reading `now`, or `None` if it already
    /// belongs to the new quota.
    fn convert(&self, word: u64, now: u64) -> Option<u64> {
        if word & GENERATION == self.to {
            return None;
        }
        let low = self.old.convert(&self.new, word & !GENERATION, now);
        Some(self.to | (low & !GENERATION))
    }
}

mod sealed {
    /// Only the crate's live forms reconfigure.
    pub trait Sealed {}
}

/// An algorithm whose quota can be changed while it serves: the live forms,
/// [`LiveTokenBucket`](crate::LiveTokenBucket), [`LiveGcra`],
/// [`LiveFixedWindow`] and [`LiveSlidingWindow`]. It gives
/// [`RateLimiter::set_quota`](crate::RateLimiter::set_quota),
/// [`KeyedLimiter::set_quota`](crate::KeyedLimiter::set_quota) and
/// [`Tiered::set_quota`](crate::Tiered::set_quota). Sealed.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{FixedWindow, LiveFixedWindow, ManualClock, RateLimiter, Reconfigure};
///
/// let window = LiveFixedWindow::new(FixedWindow::new(10, Duration::from_secs(1))?)?;
/// let limiter = RateLimiter::from_parts(window, ManualClock::new());
/// limiter.set_quota(FixedWindow::new(4, Duration::from_secs(1))?)?;
/// assert_eq!(limiter.algorithm().quota().limit(), 4);
/// assert_eq!(limiter.algorithm().changes(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Reconfigure: Algorithm + sealed::Sealed {
    /// What a change is given: a [`Quota`] for the token bucket and GCRA, a
    /// [`FixedWindow`] or [`SlidingWindow`] (its limit and window) for the
    /// windows.
    type Quota: Copy + PartialEq + fmt::Debug + Send + Sync + 'static;

    /// The quota in force.
    fn quota(&self) -> Self::Quota;

    /// How many times the quota has been changed.
    fn changes(&self) -> u64;

    /// Start a change to `quota` and hand `walk` its rule, to convert every
    /// word with; the change ends when `walk` returns. (The limiters'
    /// `set_quota`; not for callers.)
    #[doc(hidden)]
    fn reconfigure(
        &self,
        quota: Self::Quota,
        walk: &mut dyn FnMut(Rule<'_>),
    ) -> Result<(), QuotaError>;
}

impl sealed::Sealed for crate::LiveTokenBucket {}

impl Reconfigure for crate::LiveTokenBucket {
    type Quota = Quota;

    fn quota(&self) -> Quota {
        crate::LiveTokenBucket::quota(self)
    }

    fn changes(&self) -> u64 {
        crate::LiveTokenBucket::changes(self)
    }

    fn reconfigure(&self, quota: Quota, walk: &mut dyn FnMut(Rule<'_>)) -> Result<(), QuotaError> {
        let change = self.begin(quota)?;
        walk(&|word, now| change.convert(word, now));
        Ok(())
    }
}

/// The largest limit a live window's word is laid out for by default.
const DEFAULT_CEILING: u32 = 65_535;

macro_rules! live_form {
    ($(#[$doc:meta])* $name:ident, $form:ty, $quota:ty, $new:literal, $next:literal) => {
        $(#[$doc])*
        pub struct $name(Live<$form>);

        impl $name {
            /// How many times the quota has been changed.
            ///
            /// ```
            /// # use std::time::Duration;
            /// # use turnstile::*;
            #[doc = concat!("let live = ", $new, ";")]
            /// let limiter = RateLimiter::from_parts(live, ManualClock::new());
            /// assert_eq!(limiter.algorithm().changes(), 0);
            #[doc = concat!("limiter.set_quota(", $next, ")?;")]
            /// assert_eq!(limiter.algorithm().changes(), 1);
            /// # Ok::<(), Box<dyn std::error::Error>>(())
            /// ```
            pub fn changes(&self) -> u64 {
                self.0.changes()
            }

            /// The quota in force.
            ///
            /// ```
            /// # use std::time::Duration;
            /// # use turnstile::*;
            #[doc = concat!("let live = ", $new, ";")]
            /// let limiter = RateLimiter::from_parts(live, ManualClock::new());
            #[doc = concat!("limiter.set_quota(", $next, ")?;")]
            #[doc = concat!("assert_eq!(limiter.algorithm().quota(), ", $next, ");")]
            /// # Ok::<(), Box<dyn std::error::Error>>(())
            /// ```
            pub fn quota(&self) -> $quota {
                self.0.current().quota()
            }
        }

        impl sealed::Sealed for $name {}

        impl Reconfigure for $name {
            type Quota = $quota;

            fn quota(&self) -> $quota {
                $name::quota(self)
            }

            fn changes(&self) -> u64 {
                self.0.changes()
            }

            fn reconfigure(
                &self,
                quota: $quota,
                walk: &mut dyn FnMut(Rule<'_>),
            ) -> Result<(), QuotaError> {
                let change = self.0.begin(quota)?;
                walk(&|word, now| change.convert(word, now));
                Ok(())
            }
        }

        impl Algorithm for $name {
            #[inline]
            fn fresh(&self) -> u64 {
                self.0.fresh()
            }
            #[inline]
            fn capacity(&self) -> u32 {
                self.0.capacity()
            }
            #[inline(always)]
            fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
                self.0.decide(word, now, n)
            }
            #[inline]
            fn remaining(&self, word: u64, now: u64) -> u32 {
                self.0.remaining(word, now)
            }
            #[inline]
            fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
                self.0.refund(word, written, n)
            }
            #[inline]
            fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
                self.0.is_fresh_equivalent(word, now)
            }
            fn fresh_after_idle(&self) -> Duration {
                self.0.fresh_after_idle()
            }
            fn fresh_by(&self, now: u64) -> Duration {
                self.0.fresh_by(now)
            }
            fn advertise(&self) -> Option<(u32, Duration)> {
                self.0.advertise()
            }
            fn owe(&self, word: u64, now: u64, n: u32) -> Option<(u64, u64)> {
                self.0.owe(word, now, n)
            }
            fn epoch(&self) -> u64 {
                self.0.epoch()
            }
            fn refund_unless_changed(&self, epoch: u64, refund: &mut dyn FnMut() -> bool) -> bool {
                self.0.refund_unless_changed(epoch, refund)
            }
            const DEFERRED_WAIT: bool = false;
            const RECHECK_DENIAL: bool = true;
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("quota", &self.quota())
                    .field("ceiling", &self.0.ceiling)
                    .field("changes", &self.changes())
                    .finish()
            }
        }
    };
}

live_form!(
    /// The [`Gcra`] meter, with a quota that can be changed from any thread
    /// while decisions run ([`RateLimiter::set_quota`],
    /// [`KeyedLimiter::set_quota`], [`Tiered::set_quota`]). Any quota: the
    /// word holds a time, whatever the capacity.
    ///
    /// [`RateLimiter::set_quota`]: crate::RateLimiter::set_quota
    /// [`KeyedLimiter::set_quota`]: crate::KeyedLimiter::set_quota
    /// [`Tiered::set_quota`]: crate::Tiered::set_quota
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Decision, LiveGcra, ManualClock, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// // Burst 10, one permit back every 100 ms.
    /// let meter = LiveGcra::new(Quota::new(10, 1, Duration::from_millis(100))?);
    /// let limiter = RateLimiter::from_parts(meter, clock.clone());
    /// assert!(limiter.try_acquire_n(6)?.is_allowed()); // 4 left
    ///
    /// // Lowered: the meter keeps what it has, up to the new burst.
    /// limiter.set_quota(Quota::new(3, 1, Duration::from_millis(100))?)?;
    /// assert_eq!(limiter.remaining(), 3);
    ///
    /// // Raised: a meter that is not full keeps its permits; the new rate
    /// // brings the next one a whole new interval after the change.
    /// assert!(limiter.try_acquire_n(2)?.is_allowed()); // 1 left
    /// limiter.set_quota(Quota::new(20, 1, Duration::from_millis(10))?)?;
    /// assert_eq!(limiter.remaining(), 1);
    /// clock.advance(Duration::from_millis(10));
    /// assert_eq!(limiter.try_acquire(), Decision::Allowed { remaining: 1 });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # What a change does to a meter
    ///
    /// A change at clock reading `t` (the limiter's clock, read by
    /// `set_quota`) turns each meter, of theoretical arrival time `TAT`, into
    /// one of the new quota (emission interval `T'`, burst `c'`):
    ///
    /// - a meter idle at `t` (`TAT <= t`: full) is a fresh one, exactly as a
    ///   key first seen after the change (so raising the burst gives an idle
    ///   client the new burst at once, and sweeping an idle key stays
    ///   invisible);
    /// - any other meter keeps its permits available at `t`, `a` (what
    ///   `remaining` answers: `floor((c·T - (TAT - t)) / T)` in the old
    ///   quota), up to the new burst: `TAT' = t + (c' - min(a, c'))·T'`. So
    ///   the fraction of an interval under way at `t` is dropped, and the
    ///   next permit comes back one whole new interval after the change.
    ///
    /// So a change never leaves more available than the new burst, and
    /// creates permits only in a full meter, raised to the new burst. In any
    /// interval `[a, b]` containing one change at `t`, the permits admitted
    /// are at most what the old quota allows in `[a, t]` plus what a meter of
    /// the new quota, holding what the rules above give at `t`, allows in
    /// `(t, b]`. Each decision is exactly the old quota's decision on the
    /// old meter or the new quota's on the converted one (`tests/live.rs`
    /// checks this against a model, decision for decision, on direct and
    /// keyed limiters with sweeps).
    ///
    /// # How the word carries the quota
    ///
    /// The top bit of the word names which of two parameter slots the word
    /// belongs to; the 63 below it are a [`Gcra`] word, the TAT (exact for
    /// 292 years of clock readings; past that every request is denied). A
    /// change writes the new quota into the slot not in force, under a
    /// sequence number, then converts every word by compare-and-swap to the
    /// other bit. A decision reads the word, then, after an Acquire fence,
    /// the slot its bit names, whole, under the slot's sequence number
    /// (again until stable), and decides on those parameters; an
    /// admission's compare-and-swap succeeds only on the word it read, and a
    /// denial, which writes nothing, stands only if a second load of the
    /// word finds it unchanged (else it is decided again on the word found).
    /// Changes are serialized by a lock that decisions never touch.
    ///
    /// Why the parameters are the word's: a slot is rewritten only by the
    /// change after next, which begins only once the next change has
    /// converted every word away from that slot's bit. A decision that read
    /// its word and then a stable slot whose parameters are a later
    /// generation's (the word converted away meanwhile) fails its
    /// compare-and-swap, unless the word has come back bit for bit in that
    /// later generation, whose parameters it then rightly used. A denial in
    /// that case is caught by its second load: the conversion of the word
    /// happened before the slot's rewrite, whose sequence number the
    /// decision read with Acquire, so the second load sees the converted
    /// word (or a later one). The one
    /// case left is a decision that read its slot stable before the change
    /// after next rewrote it, and whose compare-and-swap lands only after
    /// that change has converted its word back, bit for bit, to what it
    /// read: it must stall between reading the slot and its
    /// compare-and-swap (a few instructions of arithmetic) across one whole
    /// change of every word and most of a second. `loom-tests/` checks the
    /// protocol with one decision against changes.
    ///
    /// # Cost
    ///
    /// A decision reads the slot's seven words and its sequence number twice
    /// besides the word, and a denial the word again: 55 callgrind
    /// instructions per admission against [`Gcra`]'s 40, and 45 per denial
    /// against 25 (BENCHMARKS.md, "Live quotas: instructions per decision";
    /// the windows' counts are there too).
    LiveGcra,
    Gcra,
    Quota,
    "LiveGcra::new(Quota::per_second(10)?)",
    "Quota::per_second(25)?"
);

impl LiveGcra {
    /// A live meter for `quota`, which can later be changed to any quota.
    ///
    /// ```
    /// use turnstile::{KeyedBuilder, LiveGcra, Quota};
    ///
    /// let limiter = KeyedBuilder::<String, _>::new(LiveGcra::new(Quota::per_second(5)?)).build()?;
    /// assert!(limiter.try_acquire_n("alice", 5)?.is_allowed());
    /// limiter.set_quota(Quota::per_second(50)?)?;
    /// assert_eq!(limiter.remaining("alice"), 0); // nothing created for alice
    /// assert_eq!(limiter.remaining("bob"), 50); // a new key: the new quota
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(quota: Quota) -> LiveGcra {
        // The TAT takes no more bits for a larger quota: no ceiling.
        LiveGcra(Live::from_form(Gcra::new(quota), u32::MAX))
    }

    /// A reservation on the quota `word` names ([`Lend`](crate::Lend)).
    #[cfg(feature = "std")]
    pub(crate) fn lend(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Result<(Decision, u64, u64), u64> {
        // GCRA always lends.
        self.0
            .lend(word, now, n, max_ahead)
            .unwrap_or(Err(u64::MAX))
    }

    /// Run `f` with changes held off, if none has started since
    /// [`changes`](LiveGcra::changes) returned `since`.
    #[cfg(feature = "std")]
    pub(crate) fn unless_changed<R>(&self, since: u64, f: impl FnOnce() -> R) -> Option<R> {
        self.0.unless_changed(since, f)
    }
}

live_form!(
    /// The [`FixedWindow`] counter, with a limit and window that can be
    /// changed from any thread while decisions run
    /// ([`RateLimiter::set_quota`], [`KeyedLimiter::set_quota`],
    /// [`Tiered::set_quota`]), given as a [`FixedWindow`].
    ///
    /// [`RateLimiter::set_quota`]: crate::RateLimiter::set_quota
    /// [`KeyedLimiter::set_quota`]: crate::KeyedLimiter::set_quota
    /// [`Tiered::set_quota`]: crate::Tiered::set_quota
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, LiveFixedWindow, ManualClock, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let window = LiveFixedWindow::new(FixedWindow::new(10, Duration::from_secs(1))?)?;
    /// let limiter = RateLimiter::from_parts(window, clock.clone());
    /// assert!(limiter.try_acquire_n(7)?.is_allowed()); // 3 left this window
    ///
    /// // Lowered: what is left this window, up to the new limit.
    /// limiter.set_quota(FixedWindow::new(2, Duration::from_secs(1))?)?;
    /// assert_eq!(limiter.remaining(), 2);
    /// assert!(limiter.try_acquire().is_allowed()); // 1 left
    /// // Raised: a window that is not full keeps what it has left...
    /// limiter.set_quota(FixedWindow::new(50, Duration::from_secs(1))?)?;
    /// assert_eq!(limiter.remaining(), 1);
    /// // ...and the next window opens with the new limit.
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(limiter.remaining(), 50);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # What a change does to a window
    ///
    /// A change at clock reading `t` (the limiter's clock, read by
    /// `set_quota`) turns each word, counting `c` permits of limit `L` in the
    /// window `t` falls in (or in a later window the word was written in, for
    /// a reading behind it), into one of the new limit `L'` and window `W'`:
    ///
    /// - a word with nothing counted (`c = 0`: full) is a fresh one, exactly
    ///   as a key first seen after the change (and so is a word that an
    ///   earlier change left holding the whole of its new limit: it is full
    ///   in that quota, as a token bucket clamped to its new capacity is);
    /// - any other keeps the permits it has left, `L - c`, up to the new
    ///   limit: it counts `L' - min(L - c, L')` in the new window (of the
    ///   new grid, windows at multiples of `W'` from the clock's epoch) that
    ///   holds `t`, or the start of the counted window if that is later.
    ///   That window ends at its own boundary, when the count resets to 0 as
    ///   any window's does: a shorter new window resets sooner, a longer one
    ///   later, and with the same window the boundary is unchanged.
    ///
    /// So a change never leaves more available than the new limit, and
    /// creates permits only in a window with nothing counted. Each decision
    /// is exactly the old quota's on the old word or the new quota's on the
    /// converted one (`tests/live.rs`, against a model).
    ///
    /// # How the word carries the quota
    ///
    /// As [`LiveGcra`]'s: the top bit names a parameter slot, and the 63 bits
    /// below it are a [`FixedWindow`] word laid out for the *ceiling* (the
    /// largest limit this window can be changed to), so that the layout never
    /// changes: the count as wide as the ceiling needs, the window number in
    /// the rest (`63 - w` bits for a ceiling of `w` bits: windows of at least
    /// 2 µs at the default ceiling of 65,535). The protocol, and its one
    /// case, are [`LiveGcra`]'s.
    LiveFixedWindow,
    FixedWindow,
    FixedWindow,
    "LiveFixedWindow::new(FixedWindow::new(10, Duration::from_secs(1))?)?",
    "FixedWindow::new(25, Duration::from_secs(60))?"
);

impl LiveFixedWindow {
    /// A live window for `window`'s limit and window length, which can later
    /// be changed to any limit up to 65,535 (or `window`'s own, if larger).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, KeyedBuilder, LiveFixedWindow};
    ///
    /// let window = LiveFixedWindow::new(FixedWindow::new(100, Duration::from_secs(60))?)?;
    /// assert_eq!(window.ceiling(), 65_535);
    /// let limiter = KeyedBuilder::<String, _>::new(window).build()?;
    /// limiter.set_quota(FixedWindow::new(1_000, Duration::from_secs(60))?)?;
    /// assert_eq!(limiter.remaining("alice"), 1_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`QuotaError::WindowTooShort`] when the window is too short for the
    /// live word's window number (under 2 µs at a ceiling of 65,535).
    pub fn new(window: FixedWindow) -> Result<LiveFixedWindow, QuotaError> {
        LiveFixedWindow::with_ceiling(window, window.limit().max(DEFAULT_CEILING))
    }

    /// A live window for `window` that can later take any limit up to
    /// `ceiling`. A higher ceiling leaves fewer bits for the window number,
    /// so the shortest window grows: `2^(w - 15)` µs for a ceiling of `w`
    /// bits.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, LiveFixedWindow, QuotaError};
    ///
    /// let live = LiveFixedWindow::with_ceiling(FixedWindow::new(10, Duration::from_secs(1))?, 100)?;
    /// assert_eq!(live.ceiling(), 100);
    /// assert!(matches!(
    ///     LiveFixedWindow::with_ceiling(FixedWindow::new(500, Duration::from_secs(1))?, 100),
    ///     Err(QuotaError::AboveCeiling { capacity: 500, ceiling: 100 })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`QuotaError::AboveCeiling`] when `window`'s limit is above
    /// `ceiling`, and [`QuotaError::WindowTooShort`] when the window is too
    /// short for the live word.
    pub fn with_ceiling(window: FixedWindow, ceiling: u32) -> Result<LiveFixedWindow, QuotaError> {
        Ok(LiveFixedWindow(Live::new(window, ceiling)?))
    }

    /// The largest limit this window can be changed to.
    pub fn ceiling(&self) -> u32 {
        self.0.ceiling
    }
}

live_form!(
    /// The [`SlidingWindow`] counter, with a limit and window that can be
    /// changed from any thread while decisions run
    /// ([`RateLimiter::set_quota`], [`KeyedLimiter::set_quota`],
    /// [`Tiered::set_quota`]), given as a [`SlidingWindow`].
    ///
    /// [`RateLimiter::set_quota`]: crate::RateLimiter::set_quota
    /// [`KeyedLimiter::set_quota`]: crate::KeyedLimiter::set_quota
    /// [`Tiered::set_quota`]: crate::Tiered::set_quota
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{LiveSlidingWindow, ManualClock, RateLimiter, SlidingWindow};
    ///
    /// let clock = ManualClock::new();
    /// let window = LiveSlidingWindow::new(SlidingWindow::new(10, Duration::from_secs(1))?)?;
    /// let limiter = RateLimiter::from_parts(window, clock.clone());
    /// assert!(limiter.try_acquire_n(10)?.is_allowed()); // none left
    ///
    /// // Raised: nothing is created in a window that is not full; the count
    /// // fades out over the next window, as any window's does.
    /// limiter.set_quota(SlidingWindow::new(20, Duration::from_secs(1))?)?;
    /// assert_eq!(limiter.remaining(), 0);
    /// clock.advance(Duration::from_millis(1_500)); // half the count faded
    /// assert_eq!(limiter.remaining(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # What a change does to a window
    ///
    /// A change at clock reading `t` (the limiter's clock, read by
    /// `set_quota`) turns each word into one of the new limit `L'` and window
    /// `W'`:
    ///
    /// - a word counting nothing in the current or previous window (full) is
    ///   a fresh one, exactly as a key first seen after the change;
    /// - any other keeps the permits its estimate leaves at `t`, `a` (what
    ///   `remaining` answers; for a reading behind the stored window, at that
    ///   window's start), up to the new limit: it counts `L' - min(a, L')` in
    ///   the new window (of the new grid, windows at multiples of `W'` from
    ///   the clock's epoch) that holds `t`, or the start of the counted
    ///   window if that is later, and nothing in the window before. That
    ///   count holds until its window ends, then fades over the next one.
    ///
    /// So a change never leaves more available than the new limit, and
    /// creates permits only in a word counting nothing. Each decision is
    /// exactly the old quota's on the old word or the new quota's on the
    /// converted one (`tests/live.rs`, against a model).
    ///
    /// # How the word carries the quota
    ///
    /// As [`LiveGcra`]'s: the top bit names a parameter slot, and the 63 bits
    /// below it are a [`SlidingWindow`] word laid out for the *ceiling*: both
    /// counts as wide as the ceiling needs, the window number in the rest
    /// (`63 - 2w` bits for a ceiling of `w` bits: windows of at least
    /// 131 ms at the default ceiling of 65,535, 512 µs at 4,095). The
    /// protocol, and its one case, are [`LiveGcra`]'s.
    LiveSlidingWindow,
    SlidingWindow,
    SlidingWindow,
    "LiveSlidingWindow::new(SlidingWindow::new(10, Duration::from_secs(1))?)?",
    "SlidingWindow::new(25, Duration::from_secs(60))?"
);

impl LiveSlidingWindow {
    /// A live window for `window`'s limit and window length, which can later
    /// be changed to any limit up to 65,535 (or `window`'s own, if larger).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedBuilder, LiveSlidingWindow, SlidingWindow};
    ///
    /// let window = LiveSlidingWindow::new(SlidingWindow::new(100, Duration::from_secs(60))?)?;
    /// let limiter = KeyedBuilder::<String, _>::new(window).build()?;
    /// limiter.set_quota(SlidingWindow::new(10, Duration::from_secs(60))?)?;
    /// assert_eq!(limiter.remaining("alice"), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`QuotaError::WindowTooShort`] when the window is too short for the
    /// live word's window number (under 131 ms at a ceiling of 65,535: give a
    /// lower ceiling with [`with_ceiling`](Self::with_ceiling)), and
    /// [`QuotaError::LimitTooLarge`] for a limit of `2^30` or more.
    pub fn new(window: SlidingWindow) -> Result<LiveSlidingWindow, QuotaError> {
        LiveSlidingWindow::with_ceiling(window, window.limit().max(DEFAULT_CEILING))
    }

    /// A live window for `window` that can later take any limit up to
    /// `ceiling`; the shortest window is `2^(2w - 15)` µs for a ceiling of
    /// `w` bits.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{LiveSlidingWindow, SlidingWindow};
    ///
    /// let window = SlidingWindow::new(10, Duration::from_millis(10))?;
    /// assert!(LiveSlidingWindow::new(window).is_err()); // 131 ms at least
    /// assert_eq!(LiveSlidingWindow::with_ceiling(window, 1_000)?.ceiling(), 1_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`QuotaError::AboveCeiling`] when `window`'s limit is above
    /// `ceiling`, [`QuotaError::WindowTooShort`] when the window is too
    /// short for the live word, and [`QuotaError::LimitTooLarge`] for a
    /// ceiling of `2^30` or more (two counts that wide leave the live word
    /// too few bits to number its windows).
    pub fn with_ceiling(
        window: SlidingWindow,
        ceiling: u32,
    ) -> Result<LiveSlidingWindow, QuotaError> {
        Ok(LiveSlidingWindow(Live::new(window, ceiling)?))
    }

    /// The largest limit this window can be changed to.
    pub fn ceiling(&self) -> u32 {
        self.0.ceiling
    }
}
