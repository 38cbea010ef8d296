//! The failover rule of the Redis modes ([`Guarded`](super::Guarded),
//! [`LeasedLimiter`](super::LeasedLimiter)): when a failure starts the
//! backoff, how the local share of [`OnFailure::Local`](super::OnFailure)
//! starts, and how Redis is charged for what it admitted.
//!
//! - **Strikes.** A call that timed out may only have met a slow Redis (a
//!   loaded host, a pause of the process): it counts as one strike, and the
//!   backoff starts at the `k`-th timeout in a row (3 by default) with no
//!   answered call between them. Any other failure (a refused or dropped
//!   connection, an error reply) starts it at once, and so does any failure
//!   once one has started it, until a call is answered (a probe after the
//!   backoff that times out backs off again). A failed call is always
//!   answered by the failure policy and never sent again.
//! - **A key's own error is no failure of Redis.** An error reply about the
//!   call's key alone (it holds a value that is not this limiter's state, or
//!   one of another type: `WRONGTYPE`) shows that Redis answers: the request
//!   is answered by the policy and the failure counted, but it is no strike,
//!   starts no backoff and no degraded period (and ends those, as an answer
//!   does), so that one such key never turns away the others.
//! - **The local share starts empty.** Each degraded period (from a failed call
//!   to the next answered one) empties a key's local bucket before its first
//!   local decision of the period, so a process admits locally only what its
//!   share refills during the period, never a burst stored up while Redis was
//!   answering. A fallback while Redis answers (a request that waited out
//!   another's fetch past its deadline) empties the bucket too, once per
//!   healthy stretch between periods.
//! - **Recovery charges Redis.** What the local share admitted for a key is
//!   owed to the key's limit in Redis. The key's next call that decides in
//!   Redis asks for its own permits plus what is owed (up to the capacity),
//!   all or nothing: admitted, the debt is paid; denied or failed, it stays
//!   owed (a failed call may have run: then it is paid twice, which errs on
//!   the side of admitting less). After such a denial (a bucket that others
//!   keep near empty never holds the request and the debt at once) the key
//!   pays as it goes: each of its calls asks for the debt alone, no more
//!   than the request's own permits, and an admission pays it instead of
//!   admitting the request (denied, with the least wait), until nothing is
//!   owed. A request that leaves no room beside it within the capacity (one
//!   for the whole capacity, as every request of a capacity-1 limit is)
//!   pays as it goes at once: it could never carry the debt beside it, nor
//!   so be denied with a debt.

use core::fmt;
use core::hash::BuildHasher;
use std::collections::HashMap;
use std::hash::RandomState;

use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::decision::{Decision, KeyedDecision, RetryAfter};
use crate::keyed::KeyedLimiter;
use crate::sync::{AtomicU64, Mutex, Ordering, lock};

/// The timeouts in a row that start the backoff by default.
pub(crate) const DEFAULT_TIMEOUTS_TO_BACK_OFF: u32 = 3;

/// The ledger's shards (a key's shard is its hash's).
const SHARDS: usize = 16;
/// The fewest keys a shard keeps; a shard that is full drops the entries of
/// past periods that owe nothing, and refuses a new key if none is left to
/// drop. A ledger for a local share keeps more: see [`Ledger::for_keys`].
const SHARD_KEYS: usize = 4_096;

/// A failed call's error: whether it was a timeout, and whether it was
/// about its key alone.
pub(crate) trait Failure: fmt::Display {
    /// `true` when the call gave up at its deadline.
    fn timed_out(&self) -> bool;

    /// `true` when Redis answered, with an error about the call's key alone
    /// ([`key_error`]): no failure of Redis, to be answered for that key
    /// only, with no strike, backoff or degraded period.
    fn per_key(&self) -> bool;
}

impl Failure for super::RedisLimitError {
    fn timed_out(&self) -> bool {
        self.is_timeout()
    }

    fn per_key(&self) -> bool {
        matches!(self, super::RedisLimitError::Redis(e) if key_error(e))
    }
}

impl Failure for ::redis::RedisError {
    fn timed_out(&self) -> bool {
        self.is_timeout()
    }

    fn per_key(&self) -> bool {
        key_error(self)
    }
}

