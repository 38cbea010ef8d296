//! The keyed limiter: per-key buckets, lossless sweeping, the key bound, and
//! concurrency on the real clock.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use turnstile::{
    AcquireError, Clock, Decision, KeyedConfigError, KeyedDecision, KeyedLimiter, KeyedStats,
    MIN_SWEEP_INTERVAL, ManualClock, Quota, RateLimiter, RealClock, TokenBucket,
};

type Manual<K> = KeyedLimiter<K, TokenBucket, ManualClock>;

/// Held by every test here, so they run one at a time. Freed keys are reused
/// after a grace period that waits for every thread of the process caught in
/// a lookup when they were evicted; the key-bound tests count on that room
/// being back by their next request, which a thread of another test here,
/// descheduled in the middle of a lookup on a loaded machine, could delay.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn quota(capacity: u32, period: Duration) -> Quota {
    Quota::new(capacity, 1, period).unwrap()
}

fn manual<K: std::hash::Hash + Eq>(q: Quota, max_keys: usize) -> (Manual<K>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<K>::builder(q)
        .clock(clock.clone())
        .max_keys(max_keys)
        .build()
        .unwrap();
    (limiter, clock)
}

#[test]
fn one_clients_burst_does_not_spend_anothers_tokens() {
    let _serial = serial();
    let (l, _) = manual::<String>(quota(2, Duration::from_secs(1)), 100);
    assert!(l.try_acquire("alice").is_allowed());
    assert!(l.try_acquire("alice").is_allowed());
    assert!(l.try_acquire("alice").is_denied());
    assert_eq!(
        l.try_acquire("bob"),
        KeyedDecision::Allowed { remaining: 1 }
    );
}

#[test]
fn string_keys_by_str_and_ip_addresses() {
    let _serial = serial();
    let (l, _) = manual::<String>(quota(3, Duration::from_secs(1)), 100);
    let owned = String::from("key-123");
    assert!(l.try_acquire(owned.as_str()).is_allowed());
    assert_eq!(l.remaining("key-123"), 2);
    assert_eq!(l.len(), 1);

    let (l, _) = manual::<IpAddr>(quota(1, Duration::from_secs(1)), 100);
    let v4 = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    assert!(l.try_acquire(&v4).is_allowed());
    assert!(l.try_acquire(&v4).is_denied());
    assert!(l.try_acquire(&v6).is_allowed());
}

#[test]
fn remaining_peeks_without_storing_the_key() {
    let _serial = serial();
    let (l, _) = manual::<u64>(quota(4, Duration::from_secs(1)), 100);
    assert_eq!(l.remaining(&7), 4);
    assert!(l.is_empty());
    assert_eq!(
        l.try_acquire_n(&7, 3),
        Ok(KeyedDecision::Allowed { remaining: 1 })
    );
    assert_eq!(l.remaining(&7), 1);
    assert_eq!(l.len(), 1);
}

#[test]
fn bad_permit_counts_are_errors_and_touch_nothing() {
    let _serial = serial();
    let (l, _) = manual::<u64>(quota(4, Duration::from_secs(1)), 100);
    assert_eq!(l.try_acquire_n(&1, 0), Err(AcquireError::ZeroPermits));
    assert_eq!(
        l.try_acquire_n(&1, 5),
        Err(AcquireError::InsufficientCapacity {
            requested: 5,
            capacity: 4
        })
    );
    assert!(l.is_empty());
}

#[test]
fn bad_configurations_are_refused() {
    let _serial = serial();
    let q = quota(1, Duration::from_secs(1));
    for shards in [0, 3, 6, 1_000, (1 << 16) + 1, 1 << 17] {
        let err = KeyedLimiter::<u64>::builder(q)
            .shards(shards)
            .build()
            .unwrap_err();
        assert_eq!(err, KeyedConfigError::Shards { shards });
        assert!(
            err.to_string().contains("power of two from 1 to 65536"),
            "{err}"
        );
    }
    for shards in [1, 2, 64, 1 << 16] {
        let l = KeyedLimiter::<u64>::builder(q)
            .shards(shards)
            .build()
            .unwrap();
        assert_eq!(l.shard_count(), shards);
    }
    let err = KeyedLimiter::<u64>::builder(q)
        .max_keys(0)
        .build()
        .unwrap_err();
    assert_eq!(err, KeyedConfigError::ZeroMaxKeys);
    let err = KeyedLimiter::<u64>::builder(q)
        .sweep_every(0)
        .build()
        .unwrap_err();
    assert_eq!(err, KeyedConfigError::ZeroSweepEvery);

    let l = KeyedLimiter::<u64>::new(q);
    assert!(l.shard_count().is_power_of_two());
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(l.shard_count() >= 4 * cores);
    assert_eq!(l.max_keys(), turnstile::DEFAULT_MAX_KEYS);
}

#[test]
fn sweeping_evicts_only_buckets_indistinguishable_from_fresh() {
    let _serial = serial();
    let period = Duration::from_millis(100);
    let (l, clock) = manual::<u64>(quota(3, period), 100);
    let _ = l.try_acquire_n(&1, 3).unwrap(); // empty
    let _ = l.try_acquire(&2); // 2 left
    assert_eq!(l.sweep(), 0, "neither would be full yet");
    clock.advance(period); // key 2 full again, key 1 has 1 of 3
    assert_eq!(l.sweep(), 1);
    assert_eq!(l.len(), 1);
    assert_eq!(l.remaining(&1), 1, "key 1 kept its exact state");
    assert_eq!(l.remaining(&2), 3, "key 2 comes back as it would have been");
    clock.advance(period * 2);
    assert_eq!(l.sweep(), 1);
    assert!(l.is_empty());
    let stats = l.stats();
    assert_eq!((stats.keys, stats.evicted, stats.admitted), (0, 2, 2));
}

#[test]
fn a_denial_on_a_fresh_bucket_stores_nothing_and_denials_are_counted() {
    let _serial = serial();
    let (l, _) = manual::<u64>(quota(1, Duration::from_secs(1)), 100);
    let _ = l.try_acquire(&9);
    assert!(l.try_acquire(&9).is_denied());
    assert!(l.try_acquire(&9).is_denied());
    assert_eq!(
        l.stats(),
        KeyedStats {
            keys: 1,
            admitted: 1,
            denied: 2,
            denied_key_limit: 0,
            evicted: 0
        }
    );
}

