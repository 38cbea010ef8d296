//! Model checks of the compare-and-swap cell under every interleaving loom can
//! reach (bounded by `LOOM_MAX_PREEMPTIONS`).
//!
//! ```text
//! RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom
//! ```
#![cfg(turnstile_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::sync::atomic::Ordering::SeqCst;
use loom::thread;
use turnstile::{
    Algorithm, ConcurrencyLimiter, Decision, FixedWindow, Gcra, KeyedLimiter, LiveTokenBucket,
    ManualClock, Quota, RateLimiter, SlidingWindow, TokenBucket, WarmUp, chain,
};

type Limiter = RateLimiter<TokenBucket, ManualClock>;
type Keyed = KeyedLimiter<u64, TokenBucket, ManualClock, ahash::RandomState>;

/// A keyed limiter small enough to model: one shard and a fixed hasher, so every
/// execution hashes alike and every key meets every sweep.
fn keyed(capacity: u32, period: Duration) -> (Arc<Keyed>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64>::builder(Quota::new(capacity, 1, period).unwrap())
        .clock(clock.clone())
        .hasher(ahash::RandomState::with_seeds(1, 2, 3, 4))
        .shards(1)
        .max_keys(16)
        .build()
        .unwrap();
    (Arc::new(limiter), clock)
}

/// How many of `tries` acquires of one permit for `key` are admitted.
fn admitted(limiter: &Keyed, key: u64, tries: u32) -> u32 {
    (0..tries)
        .map(|_| limiter.try_acquire(&key).is_allowed() as u32)
        .sum()
}

/// [`admitted`] on a thread of its own.
fn spawn_admitted(limiter: &Arc<Keyed>, key: u64, tries: u32) -> thread::JoinHandle<u32> {
    let limiter = limiter.clone();
    thread::spawn(move || admitted(&limiter, key, tries))
}

fn limiter(capacity: u32, period: Duration) -> (Arc<Limiter>, ManualClock) {
    let clock = ManualClock::new();
    let quota = Quota::new(capacity, 1, period).unwrap();
    (
        Arc::new(RateLimiter::with_clock(quota, clock.clone())),
        clock,
    )
}

/// `k` threads acquire one permit each at the same instant from a limiter of
/// capacity `c`: exactly `min(k, c)` are admitted, and the limiter holds what is
/// left. The one argument for every algorithm: the cell's compare-and-swap.
fn k_threads_on_capacity_c<A>(k: u32, algorithm: impl Fn() -> A + Sync + Send + 'static)
where
    A: Algorithm + Send + Sync + 'static,
{
    loom::model(move || {
        let a = algorithm();
        let c = a.capacity();
        let limiter = Arc::new(RateLimiter::from_parts(a, ManualClock::new()));
        let threads: Vec<_> = (0..k)
            .map(|_| {
                let limiter = limiter.clone();
                thread::spawn(move || limiter.try_acquire())
            })
            .collect();
        let decisions: Vec<Decision> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let admitted = decisions.iter().filter(|d| d.is_allowed()).count() as u32;
        assert_eq!(admitted, k.min(c), "{decisions:?}");
        assert_eq!(limiter.remaining(), c - admitted);
        // Every admitted decision reports a distinct number of permits left: no
        // two threads spent the same one.
        let mut left: Vec<u32> = decisions.iter().filter_map(|d| d.remaining()).collect();
        left.sort_unstable();
        left.dedup();
        assert_eq!(left.len() as u32, admitted);
    });
}

fn bucket(c: u32) -> impl Fn() -> TokenBucket + Sync + Send + 'static {
    move || TokenBucket::new(Quota::new(c, 1, Duration::from_secs(1)).unwrap())
}

fn fixed(c: u32) -> impl Fn() -> FixedWindow + Sync + Send + 'static {
    move || FixedWindow::new(c, Duration::from_secs(1)).unwrap()
}

fn sliding(c: u32) -> impl Fn() -> SlidingWindow + Sync + Send + 'static {
    move || SlidingWindow::new(c, Duration::from_secs(1)).unwrap()
}

fn gcra(c: u32) -> impl Fn() -> Gcra + Sync + Send + 'static {
    move || Gcra::new(Quota::new(c, 1, Duration::from_secs(1)).unwrap())
}

fn warm_up(c: u32) -> impl Fn() -> WarmUp + Sync + Send + 'static {
    move || {
        let quota = Quota::new(c, 1, Duration::from_secs(1)).unwrap();
        WarmUp::new(quota, Duration::from_secs(4), 3.0).unwrap()
    }
}

#[test]
fn two_threads_capacity_one() {
    k_threads_on_capacity_c(2, bucket(1));
}

#[test]
fn two_threads_capacity_two() {
    k_threads_on_capacity_c(2, bucket(2));
}

#[test]
fn three_threads_capacity_two() {
    k_threads_on_capacity_c(3, bucket(2));
}

#[test]
fn three_threads_capacity_one() {
    k_threads_on_capacity_c(3, bucket(1));
}

#[test]
fn fixed_window_two_threads_limit_one() {
    k_threads_on_capacity_c(2, fixed(1));
}

#[test]
fn fixed_window_three_threads_limit_two() {
    k_threads_on_capacity_c(3, fixed(2));
}

#[test]
fn sliding_window_two_threads_limit_one() {
    k_threads_on_capacity_c(2, sliding(1));
}

#[test]
fn sliding_window_three_threads_limit_two() {
    k_threads_on_capacity_c(3, sliding(2));
}

#[test]
fn gcra_two_threads_burst_one() {
    k_threads_on_capacity_c(2, gcra(1));
}

#[test]
fn gcra_three_threads_burst_two() {
    k_threads_on_capacity_c(3, gcra(2));
}

#[test]
fn warm_up_two_threads_burst_one() {
    k_threads_on_capacity_c(2, warm_up(1));
}

#[test]
fn warm_up_three_threads_burst_two() {
    k_threads_on_capacity_c(3, warm_up(2));
}

