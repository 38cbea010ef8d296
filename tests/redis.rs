//! Exact mode on Redis (`turnstile::redis`), against a real `redis-server`
//! that each test starts on a free port of its own and stops when done.
//!
//! Without `redis-server` on PATH each test says so and passes, unless
//! `TURNSTILE_REQUIRE_REDIS=1` is set (CI sets it), when it fails.

#[allow(dead_code)]
#[path = "support/redis_server.rs"]
mod redis_server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Client, ConnectionLike};
use redis_server::{Server, spawn_on};
use turnstile::redis::{
    Deadlines, Guarded, GuardedStats, OnFailure, RedisConfigError, RedisLimitError, RedisLimiter,
};
use turnstile::{
    AcquireError, Algorithm, Decision, FixedWindow, Gcra, KeyedLimiter, Quota, QuotaError,
    SlidingWindow, TokenBucket,
};

fn dbsize(con: &mut dyn ConnectionLike) -> i64 {
    redis::cmd("DBSIZE").query(con).expect("DBSIZE")
}

/// A key's state as the scripts store it: whole numbers joined by ':'.
fn state(con: &mut dyn ConnectionLike, key: &[u8]) -> Vec<u64> {
    let value: String = redis::cmd("GET").arg(key).query(con).expect("a state");
    value
        .split(':')
        .map(|field| field.parse().expect("a whole number"))
        .collect()
}

/// Redis' clock, in microseconds since the Unix epoch.
fn redis_time(con: &mut dyn ConnectionLike) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1_000_000 + micros
}

fn server() -> Option<Server> {
    redis_server::server("redis")
}

/// Deterministic pseudo-random numbers (xorshift), so a failing trace replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 2025-11-30 in microseconds since the Unix epoch: explicit times as large as
/// Redis' own.
const START_MICROS: u64 = 1_764_460_800_000_000;