#[test]
fn a_shard_sweeps_itself_after_enough_inserts() {
    let _serial = serial();
    let period = Duration::from_millis(10);
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64>::builder(quota(1, period))
        .clock(clock.clone())
        .shards(1)
        .sweep_every(100)
        .build()
        .unwrap();
    for k in 0..100 {
        assert!(l.try_acquire(&k).is_allowed());
    }
    assert_eq!(l.len(), 100);
    clock.advance(period); // all 100 are full again
    // The 101st insert sweeps first. The shard's first sweep takes every
    // sweepable key (the later ones spare keys used within a second or since
    // the sweep before: below).
    assert!(l.try_acquire(&1_000).is_allowed());
    assert_eq!(l.len(), 1);
    assert_eq!(l.stats().evicted, 100);
}

/// Move `clock` forward to `millis` after its start.
fn at(clock: &ManualClock, millis: u64) {
    let now = Duration::from_nanos(clock.now());
    clock.advance(Duration::from_millis(millis) - now);
}

/// A limiter of one shard that sweeps itself after 100 inserts, on a quota of
/// one permit back every 10 ms: every bucket is full 10 ms after its last
/// admission. `sweep()` at 2 s leaves it empty, with a sweep on record.
fn swept_at_two_seconds() -> (Manual<u64>, ManualClock) {
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64>::builder(quota(1, Duration::from_millis(10)))
        .clock(clock.clone())
        .shards(1)
        .sweep_every(100)
        .build()
        .unwrap();
    for k in 0..100 {
        assert!(l.try_acquire(&k).is_allowed());
    }
    at(&clock, 2_000);
    assert_eq!(l.sweep(), 100);
    (l, clock)
}

/// At `millis` after the clock's start, a check of each key of `keys`, every
/// one admitted.
fn admit_at(l: &Manual<u64>, clock: &ManualClock, millis: u64, keys: std::ops::Range<u64>) {
    at(clock, millis);
    for k in keys {
        assert!(l.try_acquire(&k).is_allowed(), "key {k} at {millis} ms");
    }
}

/// A sweep that inserts trigger spares the keys used since the shard's
/// previous sweep, though their buckets are full again and they have been
/// idle for over a second; at the sweep after, the ones still idle go. (New
/// keys throughout: the keys swept at 2 s wait in limbo, and taking one back
/// from there is not an insert.)
#[test]
fn a_sweep_that_inserts_trigger_spares_keys_used_since_the_last_sweep() {
    let _serial = serial();
    let (l, clock) = swept_at_two_seconds();
    admit_at(&l, &clock, 2_500, 10_000..10_060);
    // At 5 s the 101st insert since the sweep at 2 s sweeps: keys 10,000..10,060
    // have been full since 2.51 s but were used after 2 s, so they stay.
    admit_at(&l, &clock, 5_000, 11_000..11_041);
    assert_eq!((l.len(), l.stats().evicted), (101, 100));
    // Keys 10,000..10,030 are used again at 5.5 s; 10,030..10,060 stay idle.
    admit_at(&l, &clock, 5_500, 10_000..10_030);
    // At 7.6 s the next sweep (the 101st insert since the last): keys
    // 10,030..10,060, not used since the sweep at 5 s, go; 10,000..10,030
    // (used at 5.5 s) and 11,000..11,041 (inserted at 5 s, the last sweep's
    // own reading) stay. Had the sweep at 5 s not happened, this one would
    // judge by 2 s and take none.
    admit_at(&l, &clock, 7_600, 12_000..12_100);
    assert_eq!(l.stats().evicted, 130);
    assert_eq!(l.len(), 101 + 100 - 30);
    // `sweep()` takes every key whose bucket is full, in use or not.
    at(&clock, 7_610);
    let held = l.len();
    assert_eq!(l.sweep(), held);
    assert_eq!(l.len(), 0);
}

/// A sweep that inserts trigger spares keys idle for less than a second, even
/// when they have not been used since the shard's previous sweep.
#[test]
fn a_sweep_that_inserts_trigger_spares_keys_idle_under_a_second() {
    let _serial = serial();
    let (l, clock) = swept_at_two_seconds();
    admit_at(&l, &clock, 3_000, 10_000..10_050);
    // At 3.2 s the 101st insert since the sweep at 2 s sweeps: keys
    // 10,000..10,050 were used since then, and stay.
    admit_at(&l, &clock, 3_200, 11_000..11_051);
    assert_eq!((l.len(), l.stats().evicted), (101, 100));
    // At 3.7 s the next (again the 101st insert since the last): keys
    // 10,000..10,050 have not been used since the sweep at 3.2 s and have
    // been full since 3.01 s, but idle for only 0.7 s: they stay.
    admit_at(&l, &clock, 3_700, 12_000..12_100);
    assert_eq!((l.len(), l.stats().evicted), (201, 100));
    // At 4.1 s the next (the 201st insert: the shard held 200 after the last
    // sweep): idle for 1.1 s now, keys 10,000..10,050 go; the keys inserted at
    // 3.2 s and 3.7 s were used since 3.1 s and stay.
    admit_at(&l, &clock, 4_100, 13_000..13_200);
    assert_eq!(l.stats().evicted, 150);
    assert_eq!(l.len(), 201 + 200 - 50);
}