/// Two threads run a chain of a per-caller stage (capacity 2) and a global
/// stage (capacity 1). Exactly one is admitted; the other's refund of the first
/// stage races the winner's spend. The first stage never ends with more than
/// one permit left of two (a refund never gives back what it did not take);
/// for the windows, whose refunds are always exact, it ends with exactly one.
/// The token bucket, GCRA and the warm-up keep a refund's permits spent when another
/// admission landed on the word in between, so there it may end with none.
fn chain_refund_races_a_spend<A>(first: impl Fn() -> A + Sync + Send + 'static, exact: bool)
where
    A: Algorithm + Send + Sync + 'static,
{
    loom::model(move || {
        let clock = ManualClock::new();
        let a = first();
        let c = a.capacity();
        let first = Arc::new(RateLimiter::from_parts(a, clock.clone()));
        let global = Arc::new(RateLimiter::from_parts(bucket(1)(), clock.clone()));
        let other = {
            let (first, global) = (first.clone(), global.clone());
            thread::spawn(move || chain::try_acquire(&[&*first, &*global]).is_allowed() as u32)
        };
        let admitted =
            chain::try_acquire(&[&*first, &*global]).is_allowed() as u32 + other.join().unwrap();
        assert_eq!(admitted, 1);
        assert_eq!(global.remaining(), 0);
        let left = first.remaining();
        assert!(
            left < c,
            "a refund gave back more than it took: {left} left"
        );
        if exact {
            assert_eq!(left, c - 1, "a refund was lost");
        } else {
            assert!(
                left >= c - 2,
                "more than the loser's permit kept: {left} left"
            );
        }
    });
}

#[test]
fn chain_refund_token_bucket() {
    chain_refund_races_a_spend(bucket(2), false);
}

#[test]
fn chain_refund_fixed_window() {
    chain_refund_races_a_spend(fixed(2), true);
}

#[test]
fn chain_refund_sliding_window() {
    chain_refund_races_a_spend(sliding(2), true);
}

#[test]
fn chain_refund_gcra() {
    chain_refund_races_a_spend(gcra(2), false);
}

#[test]
fn chain_refund_warm_up() {
    chain_refund_races_a_spend(warm_up(2), false);
}

/// One thread's chain is refused by the global stage while no other admission
/// touches the first stage: the refund is exact for every algorithm, whatever
/// the interleaving with a thread that only peeks.
#[test]
fn chain_refund_without_a_competing_spend_is_exact() {
    fn check<A: Algorithm + Send + Sync + 'static>(first: impl Fn() -> A + Sync + Send + 'static) {
        loom::model(move || {
            let clock = ManualClock::new();
            let a = first();
            let c = a.capacity();
            let first = Arc::new(RateLimiter::from_parts(a, clock.clone()));
            let global = Arc::new(RateLimiter::from_parts(bucket(1)(), clock.clone()));
            assert!(global.try_acquire().is_allowed()); // the global stage is empty
            let peeker = {
                let first = first.clone();
                thread::spawn(move || first.remaining())
            };
            assert!(!chain::try_acquire(&[&*first, &*global]).is_allowed());
            let seen = peeker.join().unwrap();
            assert!(seen == c || seen == c - 1, "{seen}");
            assert_eq!(first.remaining(), c);
        });
    }
    check(bucket(2));
    check(fixed(2));
    check(sliding(2));
    check(gcra(2));
    check(warm_up(2));
}

/// Three threads each try to run a call behind a bulkhead of 2, and release
/// when done; a fourth counter tracks holders. Never more than 2 hold at once,
/// at least 2 calls run (the first two to try cannot both fail), and every
/// permit comes back.
#[test]
fn concurrency_limiter_bounds_holders_and_loses_no_permit() {
    loom::model(|| {
        // std's `Arc`: owned permits hold one (loom's counter inside is modelled).
        let bulkhead = std::sync::Arc::new(ConcurrencyLimiter::new(2).unwrap());
        let holders = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (bulkhead, holders) = (bulkhead.clone(), holders.clone());
                thread::spawn(move || {
                    let Some(permit) = bulkhead.try_acquire_owned() else {
                        return 0;
                    };
                    let held = holders.fetch_add(1, SeqCst) + 1;
                    assert!(held <= 2, "{held} holders");
                    holders.fetch_sub(1, SeqCst);
                    drop(permit);
                    1
                })
            })
            .collect();
        let ran: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(ran >= 2, "{ran} ran");
        assert_eq!(bulkhead.in_flight(), 0);
    });
}

/// Two threads acquire while a third moves the clock forward by one period, then
/// another, from an empty bucket of capacity 2. Whatever the interleaving, no
/// token is created or lost: the two refills are either admitted or still in the
/// bucket at the end.
#[test]
fn clock_advancing_between_operations_creates_and_loses_nothing() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, clock) = limiter(2, period);
        assert!(limiter.try_acquire_n(2).unwrap().is_allowed()); // empty at t = 0
        let acquirers: Vec<_> = (0..2)
            .map(|_| {
                let limiter = limiter.clone();
                thread::spawn(move || limiter.try_acquire().is_allowed())
            })
            .collect();
        let ticker = {
            let clock = clock.clone();
            thread::spawn(move || {
                clock.advance(period);
                clock.advance(period);
            })
        };
        ticker.join().unwrap();
        let admitted = acquirers
            .into_iter()
            .map(|t| t.join().unwrap() as u32)
            .sum::<u32>();
        assert_eq!(clock.elapsed(), 2 * period);
        assert_eq!(admitted + limiter.remaining(), 2, "admitted {admitted}");
    });
}