/// Replay a random trace over several keys through the Redis script and the
/// in-process algorithm (`Algorithm::decide` on a word per key), with the
/// same explicit times, and require the same decisions: admissions with the
/// same `remaining`, denials with the same wait to the nanosecond.
fn differential<A: Algorithm + Copy + Into<turnstile::redis::RedisAlgorithm>>(
    server: &Server,
    name: &str,
    algorithm: A,
    step_micros: u64,
    seed: u64,
    steps: usize,
) -> (usize, usize) {
    // Keys expire on Redis' clock while the trace's time runs much faster;
    // the slack keeps a key written just before it is fresh again alive for a
    // step that goes back in time, however slow the machine is.
    let limiter = RedisLimiter::new(name, algorithm)
        .expect("a configuration Redis keeps exact")
        .with_expiry_slack(Duration::from_secs(60))
        .expect("a slack Redis keeps exact");
    let mut con = server.connection();
    let mut rng = Rng(seed);
    let keys = ["a", "b", "c"];
    let mut words: HashMap<&str, u64> = keys.iter().map(|k| (*k, algorithm.fresh())).collect();
    let mut now = START_MICROS + rng.below(step_micros * 10);
    let capacity = u64::from(algorithm.capacity());
    let (mut allowed, mut denied) = (0, 0);
    for step in 0..steps {
        // Mostly forwards, by up to two steps; sometimes not at all, sometimes
        // back (a reading behind the stored state).
        match rng.below(10) {
            0 => {}
            1 => now -= rng.below(step_micros).min(now - START_MICROS),
            _ => now += rng.below(2 * step_micros) + 1,
        }
        let key = keys[rng.below(keys.len() as u64) as usize];
        // Small requests mostly, the whole capacity sometimes.
        let n = if rng.below(8) == 0 {
            capacity
        } else {
            1 + rng.below(capacity.min(3))
        } as u32;
        let word = words[key];
        let (expected, next) = algorithm.decide(word, now * 1_000, n);
        if let Some(next) = next {
            words.insert(key, next);
        }
        let got = limiter
            .try_acquire_n_at(&mut con, key, n, now)
            .expect("the script answers");
        assert_eq!(
            got, expected,
            "{name}, seed {seed}, step {step}: key {key}, n {n}, at {now} us"
        );
        if got.is_allowed() {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    (allowed, denied)
}

/// Each configuration sees both admissions and denials, or the comparison
/// would prove little.
fn check_mix(name: &str, (allowed, denied): (usize, usize)) {
    assert!(
        allowed > 20 && denied > 20,
        "{name}: {allowed} allowed, {denied} denied"
    );
}

const MS: Duration = Duration::from_millis(1);

#[test]
fn token_bucket_matches_in_process() {
    let Some(server) = server() else { return };
    let cases = [
        (Quota::new(3, 1, 100 * MS).unwrap(), 40_000),
        (Quota::new(10, 3, 250 * MS).unwrap(), 60_000),
        (Quota::new(5, 5, 100 * MS).unwrap(), 30_000),
        (Quota::new(1, 1, 300 * MS).unwrap(), 200_000),
        // 2 µs time units: the reading's place in its unit matters.
        (
            Quota::new(70_000, 7_000, Duration::from_micros(100_000)).unwrap(),
            20_000,
        ),
    ];
    for (i, (quota, step)) in cases.into_iter().enumerate() {
        for seed in 1..=3 {
            let name = format!("tb{i}-{seed}");
            let mix = differential(
                &server,
                &name,
                TokenBucket::new(quota),
                step,
                seed * 7919 + i as u64,
                400,
            );
            if quota.capacity() < 100 {
                check_mix(&name, mix);
            }
        }
    }
}

#[test]
fn fixed_window_matches_in_process() {
    let Some(server) = server() else { return };
    let cases = [
        (3, 200 * MS, 50_000),
        (10, 333 * MS, 40_000),
        (1, 100 * MS, 60_000),
    ];
    for (i, (limit, window, step)) in cases.into_iter().enumerate() {
        for seed in 1..=3 {
            let name = format!("fw{i}-{seed}");
            let algorithm = FixedWindow::new(limit, window).unwrap();
            check_mix(
                &name,
                differential(&server, &name, algorithm, step, seed * 31 + i as u64, 400),
            );
        }
    }
}

#[test]
fn sliding_window_matches_in_process() {
    let Some(server) = server() else { return };
    // Windows and limits whose weights leave nanosecond fractions in the waits.
    let cases = [
        (7, Duration::from_micros(1_000_003), 150_000),
        (3, 200 * MS, 40_000),
        (20, 333 * MS, 10_000),
        (1, 100 * MS, 60_000),
    ];
    for (i, (limit, window, step)) in cases.into_iter().enumerate() {
        for seed in 1..=3 {
            let name = format!("sw{i}-{seed}");
            let algorithm = SlidingWindow::new(limit, window).unwrap();
            check_mix(
                &name,
                differential(&server, &name, algorithm, step, seed * 131 + i as u64, 400),
            );
        }
    }
}

#[test]
fn gcra_matches_in_process() {
    let Some(server) = server() else { return };
    let cases = [
        (Quota::new(3, 1, 100 * MS).unwrap(), 40_000),
        // An emission interval of 333,334 ns (period / amount rounded up to
        // whole nanoseconds): the TAT keeps its nanoseconds.
        (
            Quota::new(10, 3, Duration::from_micros(1_000_001)).unwrap(),
            100_000,
        ),
        (Quota::new(5, 7, 100 * MS).unwrap(), 10_000),
        (Quota::new(1, 1, 300 * MS).unwrap(), 200_000),
    ];
    for (i, (quota, step)) in cases.into_iter().enumerate() {
        for seed in 1..=3 {
            let name = format!("gcra{i}-{seed}");
            check_mix(
                &name,
                differential(
                    &server,
                    &name,
                    Gcra::new(quota),
                    step,
                    seed * 17 + i as u64,
                    400,
                ),
            );
        }
    }
}

/// A local share for 0 processes is refused (it used to be taken as one
/// process, the whole quota here): no server is needed, none is asked.
#[test]
fn a_local_share_for_zero_processes_is_refused() {
    let quota = Quota::per_second(100).unwrap();
    let result = OnFailure::local_share(quota, 0);
    assert!(
        matches!(result, Err(QuotaError::ZeroProcesses)),
        "{result:?}"
    );
    let text = result.unwrap_err().to_string();
    assert!(
        text.contains("0 processes") && text.contains("at least 1"),
        "{text}"
    );
}

/// A deadline under 1 µs (zero included; it used to become 1 µs) is refused
/// by the setter, naming which deadline; 1 µs is accepted. No connection.
#[test]
fn a_deadline_under_a_microsecond_is_refused() {
    let min = Duration::from_micros(1);
    for value in [Duration::ZERO, Duration::from_nanos(999)] {
        assert_eq!(
            Deadlines::default().connect(value),
            Err(RedisConfigError::DeadlineTooShort {
                what: "connect deadline",
                value,
                min
            })
        );
        let err = Deadlines::default().response(value).unwrap_err();
        assert_eq!(
            err,
            RedisConfigError::DeadlineTooShort {
                what: "response deadline",
                value,
                min
            }
        );
        assert!(
            err.to_string().contains(&format!(
                "the response deadline is {value:?}; it must be at least 1µs"
            )),
            "{err}"
        );
    }
    let deadlines = Deadlines::default()
        .connect(min)
        .unwrap()
        .response(min)
        .unwrap();
    assert_eq!(
        (deadlines.connect_timeout(), deadlines.response_timeout()),
        (min, min)
    );
}

/// An expiry slack past 2^47 µs (it used to saturate, and every write then
/// failed on Redis) is refused by the setter; the bound itself is accepted.
#[test]
fn an_expiry_slack_past_the_scripts_bound_is_refused() {
    let limiter =
        || RedisLimiter::new("slack", TokenBucket::new(Quota::per_second(5).unwrap())).unwrap();
    let max = Duration::from_micros(1 << 47);
    for slack in [max + Duration::from_micros(1), Duration::MAX] {
        let err = limiter().with_expiry_slack(slack).err();
        assert_eq!(
            err,
            Some(RedisConfigError::TooLong {
                what: "expiry slack",
                value: slack,
                max
            })
        );
    }
    assert!(limiter().with_expiry_slack(max).is_ok());
    let hour = Duration::from_secs(3_600);
    assert_eq!(
        limiter().with_expiry_slack(hour).unwrap().expiry_slack(),
        hour
    );
}

#[test]
fn a_request_that_can_never_succeed_fails_without_a_round_trip() {
    // No server at all on this connection: the checks come first.
    let nowhere = Deadlines::default().blocking(Client::open("redis://127.0.0.1:1/").unwrap());
    let mut con = nowhere;
    let limiter = RedisLimiter::new("x", TokenBucket::new(Quota::per_second(5).unwrap())).unwrap();
    assert!(matches!(
        limiter.try_acquire_n(&mut con, "k", 0),
        Err(RedisLimitError::Acquire(AcquireError::ZeroPermits))
    ));
    assert!(matches!(
        limiter.try_acquire_n(&mut con, "k", 6),
        Err(RedisLimitError::Acquire(
            AcquireError::InsufficientCapacity {
                requested: 6,
                capacity: 5
            }
        ))
    ));
    assert!(!con.is_connected(), "nothing was sent");
    // A request that could succeed does try, and fails as a Redis error.
    assert!(matches!(
        limiter.try_acquire(&mut con, "k"),
        Err(RedisLimitError::Redis(_))
    ));
}

#[test]
fn idle_keys_expire_once_fresh_again() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let quota = Quota::new(4, 1, 50 * MS).unwrap(); // fill time 200 ms
    let limiters = [
        RedisLimiter::new("tb", TokenBucket::new(quota)).unwrap(),
        RedisLimiter::new("gcra", Gcra::new(quota)).unwrap(),
        RedisLimiter::new("fw", FixedWindow::new(4, 100 * MS).unwrap()).unwrap(),
        RedisLimiter::new("sw", SlidingWindow::new(4, 100 * MS).unwrap()).unwrap(),
    ];
    // At one explicit time, the start of a fixed window: on Redis' own clock
    // a window could end between the two requests (the second admitted) or
    // before the count of keys below (the first key gone).
    for limiter in &limiters {
        for key in ["a", "b"] {
            assert!(
                limiter
                    .try_acquire_n_at(&mut con, key, 4, START_MICROS)
                    .unwrap()
                    .is_allowed()
            );
            assert!(
                limiter
                    .try_acquire_n_at(&mut con, key, 1, START_MICROS)
                    .unwrap()
                    .is_denied()
            );
            let ttl: i64 = redis::cmd("PTTL")
                .arg(limiter.redis_key(key))
                .query(&mut con)
                .unwrap();
            // At most the longest time to be fresh again: 200 ms (the sliding
            // window's two windows, the bucket's and GCRA's fill time).
            assert!(
                ttl > 0 && ttl <= 200,
                "{:?}: PTTL {ttl}",
                limiter.algorithm()
            );
        }
    }
    assert_eq!(dbsize(&mut con), 8);
    // Denials write nothing: still 8 keys. After the longest time to be
    // fresh again, none: `EXISTS` sees a key past its expiry as gone (and
    // deletes it, where Redis' background expiry would get to it within
    // 100 ms or so), so then DBSIZE is 0 too.
    thread::sleep(Duration::from_millis(210));
    let keys: Vec<Vec<u8>> = limiters
        .iter()
        .flat_map(|l| [l.redis_key("a"), l.redis_key("b")])
        .collect();
    let exists: i64 = redis::cmd("EXISTS").arg(&keys).query(&mut con).unwrap();
    assert_eq!(exists, 0);
    assert_eq!(dbsize(&mut con), 0);
    // And a key that comes back finds a fresh allowance.
    for limiter in &limiters {
        assert_eq!(
            limiter.try_acquire_n(&mut con, "a", 4).unwrap(),
            Decision::Allowed { remaining: 0 }
        );
    }
}

#[test]
fn time_comes_from_redis_not_from_any_client() {
    let Some(server) = server() else { return };
    let (mut one, mut two) = (server.connection(), server.connection());
    let quota = Quota::new(2, 1, Duration::from_secs(10)).unwrap();
    let limiter = RedisLimiter::new("t", TokenBucket::new(quota)).unwrap();
    let before = redis_time(&mut one);
    assert_eq!(
        limiter.try_acquire(&mut one, "k").unwrap(),
        Decision::Allowed { remaining: 1 }
    );
    let after = redis_time(&mut one);
    // The bucket's refill time is Redis' clock at the decision.
    let stored = state(&mut one, &limiter.redis_key("k"))[1];
    assert!(
        (before..=after).contains(&stored),
        "{before} <= {stored} <= {after}"
    );
    // A second client (another process, as far as Redis can tell) shares the
    // bucket, and its wait is counted on the same clock.
    assert_eq!(
        limiter.try_acquire(&mut two, "k").unwrap(),
        Decision::Allowed { remaining: 0 }
    );
    let wait = limiter
        .try_acquire(&mut two, "k")
        .unwrap()
        .retry_after()
        .expect("the bucket is empty")
        .duration();
    let end = redis_time(&mut two);
    let waited = Duration::from_micros(end - stored);
    // The next token is due 10 s after the first admission, on Redis' clock.
    assert!(wait <= Duration::from_secs(10) && wait + waited >= Duration::from_secs(10));
    // An explicit time far from Redis' clock is just as valid a clock: the
    // same key, decided 20 s after the stored time, finds the bucket full.
    assert_eq!(
        limiter
            .try_acquire_n_at(&mut one, "k", 2, stored + 20_000_000)
            .unwrap(),
        Decision::Allowed { remaining: 0 }
    );
}

#[test]
fn four_connections_on_one_key_admit_at_most_the_bound() {
    let Some(server) = server() else { return };
    let quota = Quota::new(20, 1, 10 * MS).unwrap();
    let limiter = Arc::new(RedisLimiter::new("hot", TokenBucket::new(quota)).unwrap());
    let admitted = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(4));
    let mut clock = server.connection();
    let start = redis_time(&mut clock);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, admitted, calls, barrier) = (
                limiter.clone(),
                admitted.clone(),
                calls.clone(),
                barrier.clone(),
            );
            let mut con = server.connection();
            thread::spawn(move || {
                barrier.wait();
                let until = Instant::now() + Duration::from_secs(1);
                while Instant::now() < until {
                    let decision = limiter.try_acquire(&mut con, "k").expect("a decision");
                    calls.fetch_add(1, Ordering::Relaxed);
                    if decision.is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("no panic");
    }
    let end = redis_time(&mut clock);
    let elapsed = end - start;
    let admitted = admitted.load(Ordering::Relaxed);
    let bound = 20 + elapsed / 10_000;
    eprintln!(
        "4 connections, {} calls in {elapsed} us: {admitted} admitted, bound {bound}",
        calls.load(Ordering::Relaxed)
    );
    assert!(admitted <= bound, "{admitted} admitted > bound {bound}");
    // It did admit the refills, not just the burst: well over half of them.
    assert!(admitted > 20 + elapsed / 20_000, "{admitted} admitted");
}

#[test]
fn a_flushed_script_is_loaded_again_and_counted_once() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let limiter =
        RedisLimiter::new("f", FixedWindow::new(10, Duration::from_secs(60)).unwrap()).unwrap();
    let now = START_MICROS;
    assert_eq!(
        limiter.try_acquire_n_at(&mut con, "k", 2, now).unwrap(),
        Decision::Allowed { remaining: 8 }
    );
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    // NOSCRIPT, then SCRIPT LOAD and the call again: 3 more, counted once.
    assert_eq!(
        limiter.try_acquire_n_at(&mut con, "k", 3, now).unwrap(),
        Decision::Allowed { remaining: 5 }
    );
    assert_eq!(state(&mut con, &limiter.redis_key("k"))[0], 5);
}