#[test]
fn at_the_bound_a_new_key_is_refused_with_its_own_reason() {
    let _serial = serial();
    let fill = Duration::from_secs(2);
    // One shard, so the sweep a new key triggers sees every key.
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64>::builder(quota(2, Duration::from_secs(1)))
        .clock(clock.clone())
        .shards(1)
        .max_keys(3)
        .build()
        .unwrap();
    for k in 0..3 {
        assert!(l.try_acquire(&k).is_allowed());
    }
    let refused = l.try_acquire(&3);
    assert_eq!(
        refused,
        KeyedDecision::KeyLimit {
            retry_after: turnstile::RetryAfter::from_nanos(2_000_000_000)
        }
    );
    assert!(refused.is_key_limit() && refused.is_denied());
    assert_eq!(refused.retry_after().unwrap().duration(), fill);
    // Known keys are unaffected.
    assert_eq!(l.try_acquire(&0), KeyedDecision::Allowed { remaining: 0 });
    assert_eq!(l.len(), 3);
    assert_eq!(l.stats().denied_key_limit, 1);
    // Once a bucket would be full again, the shard's sweep makes room.
    clock.advance(Duration::from_secs(1)); // keys 1 and 2 refill to full
    assert!(l.try_acquire(&3).is_allowed());
    assert!(l.len() <= 3);
    assert_eq!(l.remaining(&0), 1, "key 0 kept its state through the sweep");
}

/// A flood of a million unique keys against a bound of 10,000: the map never
/// holds more than the bound, and resident keys decide exactly as their own
/// direct limiters do, with the clock frozen and with it moving.
#[test]
fn a_key_flood_stays_within_the_bound_and_residents_keep_exact_allowances() {
    let _serial = serial();
    const BOUND: usize = 10_000;
    const FLOOD: u64 = 1_000_000;
    const RESIDENTS: u64 = 100;
    let period = Duration::from_millis(10);
    let q = quota(5, period);
    let (l, clock) = manual::<u64>(q, BOUND);
    let reference: HashMap<u64, RateLimiter<TokenBucket, ManualClock>> = (0..RESIDENTS)
        .map(|k| (k, RateLimiter::with_clock(q, clock.clone())))
        .collect();
    let check_resident = |l: &Manual<u64>, k: u64| {
        let ours = l.try_acquire(&k);
        let theirs: KeyedDecision = reference[&k].try_acquire().into();
        assert_eq!(ours, theirs, "resident {k} at {:?}", clock.elapsed());
    };
    for k in 0..RESIDENTS {
        check_resident(&l, k);
    }

    // Phase 1, time frozen: no bucket can become fresh again, so once the map is
    // full every new key is refused.
    let mut refused = 0;
    for i in 0..FLOOD {
        let d = l.try_acquire(&(1 << 40 | i));
        assert!(
            !matches!(d, KeyedDecision::Denied { .. }),
            "a new key's bucket is full"
        );
        refused += u64::from(d.is_key_limit());
        if i % 10 == 0 {
            check_resident(&l, i / 10 % RESIDENTS);
        }
        if i % 4_096 == 0 {
            assert!(l.len() <= BOUND);
        }
    }
    assert_eq!(l.len(), BOUND);
    assert_eq!(refused, FLOOD - (BOUND as u64 - RESIDENTS));

    // Phase 2, a microsecond per request: flood buckets refill and are swept, new
    // flood keys take their places, residents (asked every 10 requests, so never
    // full) keep their exact allowances.
    let before = l.stats();
    for i in 0..FLOOD {
        clock.advance(Duration::from_micros(1));
        let _ = l.try_acquire(&(2 << 40 | i));
        if i % 10 == 0 {
            check_resident(&l, i / 10 % RESIDENTS);
        }
        if i % 4_096 == 0 {
            assert!(l.len() <= BOUND);
        }
    }
    let after = l.stats();
    eprintln!("flood: {before:?} -> {after:?}");
    assert!(after.keys <= BOUND);
    assert!(
        after.evicted > before.evicted + 100_000,
        "{before:?} -> {after:?}"
    );
    assert!(
        after.admitted > before.admitted + 100_000,
        "{before:?} -> {after:?}"
    );
}

#[test]
fn two_first_requests_for_one_key_share_one_bucket() {
    let _serial = serial();
    for _ in 0..200 {
        let (l, _) = manual::<u64>(quota(1, Duration::from_secs(1)), 100);
        let l = Arc::new(l);
        let start = Arc::new(Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (l, start) = (Arc::clone(&l), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    l.try_acquire(&42).is_allowed()
                })
            })
            .collect();
        let admitted: u32 = threads.into_iter().map(|t| t.join().unwrap() as u32).sum();
        assert_eq!(admitted, 1);
        assert_eq!(l.len(), 1);
    }
}

#[test]
fn the_background_sweeper_sweeps_and_stops_on_drop() {
    let _serial = serial();
    let period = Duration::from_millis(1);
    let l = Arc::new(
        KeyedLimiter::<u64>::builder(quota(1, period))
            .clock(RealClock::new())
            .build()
            .unwrap(),
    );
    for k in 0..50 {
        let _ = l.try_acquire(&k);
    }
    assert_eq!(l.len(), 50);
    let sweeper = l.start_sweeper(Duration::from_millis(5)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !l.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper never emptied it"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(sweeper); // joins the thread
    for k in 0..50 {
        let _ = l.try_acquire(&k);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(l.len(), 50, "a stopped sweeper sweeps nothing");
}

/// Both cores, many keys, the real clock: no key is ever admitted more than
/// `capacity + refill(elapsed)`.
#[test]
fn concurrent_keys_on_the_real_clock_stay_within_their_bounds() {
    let _serial = serial();
    const KEYS: u64 = 64;
    let period = Duration::from_micros(100);
    let q = Quota::new(10, 1, period).unwrap();
    let clock = RealClock::new();
    let l = Arc::new(
        KeyedLimiter::<u64>::builder(q)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2);
    let start = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (l, start) = (Arc::clone(&l), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut admitted = vec![0u64; KEYS as usize];
                start.wait();
                for i in 0..400_000u64 {
                    let k = (i * 7 + t as u64) % KEYS;
                    admitted[k as usize] += u64::from(l.try_acquire(&k).is_allowed());
                }
                admitted
            })
        })
        .collect();
    let t0 = clock.now();
    start.wait();
    let per_thread: Vec<Vec<u64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let t1 = clock.now();
    let elapsed_units = t1 / 1_000 - t0 / 1_000; // 1 µs units for capacity 10
    let bound = 10 + elapsed_units / 100;
    let mut total = 0;
    for k in 0..KEYS as usize {
        let admitted: u64 = per_thread.iter().map(|a| a[k]).sum();
        assert!(admitted <= bound, "key {k}: {admitted} > {bound}");
        total += admitted;
    }
    let stats = l.stats();
    assert_eq!(stats.admitted, total);
    assert_eq!(stats.admitted + stats.denied, threads as u64 * 400_000);
}