/// One thread acquires, advances the clock and acquires again while another
/// acquires, on a capacity-1 bucket with one token due at 10 ms and one at 20 ms.
/// The first thread's first request always reads 10 ms (only it advances the
/// clock), so neither token can be dropped by a full bucket: exactly two are
/// admitted, whoever gets them, and none is left.
#[test]
fn a_thread_advancing_its_own_clock_races_another() {
    loom::model(|| {
        let period = Duration::from_millis(10);
        let (limiter, clock) = limiter(1, period);
        assert!(limiter.try_acquire().is_allowed()); // empty at t = 0
        clock.advance(period); // one token due
        let first = {
            let (limiter, clock) = (limiter.clone(), clock.clone());
            thread::spawn(move || {
                let a = limiter.try_acquire().is_allowed() as u32;
                clock.advance(period);
                a + limiter.try_acquire().is_allowed() as u32
            })
        };
        let second = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.try_acquire().is_allowed() as u32)
        };
        let admitted = first.join().unwrap() + second.join().unwrap();
        assert_eq!(admitted, 2);
        assert_eq!(limiter.remaining(), 0);
    });
}

/// Two threads touch one new key of a capacity-1 bucket at once: both miss, both
/// race to insert, and exactly one is admitted from the one bucket they share.
#[test]
fn keyed_first_touch_by_two_threads_shares_one_bucket() {
    loom::model(|| {
        let (limiter, _clock) = keyed(1, Duration::from_secs(1));
        let other = spawn_admitted(&limiter, 7, 1);
        let admitted = admitted(&limiter, 7, 1) + other.join().unwrap();
        assert_eq!(admitted, 1);
        assert_eq!(limiter.len(), 1);
    });
}

/// A sweep runs while two acquires on the same key are in flight. The key's
/// bucket holds one token and is fresh-equivalent (full) when they start, so the
/// sweep may evict it; but it must never evict it after a token was spent, or the
/// second acquire would find a fresh bucket and be admitted too.
#[test]
fn keyed_sweep_racing_acquires_on_one_key_admits_one_bucket_at_most() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, clock) = keyed(1, period);
        assert!(limiter.try_acquire(&7).is_allowed());
        clock.advance(period); // full again: fresh-equivalent
        let sweeper = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.sweep())
        };
        let other = spawn_admitted(&limiter, 7, 1);
        let admitted = admitted(&limiter, 7, 1) + other.join().unwrap();
        let evicted = sweeper.join().unwrap();
        assert_eq!(admitted, 1, "evicted {evicted}");
        assert_eq!(limiter.remaining(&7), 0);
    });
}

/// An insert of a new key races a sweep of its shard, which also holds a key
/// that is fresh-equivalent: the new key's spend survives whatever the sweep
/// removes.
#[test]
fn keyed_insert_racing_a_sweep_of_its_shard_loses_nothing() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, clock) = keyed(1, period);
        assert!(limiter.try_acquire(&1).is_allowed());
        clock.advance(period); // key 1 is fresh-equivalent
        let sweeper = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.sweep())
        };
        assert!(limiter.try_acquire(&2).is_allowed());
        let evicted = sweeper.join().unwrap();
        assert!(evicted <= 1, "only key 1 may go");
        assert_eq!(limiter.remaining(&2), 0, "key 2's spend is kept");
        assert!(limiter.try_acquire(&2).is_denied());
        assert_eq!(limiter.len(), 2 - evicted);
    });
}

/// The over-admission this map was rebuilt to rule out: a decision reads the
/// clock, is delayed, and meanwhile time passes, a sweep unlinks its key's
/// (now fresh-equivalent) word and a second sweep frees it. The late decision
/// then misses the key and starts a fresh word.
///
/// Capacity 1, one token a second: the key spends its token at 0 s; over
/// `[0 s, 1 s]` at most 2 permits exist. The late decision and one more at 1 s
/// must not get 2 more between them.
///
/// A new key reads the clock under its shard's lock, after any sweep that freed
/// its last word, so a fresh word is never decided at a reading older than the
/// one that judged it. Built with `--cfg turnstile_mutant="stale_insert_reading"`
/// (the insert path decides at the reading taken before the lookup, as the
/// first keyed map did) this model fails: the late decision admits a fresh word
/// at 0 s and the final one is admitted at 1 s, 3 permits in all. It fails
/// too under the mutants of the next model (`no_recheck`, `no_grace`), which
/// free the word while the late decision can still land in it.
#[test]
#[cfg_attr(
    any(
        turnstile_mutant = "stale_insert_reading",
        turnstile_mutant = "no_recheck",
        turnstile_mutant = "no_grace"
    ),
    should_panic
)]
fn keyed_decision_delayed_across_sweeps_never_starts_a_fresh_word_early() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, clock) = keyed(1, period);
        assert!(limiter.try_acquire(&7).is_allowed()); // empty at 0 s
        let late = spawn_admitted(&limiter, 7, 1);
        clock.advance(period); // full again: fresh-equivalent
        limiter.sweep(); // unlinks it
        limiter.sweep(); // frees it, once no reader holds it
        let late = late.join().unwrap();
        let last = admitted(&limiter, 7, 1);
        assert!(1 + late + last <= 2, "late {late}, last {last}");
    });
}

/// A decision that found its key's word keeps deciding on it while a sweep
/// unlinks it: its compare-and-swap lands in the key's slot, which waits in
/// limbo and is freed only when no reader holds it *and* its word is
/// fresh-equivalent again; a later decision links it back.
///
/// Capacity 2, one token a second: 1 spent at 0 s; over `[0 s, 1 s]` at most 3
/// permits exist. Fails when built with `--cfg turnstile_mutant="no_recheck"`
/// (keys in limbo freed without judging their word again: the late admission is
/// forgotten and the final two are both admitted) and with
/// `--cfg turnstile_mutant="no_grace"` (freed while the late decision still
/// holds the slot: its admission lands in a freed word), and with
/// `stale_insert_reading` (once the sweeps have freed the word, the late
/// decision starts a fresh one at 0 s, and the final two are both admitted).
#[test]
#[cfg_attr(
    any(
        turnstile_mutant = "stale_insert_reading",
        turnstile_mutant = "no_recheck",
        turnstile_mutant = "no_grace"
    ),
    should_panic
)]
fn keyed_decision_racing_an_unlink_is_kept_until_its_word_is_fresh_again() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, clock) = keyed(2, period);
        assert!(limiter.try_acquire(&7).is_allowed()); // 1 left at 0 s
        let late = spawn_admitted(&limiter, 7, 1);
        clock.advance(period); // full again: fresh-equivalent
        limiter.sweep();
        limiter.sweep();
        let late = late.join().unwrap();
        let last = admitted(&limiter, 7, 2);
        assert!(1 + late + last <= 3, "late {late}, last {last}");
    });
}