/// Whether `error` is Redis' answer that the call's key holds something
/// other than this limiter's state: a string that is not a state (the
/// scripts' error, `turnstile: … not this limiter's state`) or a value of
/// another type (`WRONGTYPE`). Redis answered, so it is up; the other keys
/// decide as before. Read from the code, and from the text for a Redis
/// before 7, which wraps a script's errors in `ERR Error running script`.
pub(crate) fn key_error(error: &::redis::RedisError) -> bool {
    match error.code() {
        Some("WRONGTYPE") => true,
        Some(_) => error.detail().is_some_and(|detail| {
            detail.contains("not this limiter's state") || detail.contains("WRONGTYPE")
        }),
        None => false,
    }
}

/// Consecutive timeouts, and when they start the backoff.
pub(crate) struct Strikes {
    /// Timeouts since the last answered call (at least `limit` once any
    /// failure has started the backoff: a failed probe restarts it at once).
    run: AtomicU64,
    /// The timeouts in a row that start the backoff (at least 1).
    limit: u64,
}

impl Strikes {
    pub(crate) fn new(limit: u32) -> Self {
        Strikes {
            run: AtomicU64::new(0),
            limit: u64::from(limit.max(1)),
        }
    }

    /// The timeouts in a row that start the backoff.
    pub(crate) fn limit(&self) -> u32 {
        u32::try_from(self.limit).unwrap_or(u32::MAX)
    }

    /// A call failed (`timeout`: by its deadline): whether the backoff starts.
    pub(crate) fn struck(&self, timeout: bool) -> bool {
        // Relaxed, all: a count that publishes no other data; a race between
        // two failures and a success at worst starts the backoff one timeout
        // late or early.
        if !timeout {
            self.run.store(self.limit, Ordering::Relaxed);
            return true;
        }
        self.run.fetch_add(1, Ordering::Relaxed) + 1 >= self.limit
    }