#[test]
fn decisions_convert_from_direct_ones() {
    let _serial = serial();
    let d: KeyedDecision = Decision::Allowed { remaining: 3 }.into();
    assert_eq!(d.remaining(), Some(3));
    assert!(!d.is_key_limit());
}

/// Every algorithm works per key: keys are independent, each key agrees with a
/// direct limiter of its own, a sweep keeps every key that still owes something
/// and drops it once it is fresh-equivalent, and a refused new key at the bound
/// is told to come back when the keys held are fresh.
#[test]
fn every_algorithm_works_per_key_and_sweeps_by_its_own_criterion() {
    let _serial = serial();
    use turnstile::{Algorithm, FixedWindow, Gcra, KeyedBuilder, SlidingWindow};

    fn check<A: Algorithm + Clone + std::fmt::Debug>(algorithm: A, owes_for: Duration) {
        let clock = ManualClock::new();
        clock.set(Duration::from_millis(100));
        let keyed: KeyedLimiter<u32, A, ManualClock> = KeyedBuilder::new(algorithm.clone())
            .clock(clock.clone())
            .max_keys(2)
            .build()
            .unwrap();
        let direct = RateLimiter::from_parts(algorithm.clone(), clock.clone());
        let capacity = algorithm.capacity();
        for _ in 0..capacity + 2 {
            let decision = keyed.try_acquire(&1);
            assert_eq!(decision, direct.try_acquire().into(), "{algorithm:?}");
        }
        assert_eq!(keyed.remaining(&2), capacity, "key 2 untouched");
        assert!(keyed.try_acquire_n(&2, capacity).unwrap().is_allowed());
        // At the bound: a third key is refused until the keys held are
        // fresh, the time the sweeps below find (a window's: its end).
        match keyed.try_acquire(&3) {
            KeyedDecision::KeyLimit { retry_after } => {
                assert_eq!(retry_after.duration(), owes_for, "{algorithm:?}");
                assert!(retry_after.duration() <= algorithm.fresh_after_idle());
            }
            other => panic!("{algorithm:?}: {other:?}"),
        }
        // Still owed just before the documented time: nothing swept.
        clock.advance(owes_for - Duration::from_nanos(1));
        assert_eq!(keyed.sweep(), 0, "{algorithm:?}");
        clock.advance(Duration::from_nanos(1));
        assert_eq!(keyed.sweep(), 2, "{algorithm:?}");
        assert!(keyed.is_empty());
        assert!(keyed.try_acquire(&3).is_allowed());
    }
    let second = Duration::from_secs(1);
    let quota = Quota::new(3, 1, second).unwrap();
    // Both keys drained at 100 ms: the fixed window owes until 1 s, the sliding
    // window until 2 s, GCRA and the bucket until refilled, 3 s later.
    check(
        FixedWindow::new(3, second).unwrap(),
        Duration::from_millis(900),
    );
    check(
        SlidingWindow::new(3, second).unwrap(),
        Duration::from_millis(1_900),
    );
    check(Gcra::new(quota), Duration::from_secs(3));
    check(TokenBucket::new(quota), Duration::from_secs(3));
}

/// A full bound whose keys have all gone idle: every new key is admitted, the
/// room found in whichever shards hold the idle keys (not only the new key's).
#[test]
fn a_full_bound_of_idle_keys_admits_every_new_key() {
    let _serial = serial();
    for shards in [1, 8, 64] {
        let clock = ManualClock::new();
        let l = KeyedLimiter::<u64>::builder(quota(2, Duration::from_millis(100)))
            .clock(clock.clone())
            .shards(shards)
            .max_keys(100)
            .build()
            .unwrap();
        for k in 0..100 {
            assert!(l.try_acquire(&k).is_allowed());
        }
        clock.advance(Duration::from_secs(3_600));
        for k in 100..200 {
            assert!(
                l.try_acquire(&k).is_allowed(),
                "{shards} shards: key {k} refused while idle keys were held"
            );
        }
        assert_eq!(l.len(), 100);
        let stats = l.stats();
        assert_eq!((stats.denied_key_limit, stats.evicted), (0, 100));
    }
}

/// Far more shards than keys, every held key idle by the time the next new
/// key comes: each new key is admitted. A look for room at the bound goes on
/// from where the last one stopped and passes over empty shards for free;
/// when each look began one shard further on than the last, it went over the
/// shards the last had emptied, and 95% of such keys were refused.
#[test]
fn many_shards_to_few_keys_still_find_every_idle_key() {
    let _serial = serial();
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64>::builder(quota(3, Duration::from_millis(10)))
        .clock(clock.clone())
        .shards(16_384)
        .max_keys(100)
        .build()
        .unwrap();
    for k in 0..5_000 {
        clock.advance(Duration::from_millis(30));
        assert!(
            l.try_acquire(&k).is_allowed(),
            "key {k} refused while {} idle keys were held",
            l.len()
        );
    }
    assert_eq!(l.len(), 100);
    assert_eq!(l.stats().denied_key_limit, 0);
}

/// A sweep first frees what waits in limbo, then unlinks into the room that
/// made: a full limbo does not stop a sweep from evicting idle keys, and a
/// key bound full of idle keys admits new ones however often it has churned.
#[test]
fn a_full_limbo_does_not_stop_a_sweep_or_the_bound_from_reclaiming() {
    let _serial = serial();
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64>::builder(quota(2, Duration::from_millis(100)))
        .clock(clock.clone())
        .shards(1)
        .max_keys(2)
        .build()
        .unwrap();
    for round in 0..5_u64 {
        for k in 0..2 {
            assert!(l.try_acquire(&(round * 2 + k)).is_allowed());
        }
        clock.advance(Duration::from_secs(1));
        assert_eq!(l.sweep(), 2, "round {round}: idle keys left unswept");
        assert_eq!(l.len(), 0);
    }

    let l = KeyedLimiter::<u64>::builder(quota(2, Duration::from_millis(100)))
        .clock(clock.clone())
        .shards(1)
        .max_keys(4)
        .build()
        .unwrap();
    for k in 0..40_u64 {
        if k % 4 == 0 {
            clock.advance(Duration::from_secs(1));
        }
        assert!(
            l.try_acquire(&k).is_allowed(),
            "key {k} refused while every key held was idle"
        );
    }
    assert_eq!(l.stats().denied_key_limit, 0);
}