/// Inserts grow the shard's table (every key and word moves into a new one)
/// while another thread decides twice on a key already held: both decisions
/// land in the key's one word, before the move or after it. A rebuild closes
/// the table and waits out the readers pinned before it moves a word; built
/// with `--cfg turnstile_mutant="no_grace"` (it moves them at once) this model
/// fails: a decision that found the word in the old table lands its
/// compare-and-swap there after the copy, and both decisions are admitted
/// with one permit left.
#[test]
#[cfg_attr(turnstile_mutant = "no_grace", should_panic)]
fn keyed_index_growth_racing_decisions_on_a_held_key_loses_nothing() {
    loom::model(|| {
        let (limiter, _clock) = keyed(2, Duration::from_secs(1));
        // Keys 1 to 5 fill the smallest table to just below its growth point.
        for key in 1..=5 {
            assert!(limiter.try_acquire(&key).is_allowed());
        }
        let grower = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                assert!(limiter.try_acquire(&6).is_allowed());
                assert!(limiter.try_acquire(&7).is_allowed()); // grows the table
            })
        };
        // Key 1 has 1 permit left: exactly one of two decisions gets it.
        let admitted = admitted(&limiter, 1, 2);
        grower.join().unwrap();
        assert_eq!(admitted, 1);
        assert_eq!(limiter.remaining(&1), 0);
        assert_eq!(limiter.len(), 7);
    });
}

/// A key waiting in limbo when its shard's table grows moves with its word:
/// a decision that landed in the word after the unlink is kept (the growth
/// waits for it, then judges the word again and keeps the key in limbo), and
/// the key, linked again later, decides on that word.
///
/// Capacity 2, one token a second: 1 spent at 0 s; over `[0 s, 1 s]` at most 3
/// permits exist. Fails when built with `--cfg turnstile_mutant="no_recheck"`
/// (the growth frees the key without judging its word again: the late
/// admission is forgotten) and with `--cfg turnstile_mutant="no_grace"` (the
/// growth copies the word while the late decision can still land in the old
/// table), and with `stale_insert_reading` (the late decision, sent to the
/// writer's path by the unlink or the closed table, starts a fresh word at its
/// reading from before the clock moved, once the growth has freed the key).
#[test]
#[cfg_attr(
    any(
        turnstile_mutant = "stale_insert_reading",
        turnstile_mutant = "no_recheck",
        turnstile_mutant = "no_grace"
    ),
    should_panic
)]
fn keyed_key_in_limbo_moved_by_growth_keeps_its_word() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, clock) = keyed(2, period);
        assert!(limiter.try_acquire(&7).is_allowed()); // 1 left at 0 s
        let late = spawn_admitted(&limiter, 7, 1);
        clock.advance(period); // full again: fresh-equivalent
        limiter.sweep(); // unlinks it
        // Six new keys grow the table, moving key 7's slot.
        for key in 1..=6 {
            assert!(limiter.try_acquire(&key).is_allowed());
        }
        let late = late.join().unwrap();
        let last = admitted(&limiter, 7, 2);
        assert!(1 + late + last <= 3, "late {late}, last {last}");
    });
}

/// Sweeps evict six of seven keys and then shrink the shard's table (every
/// key left moves into a smaller one) while another thread decides twice on
/// the key that stays: both decisions land in its one word, before the move
/// or after it. Fails, as the growth model does, when built with
/// `--cfg turnstile_mutant="no_grace"`.
#[test]
#[cfg_attr(turnstile_mutant = "no_grace", should_panic)]
fn keyed_table_shrink_racing_decisions_on_a_held_key_loses_nothing() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, clock) = keyed(2, period);
        // Seven keys grow the table to 16 slots.
        for key in 1..=7 {
            assert!(limiter.try_acquire(&key).is_allowed());
        }
        clock.advance(period); // keys 2 to 7 full again: fresh-equivalent
        assert!(limiter.try_acquire(&1).is_allowed()); // key 1: 1 left
        let decider = spawn_admitted(&limiter, 1, 2);
        // Unlink keys 2 to 7, free them once no reader holds them, and shrink
        // the table to the one key left.
        for _ in 0..3 {
            limiter.sweep();
        }
        let admitted = decider.join().unwrap();
        assert_eq!(admitted, 1);
        assert_eq!(limiter.remaining(&1), 0);
        assert_eq!(limiter.len(), 1);
    });
}

/// A key type with drop glue: freeing one runs its `Drop` (a `String`'s
/// deallocation), and the model's data-race check covers the free.
type KeyedStrings = KeyedLimiter<String, TokenBucket, ManualClock, ahash::RandomState>;

/// [`keyed`] with `String` keys, `shards` shards and a bound of `max_keys`.
fn keyed_strings(
    capacity: u32,
    period: Duration,
    shards: usize,
    max_keys: usize,
) -> (Arc<KeyedStrings>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<String>::builder(Quota::new(capacity, 1, period).unwrap())
        .clock(clock.clone())
        .hasher(ahash::RandomState::with_seeds(1, 2, 3, 4))
        .shards(shards)
        .max_keys(max_keys)
        .build()
        .unwrap();
    (Arc::new(limiter), clock)
}

/// How many of `tries` acquires of one permit for `key` are admitted.
fn admitted_str(limiter: &KeyedStrings, key: &str, tries: u32) -> u32 {
    (0..tries)
        .map(|_| limiter.try_acquire(key).is_allowed() as u32)
        .sum()
}

