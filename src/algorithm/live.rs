//! A token bucket whose quota can be changed while it serves.

use core::fmt;
use core::num::NonZeroU64;
use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::token_bucket::{self, Params, RawBucket, TokenBucket};
use crate::decision::Decision;
use crate::error::QuotaError;
use crate::quota::Quota;
use crate::sync::{AtomicU64, Ordering, WriterGuard, WriterLock, fence};
use crate::word::Layout;

/// The largest capacity whose bucket keeps time in whole microseconds; the
/// ceiling [`LiveTokenBucket::new`] gives any smaller quota.
const MICROSECOND_CEILING: u32 = 65_535;

/// The token bucket of [`TokenBucket`], with a quota that can be changed from
/// any thread while decisions run ([`RateLimiter::set_quota`],
/// [`KeyedLimiter::set_quota`], [`Tiered::set_quota`]).
///
/// [`RateLimiter::set_quota`]: crate::RateLimiter::set_quota
/// [`KeyedLimiter::set_quota`]: crate::KeyedLimiter::set_quota
/// [`Tiered::set_quota`]: crate::Tiered::set_quota
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Decision, LiveTokenBucket, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// let bucket = LiveTokenBucket::new(Quota::new(10, 1, Duration::from_secs(1))?)?;
/// let limiter = RateLimiter::from_parts(bucket, clock.clone());
/// assert!(limiter.try_acquire_n(6)?.is_allowed()); // 4 left
///
/// // Lowered while serving: the bucket keeps what it has, up to the new capacity.
/// clock.advance(Duration::from_millis(500));
/// limiter.set_quota(Quota::new(3, 1, Duration::from_secs(1))?)?;
/// assert_eq!(limiter.remaining(), 3);
/// assert!(limiter.try_acquire().is_allowed()); // 2 left
///
/// // Raised: a bucket that is not full keeps its tokens, and the new rate
/// // refills from the change.
/// clock.advance(Duration::from_millis(100));
/// limiter.set_quota(Quota::new(100, 50, Duration::from_secs(1))?)?;
/// assert_eq!(limiter.remaining(), 2);
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(limiter.try_acquire(), Decision::Allowed { remaining: 51 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # What a change does to a bucket
///
/// A change at clock reading `t` (the limiter's clock, read by
/// `set_quota`) turns each bucket into a bucket of the new quota:
///
/// - a bucket that the old quota has refilled to full by `t` is full in the
///   new quota, exactly as a key first seen after the change (so raising the
///   capacity gives an idle client the new burst at once, and sweeping an
///   idle key stays invisible);
/// - any other bucket holds `min(level, new capacity)` tokens, where `level`
///   is what the old quota had refilled it to at `t` (whole old periods only);
/// - the refill grid starts at `t`: the first new refill lands one new
///   period after the change, and the fraction of an old period under way at
///   `t` is dropped. (A reading behind the bucket's last refill time keeps
///   that time.)
///
/// So tokens never exceed the new capacity, and a change creates tokens only
/// in a full bucket, raised to the new capacity. In any interval `[a, b]`
/// containing one change at `t`, the permits admitted are at most what the
/// old quota allows in `[a, t]` plus what a bucket of the new quota, holding
/// what the rules above give at `t`, allows in `(t, b]`. The bound is per
/// change: a bucket clamped by a lower capacity is full in it, and so full
/// again, at the higher capacity, when the quota goes back up. A bucket of
/// 10 holding 5, changed to a capacity of 5 and back to 10, holds 10: a
/// quota switched back and forth refills its non-full buckets. Each decision is
/// exactly the old quota's decision on the old bucket or the new quota's on
/// the converted one (`tests/live.rs` checks this against a model, decision
/// for decision, on direct and keyed limiters with sweeps). A decision that
/// loses a race with the conversion is decided again, on the converted
/// bucket.
///
/// # How the word carries the quota
///
/// The word is a [`TokenBucket`] word one bit narrower, laid out for the
/// *ceiling* (the largest capacity this bucket can be changed to) so that the
/// layout never changes, with the bit below the tokens naming which of two
/// parameter slots it belongs to:
///
/// | bits | field |
/// |---|---|
/// | `63 ..= 64-w` | tokens, `w` = the bits the ceiling needs |
/// | `63-w` | generation parity: the parameter slot in force for this word |
/// | `62-w ..= 0` | last refill time, in the ceiling's time unit |
///
/// Between the two fields, the bit is left alone by reading the tokens or
/// the time and by spending tokens, so a decision runs a [`TokenBucket`]'s
/// arithmetic on the word as it is.
///
/// The time field is one bit narrower than a [`TokenBucket`]'s, so a
/// non-full bucket is exact for at least `2^46` µs (2.2 years) of
/// idleness, and a quota's fill time may be at most that long.
///
/// A change writes the new quota into the slot not in force, then converts
/// every word by compare-and-swap to the other parity. A decision reads the
/// word, then the slot its parity names, and decides; its compare-and-swap
/// succeeds only on the word it read, so a decision never applies one
/// quota's parameters to another's word. Changes are serialized by a mutex
/// that decisions never touch.
///
/// One case needs more: a decision that reads a word, stalls while *two*
/// changes complete, and then finds the word bit for bit as it read it (same
/// parity, tokens and time) may spend on it with the parameters it read
/// first. A conversion keeps or advances the word's time, so the word can
/// come back only if both changes read the clock in the same time unit as the
/// word's last refill, and the stalled decision's own reading, taken before
/// it loaded the word, is no later: it refills nothing. Spending `n` of the
/// word's tokens (or of fewer, if the older capacity was smaller) is then the
/// same under either quota, so even that decision creates no permit.
///
/// # Cost
///
/// A decision runs the same arithmetic as a [`TokenBucket`]'s on the word
/// as it is, reading each parameter from the slot the word names where the
/// bucket reads its own field; beyond that it branches on the word's
/// generation bit to one of two copies of the decision, each reading its own
/// slot at a fixed address (a slot address computed from the word put a load
/// in every decision's critical path), and sets the generation bit in a word
/// it packs anew. An admission needs nothing more: its compare-and-swap
/// proves the word unchanged, and with it the slot. A denial, which writes
/// nothing, is decided again on the slot's parameters read whole under its
/// sequence number. No locked instruction. Callgrind counts 55 instructions
/// per admission against the bucket's 54, and 129 per denial against 68; on
/// the coarse clock an admission takes 0.995× a plain bucket's time and a
/// denial 1.99× (about 3 ns more), medians of twelve criterion runs:
/// BENCHMARKS.md, "Live reconfiguration".
pub struct LiveTokenBucket {
    layout: Layout,
    /// `layout.half_range()`, computed once.
    half: u64,
    /// `layout.spare_bit()`: the bit of a word that holds the parity of the
    /// quota generation it belongs to.
    generation_bit: u64,
    /// Its position.
    generation_shift: u32,
    /// `generation_shift - 6`: see [`parity`](Self::parity).
    slot_shift: u32,
    ceiling: u32,
    /// The parameters of the current generation and of the one before; the
    /// word's generation bit picks one.
    slots: [Slot; 2],
    /// How many changes have been made. Its low bit is the parity of the
    /// words a new key gets; written only under `writer`.
    generation: AtomicU64,
    /// Held by a change from writing its slot until every word is converted.
    writer: WriterLock,
}

/// One quota's parameters, read as a whole under a sequence number: the
/// fields of a [`TokenBucket`] that a decision reads, each as the bucket
/// holds it, so that a decision does no arithmetic to rebuild the bucket.
/// Aligned to a cache line: one slot is one line, and the word's parity picks
/// it with a shift.
#[repr(align(64))]
struct Slot {
    /// Even while the slot is stable, odd while a change writes it.
    seq: AtomicU64,
    capacity: AtomicU64,
    /// At least 1.
    amount: AtomicU64,
    /// The period, in the layout's time units; at least 1.
    period: AtomicU64,
    /// The time to refill from empty, in the layout's time units.
    fill: AtomicU64,
    /// `half - period` (see [`TokenBucket`]'s `refill_window`).
    refill_window: AtomicU64,
}

impl Slot {
    fn new(bucket: &TokenBucket) -> Slot {
        let raw = bucket.raw();
        Slot {
            seq: AtomicU64::new(0),
            capacity: AtomicU64::new(raw.capacity),
            amount: AtomicU64::new(raw.amount),
            period: AtomicU64::new(raw.period),
            fill: AtomicU64::new(raw.fill),
            refill_window: AtomicU64::new(raw.refill_window),
        }
    }
}

/// A slot read field by field, each where the decision needs it: an
/// admission that finds tokens in the word reads only the capacity, the
/// period and the refill window, as a [`TokenBucket`] reads its own fields.
///
/// Every load is Relaxed, after an Acquire fence that follows the word's
/// load. In [`LiveTokenBucket`]'s `decide` a field read while a change
/// writes the slot is caught by the failed compare-and-swap of an admission,
/// and a denial is decided again on parameters read under the slot's
/// sequence number; in `reserve`, a refusal is checked against that number
/// (`unchanged`). A field may be read more than once in one decision, and
/// two readings may then differ; the arithmetic of [`token_bucket::decide`]
/// cannot panic on them, and the result is discarded.
struct SlotView<'a> {
    slot: &'a Slot,
    layout: Layout,
    half: u64,
    /// The word decided on, whose generation bit the words it packs take.
    word: u64,
}

impl Params for SlotView<'_> {
    #[inline(always)]
    fn layout(&self) -> Layout {
        self.layout
    }
    #[inline(always)]
    fn half(&self) -> u64 {
        self.half
    }
    #[inline(always)]
    fn max_tokens(&self) -> u64 {
        // Relaxed: see the type's documentation.
        self.slot.capacity.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn amount(&self) -> NonZeroU64 {
        // Relaxed: see the type's documentation. Every value stored is at
        // least 1; the fallback only keeps the type's promise without `unsafe`.
        NonZeroU64::new(self.slot.amount.load(Ordering::Relaxed)).unwrap_or(NonZeroU64::MIN)
    }
    #[inline(always)]
    fn period(&self) -> NonZeroU64 {
        NonZeroU64::new(self.period_raw()).unwrap_or(NonZeroU64::MIN)
    }
    #[inline(always)]
    fn period_raw(&self) -> u64 {
        // Relaxed: see the type's documentation.
        self.slot.period.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn fill(&self) -> u64 {
        // Relaxed: see the type's documentation.
        self.slot.fill.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn refill_window(&self) -> u64 {
        // Relaxed: see the type's documentation.
        self.slot.refill_window.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn pack(&self, tokens: u64, time: u64) -> u64 {
        self.layout.pack(tokens, time) | (self.word & self.layout.spare_bit())
    }
}

impl LiveTokenBucket {
    /// A live bucket for `quota`, which can later be changed to any quota of
    /// capacity up to 65,535 (the largest that keeps time in whole
    /// microseconds), or up to `quota`'s own capacity if that is larger.
    ///
    /// # Errors
    ///
    /// [`QuotaError::FillTimeTooLong`] when the quota takes longer than
    /// `2^46` µs (2.2 years) to refill from empty.
    pub fn new(quota: Quota) -> Result<LiveTokenBucket, QuotaError> {
        LiveTokenBucket::with_ceiling(quota, quota.capacity().max(MICROSECOND_CEILING))
    }

    /// A live bucket for `quota` that can later take any capacity up to
    /// `ceiling`. A ceiling above 65,535 coarsens the time unit as a
    /// [`TokenBucket`] of that capacity does ([`Quota::time_unit`]), and every
    /// quota it takes must have a period that is a whole number of that unit.
    ///
    /// # Errors
    ///
    /// [`QuotaError::AboveCeiling`] when `quota`'s capacity is above
    /// `ceiling`; [`QuotaError::PeriodResolution`] and
    /// [`QuotaError::FillTimeTooLong`] as for any quota this bucket takes.
    pub fn with_ceiling(quota: Quota, ceiling: u32) -> Result<LiveTokenBucket, QuotaError> {
        let layout = Layout::with_spare_bit(ceiling);
        let bucket = validate(quota, ceiling, layout)?;
        Ok(LiveTokenBucket {
            layout,
            half: layout.half_range(),
            generation_bit: layout.spare_bit(),
            generation_shift: layout.spare_bit().trailing_zeros(),
            // At least 46: the time field below the bit is that wide.
            slot_shift: layout.spare_bit().trailing_zeros() - 6,
            ceiling,
            slots: [Slot::new(&bucket), Slot::new(&bucket)],
            generation: AtomicU64::new(0),
            writer: WriterLock::new(),
        })
    }

    /// The quota in force now.
    pub fn quota(&self) -> Quota {
        self.current().quota()
    }

    /// The largest capacity this bucket can be changed to.
    pub fn ceiling(&self) -> u32 {
        self.ceiling
    }

    /// How many times the quota has been changed.
    pub fn changes(&self) -> u64 {
        // Relaxed: a count; nothing is read on the strength of it.
        self.generation.load(Ordering::Relaxed)
    }

    /// `f()`, with changes held off, if the count of changes is still `since`;
    /// `None` otherwise.
    pub(crate) fn unless_changed<R>(&self, since: u64, f: impl FnOnce() -> R) -> Option<R> {
        let _writer = self.writer.lock();
        // Relaxed: only changes store it, under `writer`, which this holds.
        (self.generation.load(Ordering::Relaxed) == since).then(f)
    }

    /// The bucket of the current generation.
    fn current(&self) -> TokenBucket {
        // Acquire: pairs with the Release store in `begin`, so the slot read
        // next holds the generation's quota, not the one before it.
        let generation = self.generation.load(Ordering::Acquire);
        self.bucket((generation & 1) as usize)
    }

    /// The parameters in slot `parity`, read whole.
    ///
    /// A slot is written only by a change, while no word of its parity
    /// remains (every word has been converted to the other). So a decision
    /// finds its slot mid-write only if its word is already stale, and then
    /// its compare-and-swap fails anyway; it waits here for the few stores of
    /// that write, and no decision on a current word ever does.
    fn bucket(&self, parity: usize) -> TokenBucket {
        loop {
            let (seq, bucket) = self.read(parity);
            if self.unchanged(parity, seq) {
                return bucket;
            }
            crate::sync::lost_race();
        }
    }

    /// Slot `parity`'s sequence number and parameters, not yet checked
    /// against a write (see [`unchanged`](Self::unchanged)).
    #[inline(always)]
    fn read(&self, parity: usize) -> (u64, TokenBucket) {
        let slot = &self.slots[parity];
        // Acquire: the field loads below stay after this one.
        let seq = slot.seq.load(Ordering::Acquire);
        // Relaxed: a field read during a write is caught by `unchanged`.
        let raw = RawBucket {
            capacity: slot.capacity.load(Ordering::Relaxed),
            amount: slot.amount.load(Ordering::Relaxed),
            period: slot.period.load(Ordering::Relaxed),
            fill: slot.fill.load(Ordering::Relaxed),
            refill_window: slot.refill_window.load(Ordering::Relaxed),
        };
        // Each field holds a value from a validated quota, so `amount` and
        // `period` are at least 1 even in fields of two quotas (a bucket built
        // from those cannot divide by zero; its result is discarded, see
        // `decide`).
        let bucket = TokenBucket::from_raw_parts(self.layout, self.half, raw);
        (seq, bucket)
    }

    /// Whether slot `parity` was stable, holding one quota's parameters,
    /// since [`read`](Self::read) returned `seq`.
    #[inline(always)]
    fn unchanged(&self, parity: usize, seq: u64) -> bool {
        // Acquire fence: the field loads before it stay before the sequence
        // load after it. If a field load read a change's store, the change's
        // odd number (stored, then a Release fence, then the fields) is
        // visible to that load.
        fence(Ordering::Acquire);
        // Relaxed: ordered by the fence above.
        let again = self.slots[parity].seq.load(Ordering::Relaxed);
        again == seq && seq & 1 == 0
    }

    /// The bucket `word`'s parity names, after a fence that makes the slot's
    /// parameters as fresh as the word.
    #[inline(always)]
    fn bucket_of(&self, word: u64) -> TokenBucket {
        // Acquire fence (no instruction on x86-64): the cell read `word` with a
        // Relaxed load; if a conversion's Release compare-and-swap wrote it,
        // this fence makes the new quota's slot, written before that, visible.
        fence(Ordering::Acquire);
        self.bucket(self.parity(word))
    }

    /// A reservation's loan on `word` ([`token_bucket::reserve`]), on the
    /// slot the word names, checked against the slot's sequence number
    /// whatever it answers. (A decision's admission needs no check, its
    /// compare-and-swap proving the word and with it the slot; a loan's is
    /// checked too, for the case of a word that two changes converted away
    /// and back to the same bits while the loan read the slot's fields, where
    /// a spend is the same under either quota but a loan's refill time, from
    /// parameters of two quotas, may not be. A reservation is not on the
    /// decision path: the check costs a load.)
    #[cfg(feature = "std")]
    pub(crate) fn reserve(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Result<(Decision, u64, u64), u64> {
        let (parity, seq, view) = self.open(word);
        let result = token_bucket::reserve(&view, word, now, n, max_ahead);
        if self.unchanged(parity, seq) {
            return result;
        }
        // A change was writing the slot: decide on parameters read whole (and
        // if `word` is stale, a loan on it fails its compare-and-swap).
        let generation = word & self.generation_bit;
        token_bucket::reserve(
            &self.bucket(parity),
            word & !self.generation_bit,
            now,
            n,
            max_ahead,
        )
        .map(|(decision, next, wait)| (decision, next | generation, wait))
    }

    /// The slot `word` names, opened for a decision on it: its parity, its
    /// sequence number (for [`unchanged`](Self::unchanged)) and a view that
    /// reads its fields where the decision needs them.
    #[cfg(feature = "std")]
    #[inline(always)]
    fn open(&self, word: u64) -> (usize, u64, SlotView<'_>) {
        let parity = self.parity(word);
        let view = self.view(parity, word);
        // Acquire: the view's field loads, made after this, stay after it.
        let seq = view.slot.seq.load(Ordering::Acquire);
        (parity, seq, view)
    }

    /// Slot `parity`, for a decision on `word`, after a fence that makes its
    /// parameters as fresh as the word (as in `bucket_of`). Its fields are
    /// read where the decision needs them.
    #[inline(always)]
    fn view(&self, parity: usize, word: u64) -> SlotView<'_> {
        // Acquire fence: as in `bucket_of`.
        fence(Ordering::Acquire);
        SlotView {
            slot: &self.slots[parity],
            layout: self.layout,
            half: self.half,
            word,
        }
    }

    /// [`decide`](Algorithm::decide) for a word of parity `P`: one copy of
    /// the decision per slot, so that the slot's address is a constant and
    /// not computed from the word (a load from an address computed from the
    /// word made a live admission on the coarse clock take 1.17–1.24× a
    /// plain one's time; the branch on the parity is predictable, as it
    /// changes only with a quota change).
    #[inline(always)]
    fn decide_in<const P: usize>(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        let view = self.view(P, word);
        // The word as it is: reading its tokens and time, and spending, leave
        // the generation bit alone, and `SlotView::pack` sets it.
        let (decision, next) = token_bucket::decide(&view, word, now, n);
        if let Some(next) = next {
            // No sequence number: the cell's compare-and-swap succeeds only
            // if the word is still `word`, so no change has converted it
            // since it was read, and its slot (rewritten only once every word
            // has left its parity) held one quota all along. If it fails,
            // this result is dropped and the decision runs again. (Loading
            // the slot's sequence number first, to check a denial against it,
            // took an admission 65 instructions against 55: the number held
            // a register through the decision and pushed others to the
            // stack.)
            return (decision, Some(next));
        }
        // A denial writes nothing, so nothing proves the fields above were
        // one quota's: decide again on the slot's parameters read whole under
        // its sequence number. (If a change converted the word meanwhile, an
        // admission found here fails its compare-and-swap, as above.)
        let (decision, next) = self.bucket(P).decide(word & !self.generation_bit, now, n);
        (
            decision,
            next.map(|next| next | (word & self.generation_bit)),
        )
    }

    /// The parity of the quota generation `word` belongs to: its slot.
    #[inline(always)]
    fn parity(&self, word: u64) -> usize {
        // The generation bit moved to bit 6 and masked there, then down to
        // bit 0: the compiler folds the last shift into the index's stride (a
        // slot is 64 bytes), so picking a slot costs a shift and a mask.
        (((word >> self.slot_shift) & 64) >> 6) as usize
    }

    /// Start a change to `quota`: hold the writer's lock, write the slot not in
    /// force, and move the generation on, so that a key created from now on
    /// starts in the new quota. The caller converts every word with the
    /// returned [`Change`] while it lives.
    pub(crate) fn begin(&self, quota: Quota) -> Result<Change<'_>, QuotaError> {
        let guard = self.writer.lock();
        let new = validate(quota, self.ceiling, self.layout)?;
        // Relaxed: only changes store it, and they hold `writer`.
        let generation = self.generation.load(Ordering::Relaxed);
        let old = self.bucket((generation & 1) as usize);
        let next = generation + 1;
        self.write((next & 1) as usize, &new);
        // Release: a new key's word, made after an Acquire load of this, is
        // decided on the slot written above.
        self.generation.store(next, Ordering::Release);
        Ok(Change {
            layout: self.layout,
            old,
            new,
            to: (next & 1) << self.generation_shift,
            _writer: guard,
        })
    }

    /// Write `bucket`'s parameters into slot `parity` (the writer's lock held).
    fn write(&self, parity: usize, bucket: &TokenBucket) {
        let slot = &self.slots[parity];
        // Relaxed: only writers store the sequence, under the lock.
        let seq = slot.seq.load(Ordering::Relaxed);
        // Relaxed, then a Release fence: the odd number is ordered before
        // each field store, so a reader that sees any new field sees the odd
        // number (or a later one) when it reads the sequence again (it reads
        // it after an Acquire fence, in `unchanged`).
        slot.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        // Relaxed: ordered by the fence above and the Release store below.
        let raw = bucket.raw();
        slot.capacity.store(raw.capacity, Ordering::Relaxed);
        slot.amount.store(raw.amount, Ordering::Relaxed);
        slot.period.store(raw.period, Ordering::Relaxed);
        slot.fill.store(raw.fill, Ordering::Relaxed);
        slot.refill_window
            .store(raw.refill_window, Ordering::Relaxed);
        // Release: a reader that sees the even number sees every field above.
        slot.seq.store(seq + 2, Ordering::Release);
    }
}

/// `quota` as a bucket in `layout`, if `ceiling` admits it.
fn validate(quota: Quota, ceiling: u32, layout: Layout) -> Result<TokenBucket, QuotaError> {
    if quota.capacity() > ceiling {
        return Err(QuotaError::AboveCeiling {
            capacity: quota.capacity(),
            ceiling,
        });
    }
    TokenBucket::with_layout(quota, layout)
}

/// A change of quota under way: the writer's lock, and the rule that turns a
/// word of the old quota into one of the new.
pub(crate) struct Change<'a> {
    layout: Layout,
    old: TokenBucket,
    new: TokenBucket,
    /// The parity bit of converted words.
    to: u64,
    _writer: WriterGuard<'a>,
}

impl Change<'_> {
    /// `word` converted at clock reading `now`, or `None` if it already
    /// belongs to the new quota.
    ///
    /// A word full at `now` becomes full; another holds `min(old level at
    /// now, new capacity)` tokens. The time is `now`, or the word's own when
    /// `now` is behind it: it never moves back.
    pub(crate) fn convert(&self, word: u64, now: u64) -> Option<u64> {
        let generation_bit = self.layout.spare_bit();
        if word & generation_bit == self.to {
            return None;
        }
        let word = word & !generation_bit;
        let old_capacity = u64::from(self.old.quota().capacity());
        let new_capacity = u64::from(self.new.quota().capacity());
        let level = self.old.level_at(word, now);
        let tokens = if level >= old_capacity {
            new_capacity
        } else {
            level.min(new_capacity)
        };
        let last = self.layout.time(word);
        let t = self.layout.time_of(now);
        let ahead = self.layout.wrap(t.wrapping_sub(last));
        let time = if ahead < self.layout.half_range() {
            t
        } else {
            last
        };
        Some(self.to | self.layout.pack(tokens, time))
    }
}

impl Algorithm for LiveTokenBucket {
    #[inline]
    fn fresh(&self) -> u64 {
        // Acquire: as in `current`.
        let generation = self.generation.load(Ordering::Acquire);
        let bucket = self.bucket((generation & 1) as usize);
        ((generation & 1) << self.generation_shift) | bucket.fresh()
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.current().capacity()
    }

    #[inline(always)]
    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        // The generation bit tested in place: one instruction against the
        // word, where `parity` shifts it down to index a slot.
        if word & self.generation_bit == 0 {
            self.decide_in::<0>(word, now, n)
        } else {
            self.decide_in::<1>(word, now, n)
        }
    }

    #[cfg(feature = "std")]
    fn owe(&self, word: u64, now: u64, n: u32) -> Option<(u64, u64)> {
        // At most one fill time ahead, as a reservation's loan.
        let max_ahead = u64::try_from(self.quota().fill_time().as_nanos()).unwrap_or(u64::MAX);
        self.reserve(word, now, n, max_ahead)
            .ok()
            .map(|(_, next, ahead)| (next, ahead))
    }

    #[inline]
    fn remaining(&self, word: u64, now: u64) -> u32 {
        self.bucket_of(word)
            .remaining(word & !self.generation_bit, now)
    }

    #[inline]
    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
        if (word ^ written) & self.generation_bit != 0 {
            // The quota changed since: the conversion settled the bucket with
            // the permits spent. (Two changes bring the generation bit back;
            // a refund runs only through `refund_unless_changed`, which
            // declines after any change.)
            return None;
        }
        self.bucket_of(word)
            .refund(
                word & !self.generation_bit,
                written & !self.generation_bit,
                n,
            )
            .map(|next| next | (word & self.generation_bit))
    }

    #[inline]
    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        self.bucket_of(word)
            .is_fresh_equivalent(word & !self.generation_bit, now)
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

    // And the denial itself checked against the word: decided again under
    // the slot's sequence number, it read the slot whole, but a slot the
    // change after next rewrote, with a word the changes have converted
    // since (a fast quota between two slow ones refilled it: every order
    // admits, where the stale word denied with a wait no order gives; the
    // loom model `live_quota_changes_racing_a_denial_with_the_fast_quota_between`).
    const RECHECK_DENIAL: bool = true;

    fn fresh_after_idle(&self) -> Duration {
        // Either slot's words may still be held while a change runs.
        let a = self.bucket(0).fresh_after_idle();
        let b = self.bucket(1).fresh_after_idle();
        a.max(b)
    }

    fn advertise(&self) -> Option<(u32, Duration)> {
        // The quota in force: a change converts every word before it ends,
        // so only during one can a word of the previous quota still decide.
        let quota = self.quota();
        Some((quota.capacity(), quota.fill_time()))
    }
}