#[test]
fn a_call_past_its_deadline_fails_fast_and_the_late_reply_is_never_read() {
    let Some(server) = server() else { return };
    let limiter =
        RedisLimiter::new("d", FixedWindow::new(100, Duration::from_secs(60)).unwrap()).unwrap();
    let mut con = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_millis(50))
        .unwrap()
        .blocking(server.client());
    assert_eq!(
        limiter
            .try_acquire_n_at(&mut con, "k", 1, START_MICROS)
            .unwrap(),
        Decision::Allowed { remaining: 99 }
    );
    // Redis busy for 2 s: the next decision waits 50 ms, not 2 s.
    let sleeper = server.pause(Duration::from_secs(2));
    let start = Instant::now();
    let err = limiter
        .try_acquire_n_at(&mut con, "k", 10, START_MICROS)
        .expect_err("Redis is asleep");
    let took = start.elapsed();
    assert!(err.is_timeout(), "{err}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(!con.is_connected(), "the connection was dropped");
    sleeper.wait();
    // The next call reads its own reply on a new connection: 88 left if the
    // timed-out call ran once Redis woke, 98 if it never reached the script;
    // never the late reply (89 left).
    let next = limiter
        .try_acquire_n_at(&mut con, "k", 1, START_MICROS)
        .unwrap();
    assert!(
        matches!(next, Decision::Allowed { remaining: 88 | 98 }),
        "{next:?}"
    );
}