/// As `keyed_decision_racing_an_unlink_is_kept_until_its_word_is_fresh_again`,
/// with `String` keys: the key a late decision compares is freed (its
/// `String` dropped) only once no reader holds it, and its word is kept.
/// Fails under the same mutants, `no_grace` also as a data race between the
/// reader's comparison and the free.
#[test]
#[cfg_attr(
    any(
        turnstile_mutant = "stale_insert_reading",
        turnstile_mutant = "no_recheck",
        turnstile_mutant = "no_grace"
    ),
    should_panic
)]
fn keyed_string_key_racing_its_unlink_and_free_is_kept() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, clock) = keyed_strings(2, period, 1, 16);
        assert!(limiter.try_acquire("seven").is_allowed()); // 1 left at 0 s
        let late = {
            let limiter = limiter.clone();
            thread::spawn(move || admitted_str(&limiter, "seven", 1))
        };
        clock.advance(period); // full again: fresh-equivalent
        limiter.sweep();
        limiter.sweep();
        let late = late.join().unwrap();
        let last = admitted_str(&limiter, "seven", 2);
        assert!(1 + late + last <= 3, "late {late}, last {last}");
    });
}

/// Two shards and a bound of one key, reached: a new key reclaims room by
/// sweeping an idle key (in its own shard or the other) while another
/// thread decides on that idle key. The idle key's spend is never lost:
/// capacity 1, one token a second, spent at 0 s: at 1 s one token, which the
/// late decision took or the key still holds. Fails under `no_recheck` (a
/// key in limbo freed without judging its word again: the racing spend is
/// forgotten).
#[test]
#[cfg_attr(turnstile_mutant = "no_recheck", should_panic)]
fn keyed_new_key_at_the_bound_reclaiming_a_key_in_use_loses_nothing() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, clock) = keyed_strings(1, period, 2, 1);
        assert!(limiter.try_acquire("a").is_allowed()); // empty at 0 s
        clock.advance(period); // "a" full again: sweepable
        let user = {
            let limiter = limiter.clone();
            thread::spawn(move || admitted_str(&limiter, "a", 1))
        };
        // At the bound: room comes only from "a".
        let b = limiter.try_acquire("b");
        let late = user.join().unwrap();
        // "b" may be refused if "a" was in use; either way "a" is exact:
        // one token at 1 s, taken by the late decision or still there.
        limiter.sweep();
        limiter.sweep();
        let left = limiter.remaining("a");
        assert_eq!(late + left, 1, "late {late}, left {left}, b {b:?}");
        assert!(limiter.len() <= 1);
    });
}

#[path = "../tests/model/mod.rs"]
mod model;

/// Two changes of a live quota race a decision that reads the clock after
/// moving it on. Whatever the interleaving, the decision and the bucket
/// left behind are those of *some* order of the three operations, each
/// change reading the clock before or after the move (the model of
/// [`turnstile::LiveTokenBucket`]'s rule, `tests/model`): a decision never
/// mixes one quota's parameters with another's word. A decision that took the
/// quota in force instead of the one its word names gives `(4, 8)` in some
/// interleaving, which no order gives, and this model then fails.
#[test]
fn live_quota_changes_racing_a_decision_decide_as_some_order() {
    live_changes_racing_a_decision(4, 1, rising_quotas());
}

/// As above, with a request for three: under the first quota a denial, which
/// writes nothing, so no compare-and-swap checks the parameters it read; it
/// reads them between two readings of the slot's sequence number. A denial
/// returned without that check mixes, in some interleaving, a slot the
/// second change rewrote with a word of the first quota, and fails this.
#[test]
fn live_quota_changes_racing_a_denial_decide_as_some_order() {
    live_changes_racing_a_decision(4, 3, rising_quotas());
}

/// As above, with a first change that refills fast and a second that
/// refills slowly: a denial decided on a word of the first quota with the
/// slot the second change rewrote (read whole under its sequence number)
/// finds the bucket empty where every order finds it refilled, and must be
/// decided again on the word the changes left (`RECHECK_DENIAL`).
#[test]
fn live_quota_changes_racing_a_denial_with_the_fast_quota_between() {
    let ms = Duration::from_millis;
    let q0 = Quota::new(4, 1, ms(20)).unwrap();
    let fast = Quota::new(4, 4, ms(1)).unwrap();
    let slow = Quota::new(4, 1, ms(100)).unwrap();
    live_changes_racing_a_decision(4, 3, [q0, fast, slow]);
}

/// A bucket of 4 refilled 1 per 20 ms, changed to 2 per 10 ms, then to 8
/// refilled 4 per 10 ms.
fn rising_quotas() -> [Quota; 3] {
    let ms = Duration::from_millis;
    [
        Quota::new(4, 1, ms(20)).unwrap(),
        Quota::new(4, 2, ms(10)).unwrap(),
        Quota::new(8, 4, ms(10)).unwrap(),
    ]
}

/// Two changes (to `quotas[1]`, then `quotas[2]`) race a decision for `n`
/// permits on a live bucket of `quotas[0]` that spent `spent` at 0 ms;
/// every outcome must be some order's.
fn live_changes_racing_a_decision(spent: u32, n: u32, quotas: [Quota; 3]) {
    let ms = Duration::from_millis;
    let [q0, q1, q2] = quotas;
    // Every order: the decision before both changes, between them or after;
    // each change at 25 ms or 35 ms, whatever its place (a change reads the
    // clock before it converts, so it may read 25 ms and land after the
    // decision).
    let mut allowed = Vec::new();
    for position in 0..=2 {
        for (c1, c2) in [(25, 25), (25, 35), (35, 35)] {
            let mut m = model::Model::denial_writes_nothing(q0);
            let _ = m.acquire(0, spent);
            let mut decision = None;
            for step in 0..2 {
                if step == position {
                    decision = Some(m.acquire(35_000_000, n));
                }
                if step == 0 {
                    m.set_quota(q1, c1 * 1_000_000);
                } else {
                    m.set_quota(q2, c2 * 1_000_000);
                }
            }
            if position == 2 {
                decision = Some(m.acquire(35_000_000, n));
            }
            allowed.push((decision.unwrap(), m.remaining(35_000_000)));
        }
    }
    let allowed = std::sync::Arc::new(allowed);
    loom::model(move || {
        let clock = ManualClock::new();
        let limiter = Arc::new(RateLimiter::from_parts(
            LiveTokenBucket::new(q0).unwrap(),
            clock.clone(),
        ));
        assert!(limiter.try_acquire_n(spent).unwrap().is_allowed());
        clock.advance(ms(25));
        let changer = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                limiter.set_quota(q1).unwrap();
                limiter.set_quota(q2).unwrap();
            })
        };
        clock.advance(ms(10));
        let decision = limiter.try_acquire_n(n).unwrap();
        changer.join().unwrap();
        let outcome = (decision, limiter.remaining());
        assert!(
            allowed.contains(&outcome),
            "{outcome:?} is no order's outcome: {allowed:?}"
        );
    });
}