    /// A call was answered: the run of timeouts ends.
    #[inline]
    pub(crate) fn cleared(&self) {
        // Relaxed: as in `struck`; the load keeps a healthy call from writing
        // a line other cores read.
        if self.run.load(Ordering::Relaxed) != 0 {
            self.run.store(0, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for Strikes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Strikes")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// A key's line in the [`Ledger`].
#[derive(Clone, Copy, Default)]
struct Entry {
    /// The stretch ([`Health::stretch`](super::health::Health::stretch)) in
    /// which the key's local bucket was last emptied (0: never; stretches
    /// begin at 1).
    drained: u64,
    /// Permits the local share admitted for the key and Redis was not yet
    /// charged for.
    owed: u64,
    /// Whether the key pays as it goes: a call that asked for the request
    /// and the debt at once was denied.
    converting: bool,
}

impl Entry {
    /// What a call asking for `n` permits, with `room` more within the
    /// capacity, takes of this debt ([`Ledger::claim`]).
    fn claimable(&self, n: u32, room: u32) -> Claimed {
        // A request that leaves no room beside it (one for the whole
        // capacity: every request of a capacity-1 limit) could never carry
        // any of the debt, and, never denied with a debt beside it, would
        // never start paying as it goes: it pays as it goes at once.
        let convert = self.converting || (room == 0 && self.owed > 0);
        let most = if convert { n } else { room };
        // At most `room` or `n`, so it fits a u32.
        let take = self.owed.min(u64::from(most)) as u32;
        Claimed {
            amount: take,
            convert: convert && take > 0,
        }
    }
}

/// One shard of the [`Ledger`]: its keys' lines.
type Shard = HashMap<Vec<u8>, Entry>;

/// Per key: the degraded period whose start emptied its local bucket, and
/// what its local admissions owe Redis. Touched only by local decisions and,
/// while anything is owed, by calls to Redis; a healthy call reads one
/// atomic.
pub(crate) struct Ledger {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// The keys a shard keeps (at least [`SHARD_KEYS`]).
    shard_keys: usize,
    /// All keys' debts together: 0 lets a call skip the lookup.
    owed: AtomicU64,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger::for_keys(0)
    }
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("owed", &self.total())
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// A ledger for a local share that holds up to `max_keys` keys
    /// ([`KeyedLimiter::max_keys`]): room for each of them, so that the
    /// ledger never refuses a key the share could admit, with an eighth
    /// more per shard for an uneven spread of the keys' hashes (each shard
    /// keeps at least [`SHARD_KEYS`]). Entries take memory only once used.
    pub(crate) fn for_keys(max_keys: usize) -> Self {
        let per_shard = max_keys.div_ceil(SHARDS);
        Ledger {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            shard_keys: per_shard.saturating_add(per_shard / 8).max(SHARD_KEYS),
            owed: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        // The remainder is below SHARDS, so it fits.
        &self.shards[(self.hasher.hash_one(key) % SHARDS as u64) as usize]
    }

    /// Permits owed to Redis, all keys together.
    pub(crate) fn total(&self) -> u64 {
        // Relaxed: a hint; the entries, behind their locks, are the truth.
        self.owed.load(Ordering::Relaxed)
    }

    /// Ready `key`'s local bucket in `local` for a decision in stretch
    /// `period` ([`Health::stretch`](super::health::Health::stretch): a
    /// degraded period, or the healthy time after one): emptied, if this
    /// stretch has not emptied it yet. `false` when the ledger has no room
    /// for the key, or the local limiter none for it: the local share must
    /// not admit (what it admitted could not be charged, or was not
    /// emptied).
    pub(crate) fn prepare<A: Algorithm, C: Clock>(
        &self,
        local: &KeyedLimiter<Vec<u8>, A, C>,
        key: &[u8],
        period: u64,
    ) -> bool {
        let mut shard = lock(self.shard(key));
        if !shard.contains_key(key) && shard.len() >= self.shard_keys {
            shard.retain(|_, e| e.owed > 0 || e.drained == period);
            if shard.len() >= self.shard_keys {
                return false;
            }
        }
        let entry = shard.entry(key.to_vec()).or_default();
        if entry.drained != period {
            // Under the shard's lock: no local decision of this key begins
            // until its bucket is empty. What refills meanwhile may go too;
            // that only admits less.
            for _ in 0..4 {
                let left = local.remaining(key);
                if left == 0 {
                    break;
                }
                if let KeyedDecision::KeyLimit { .. } = local.try_uncounted(key, left) {
                    // The local limiter has no room for the key: nothing was
                    // emptied (an absent key reads as a full bucket). Not
                    // marked emptied, so that a key let in later this
                    // period is emptied first rather than admitting a
                    // whole burst; and not admitted now.
                    return false;
                }
            }
            entry.drained = period;
        }
        true
    }

    /// The local share admitted `n` permits for `key`: owed to Redis.
    pub(crate) fn owe(&self, key: &[u8], n: u32) {
        let mut shard = lock(self.shard(key));
        shard.entry(key.to_vec()).or_default().owed += u64::from(n);
        // Relaxed: a hint (see `total`), written under the lock.
        self.owed.fetch_add(u64::from(n), Ordering::Relaxed);
    }

    /// A local admission of `n` for `key` was given back to the local share:
    /// no longer owed.
    pub(crate) fn forgive(&self, key: &[u8], n: u32) {
        let mut shard = lock(self.shard(key));
        if let Some(entry) = shard.get_mut(key) {
            let n = entry.owed.min(u64::from(n));
            entry.owed -= n;
            // Relaxed: as in `owe`.
            self.owed.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Take some of `key`'s debt for a call that asks for `n` permits, with
    /// `room` more within the capacity: up to `room`, asked for beside the
    /// request, or up to `n` when the key pays as it goes or `room` is 0
    /// (see the module's rule). Give it back with [`unpaid`](Self::unpaid)
    /// unless the call admitted.
    #[inline]
    pub(crate) fn claim(&self, key: &[u8], n: u32, room: u32) -> Claimed {
        if self.total() == 0 {
            return Claimed::NONE;
        }
        self.claim_slow(key, n, room)
    }

    #[cold]
    fn claim_slow(&self, key: &[u8], n: u32, room: u32) -> Claimed {
        let mut shard = lock(self.shard(key));
        let Some(entry) = shard.get_mut(key) else {
            return Claimed::NONE;
        };
        let claimed = entry.claimable(n, room);
        entry.owed -= u64::from(claimed.amount);
        if entry.owed == 0 {
            entry.converting = false;
        }
        // Relaxed: as in `owe`.
        self.owed
            .fetch_sub(u64::from(claimed.amount), Ordering::Relaxed);
        claimed
    }

    /// What [`claim`](Self::claim) would take for the same call, taking
    /// nothing: for a peek, which asks Redis what the call would.
    pub(crate) fn peek(&self, key: &[u8], n: u32, room: u32) -> Claimed {
        if self.total() == 0 {
            return Claimed::NONE;
        }
        let shard = lock(self.shard(key));
        shard
            .get(key)
            .map_or(Claimed::NONE, |entry| entry.claimable(n, room))
    }

    /// A call that asked for its request and `key`'s debt at once was
    /// denied: the key pays as it goes from now on.
    fn convert(&self, key: &[u8]) {
        if let Some(entry) = lock(self.shard(key)).get_mut(key) {
            entry.converting = true;
        }
    }

    /// A claimed debt that a call did not pay (denied, or failed): owed
    /// again.
    pub(crate) fn unpaid(&self, key: &[u8], debt: u32) {
        if debt > 0 {
            self.owe(key, debt);
        }
    }

    /// Whether `key` owes anything.
    pub(crate) fn owes(&self, key: &[u8]) -> bool {
        self.total() != 0 && lock(self.shard(key)).get(key).is_some_and(|e| e.owed > 0)
    }
}

/// A claim on a key's debt, as a step to be made later keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claimed {
    amount: u32,
    /// Paid by the request's own admission, not asked for beside it.
    convert: bool,
}

impl Claimed {
    pub(crate) const NONE: Claimed = Claimed {
        amount: 0,
        convert: false,
    };

    /// What a peek asks Redis for, for a request of `n`: what the call
    /// with this claim would ask ([`Debt::ask`]).
    pub(crate) fn ask(self, n: u32) -> u32 {
        if self.convert {
            self.amount
        } else {
            n + self.amount
        }
    }

    /// The request's decision from Redis' answer to [`ask`](Self::ask), as
    /// [`Debt::settle`] would make it, changing nothing: paying as it goes,
    /// an admission pays the debt and is the request's denial.
    pub(crate) fn answer(self, decision: Decision) -> Decision {
        match decision {
            Decision::Allowed { .. } if self.convert => Decision::Denied {
                retry_after: RetryAfter::from_nanos(1),
            },
            decision => decision,
        }
    }
}

/// A debt claimed for a call: owed again when dropped unless the call's
/// decision [`settle`](Self::settle)s it (a future dropped mid-call, a
/// denial, a failure).
pub(crate) struct Debt<'a> {
    ledger: &'a Ledger,
    key: &'a [u8],
    claimed: Claimed,
}

impl<'a> Debt<'a> {
    /// Claim some of `key`'s debt for a call asking for `n` permits, with
    /// `room` more within the capacity.
    pub(crate) fn claim(ledger: &'a Ledger, key: &'a [u8], n: u32, room: u32) -> Self {
        Debt {
            ledger,
            key,
            claimed: ledger.claim(key, n, room),
        }
    }

    /// A claim made earlier ([`keep`](Self::keep)).
    pub(crate) fn claimed(ledger: &'a Ledger, key: &'a [u8], claimed: Claimed) -> Self {
        Debt {
            ledger,
            key,
            claimed,
        }
    }

    /// The permits to ask Redis for, for a request of `n`: the request and
    /// the debt claimed beside it, or, paying as it goes, the debt claimed
    /// alone (at most `n`): the request, admitted, only pays it, so asking
    /// for all of `n` would charge Redis for permits nobody gets.
    pub(crate) fn ask(&self, n: u32) -> u32 {
        self.claimed.ask(n)
    }

    /// Keep the claim past this guard (a step to be made later):
    /// [`claimed`](Self::claimed) makes a guard of it again.
    pub(crate) fn keep(mut self) -> Claimed {
        core::mem::replace(&mut self.claimed, Claimed::NONE)
    }

    /// The call decided: an admission pays the debt (and, paying as it goes,
    /// is the request's denial, with the least wait); a denial leaves it
    /// owed, and a denial of the request and the debt at once makes the key
    /// pay as it goes (as does a denial of a debt paid as it goes).
    pub(crate) fn settle(mut self, decision: Decision) -> Decision {
        let claimed = core::mem::replace(&mut self.claimed, Claimed::NONE);
        if let Decision::Denied { .. } = decision {
            self.ledger.unpaid(self.key, claimed.amount);
            // Denied with a debt beside the request: pay as it goes. And
            // denied paying as it goes: go on so (the claim may have taken
            // the whole debt and ended the mode).
            if claimed.amount > 0 {
                self.ledger.convert(self.key);
            }
        }
        claimed.answer(decision)
    }
}

impl Drop for Debt<'_> {
    fn drop(&mut self) {
        let Claimed { amount, convert } = self.claimed;
        self.ledger.unpaid(self.key, amount);
        // A claim that took the whole debt ended the pay-as-it-goes mode;
        // abandoned (a future dropped mid-call, a failure), the key owes
        // again and pays as it goes again, as before the claim. (A claim
        // that paid as it goes for want of room leaves the key paying as it
        // goes from now on, as a denial would: that only admits less.)
        if convert {
            self.ledger.convert(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;
    use core::time::Duration;

    #[test]
    fn three_timeouts_in_a_row_or_any_other_failure_start_the_backoff() {
        let strikes = Strikes::new(3);
        assert!(!strikes.struck(true));
        assert!(!strikes.struck(true));
        strikes.cleared();
        assert!(!strikes.struck(true));
        assert!(!strikes.struck(true));
        assert!(strikes.struck(true));
        // Until a call is answered, a probe that times out backs off again.
        assert!(strikes.struck(true));
        strikes.cleared();
        assert!(strikes.struck(false));
        assert!(strikes.struck(true), "after another failure too");
        strikes.cleared();
        assert!(!strikes.struck(true));
        assert!(Strikes::new(0).struck(true), "0 is taken as 1");
    }

    /// A key the local limiter has no room for is not marked emptied (an
    /// absent key reads as a full bucket): once room frees up in the same
    /// period it is emptied before its first local decision, instead of
    /// admitting its whole burst.
    #[test]
    fn a_key_refused_room_is_emptied_once_it_has_some() {
        let clock = crate::ManualClock::new();
        let local: KeyedLimiter<Vec<u8>, crate::TokenBucket, crate::ManualClock> =
            KeyedLimiter::builder(Quota::new(5, 1, Duration::from_secs(1)).unwrap())
                .clock(clock.clone())
                .max_keys(1)
                .build()
                .unwrap();
        let ledger = Ledger::default();
        assert!(ledger.prepare(&local, b"a", 1));
        assert!(!ledger.prepare(&local, b"b", 1), "no room: not admitted");
        // `a` refills and is swept: room for `b`, in the same period.
        clock.advance(Duration::from_secs(60));
        local.sweep();
        assert!(ledger.prepare(&local, b"b", 1));
        assert_eq!(
            local.remaining(b"b".as_slice()),
            0,
            "emptied, not a full burst"
        );
    }

    /// A request for the whole capacity leaves no room beside it: asked
    /// beside it, the debt was claimed as 0 every time, the request was
    /// admitted alone, and the key owed for good.
    #[test]
    fn a_request_that_leaves_no_room_pays_the_debt_as_it_goes() {
        let ledger = Ledger::default();
        let allowed = Decision::Allowed { remaining: 0 };
        let denied = Decision::Denied {
            retry_after: RetryAfter::from_nanos(5),
        };
        ledger.owe(b"k", 4);
        // Capacity 1: every request asks for it all.
        let debt = Debt::claim(&ledger, b"k", 1, 0);
        assert_eq!(debt.ask(1), 1, "the debt, up to the request's permits");
        assert!(debt.settle(allowed).is_denied(), "its admission pays");
        assert_eq!(ledger.total(), 3);
        // Denied: owed again, and still paid as it goes.
        assert_eq!(Debt::claim(&ledger, b"k", 1, 0).settle(denied), denied);
        assert_eq!(ledger.total(), 3);
        // A larger capacity, asked for whole: the debt alone, at most `n`.
        let debt = Debt::claim(&ledger, b"k", 2, 0);
        assert_eq!(debt.ask(2), 2);
        assert!(debt.settle(allowed).is_denied());
        assert_eq!(ledger.total(), 1);
        let debt = Debt::claim(&ledger, b"k", 3, 0);
        assert_eq!(debt.ask(3), 1, "the debt alone, not the request");
        assert!(debt.settle(allowed).is_denied());
        assert_eq!(ledger.total(), 0);
        // Nothing owed: the request alone, and its admission admits.
        let debt = Debt::claim(&ledger, b"k", 1, 0);
        assert_eq!(debt.ask(1), 1);
        assert_eq!(debt.settle(allowed), allowed);
        // Abandoned for want of room: owed again, paid as it goes after.
        ledger.owe(b"k", 1);
        drop(Debt::claim(&ledger, b"k", 1, 0));
        assert_eq!(ledger.total(), 1);
        let debt = Debt::claim(&ledger, b"k", 1, 5);
        assert_eq!(debt.ask(1), 1, "paying as it goes, with room now");
        assert!(debt.settle(allowed).is_denied());
        assert_eq!(ledger.total(), 0);
    }

    #[test]
    fn a_period_empties_the_local_bucket_once_and_debts_are_claimed_and_restored() {
        let local: KeyedLimiter<Vec<u8>> =
            KeyedLimiter::new(Quota::new(5, 1, Duration::from_secs(60)).unwrap());
        let ledger = Ledger::default();
        assert!(ledger.prepare(&local, b"k", 1));
        assert_eq!(local.remaining(b"k".as_slice()), 0, "emptied");
        // Not again within the period: a refill stays (none here in a minute).
        assert!(ledger.prepare(&local, b"k", 1));
        ledger.owe(b"k", 3);
        assert!(ledger.owes(b"k") && !ledger.owes(b"j"));
        assert_eq!(ledger.claim(b"k", 1, 2).amount, 2);
        ledger.unpaid(b"k", 2);
        let allowed = Decision::Allowed { remaining: 0 };
        let denied = Decision::Denied {
            retry_after: RetryAfter::from_nanos(5),
        };
        {
            let debt = Debt::claim(&ledger, b"k", 1, 10);
            assert_eq!(debt.ask(1), 4, "the request and the debt");
            assert_eq!(ledger.total(), 0);
        }
        assert_eq!(ledger.total(), 3, "dropped unpaid: owed again");
        // Denied with the debt: owed again, and paid as it goes after.
        assert_eq!(Debt::claim(&ledger, b"k", 1, 10).settle(denied), denied);
        assert_eq!(ledger.total(), 3);
        let debt = Debt::claim(&ledger, b"k", 2, 10);
        assert_eq!(debt.ask(2), 2, "the debt, up to the request's permits");
        assert!(debt.settle(allowed).is_denied(), "its admission pays");
        assert_eq!(ledger.total(), 1);
        let debt = Debt::claim(&ledger, b"k", 2, 10);
        assert_eq!(debt.ask(2), 1, "the debt alone, not the request");
        assert!(debt.settle(allowed).is_denied());
        assert_eq!(ledger.total(), 0);
        // Denied paying the whole debt as it goes: still paying as it goes.
        ledger.owe(b"k", 1);
        ledger.convert(b"k");
        let debt = Debt::claim(&ledger, b"k", 3, 10);
        assert_eq!(debt.ask(3), 1);
        assert_eq!(debt.settle(denied), denied);
        assert_eq!(ledger.total(), 1);
        let debt = Debt::claim(&ledger, b"k", 3, 10);
        assert_eq!(debt.ask(3), 1, "paying as it goes still");
        assert!(debt.settle(allowed).is_denied());
        assert_eq!(ledger.total(), 0);
        // Abandoned while paying the whole debt as it goes: owed again and
        // still paid as it goes, not asked for beside the next request.
        ledger.owe(b"k", 1);
        ledger.convert(b"k");
        {
            let debt = Debt::claim(&ledger, b"k", 3, 10);
            assert_eq!(debt.ask(3), 1);
        }
        assert_eq!(ledger.total(), 1, "dropped: owed again");
        let debt = Debt::claim(&ledger, b"k", 3, 10);
        assert_eq!(debt.ask(3), 1, "paying as it goes still, after a drop");
        assert!(debt.settle(allowed).is_denied());
        assert_eq!(ledger.total(), 0);
        assert_eq!(Debt::claim(&ledger, b"k", 1, 10).settle(allowed), allowed);
        ledger.owe(b"k", 2);
        let debt = Debt::claim(&ledger, b"k", 1, 10);
        assert_eq!(debt.ask(1), 3, "asked beside the request again");
        assert_eq!(debt.settle(allowed), allowed);
        ledger.owe(b"k", 2);
        ledger.forgive(b"k", 5);
        assert_eq!(ledger.total(), 0);
        assert_eq!(ledger.claim(b"k", 1, 9), Claimed::NONE);
    }
}