/// `KeyLimit`'s `retry_after` is an upper bound: a key refused at the bound is
/// admitted once it has waited that long, as long as the keys held meanwhile
/// went idle.
#[test]
fn a_key_refused_at_the_bound_is_admitted_after_its_retry_after() {
    let _serial = serial();
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64>::builder(quota(3, Duration::from_millis(250)))
        .clock(clock.clone())
        .max_keys(10)
        .build()
        .unwrap();
    for k in 0..10 {
        assert!(l.try_acquire(&k).is_allowed());
    }
    clock.advance(Duration::from_secs(3_600));
    let mut refused = 0;
    for k in 10..110 {
        match l.try_acquire(&k) {
            KeyedDecision::Allowed { .. } => {}
            KeyedDecision::KeyLimit { retry_after } => {
                refused += 1;
                assert_eq!(retry_after.duration(), Duration::from_millis(750));
                clock.advance(retry_after.duration());
                assert!(
                    l.try_acquire(&k).is_allowed(),
                    "key {k} refused again after waiting {retry_after:?}"
                );
            }
            denied => panic!("a new key is never rate-limited: {denied:?}"),
        }
        assert!(l.len() <= 10);
    }
    // Each wait lets the next 10 keys in.
    assert_eq!(refused, 9);
}

/// A window's keys are all fresh when the window of the reading ends (a
/// sliding window's: the one after it), so a key refused at the bound
/// waits until then, not a whole window (or two) from the refusal: a day
/// window full at noon said 24 hours where 12 was enough. Admitted after
/// that wait, in both.
#[test]
fn a_window_at_the_bound_says_when_its_window_ends() {
    let _serial = serial();
    let day = Duration::from_secs(86_400);
    let hours = |h: u64| Duration::from_secs(h * 3_600);
    fn check<A: turnstile::Algorithm>(algorithm: A, after_end: Duration, probe_early: bool) {
        let clock = ManualClock::new();
        let l = turnstile::KeyedBuilder::<u64, A>::new(algorithm)
            .clock(clock.clone())
            .max_keys(4)
            .build()
            .unwrap();
        clock.advance(Duration::from_secs(12 * 3_600));
        for k in 0..4 {
            assert!(l.try_acquire(&k).is_allowed());
        }
        let KeyedDecision::KeyLimit { retry_after } = l.try_acquire(&4) else {
            panic!("a fifth key at a bound of four");
        };
        assert_eq!(retry_after.duration(), after_end);
        if probe_early {
            // A look 1 ns before finds no room; its cooldown ends with the
            // window, so the key told to come back then finds room.
            clock.advance(retry_after.duration() - Duration::from_nanos(1));
            let early = l.try_acquire(&4);
            assert!(matches!(early, KeyedDecision::KeyLimit { .. }), "{early:?}");
            clock.advance(Duration::from_nanos(1));
        } else {
            clock.advance(retry_after.duration());
        }
        let on_time = l.try_acquire(&4);
        assert!(
            on_time.is_allowed(),
            "room once the window ended: {on_time:?}"
        );
    }
    check(
        turnstile::FixedWindow::new(10, day).unwrap(),
        hours(12),
        true,
    );
    check(
        turnstile::SlidingWindow::new(10, day).unwrap(),
        hours(36),
        false,
    );
    check(
        turnstile::LiveFixedWindow::new(turnstile::FixedWindow::new(10, day).unwrap()).unwrap(),
        hours(12),
        true,
    );
}

/// A limiter that owns its sweeper reclaims idle keys with no request coming,
/// inside a gate, and stops the thread when dropped.
#[test]
fn a_limiter_with_its_own_sweeper_reclaims_idle_keys_behind_a_gate() {
    let _serial = serial();
    let limiter = KeyedLimiter::<String>::builder(quota(1, Duration::from_millis(2)))
        .max_keys(10_000)
        .build()
        .unwrap()
        .with_sweeper(Duration::from_millis(5))
        .unwrap();
    let gate = turnstile::Gate::new(limiter);
    for k in 0..1_000 {
        assert!(gate.check(Some(&format!("key-{k}"))).is_admitted());
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !gate.limiter().is_empty() {
        assert!(std::time::Instant::now() < deadline, "never swept");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(gate.limiter().stats().evicted, 1_000);
}

/// A sweeper interval below `MIN_SWEEP_INTERVAL` (1 ms), zero included, is
/// refused before any thread starts, by both ways of starting one; 1 ms is
/// accepted.
#[test]
fn a_sweeper_interval_below_a_millisecond_is_refused() {
    assert_eq!(MIN_SWEEP_INTERVAL, Duration::from_millis(1));
    for interval in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_micros(999),
    ] {
        let too_short = KeyedConfigError::SweepIntervalTooShort {
            interval,
            min: MIN_SWEEP_INTERVAL,
        };
        let err = KeyedLimiter::<u64>::new(quota(1, Duration::from_secs(1)))
            .with_sweeper(interval)
            .unwrap_err();
        assert_eq!(err, too_short);
        assert!(
            err.to_string()
                .contains(&format!("{interval:?} is too short"))
                && err.to_string().contains("at least 1ms"),
            "{err}"
        );
        let shared = Arc::new(KeyedLimiter::<u64>::new(quota(1, Duration::from_secs(1))));
        let err = shared.start_sweeper(interval).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        let inner = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<KeyedConfigError>());
        assert_eq!(inner, Some(&too_short));
    }
    let shared = Arc::new(KeyedLimiter::<u64>::new(quota(1, Duration::from_secs(1))));
    drop(shared.start_sweeper(MIN_SWEEP_INTERVAL).unwrap());
    drop(
        KeyedLimiter::<u64>::new(quota(1, Duration::from_secs(1)))
            .with_sweeper(MIN_SWEEP_INTERVAL)
            .unwrap(),
    );
}