/// A change of a keyed limiter's live quota races a decision on a held key and
/// the first decision on a new key. Whatever the interleaving, each key ends
/// as in some order of the change and its decision: the held key converted
/// after or before its decision, and the new key created in the old quota and
/// converted, or created in the new one. A change that skipped the walk over
/// held keys, or new keys always made in the first slot's quota, fail it.
#[test]
fn keyed_live_change_racing_a_held_key_and_a_new_key_decides_as_some_order() {
    let ms = Duration::from_millis;
    let q1 = Quota::new(4, 1, ms(20)).unwrap();
    let q2 = Quota::new(2, 2, ms(10)).unwrap();
    // (decision, remaining after) for a key holding `tokens` of q1 at 0 ms,
    // decided at 30 ms before or after a change read at 30 ms.
    let orders = |tokens: u32| {
        let mut outcomes = Vec::new();
        for change_first in [false, true] {
            let mut m = model::Model::denial_writes_nothing(q1);
            if tokens < 4 {
                let _ = m.acquire(0, 4 - tokens);
            }
            let now = 30_000_000;
            let d = if change_first {
                m.set_quota(q2, now);
                m.acquire(now, 1)
            } else {
                let d = m.acquire(now, 1);
                m.set_quota(q2, now);
                d
            };
            outcomes.push((d, m.remaining(now)));
        }
        outcomes
    };
    let held = std::sync::Arc::new(orders(0));
    let new = std::sync::Arc::new(orders(4));
    loom::model(move || {
        let clock = ManualClock::new();
        let limiter = Arc::new(
            turnstile::KeyedBuilder::<u64, _>::new(LiveTokenBucket::new(q1).unwrap())
                .clock(clock.clone())
                .hasher(ahash::RandomState::with_seeds(1, 2, 3, 4))
                .shards(1)
                .max_keys(16)
                .build()
                .unwrap(),
        );
        assert!(limiter.try_acquire_n(&1, 4).unwrap().is_allowed()); // empty at 0
        clock.advance(ms(30));
        let changer = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.set_quota(q2).unwrap())
        };
        let on_held = limiter.try_acquire(&1);
        let on_new = limiter.try_acquire(&2);
        changer.join().unwrap();
        let direct = |d: turnstile::KeyedDecision| match d {
            turnstile::KeyedDecision::Allowed { remaining } => Decision::Allowed { remaining },
            turnstile::KeyedDecision::Denied { retry_after } => Decision::Denied { retry_after },
            other => panic!("no key bound here: {other:?}"),
        };
        let held_outcome = (direct(on_held), limiter.remaining(&1));
        let new_outcome = (direct(on_new), limiter.remaining(&2));
        assert!(
            held.contains(&held_outcome),
            "held key: {held_outcome:?} not in {held:?}"
        );
        assert!(
            new.contains(&new_outcome),
            "new key: {new_outcome:?} not in {new:?}"
        );
    });
}

/// A reservation races a plain request for the one token of a bucket. Exactly
/// one of them has it now; the other is lent, or told to wait, for the next
/// refill, a period later; the bucket ends empty either way.
#[test]
fn a_reservation_racing_a_request_for_the_last_token_lends_the_next_one() {
    loom::model(|| {
        let period = Duration::from_secs(1);
        let (limiter, _clock) = limiter(1, period);
        let other = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.try_acquire())
        };
        let reserved = limiter.reserve(Duration::from_secs(10)).unwrap().delay();
        let decision = other.join().unwrap();
        if reserved.is_zero() {
            assert_eq!(
                decision.retry_after().map(|r| r.duration()),
                Some(period),
                "{decision:?}"
            );
        } else {
            assert_eq!(reserved, period);
            assert!(decision.is_allowed(), "{decision:?}");
        }
        assert_eq!(limiter.remaining(), 0);
    });
}

/// A reservation's cancel races another request on the same bucket: it gives
/// the permit back only if nothing changed the bucket since, so the bucket
/// never ends with more than the request left it. A cancel that restored the
/// earlier word without that check fails it.
#[test]
fn a_cancel_racing_a_request_never_gives_back_more_than_was_taken() {
    loom::model(|| {
        let (limiter, _clock) = limiter(2, Duration::from_secs(1));
        let reservation = limiter.reserve(Duration::ZERO).unwrap();
        let other = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.try_acquire().is_allowed())
        };
        let cancelled = reservation.cancel();
        assert!(other.join().unwrap());
        assert_eq!(
            limiter.remaining(),
            u32::from(cancelled),
            "cancelled: {cancelled}"
        );
    });
}

/// Models of the grace-period protocol itself (`src/reclaim/`), in fence
/// mode, the mode loom can check: a writer unpublishes one of two values,
/// waits for its snapshot to pass and then frees the value (writes it). A
/// reader that could still read it when it is freed is a data race on the
/// value's `UnsafeCell`, which loom reports, and a read of the freed value
/// fails the model's assertion.
///
/// Each model fails when built with `--cfg turnstile_mutant="no_pin_fence"`
/// (a pin without its `SeqCst` fence: the writer's scan can miss a pin whose
/// reader then reads the old pointer) and with
/// `--cfg turnstile_mutant="relaxed_unpin"` (an unpin that does not release
/// the reader's reads to the writer that sees it).
mod reclaim_models {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;
    use turnstile::reclaim_model::Collector;