#[test]
fn the_async_api_decides_as_the_blocking_one() {
    let Some(server) = server() else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let quota = Quota::new(3, 1, Duration::from_secs(1)).unwrap();
    let limiter = RedisLimiter::new("async", Gcra::new(quota)).unwrap();
    let deadlines = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_secs(2))
        .unwrap();
    runtime.block_on(async {
        let mut con = deadlines.multiplexed(&server.client()).await.unwrap();
        let now = START_MICROS;
        for left in [2, 1, 0] {
            assert_eq!(
                limiter
                    .try_acquire_n_at_async(&mut con, "k", 1, now)
                    .await
                    .unwrap(),
                Decision::Allowed { remaining: left }
            );
        }
        let wait = limiter
            .try_acquire_n_at_async(&mut con, "k", 1, now + 300_000)
            .await
            .unwrap()
            .retry_after()
            .unwrap();
        assert_eq!(wait.duration(), Duration::from_millis(700));
        assert!(matches!(
            limiter.try_acquire_n_async(&mut con, "k", 4).await,
            Err(RedisLimitError::Acquire(_))
        ));
        // On Redis' clock: another key, admitted.
        assert!(
            limiter
                .try_acquire_async(&mut con, "other")
                .await
                .unwrap()
                .is_allowed()
        );
    });
    // The blocking API sees the same state.
    let mut con = server.connection();
    assert!(
        limiter
            .try_acquire_n_at(&mut con, "k", 1, START_MICROS + 300_000)
            .unwrap()
            .is_denied()
    );
}