/// Both cores hammer one key in bursts with pauses long enough for its bucket
/// to refill, while a third thread sweeps without pause: the sweeps keep
/// unlinking the key between bursts, and decisions keep racing them. Over the
/// whole run the key is never admitted more than `capacity + floor(T / period)`.
#[test]
fn sweeps_racing_decisions_on_the_real_clock_never_over_admit() {
    let _serial = serial();
    let (capacity, period) = (4u64, Duration::from_millis(1));
    let l = Arc::new(
        KeyedLimiter::<u64>::builder(quota(capacity as u32, period))
            .clock(RealClock::new())
            .build()
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let start = l.clock().now();
    let sweeper = {
        let (l, stop) = (Arc::clone(&l), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut evicted = 0;
            while !stop.load(Ordering::Relaxed) {
                evicted += l.sweep();
            }
            evicted
        })
    };
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let mut admitted = 0u64;
                let until = std::time::Instant::now() + Duration::from_millis(600);
                let mut i = t;
                while std::time::Instant::now() < until {
                    for _ in 0..8 {
                        admitted += l.try_acquire(&7).is_allowed() as u64;
                    }
                    i = i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    std::thread::sleep(Duration::from_micros(3_000 + (i >> 33) % 4_000));
                }
                admitted
            })
        })
        .collect();
    let admitted: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let end = l.clock().now();
    stop.store(true, Ordering::Relaxed);
    let evicted = sweeper.join().unwrap();
    let bound = capacity + (end - start) / period.as_nanos() as u64;
    assert!(admitted <= bound, "admitted {admitted}, bound {bound}");
    assert!(evicted > 0, "the sweeps never met the key idle");
}

#[test]
fn check_at_the_bound_is_a_key_limit_with_the_idle_to_fresh_wait() {
    let _serial = serial();
    let (l, _) = manual::<u64>(quota(2, Duration::from_secs(1)), 1);
    assert_eq!(l.check(&1).ok(), Some(1));
    let refused = l.check(&2).unwrap_err();
    assert!(refused.is_key_limit());
    assert_eq!(refused.retry_after().duration(), Duration::from_secs(2));
    assert_eq!(l.check(&1).ok(), Some(0));
    let denied = l.check(&1).unwrap_err();
    assert!(!denied.is_key_limit());
    assert_eq!(denied.retry_after().duration(), Duration::from_secs(1));
    assert_eq!(l.stats().denied_key_limit, 1);
}

/// More threads alive at once than there are counter slots of their own: the
/// threads beyond share one slot, and every decision is still counted once.
#[test]
fn many_threads_at_once_are_all_counted() {
    let _serial = serial();
    let l = Arc::new(KeyedLimiter::<u64>::new(quota(
        1_000_000,
        Duration::from_secs(1),
    )));
    let threads = 100;
    let start = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (l, start) = (Arc::clone(&l), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait(); // all alive at once
                (0..1_000)
                    .filter(|i| l.try_acquire(&(t * 10 + i % 10)).is_allowed())
                    .count()
            })
        })
        .collect();
    let admitted: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(admitted, threads * 1_000);
    let stats = l.stats();
    assert_eq!((stats.admitted, stats.denied), (admitted as u64, 0));
}

/// Both cores on 64 keys against a bound of 16, with a third thread sweeping:
/// new keys keep reclaiming room from idle ones in other shards while
/// decisions, relinks from limbo and sweeps race. The keys in use slide, so
/// some always fall idle (evictions) while others arrive at a full bound. No key is ever admitted more
/// than `capacity + floor(T / period)` over the run, and the bound holds.
#[test]
fn a_key_bound_under_pressure_from_two_threads_never_over_admits() {
    let _serial = serial();
    let (capacity, period) = (2u64, Duration::from_millis(1));
    let l = Arc::new(
        KeyedLimiter::<u64>::builder(quota(capacity as u32, period))
            .clock(RealClock::new())
            .max_keys(16)
            .sweep_every(8)
            .build()
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let start = l.clock().now();
    let sweeper = {
        let (l, stop) = (Arc::clone(&l), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                l.sweep();
                assert!(l.len() <= 16);
                std::thread::yield_now();
            }
        })
    };
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let mut admitted = [0u64; 64];
                let mut state = t + 1;
                let begun = std::time::Instant::now();
                let until = begun + Duration::from_millis(500);
                while std::time::Instant::now() < until {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // A window of 24 keys (more than the bound) that slides by
                    // 8 every 4 ms: keys leaving it fall idle and become
                    // sweepable 2 ms later, whatever the scheduling, while
                    // new ones keep arriving at the bound.
                    let phase = (begun.elapsed().as_millis() / 4) as u64;
                    let key = (phase * 8 + (state >> 58) % 24) % 64;
                    if l.try_acquire(&key).is_allowed() {
                        admitted[key as usize] += 1;
                    }
                    assert!(l.len() <= 16);
                }
                admitted
            })
        })
        .collect();
    let mut admitted = [0u64; 64];
    for w in workers {
        for (total, n) in admitted.iter_mut().zip(w.join().unwrap()) {
            *total += n;
        }
    }
    let end = l.clock().now();
    stop.store(true, Ordering::Relaxed);
    sweeper.join().unwrap();
    let bound = capacity + (end - start) / period.as_nanos() as u64;
    for (key, &n) in admitted.iter().enumerate() {
        assert!(n <= bound, "key {key}: admitted {n}, bound {bound}");
    }
    let stats = l.stats();
    assert!(stats.denied_key_limit > 0, "the bound was never reached");
    assert!(stats.evicted > 0);
}

/// A hasher that hashes a `u64` key to itself, to place keys in chosen shards.
#[derive(Default)]
struct IdentityHasher(u64);

impl std::hash::Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("u64 keys only")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Identity = std::hash::BuildHasherDefault<IdentityHasher>;

/// With two shards, the top bit of the hash picks the shard.
const SHARD_1: u64 = 1 << 63;

fn two_shards_one_key(
    quota: Quota,
    clock: &ManualClock,
) -> KeyedLimiter<u64, TokenBucket, ManualClock, Identity> {
    KeyedLimiter::<u64>::builder(quota)
        .clock(clock.clone())
        .hasher(Identity::default())
        .shards(2)
        .max_keys(1)
        .build()
        .unwrap()
}