    const LIVE: u64 = 7;
    const FREED: u64 = 0xDEAD;

    /// Two values and the index of the published one.
    struct Shared {
        current: AtomicUsize,
        values: [UnsafeCell<u64>; 2],
        collector: Collector,
    }

    fn shared() -> Arc<Shared> {
        Arc::new(Shared {
            current: AtomicUsize::new(0),
            values: [UnsafeCell::new(LIVE), UnsafeCell::new(LIVE)],
            collector: Collector::default(),
        })
    }

    /// Pin (with a record of this thread's, or as a thread without one),
    /// read the published value, unpin.
    fn read(shared: &Shared, recorded: bool) -> u64 {
        let _guard = if recorded {
            shared.collector.pin()
        } else {
            shared.collector.pin_unrecorded()
        };
        // Acquire: pairs with the writer's Release publication.
        let index = shared.current.load(Ordering::Acquire);
        // SAFETY: the value is freed only after a grace period that waits
        // for this pin (what the model checks).
        shared.values[index].with(|value| unsafe { *value })
    }

    /// Publish the second value, wait for the readers pinned before, and
    /// free the first.
    fn unpublish_and_free(shared: &Shared) {
        // Release: publishes the second value.
        shared.current.store(1, Ordering::Release);
        let mut snapshot = shared.collector.snapshot();
        while !snapshot.passed(&shared.collector) {
            thread::yield_now();
        }
        // SAFETY: no reader can read it any more (what the model checks).
        shared.values[0].with_mut(|value| unsafe { *value = FREED });
    }

    /// One reader, pinned before or after the unpublish: it never reads a
    /// freed value.
    #[test]
    #[cfg_attr(
        any(turnstile_mutant = "no_pin_fence", turnstile_mutant = "relaxed_unpin"),
        should_panic
    )]
    fn reclaim_a_reader_pinned_before_an_unpublish_is_waited_for() {
        loom::model(|| {
            let shared = shared();
            let reader = {
                let shared = shared.clone();
                thread::spawn(move || read(&shared, true))
            };
            unpublish_and_free(&shared);
            assert_eq!(reader.join().unwrap(), LIVE);
        });
    }

    /// A reader pins, unpins and pins again (its record goes odd, even, odd:
    /// a later pin is a different number from the one a snapshot noted).
    #[test]
    #[cfg_attr(
        any(turnstile_mutant = "no_pin_fence", turnstile_mutant = "relaxed_unpin"),
        should_panic
    )]
    fn reclaim_a_reader_that_pins_again_is_told_apart_from_its_earlier_pin() {
        loom::model(|| {
            let shared = shared();
            let reader = {
                let shared = shared.clone();
                thread::spawn(move || (read(&shared, true), read(&shared, true)))
            };
            unpublish_and_free(&shared);
            assert_eq!(reader.join().unwrap(), (LIVE, LIVE));
        });
    }

    /// A thread reads and exits; the next thread takes its index, so its
    /// record, and reads, while the writer frees.
    #[test]
    #[cfg_attr(
        any(turnstile_mutant = "no_pin_fence", turnstile_mutant = "relaxed_unpin"),
        should_panic
    )]
    fn reclaim_a_record_reused_after_its_thread_exits_keeps_the_rule() {
        loom::model(|| {
            let shared = shared();
            let writer = {
                let shared = shared.clone();
                thread::spawn(move || unpublish_and_free(&shared))
            };
            let first = {
                let shared = shared.clone();
                thread::spawn(move || read(&shared, true))
            };
            assert_eq!(first.join().unwrap(), LIVE);
            let second = {
                let shared = shared.clone();
                thread::spawn(move || read(&shared, true))
            };
            assert_eq!(second.join().unwrap(), LIVE);
            writer.join().unwrap();
        });
    }

    /// A reader without a record (its thread-locals being destroyed) is
    /// counted in the collector's shared count, and waited for too.
    #[test]
    #[cfg_attr(
        any(turnstile_mutant = "no_pin_fence", turnstile_mutant = "relaxed_unpin"),
        should_panic
    )]
    fn reclaim_a_reader_without_a_record_is_waited_for() {
        loom::model(|| {
            let shared = shared();
            let reader = {
                let shared = shared.clone();
                thread::spawn(move || read(&shared, false))
            };
            unpublish_and_free(&shared);
            assert_eq!(reader.join().unwrap(), LIVE);
        });
    }
}

/// Two changes of a live form's quota race a decision (`LiveGcra`,
/// `LiveFixedWindow`: the one mechanism of the live forms of GCRA and both
/// windows). Whatever the interleaving, the decision and the state left
/// behind are those of *some* order of the three operations run one after
/// another on one thread, each change reading the clock before or after the
/// decision's move of it: a decision never applies one quota's parameters to
/// another quota's word (a decision that took the slot in force rather than
/// the one its word names, or read a slot mid-write without its sequence
/// number, gives an outcome no order gives).
fn live_form_changes_racing_a_decision<A, F>(build: F, quotas: [A::Quota; 3], spent: u32, n: u32)
where
    A: turnstile::Reconfigure + Send + Sync + 'static,
    F: Fn(A::Quota) -> A + Send + Sync + 'static,
{
    live_form_changes_racing(build, quotas, spent, n, |limiter, n| {
        limiter.try_acquire_n(n).unwrap()
    });
}