#[test]
fn one_decision_costs_one_round_trip() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let quota = Quota::new(10_000, 1, Duration::from_micros(1)).unwrap();
    let limiter = RedisLimiter::new("cost", TokenBucket::new(quota)).unwrap();
    // Warm: the script loaded, the connection made; then count from zero.
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let calls = 2_000;
    let start = Instant::now();
    let mut admitted = 0;
    for _ in 0..calls {
        admitted += usize::from(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    let per_call = start.elapsed() / calls as u32;
    // The round trip alone, on the same connection: what the script adds.
    let start = Instant::now();
    for _ in 0..calls {
        let _: String = redis::cmd("PING").query(&mut con).unwrap();
    }
    let per_ping = start.elapsed() / calls as u32;
    eprintln!(
        "one exact-mode decision over TCP loopback: {per_call:?}, a PING {per_ping:?} \
         (means of {calls})"
    );
    assert_eq!(admitted, calls);
    let commands: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .unwrap();
    let evalsha = commands
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .expect("EVALSHA counted");
    assert!(
        evalsha.starts_with(&format!("cmdstat_evalsha:calls={calls},")),
        "{evalsha}"
    );
}

#[test]
fn while_redis_is_down_a_local_limit_answers_and_redis_is_tried_after_the_backoff() {
    let Some(server) = server() else { return };
    let port = server.port();
    let global = RedisLimiter::new(
        "g",
        TokenBucket::new(Quota::new(5, 1, 60 * 1_000 * MS).unwrap()),
    )
    .unwrap();
    // This process's share while Redis is out: 2 per key.
    let local = KeyedLimiter::new(Quota::new(2, 1, 60 * 1_000 * MS).unwrap());
    let backoff = 1_000 * MS;
    let guarded = Guarded::new(global, OnFailure::Local(local), backoff);
    let mut con = server.connection();
    let allowed = |remaining| Ok(Decision::Allowed { remaining });
    assert_eq!(guarded.try_acquire(&mut con, "k"), allowed(4));
    assert_eq!(guarded.stats(), GuardedStats::default());

    drop(server); // killed
    let failed_at = Instant::now();
    // The call fails, and the local limit answers.
    assert_eq!(guarded.try_acquire(&mut con, "k"), allowed(1));
    assert!(guarded.is_backing_off());
    // During the backoff Redis is not called: the failures stay at 1.
    assert_eq!(guarded.try_acquire(&mut con, "k"), allowed(0));
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_denied());
    let stats = guarded.stats();
    assert_eq!((stats.failures, stats.fallbacks), (1, 3));
    assert!(
        failed_at.elapsed() < backoff,
        "the test was too slow to tell"
    );

    // Redis is back (empty); after the backoff it decides again.
    let _server = spawn_on(port).expect("redis-server restarts on its port");
    thread::sleep((backoff + 50 * MS).saturating_sub(failed_at.elapsed()));
    assert_eq!(guarded.try_acquire(&mut con, "k"), allowed(4));
    assert!(!guarded.is_backing_off());
    let stats = guarded.stats();
    assert_eq!((stats.failures, stats.fallbacks), (1, 3));
}