/// Limbo is bounded for the whole limiter, but each shard freed only its own,
/// at the start of its own sweep: with the limbo full of an entry in one
/// shard, a sweep or a look for room that reached the shard of an idle key
/// first could not unlink it, and a new key was refused though the only key
/// held was idle.
#[test]
fn limbo_full_in_another_shard_does_not_stop_reclaiming_an_idle_key() {
    let _serial = serial();
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1));
    let quota = Quota::new(1, 1, Duration::from_millis(100)).unwrap();
    let limiter = two_shards_one_key(quota, &clock);
    assert!(limiter.try_acquire(&1).is_allowed()); // shard 0
    clock.advance(Duration::from_secs(1));
    assert!(limiter.try_acquire(&(SHARD_1 | 2)).is_allowed()); // key 1 into limbo
    clock.advance(Duration::from_secs(1)); // key 2 idle for ten fill times
    let decision = limiter.try_acquire(&(SHARD_1 | 3));
    assert!(decision.is_allowed(), "{decision:?} {:?}", limiter.stats());

    let limiter = two_shards_one_key(quota, &clock);
    assert!(limiter.try_acquire(&(SHARD_1 | 1)).is_allowed());
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.sweep(), 1); // key 1 into limbo, in shard 1
    assert!(limiter.try_acquire(&2).is_allowed()); // shard 0
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.sweep(), 1, "an idle key left unswept");
}

/// A look for room at the bound only tried the other shards' locks and
/// skipped those another thread held (here a thread reading `stats`), then
/// refused every new key for a millisecond: new keys were refused though the
/// only key held was idle, some again after waiting the `retry_after` given.
#[test]
fn a_shard_busy_elsewhere_does_not_make_the_bound_refuse_room() {
    // Serial: limbo is freed after a grace period, which waits for readers
    // pinned anywhere in the process; other tests' threads would make it late.
    let _serial = serial();
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1));
    let limiter = two_shards_one_key(Quota::new(1, 1, Duration::from_millis(1)).unwrap(), &clock);
    let stop = AtomicBool::new(false);
    let (mut refused, mut refused_again) = (0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Relaxed: only ends the loop.
            while !stop.load(Ordering::Relaxed) {
                let _ = limiter.stats();
            }
        });
        for i in 0..20_000u64 {
            // The key held is in the other shard each time.
            let key = if i % 2 == 0 { i } else { SHARD_1 | i };
            if let KeyedDecision::KeyLimit { retry_after } = limiter.try_acquire(&key) {
                refused += 1;
                clock.advance(retry_after.duration());
                if !limiter.try_acquire(&key).is_allowed() {
                    refused_again += 1;
                }
            }
            // Empty limbo while the new key is still busy, then let it idle.
            limiter.sweep();
            limiter.sweep();
            clock.advance(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        (refused, refused_again),
        (0, 0),
        "(refused, refused again after retry_after)"
    );
}

/// Keys that count how many of them are alive.
static LIVE_KEYS: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

#[derive(Hash, PartialEq, Eq, Debug)]
struct Counted(u64);

impl Counted {
    fn new(n: u64) -> Counted {
        LIVE_KEYS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Counted(n)
    }
}