/// [`live_form_changes_racing_a_decision`] with the decision `decide`'s: a
/// reservation's, say, whose loan is written by a compare-and-swap as an
/// admission is, and whose refusal (too far) writes nothing, as a denial.
fn live_form_changes_racing<A, F, O, D>(
    build: F,
    quotas: [A::Quota; 3],
    spent: u32,
    n: u32,
    decide: D,
) where
    A: turnstile::Reconfigure + Send + Sync + 'static,
    F: Fn(A::Quota) -> A + Send + Sync + 'static,
    O: Clone + PartialEq + std::fmt::Debug + Send + Sync + 'static,
    D: Fn(&RateLimiter<A, ManualClock>, u32) -> O + Send + Sync + 'static,
{
    let decide = std::sync::Arc::new(decide);
    let ms = Duration::from_millis;
    let build = std::sync::Arc::new(build);
    // Every order, computed sequentially (one thread, one execution; loom's
    // atomics need a model to run in, and the runs take more than its
    // default bound on steps): the decision before both changes, between
    // them or after; each change reading 25 ms or 35 ms.
    let orders = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut sequential = loom::model::Builder::new();
    sequential.max_branches = 1 << 20;
    let (into, once, decide_once) = (orders.clone(), build.clone(), decide.clone());
    sequential.check(move || {
        let build = &once;
        let decide = &decide_once;
        let mut allowed = Vec::new();
        for position in 0..=2 {
            for (c1, c2) in [(25, 25), (25, 35), (35, 35)] {
                let clock = ManualClock::new();
                let limiter = RateLimiter::from_parts(build(quotas[0]), clock.clone());
                assert!(limiter.try_acquire_n(spent).unwrap().is_allowed());
                let mut decision = None;
                for (step, (quota, at)) in
                    [(quotas[1], c1), (quotas[2], c2)].into_iter().enumerate()
                {
                    if step == position {
                        clock.set(ms(35));
                        decision = Some(decide(&limiter, n));
                    }
                    clock.set(ms(at));
                    limiter.set_quota(quota).unwrap();
                }
                clock.set(ms(35));
                if position == 2 {
                    decision = Some(decide(&limiter, n));
                }
                allowed.push((decision.unwrap(), limiter.remaining()));
            }
        }
        *into.lock().unwrap() = allowed;
    });
    let allowed = std::sync::Arc::new(orders.lock().unwrap().clone());
    assert_eq!(allowed.len(), 9);
    loom::model(move || {
        let clock = ManualClock::new();
        let limiter = Arc::new(RateLimiter::from_parts(build(quotas[0]), clock.clone()));
        assert!(limiter.try_acquire_n(spent).unwrap().is_allowed());
        clock.advance(ms(25));
        let changer = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                limiter.set_quota(quotas[1]).unwrap();
                limiter.set_quota(quotas[2]).unwrap();
            })
        };
        clock.advance(ms(10));
        let decision = decide(&limiter, n);
        changer.join().unwrap();
        let outcome = (decision, limiter.remaining());
        assert!(
            allowed.contains(&outcome),
            "{outcome:?} is no order's outcome: {allowed:?}"
        );
    });
}

/// GCRA: an admission (its compare-and-swap checks the word) and a denial
/// (which writes nothing: only the slot's sequence number checks the
/// parameters it read).
#[test]
fn live_gcra_changes_racing_a_decision_decide_as_some_order() {
    let ms = Duration::from_millis;
    let quotas = [
        Quota::new(4, 1, ms(20)).unwrap(),
        Quota::new(4, 2, ms(10)).unwrap(),
        Quota::new(8, 4, ms(10)).unwrap(),
    ];
    live_form_changes_racing_a_decision(turnstile::LiveGcra::new, quotas, 3, 1);
    live_form_changes_racing_a_decision(turnstile::LiveGcra::new, quotas, 4, 3);
}

/// A reservation on a live meter races two changes: its loan (a
/// compare-and-swap) and its refusal as too far (which writes nothing, and
/// is checked against the word as a denial is) are each some order's. The
/// reservation is kept; the outcome is its delay or its refusal's wait,
/// and what the limit holds after. (A refusal once measured the wait on the
/// word's quota against the fill time of the quota in force when the
/// reservation began: a wait of 25 ms refused as past 20 ms, where every
/// order lends it.)
#[test]
fn live_reservations_racing_changes_decide_as_some_order() {
    let ms = Duration::from_millis;
    let quotas = [
        Quota::new(4, 1, ms(20)).unwrap(),
        Quota::new(4, 2, ms(10)).unwrap(),
        Quota::new(8, 4, ms(10)).unwrap(),
    ];
    fn reserve<A: turnstile::Lend>(
        limiter: &RateLimiter<A, ManualClock>,
        n: u32,
    ) -> Result<Duration, turnstile::ReserveError> {
        limiter
            .reserve_n(n, Duration::from_millis(30))
            .map(|kept| kept.delay())
    }
    // The live meter's: the bucket's reservations run the same `Lender` and
    // the same cell (the model takes about four minutes each here, so once).
    live_form_changes_racing(turnstile::LiveGcra::new, quotas, 4, 3, reserve);
}

/// The fixed window, on a grid the changes move (20 ms, then 10 ms).
#[test]
fn live_fixed_window_changes_racing_a_decision_decide_as_some_order() {
    let ms = Duration::from_millis;
    let w = |limit, window| turnstile::FixedWindow::new(limit, ms(window)).unwrap();
    let quotas = [w(4, 40), w(3, 20), w(8, 10)];
    let build = |q| turnstile::LiveFixedWindow::new(q).unwrap();
    live_form_changes_racing_a_decision(build, quotas, 3, 1);
    live_form_changes_racing_a_decision(build, quotas, 4, 3);
}

/// The live token bucket through the same check: a denial decided on a slot
/// two changes rewrote after its word was loaded.
#[test]
fn live_token_bucket_changes_racing_a_decision_decide_as_some_order() {
    let ms = Duration::from_millis;
    let quotas = [
        Quota::new(4, 1, ms(20)).unwrap(),
        Quota::new(4, 2, ms(10)).unwrap(),
        Quota::new(8, 4, ms(10)).unwrap(),
    ];
    let build = |q| LiveTokenBucket::new(q).unwrap();
    live_form_changes_racing_a_decision(build, quotas, 3, 1);
    live_form_changes_racing_a_decision(build, quotas, 4, 3);
}