#[test]
fn failing_closed_denies_until_redis_is_tried_again() {
    let Some(server) = server() else { return };
    let global = RedisLimiter::new("c", FixedWindow::new(3, 60 * 1_000 * MS).unwrap()).unwrap();
    let backoff = Duration::from_secs(5);
    let guarded = Guarded::fail_closed(global, backoff);
    let mut con = server.connection();
    assert_eq!(
        guarded.try_acquire_n(&mut con, "k", 3),
        Ok(Decision::Allowed { remaining: 0 })
    );
    drop(server);
    for _ in 0..2 {
        let wait = guarded
            .try_acquire(&mut con, "k")
            .unwrap()
            .retry_after()
            .expect("denied")
            .duration();
        assert!(
            wait <= backoff && wait > backoff - Duration::from_secs(1),
            "{wait:?}"
        );
    }
    assert_eq!(
        guarded.try_acquire_n(&mut con, "k", 4),
        Err(AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        })
    );
    let stats = guarded.stats();
    assert_eq!((stats.failures, stats.fallbacks), (1, 2));
    // Where operators see them: through the `metrics` facade.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        turnstile::metrics::describe();
        stats.publish("shared_api");
    });
    let text = handle.render();
    for line in [
        r#"turnstile_redis_failures_total{limiter="shared_api"} 1"#,
        r#"turnstile_redis_fallbacks_total{limiter="shared_api"} 2"#,
        "# HELP turnstile_redis_failures_total",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in:\n{text}"
        );
    }
}