impl Clone for Counted {
    fn clone(&self) -> Counted {
        Counted::new(self.0)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        LIVE_KEYS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn live_keys() -> isize {
    LIVE_KEYS.load(std::sync::atomic::Ordering::SeqCst)
}

/// Keys move when a shard's table grows and shrinks, wait in limbo after a
/// sweep, and are freed after it: each stored key is dropped exactly once,
/// when it is freed or with the limiter, and a key in limbo that returns keeps
/// its bucket through the moves.
#[test]
fn stored_keys_are_dropped_once_through_growth_sweeps_and_shrinking() {
    let _serial = serial();
    let period = Duration::from_secs(1);
    let clock = ManualClock::new();
    let l = KeyedLimiter::<Counted>::builder(quota(3, period))
        .clock(clock.clone())
        .shards(2)
        .max_keys(100_000)
        .build()
        .unwrap();
    let before = live_keys();
    for n in 0..5_000 {
        assert!(l.try_acquire(&Counted::new(n)).is_allowed());
    }
    assert_eq!(live_keys() - before, 5_000, "one stored copy per key");
    // Key 0 spends all but one, then everything idles back to full except
    // keys 0 and 1, spent again just before the sweeps.
    assert!(l.try_acquire(&Counted::new(0)).is_allowed());
    clock.advance(period * 3);
    assert!(l.try_acquire_n(&Counted::new(0), 2).unwrap().is_allowed());
    assert!(l.try_acquire(&Counted::new(1)).is_allowed());
    // The first sweep unlinks the idle keys into limbo, the second frees
    // them (no reader holds them) and shrinks the tables.
    assert_eq!(l.sweep(), 4_998);
    l.sweep();
    assert_eq!(l.len(), 2);
    assert_eq!(live_keys() - before, 2, "the swept keys are dropped");
    assert_eq!(l.remaining(&Counted::new(0)), 1);
    assert_eq!(l.remaining(&Counted::new(1)), 2);
    // A new flood grows the tables again around the two held keys.
    for n in 10_000..13_000 {
        assert!(l.try_acquire(&Counted::new(n)).is_allowed());
    }
    assert_eq!(l.remaining(&Counted::new(0)), 1);
    assert_eq!(live_keys() - before, 3_002);
    drop(l);
    assert_eq!(
        live_keys() - before,
        0,
        "the limiter drops every key it held"
    );
}

/// Tables grow and shrink under decisions on held keys: two threads spend
/// eight hot keys' buckets (1,000 permits each; the clock stands still) while
/// a third floods the limiter with keys left full (admitted, then refunded),
/// sweeps them into limbo, frees them and shrinks the tables, round after
/// round, so that the hot keys' words move between tables many times. Every
/// hot key admits exactly its 1,000: a decision that landed in a word already
/// moved would let more through. (The interleavings that would lose one are
/// rare on real threads; the loom models of growth and shrinking check every
/// one of theirs. This runs the whole path, allocation and all.)
/// Two threads admitting on keys 0 to 7 of `l`, round after round, until
/// `stop` is set and each has made `min_rounds` rounds.
fn spend_eight_keys(l: &Arc<Manual<u64>>, stop: &Arc<AtomicBool>, min_rounds: usize) -> Spenders {
    Spenders(
        (0..2)
            .map(|_| {
                let (l, stop) = (Arc::clone(l), Arc::clone(stop));
                std::thread::spawn(move || {
                    let mut admitted = [0u32; 8];
                    let mut rounds = 0;
                    while rounds < min_rounds || !stop.load(Ordering::Relaxed) {
                        for (key, admitted) in admitted.iter_mut().enumerate() {
                            *admitted += l.try_acquire(&(key as u64)).is_allowed() as u32;
                        }
                        rounds += 1;
                    }
                    admitted
                })
            })
            .collect(),
    )
}

/// Sets its flag when dropped: a thread that holds it stops the spenders
/// when it ends, by returning or by a panic (which its `join` then reports,
/// where the spenders would otherwise spin for ever).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        // Relaxed: a stop flag; the spenders' results are read after `join`.
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A new key's first admission, `attempt` asked again while it is refused
/// with [`KeyedDecision::KeyLimit`], for at most 30 s. The limiter is far
/// below its key bound here, but a new key is refused (by design) while a
/// reader holds its shard's table rebuild longer than an insert waits: a
/// spender descheduled while pinned on a loaded machine. Any other answer
/// fails the test.
fn new_key<T>(mut attempt: impl FnMut() -> Result<T, KeyedDecision>) -> T {
    let start = std::time::Instant::now();
    loop {
        match attempt() {
            Ok(admitted) => return admitted,
            Err(KeyedDecision::KeyLimit { .. }) if start.elapsed() < Duration::from_secs(30) => {
                std::thread::yield_now();
            }
            Err(other) => panic!("a new key: {other:?}"),
        }
    }
}

/// The threads of [`spend_eight_keys`].
struct Spenders(Vec<std::thread::JoinHandle<[u32; 8]>>);

impl Spenders {
    /// Each key's admissions over both threads, once they have stopped.
    fn join(self) -> [u32; 8] {
        let mut total = [0; 8];
        for thread in self.0 {
            for (total, admitted) in total.iter_mut().zip(thread.join().unwrap()) {
                *total += admitted;
            }
        }
        total
    }
}

#[test]
fn tables_growing_and_shrinking_under_decisions_lose_no_admission() {
    // Small floods, many rounds: small tables rebuild quickly, so more
    // rebuilds overlap decisions.
    const ROUNDS: usize = 500;
    const FLOOD: usize = 40;
    let _serial = serial();
    let l = KeyedLimiter::<u64>::builder(quota(1_000, Duration::from_secs(3_600)))
        .clock(ManualClock::new())
        .shards(2)
        .build()
        .unwrap();
    let l = Arc::new(l);
    let stop = Arc::new(AtomicBool::new(false));
    let flooder = {
        let (l, stop) = (Arc::clone(&l), Arc::clone(&stop));
        std::thread::spawn(move || {
            let _stop = SetOnDrop(stop);
            let mut next = 1_000_000u64;
            let (mut evicted, mut grown_back) = (0, 0);
            for _ in 0..ROUNDS {
                for _ in 0..FLOOD {
                    let admission = new_key(|| l.try_acquire_refundable(&next));
                    assert!(admission.refund());
                    next += 1;
                }
                grown_back += l.len();
                evicted += l.sweep();
                l.sweep();
            }
            (evicted, grown_back)
        })
    };
    let spenders = spend_eight_keys(&l, &stop, 1_500);
    let admitted = spenders.join();
    let (evicted, grown_back) = flooder.join().unwrap();
    for (key, &total) in admitted.iter().enumerate() {
        assert_eq!(total, 1_000, "key {key}: {total} admitted of 1,000");
        assert_eq!(l.remaining(&(key as u64)), 0);
    }
    assert_eq!(evicted, ROUNDS * FLOOD, "every flood key was swept");
    assert!(
        grown_back >= ROUNDS * FLOOD,
        "the floods were held: {grown_back}"
    );
    assert_eq!(l.len(), 8);
}

#[test]
fn tables_large_enough_to_prefetch_keep_every_allowance_while_they_grow() {
    // 200,000 keys over two shards: each shard's table passes 131,072 slots,
    // where lookups start prefetching their slots (4 MiB of tables in all).
    // Two threads spend eight keys' allowances while a third inserts the
    // keys that grow the tables through that size, then every key is spent.
    const KEYS: u64 = 200_000;
    let _serial = serial();
    let l = KeyedLimiter::<u64>::builder(quota(3, Duration::from_secs(3_600)))
        .clock(ManualClock::new())
        .shards(2)
        .max_keys(KEYS as usize + 8)
        .build()
        .unwrap();
    let l = Arc::new(l);
    let stop = Arc::new(AtomicBool::new(false));
    let filler = {
        let (l, stop) = (Arc::clone(&l), Arc::clone(&stop));
        std::thread::spawn(move || {
            let _stop = SetOnDrop(stop);
            for k in 100..100 + KEYS {
                new_key(|| match l.try_acquire(&k) {
                    KeyedDecision::Allowed { .. } => Ok(()),
                    other => Err(other),
                });
            }
        })
    };
    let spenders = spend_eight_keys(&l, &stop, 100);
    filler.join().unwrap();
    for (key, &total) in spenders.join().iter().enumerate() {
        let left = l.remaining(&(key as u64));
        assert_eq!(total + left, 3, "key {key}: {total} admitted, {left} left");
    }
    // Every filled key has two permits left, then none, in the grown tables.
    for k in 100..100 + KEYS {
        assert_eq!(l.remaining(&k), 2, "key {k}");
        assert!(l.try_acquire_n(&k, 2).unwrap().is_allowed(), "key {k}");
        assert!(!l.try_acquire(&k).is_allowed(), "key {k}");
    }
    assert_eq!(l.len(), KEYS as usize + 8);
    assert_eq!(l.stats().evicted, 0);
}