impl fmt::Debug for LiveTokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveTokenBucket")
            .field("quota", &self.quota())
            .field("ceiling", &self.ceiling)
            .field("changes", &self.changes())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(capacity: u32, amount: u32, period_ms: u64) -> Quota {
        Quota::new(capacity, amount, Duration::from_millis(period_ms)).unwrap()
    }

    const MS: u64 = 1_000_000;

    /// Mid-change: the new quota's slot written and the generation moved on,
    /// the word not yet converted. A decision and a loan on that word are
    /// decided by the old quota (the word's slot), not the one in force; the
    /// loan's word keeps the old parity, so the conversion still takes it.
    /// (Loans are reservations': `std` only.)
    #[cfg(feature = "std")]
    #[test]
    fn a_word_not_yet_converted_is_decided_and_lent_on_its_own_quota() {
        let old = quota(2, 1, 100);
        let bucket = LiveTokenBucket::new(old).unwrap();
        // Empty at 0 (2 spent), read at 25 ms.
        let (_, word) = bucket.decide(bucket.fresh(), 0, 2);
        let word = word.unwrap();
        let change = bucket.begin(quota(4, 1, 10)).unwrap();
        assert_eq!(bucket.quota(), quota(4, 1, 10));

        // Under the new quota the word would hold 2 tokens at 25 ms; under
        // its own it holds none, and the next one comes at 100 ms.
        let (decision, next) = bucket.decide(word, 25 * MS, 1);
        assert_eq!(next, None);
        assert_eq!(decision.retry_after().unwrap().as_nanos(), 75 * MS);
        let (decision, lent, wait) = bucket.reserve(word, 25 * MS, 1, 1_000 * MS).unwrap();
        assert_eq!((decision.is_allowed(), wait), (true, 75 * MS));
        assert_eq!(bucket.parity(lent), bucket.parity(word));

        // The conversion keeps the loan's future stamp: the next permit in the
        // new quota comes one new period after it.
        let converted = change.convert(lent, 25 * MS).unwrap();
        drop(change);
        let (decision, _) = bucket.decide(converted, 25 * MS, 1);
        assert_eq!(decision.retry_after().unwrap().as_nanos(), 85 * MS);
    }

    #[test]
    fn decides_as_a_token_bucket_of_its_quota() {
        let q = quota(5, 2, 100);
        let live = LiveTokenBucket::new(q).unwrap();
        let plain = TokenBucket::new(q);
        let (mut a, mut b) = (live.fresh(), plain.fresh());
        for (now, n) in [(0, 3), (10, 3), (150, 1), (150, 4), (420, 5), (421, 1)] {
            let (da, na) = live.decide(a, now * MS, n);
            let (db, nb) = plain.decide(b, now * MS, n);
            assert_eq!(da, db, "at {now} ms, n = {n}");
            assert_eq!(na.is_some(), nb.is_some());
            a = na.unwrap_or(a);
            b = nb.unwrap_or(b);
            assert_eq!(live.remaining(a, now * MS), plain.remaining(b, now * MS));
        }
    }

    #[test]
    fn conversion_clamps_settles_and_restarts_the_grid() {
        let live = LiveTokenBucket::new(quota(10, 1, 100)).unwrap();
        let (_, w) = live.decide(live.fresh(), 0, 8); // 2 left, grid at 0
        let w = w.unwrap();
        // At 250 ms the old quota has refilled 2 (periods at 100 and 200).
        let change = live.begin(quota(3, 1, 40)).unwrap();
        let converted = change.convert(w, 250 * MS).unwrap();
        assert_eq!(change.convert(converted, 260 * MS), None);
        drop(change);
        assert_eq!(live.remaining(converted, 250 * MS), 3);
        let (_, w) = live.decide(converted, 250 * MS, 3);
        let w = w.unwrap();
        // The new grid starts at 250 ms: one token at 290, not at 280.
        assert!(live.decide(w, 289 * MS, 1).0.retry_after().is_some());
        assert!(live.decide(w, 290 * MS, 1).0.is_allowed());
    }

    #[test]
    fn a_reading_behind_keeps_the_time_and_a_full_bucket_stays_full() {
        let live = LiveTokenBucket::new(quota(4, 1, 100)).unwrap();
        let (_, w) = live.decide(live.fresh(), 500 * MS, 2);
        let w = w.unwrap();
        let change = live.begin(quota(9, 1, 50)).unwrap();
        let converted = change.convert(w, 400 * MS).unwrap();
        let layout = Layout::with_spare_bit(65_535);
        assert_eq!(layout.time(converted), layout.time(w));
        let full = change.convert(live.bucket(0).fresh(), 400 * MS).unwrap();
        drop(change);
        assert_eq!(live.remaining(converted, 400 * MS), 2);
        assert_eq!(live.remaining(full, 400 * MS), 9);
    }

    #[test]
    fn bad_quotas_are_refused_and_change_nothing() {
        let live = LiveTokenBucket::with_ceiling(quota(5, 1, 10), 10).unwrap();
        assert_eq!(
            live.begin(quota(11, 1, 10)).err(),
            Some(QuotaError::AboveCeiling {
                capacity: 11,
                ceiling: 10
            })
        );
        assert_eq!(live.changes(), 0);
        assert_eq!(live.quota(), quota(5, 1, 10));
        assert!(matches!(
            LiveTokenBucket::new(quota(1, 1, 3 * 365 * 24 * 3_600_000)),
            Err(QuotaError::FillTimeTooLong { .. })
        ));
        assert!(matches!(
            LiveTokenBucket::with_ceiling(quota(7, 1, 10), 6),
            Err(QuotaError::AboveCeiling { .. })
        ));
        // A ceiling of a million keeps time in 16 µs units.
        let big = LiveTokenBucket::with_ceiling(quota(5, 1, 10), 1_000_000).unwrap();
        assert!(matches!(
            big.begin(Quota::new(5, 1, Duration::from_micros(1_001)).unwrap()),
            Err(QuotaError::PeriodResolution { .. })
        ));
    }

    #[test]
    fn refunds_across_a_change_decline() {
        let live = LiveTokenBucket::new(quota(5, 1, 100)).unwrap();
        let (_, written) = live.decide(live.fresh(), 0, 2);
        let written = written.unwrap();
        assert!(live.refund(written, written, 2).is_some());
        let change = live.begin(quota(5, 1, 50)).unwrap();
        let converted = change.convert(written, MS).unwrap();
        drop(change);
        assert_eq!(live.refund(converted, written, 2), None);
    }
}