/// Any parameters, not just the hand-picked ones: a random algorithm with a
/// random capacity, refill and period or window (any whole number of
/// microseconds), and a random trace on it.
#[test]
fn every_algorithm_matches_in_process_for_random_parameters() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let Some(server) = server() else { return };
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let parameters = (0..4u8, 1..=20u32, 1..=5u32, 1..=300_000u64, any::<u64>());
    let case = std::cell::Cell::new(0u32);
    runner
        .run(&parameters, |(kind, capacity, amount, micros, seed)| {
            case.set(case.get() + 1);
            let name = format!("random{}", case.get());
            let period = Duration::from_micros(micros);
            let quota = Quota::new(capacity, amount, period).unwrap();
            // xorshift needs a seed other than 0.
            let seed = seed | 1;
            match kind {
                0 => differential(&server, &name, TokenBucket::new(quota), micros, seed, 60),
                1 => differential(&server, &name, Gcra::new(quota), micros, seed, 60),
                2 => {
                    let fixed = FixedWindow::new(capacity, period).unwrap();
                    differential(&server, &name, fixed, micros, seed, 60)
                }
                _ => {
                    let sliding = SlidingWindow::new(capacity, period).unwrap();
                    differential(&server, &name, sliding, micros, seed, 60)
                }
            };
            Ok(())
        })
        .unwrap();
}

/// The largest values each algorithm allows: the full 32-bit capacity (the
/// token bucket's coarsest time unit), long windows, a sliding window at the
/// edge of what Lua keeps exact, GCRA's longest horizon.
#[test]
fn the_largest_parameters_match_in_process() {
    let Some(server) = server() else { return };
    let hour = Duration::from_secs(3_600);
    let big = Quota::new(u32::MAX, 1 << 30, Duration::from_micros(65_536 * 16)).unwrap();
    differential(&server, "big-tb", TokenBucket::new(big), 300_000, 3, 300);
    let wide = SlidingWindow::new(65_535, 38 * hour).unwrap();
    differential(&server, "big-sw", wide, 3_600_000_000, 5, 300);
    let long = FixedWindow::new(u32::MAX, 24 * hour).unwrap();
    differential(&server, "big-fw", long, 3_600_000_000, 7, 300);
    // 13 days of horizon, an emission interval with nanoseconds.
    let slow = Gcra::new(Quota::new(13, 3, Duration::from_micros(259_200_000_001)).unwrap());
    differential(&server, "big-gcra", slow, 20_000_000_000, 11, 300);
}

#[test]
fn a_key_written_by_something_else_never_panics() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let limiter =
        RedisLimiter::new("w", SlidingWindow::new(3, Duration::from_secs(60)).unwrap()).unwrap();
    let mut plain = server.plain();
    // A string that is not a state: the call fails, naming the key, and the
    // value stays (taken as fresh, it could admit a whole burst more).
    for foreign in [
        "not:a:state:at:all",
        "1:2",
        "-1:2:3",
        "1.5:2:3",
        "",
        // Numbers Lua's tonumber would take, that no limiter writes.
        "inf:0:0",
        "1e400:0:0",
        "0x10:0:0",
        " 5:0:0",
        "-0:0:0",
        "5::0:0",
        ":5:0:0",
        "5:0:0:",
        "99999999999999999999:0:0",
    ] {
        let _: () = redis::cmd("SET")
            .arg(limiter.redis_key("text"))
            .arg(foreign)
            .query(&mut plain)
            .unwrap();
        let err = limiter
            .try_acquire_n_at(&mut con, "text", 3, START_MICROS)
            .expect_err(foreign);
        assert!(
            matches!(err, RedisLimitError::Redis(_)),
            "{foreign:?}: {err}"
        );
        assert!(
            err.to_string().contains("not this limiter's state"),
            "{err}"
        );
        let kept: String = redis::cmd("GET")
            .arg(limiter.redis_key("text"))
            .query(&mut plain)
            .unwrap();
        assert_eq!(kept, foreign);
    }
    // A key of another type: the call fails, as a Redis error.
    let _: () = redis::cmd("LPUSH")
        .arg(limiter.redis_key("list"))
        .arg("x")
        .query(&mut plain)
        .unwrap();
    let err = limiter
        .try_acquire(&mut con, "list")
        .expect_err("WRONGTYPE");
    assert!(matches!(err, RedisLimitError::Redis(_)), "{err}");
    // The connection is still good for the next decision.
    assert!(limiter.try_acquire(&mut con, "fine").unwrap().is_allowed());
}

#[test]
fn an_async_call_to_a_dead_redis_fails_within_its_deadline_and_the_guard_answers() {
    let Some(server) = server() else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limiter = RedisLimiter::new(
        "dead",
        FixedWindow::new(5, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let guarded: Guarded = Guarded::new(limiter.clone(), OnFailure::Deny, Duration::from_secs(5));
    let deadlines = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(200 * MS)
        .unwrap();
    let client = server.client();
    runtime.block_on(async {
        let mut con = deadlines.multiplexed(&client).await.unwrap();
        assert_eq!(
            guarded.try_acquire_async(&mut con, "k").await,
            Ok(Decision::Allowed { remaining: 4 })
        );
        drop(server);
        let start = Instant::now();
        let err = limiter
            .try_acquire_async(&mut con, "k")
            .await
            .expect_err("Redis is gone");
        assert!(matches!(err, RedisLimitError::Redis(_)), "{err}");
        let denied = guarded.try_acquire_async(&mut con, "k").await.unwrap();
        assert!(denied.is_denied());
        // Both within the deadline (or at once, for a closed connection).
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        let stats = guarded.stats();
        assert_eq!((stats.failures, stats.fallbacks), (1, 1));
    });
}

/// Behind any framework, a Redis decision answers as the gate does: the
/// gate's `Outcome` (status, reason, `Retry-After` rounded up) and, with a
/// policy, its `RateLimit` fields.
#[test]
fn a_redis_decision_answers_through_the_gates_outcome() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let quota = Quota::new(2, 1, Duration::from_millis(1_500)).unwrap();
    let limiter = RedisLimiter::new("gate", TokenBucket::new(quota)).unwrap();
    let policy =
        turnstile::RateLimitPolicy::from_algorithm("api", &TokenBucket::new(quota)).unwrap();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let decision = limiter
            .try_acquire_n_at(&mut con, "k", 1, START_MICROS)
            .unwrap();
        let outcome = turnstile::Outcome::from_decision(Some(decision.into()));
        statuses.push(outcome.status());
        if let Some(wait) = outcome.retry_after() {
            assert_eq!(wait.duration(), Duration::from_millis(1_500));
            assert_eq!(outcome.retry_after_secs(), Some(2), "rounded up");
            assert_eq!(outcome.reason(), "Too Many Requests");
            assert!(policy.value(&outcome).is_some());
        }
    }
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(
        turnstile::Outcome::from_decision(None).status(),
        401,
        "no key"
    );
}

/// Failing closed with no backoff still tells a client to come back
/// (`Retry-After: 1`), never that it was due already: the blocking and
/// leased limiters alike, against a port where nothing listens.
#[test]
fn failing_closed_without_a_backoff_denies_with_a_wait() {
    // Port 1: privileged and unused, so refused at once. (A port freed by
    // this test could be taken meanwhile by another test's server.)
    let client = Client::open("redis://127.0.0.1:1/").unwrap();
    let mut con = Deadlines::default()
        .connect(Duration::from_millis(200))
        .unwrap()
        .response(Duration::from_millis(200))
        .unwrap()
        .blocking(client);
    let global =
        RedisLimiter::new("nobody", TokenBucket::new(Quota::per_second(10).unwrap())).unwrap();
    let guarded = Guarded::fail_closed(global.clone(), Duration::ZERO);
    for _ in 0..3 {
        let decision = guarded.try_acquire(&mut con, "k").unwrap();
        let Decision::Denied { retry_after } = decision else {
            panic!("{decision:?}");
        };
        assert!(retry_after.as_nanos() > 0, "{decision:?}");
        assert_eq!(retry_after.header_secs(), 1);
    }
    let leased = turnstile::redis::LeasedBuilder::new(global, 8)
        .unwrap()
        .on_failure(OnFailure::Deny, Duration::ZERO)
        .build()
        .unwrap();
    for _ in 0..3 {
        let decision = leased.try_acquire(&mut con, "k").unwrap();
        let Decision::Denied { retry_after } = decision else {
            panic!("{decision:?}");
        };
        assert!(retry_after.as_nanos() > 0, "{decision:?}");
        assert_eq!(retry_after.header_secs(), 1);
    }
}
