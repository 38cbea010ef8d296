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
use redis_server::{FailingAfter, Server, spawn_on};
use turnstile::redis::{
    AdmittedBy, Deadlines, Guarded, GuardedStats, OnFailure, RedisAlgorithm, RedisConfigError,
    RedisLimitError, RedisLimiter,
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

/// A key's value, absent or not, and how many `SET`s Redis has run (scripts'
/// own included): a peek changes neither.
fn raw(con: &mut dyn ConnectionLike, key: &[u8]) -> (Option<String>, u64) {
    let value: Option<String> = redis::cmd("GET").arg(key).query(con).expect("GET");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    let sets = info
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_set:calls="))
        .map_or(0, |rest| {
            rest.split(',')
                .next()
                .unwrap_or("0")
                .parse()
                .expect("a count")
        });
    (value, sets)
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
        if rng.below(3) == 0 {
            // A peek: the decision it would get, and nothing written (the
            // acquisitions after it, compared with the words, show that too).
            let asked = 1 + rng.below(capacity) as u32;
            let before = raw(&mut con, &limiter.redis_key(key));
            let peeked = limiter
                .peek_n_at(&mut con, key, asked, now)
                .expect("the peek answers");
            assert_eq!(
                peeked,
                algorithm.decide(word, now * 1_000, asked).0,
                "{name}, seed {seed}, step {step}: a peek of {asked} for key {key} at {now} us"
            );
            assert_eq!(
                raw(&mut con, &limiter.redis_key(key)),
                before,
                "{name}: a peek wrote"
            );
        }
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
        (Quota::new(7, 5, 100 * MS).unwrap(), 10_000),
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
    // The call fails, and the local limit answers: its share starts empty in
    // the degraded period (the failover rule), and refills 1 a minute. The
    // wait told is the backoff's, when Redis is tried again and may admit
    // the request, not the share's minute.
    let denied = guarded.try_acquire(&mut con, "k").unwrap();
    assert!(
        denied
            .retry_after()
            .is_some_and(|w| w.duration() <= backoff && w.as_nanos() > 0),
        "the wait until Redis is tried again: {denied:?}"
    );
    assert!(guarded.is_backing_off());
    // During the backoff Redis is not called: the failures stay at 1.
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_denied());
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_denied());
    let stats = guarded.stats();
    assert_eq!((stats.failures, stats.fallbacks, stats.owed), (1, 3, 0));
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

/// A limit of capacity 1: every request asks for the whole capacity, so no
/// debt fits beside it. What the local share admitted while Redis was out
/// is paid all the same, as it goes: every request is denied until the debt
/// is paid. (Claimed beside the request, the debt was 0 every time: each
/// request was admitted alone, and the key owed for good.)
#[test]
fn a_debt_is_paid_by_requests_for_the_whole_capacity() {
    let Some(server) = server() else { return };
    // One token, refilled every 20 ms, in Redis and in the local share.
    let quota = Quota::new(1, 1, 20 * MS).unwrap();
    let global = RedisLimiter::new("whole", TokenBucket::new(quota)).unwrap();
    let clock = turnstile::ManualClock::new();
    let local = KeyedLimiter::builder(quota)
        .clock(clock.clone())
        .build()
        .unwrap();
    // No backoff: each request tries Redis, as a probe.
    let guarded = Guarded::new(global, OnFailure::Local(local), Duration::ZERO);
    let mut con = server.connection();
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_allowed());

    // Redis is out: the local share starts empty, then admits its refill.
    let mut down = FailingAfter(Duration::ZERO);
    let mut local_admitted = 0;
    for _ in 0..5 {
        let decision = guarded.try_acquire(&mut down, "k").unwrap();
        local_admitted += u64::from(decision.is_allowed());
        clock.advance(20 * MS);
    }
    assert_eq!(local_admitted, 4);
    assert_eq!(guarded.stats().owed, 4);

    // Redis answers again: each token it gives the key pays the debt, and
    // no request is admitted until nothing is owed.
    let start = Instant::now();
    let mut calls = 0;
    while guarded.stats().owed > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the debt is never paid: {:?}",
            guarded.stats()
        );
        let decision = guarded.try_acquire(&mut con, "k").unwrap();
        assert!(
            decision.is_denied(),
            "admitted while the key owes: {:?}",
            guarded.stats()
        );
        calls += 1;
        thread::sleep(5 * MS);
    }
    assert!(calls >= 4, "{calls} calls paid 4");
    assert!(!guarded.is_degraded());
    // Paid: the key's next token admits, and nothing is left here.
    thread::sleep(25 * MS);
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_allowed());
    clock.advance(Duration::from_secs(1));
    assert!(guarded.holds_nothing(), "{:?}", guarded.stats());
}

/// The failover ledger keeps a line for every key its local share could
/// hold: in one outage 100,000 keys each fail open once their share has
/// refilled. (Its room was 65,536 keys, fewer with an uneven spread, and a
/// key past it was denied: fail-open turned fail-closed for new keys.)
#[test]
fn an_outage_over_many_keys_fails_open_for_every_key_the_share_holds() {
    let global =
        RedisLimiter::new("many", TokenBucket::new(Quota::per_second(1).unwrap())).unwrap();
    let clock = turnstile::ManualClock::new();
    // A key each: room for 200,000 of them.
    let local = KeyedLimiter::builder(Quota::per_second(1).unwrap())
        .clock(clock.clone())
        .max_keys(200_000)
        .build()
        .unwrap();
    let guarded = Guarded::new(global, OnFailure::Local(local), Duration::from_secs(600));
    let mut down = FailingAfter(Duration::ZERO);
    let keys: Vec<String> = (0..100_000).map(|i| format!("user:{i}")).collect();
    // Each key's share starts empty in the degraded period.
    for key in &keys {
        assert!(guarded.try_acquire(&mut down, key).unwrap().is_denied());
    }
    assert!(guarded.is_backing_off());
    clock.advance(Duration::from_secs(1));
    let denied: Vec<&String> = keys
        .iter()
        .filter(|key| guarded.try_acquire(&mut down, key).unwrap().is_denied())
        .collect();
    assert!(
        denied.is_empty(),
        "{} keys denied after their share refilled, the first {:?}",
        denied.len(),
        denied.first()
    );
    assert_eq!(guarded.stats().owed, keys.len() as u64);
    assert_eq!(guarded.stats().failures, 1);
}

/// A key that holds something other than this limiter's state fails its
/// own calls only: Redis answered, so no backoff starts and no degraded
/// period opens, and the other keys decide in Redis as before.
#[test]
fn a_key_holding_a_foreign_value_fails_alone() {
    let Some(server) = server() else { return };
    let global =
        RedisLimiter::new("p3", TokenBucket::new(Quota::per_second(100).unwrap())).unwrap();
    let backoff = Duration::from_secs(5);
    let guarded = Guarded::fail_closed(global.clone(), backoff);
    let mut con = server.connection();
    let mut plain = server.plain();
    let _: () = redis::cmd("SET")
        .arg(global.redis_key("evil"))
        .arg("x")
        .query(&mut plain)
        .unwrap();
    let _: () = redis::cmd("LPUSH")
        .arg(global.redis_key("list"))
        .arg("x")
        .query(&mut plain)
        .unwrap();
    assert!(guarded.try_acquire(&mut con, "alice").unwrap().is_allowed());
    for (at, key) in ["evil", "list"].into_iter().enumerate() {
        // Its own request is answered by the policy (fail closed: denied,
        // until Redis is tried again), and counted as a failure.
        let denied = guarded.try_acquire(&mut con, key).unwrap();
        assert_eq!(denied.retry_after().map(|w| w.duration()), Some(backoff));
        let stats = guarded.stats();
        assert_eq!(
            (stats.failures, stats.fallbacks),
            (at as u64 + 1, at as u64 + 1)
        );
        assert!(!guarded.is_backing_off(), "{key}");
        assert!(!guarded.is_degraded(), "{key}");
        assert_eq!(stats.degraded_periods, 0);
        // The other keys still decide in Redis.
        assert!(guarded.try_acquire(&mut con, "alice").unwrap().is_allowed());
        assert!(guarded.try_acquire(&mut con, "bob").unwrap().is_allowed());
    }
    // The foreign values stay as they were.
    let kept: String = redis::cmd("GET")
        .arg(global.redis_key("evil"))
        .query(&mut plain)
        .unwrap();
    assert_eq!(kept, "x");

    // After a real outage, a probe that meets such a key ends the backoff
    // all the same: Redis answers.
    let short = Guarded::fail_closed(global, 10 * MS);
    assert!(
        short
            .try_acquire(&mut FailingAfter(Duration::ZERO), "alice")
            .unwrap()
            .is_denied()
    );
    assert!(short.is_backing_off() && short.is_degraded());
    thread::sleep(20 * MS);
    assert!(short.try_acquire(&mut con, "evil").unwrap().is_denied());
    assert!(!short.is_backing_off() && !short.is_degraded());
    assert!(short.try_acquire(&mut con, "alice").unwrap().is_allowed());
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

/// A guarded peek: Redis' answer while Redis answers, taking nothing (a key
/// never asked for stays absent); while Redis is down, failing closed, a
/// denial with the wait until Redis is tried; failing open, the share's
/// answer (the first peek of the outage empties it, as a request would),
/// spending nothing of it.
#[test]
fn a_guarded_peek_spends_nothing_and_answers_by_the_policy_while_redis_fails() {
    let Some(server) = server() else { return };
    let window = FixedWindow::new(2, 60 * 1_000 * MS).unwrap();
    let backoff = Duration::from_secs(5);
    let closed = Guarded::fail_closed(RedisLimiter::new("pc", window).unwrap(), backoff);
    let share = KeyedLimiter::new(Quota::per_second(1_000).unwrap());
    let open = Guarded::new(
        RedisLimiter::new("po", window).unwrap(),
        OnFailure::Local(share),
        backoff,
    );
    let mut con = server.connection();
    for guarded in [&closed, &open] {
        for _ in 0..3 {
            assert_eq!(
                guarded.peek_n(&mut con, "k", 2),
                Ok(Decision::Allowed { remaining: 0 })
            );
        }
    }
    assert_eq!(dbsize(&mut con), 0, "a peek writes nothing");
    assert_eq!(
        closed.try_acquire_n(&mut con, "k", 2),
        Ok(Decision::Allowed { remaining: 0 })
    );
    assert!(closed.peek_n(&mut con, "k", 1).unwrap().is_denied());
    assert!(open.peek_n(&mut con, "k", 1).unwrap().is_allowed());
    assert_eq!(
        closed.peek_n(&mut con, "k", 0),
        Err(AcquireError::ZeroPermits)
    );
    assert_eq!(
        closed.peek_n(&mut con, "k", 3),
        Err(AcquireError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    );
    drop(server);
    let wait = closed
        .peek_n(&mut con, "fresh", 1)
        .unwrap()
        .retry_after()
        .expect("failing closed, denied")
        .duration();
    assert!(
        wait <= backoff && wait > backoff - Duration::from_secs(1),
        "{wait:?}"
    );
    assert_eq!(closed.stats().failures, 1);
    // Failing open: the first peek finds Redis down; as a request would, it
    // empties the key's share for the outage (it starts empty), so it is
    // denied with the share's wait, not the backoff's.
    let first = open.peek_n(&mut con, "k", 1).unwrap();
    assert!(
        first
            .retry_after()
            .is_some_and(|w| w.duration() < Duration::from_secs(1)),
        "{first:?}"
    );
    // Once the share refills (1,000 a second), a peek answers from it,
    // spending nothing, with no request in between.
    thread::sleep(Duration::from_millis(20));
    let remaining = |d: Decision| match d {
        Decision::Allowed { remaining } => remaining,
        denied => panic!("the share has refilled: {denied:?}"),
    };
    let peeked = remaining(open.peek_n(&mut con, "k", 1).unwrap());
    let again = remaining(open.peek_n(&mut con, "k", 1).unwrap());
    assert!(again >= peeked, "a peek spent: {peeked} then {again}");
    assert!(open.try_acquire(&mut con, "k").unwrap().is_allowed());
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
            // A refill is at most the bucket (`AmountAboveCapacity`).
            let quota = Quota::new(capacity, amount.min(capacity), period).unwrap();
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

// Refunds in exact mode.

/// One limiter of each algorithm, 3 permits at once, on the same time scale.
fn refund_limiters(prefix: &str) -> Vec<(&'static str, RedisLimiter)> {
    limiters_of(prefix, 3)
}

/// One limiter of each algorithm, `capacity` permits at once, refilling one
/// per 100 ms or `capacity` per window of `capacity * 100 ms`.
fn limiters_of(prefix: &str, capacity: u32) -> Vec<(&'static str, RedisLimiter)> {
    let quota = Quota::new(capacity, 1, 100 * MS).unwrap();
    let window = capacity * 100 * MS;
    let named = |algorithm: &'static str| format!("{prefix}_{algorithm}");
    vec![
        (
            "token bucket",
            RedisLimiter::new(&named("tb"), TokenBucket::new(quota)).unwrap(),
        ),
        (
            "gcra",
            RedisLimiter::new(&named("gcra"), Gcra::new(quota)).unwrap(),
        ),
        (
            "fixed window",
            RedisLimiter::new(&named("fw"), FixedWindow::new(capacity, window).unwrap()).unwrap(),
        ),
        (
            "sliding window",
            RedisLimiter::new(&named("sw"), SlidingWindow::new(capacity, window).unwrap()).unwrap(),
        ),
    ]
    .into_iter()
    .map(|(name, limiter)| {
        (
            name,
            limiter.with_expiry_slack(Duration::from_secs(60)).unwrap(),
        )
    })
    .collect()
}

/// The decisions on `key` of each request, `(n, time)`, in order.
fn decisions_at(
    con: &mut dyn ConnectionLike,
    limiter: &RedisLimiter,
    key: &str,
    requests: &[(u32, u64)],
) -> Vec<Decision> {
    requests
        .iter()
        .map(|&(n, at)| limiter.try_acquire_n_at(con, key, n, at).expect("decided"))
        .collect()
}

/// Admissions of one permit at a time at `at` until the first denial.
fn admitted_at(con: &mut dyn ConnectionLike, limiter: &RedisLimiter, key: &str, at: u64) -> u32 {
    let mut admitted = 0;
    while limiter
        .try_acquire_n_at(con, key, 1, at)
        .expect("decided")
        .is_allowed()
    {
        admitted += 1;
        assert!(admitted <= 3, "past the capacity");
    }
    admitted
}

#[test]
fn a_refund_leaves_the_key_as_if_never_asked() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let t0 = START_MICROS + 1_000;
    for (name, limiter) in refund_limiters("as_if") {
        // Both keys spend one permit; the refunded key then two more, which
        // go back (a little later, as a response's cost would be settled).
        for key in ["refunded", "twin"] {
            assert!(
                limiter
                    .try_acquire_n_at(&mut con, key, 1, t0)
                    .unwrap()
                    .is_allowed()
            );
        }
        let (decision, receipt) = limiter
            .try_acquire_n_refundable_at(&mut con, "refunded", 2, t0 + 10_000)
            .unwrap();
        assert_eq!(decision, Decision::Allowed { remaining: 0 }, "{name}");
        let receipt = receipt.expect("an admission has a receipt");
        assert_eq!(receipt.permits(), 2);
        assert_eq!(receipt.key(), limiter.redis_key("refunded"));
        assert!(
            limiter
                .try_acquire_n_at(&mut con, "refunded", 1, t0 + 20_000)
                .unwrap()
                .is_denied()
        );
        assert!(
            limiter.refund_at(&mut con, receipt, t0 + 30_000).unwrap(),
            "{name}"
        );
        // From then on the two keys decide alike, to the nanosecond.
        let requests: Vec<(u32, u64)> = [
            (2, 30),
            (1, 30),
            (1, 40),
            (3, 90),
            (1, 150),
            (2, 260),
            (3, 700),
        ]
        .iter()
        .map(|&(n, ms)| (n, t0 + ms * 1_000))
        .collect();
        let refunded = decisions_at(&mut con, &limiter, "refunded", &requests);
        let twin = decisions_at(&mut con, &limiter, "twin", &requests);
        assert_eq!(refunded, twin, "{name}");
        assert!(refunded.iter().any(|d| d.is_denied()) && refunded.iter().any(|d| d.is_allowed()));
    }
}

#[test]
fn a_refund_of_a_fresh_key_deletes_it() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    for (name, limiter) in refund_limiters("fresh") {
        let (_, receipt) = limiter
            .try_acquire_n_refundable_at(&mut con, "k", 3, START_MICROS)
            .unwrap();
        assert!(
            limiter
                .refund_at(&mut con, receipt.unwrap(), START_MICROS)
                .unwrap()
        );
        // GCRA keeps the TAT it moved back to, now, which decides as fresh
        // from now on; the others read as fresh outright.
        let expected = i64::from(name == "gcra");
        assert_eq!(dbsize(&mut con), expected, "{name}");
        assert_eq!(
            admitted_at(&mut con, &limiter, "k", START_MICROS),
            3,
            "{name}"
        );
        let _: () = redis::cmd("FLUSHDB").query(&mut con).unwrap();
    }
}

#[test]
fn a_refund_after_another_admission_is_exact_or_declines_never_more() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let t0 = START_MICROS;
    for (name, limiter) in refund_limiters("another") {
        let (_, first) = limiter
            .try_acquire_n_refundable_at(&mut con, "k", 1, t0)
            .unwrap();
        assert!(
            limiter
                .try_acquire_n_at(&mut con, "k", 1, t0 + 1)
                .unwrap()
                .is_allowed()
        );
        let given = limiter.refund_at(&mut con, first.unwrap(), t0 + 2).unwrap();
        // The windows decrement the count of the window the permit was
        // counted in; the token bucket and GCRA need the state the admission
        // wrote, which the second admission changed.
        let windows = name.contains("window");
        assert_eq!(given, windows, "{name}");
        // Counted at one instant: never more than the twin that was asked
        // the same and never refunded, and as many as one asked only the
        // second time when the refund went through.
        for _ in 0..2 {
            assert!(
                limiter
                    .try_acquire_n_at(&mut con, "twin_both", 1, t0)
                    .unwrap()
                    .is_allowed()
            );
        }
        assert!(
            limiter
                .try_acquire_n_at(&mut con, "twin_second", 1, t0)
                .unwrap()
                .is_allowed()
        );
        let here = admitted_at(&mut con, &limiter, "k", t0 + 3);
        let never_refunded = admitted_at(&mut con, &limiter, "twin_both", t0 + 3);
        let only_second = admitted_at(&mut con, &limiter, "twin_second", t0 + 3);
        assert_eq!((never_refunded, only_second), (1, 2), "{name}");
        assert_eq!(
            here,
            if windows { only_second } else { never_refunded },
            "{name}"
        );
    }
}

#[test]
fn a_window_refund_follows_its_window_and_no_further() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let w = 300_000; // µs
    let t0 = START_MICROS - START_MICROS % w; // the start of window k
    for (name, limiter) in refund_limiters("later") {
        if !name.contains("window") {
            continue;
        }
        // Admitted in window k; another admission in window k + 1 moves the
        // key on.
        let (_, receipt) = limiter
            .try_acquire_n_refundable_at(&mut con, "k", 1, t0)
            .unwrap();
        assert!(
            limiter
                .try_acquire_n_at(&mut con, "k", 1, t0 + w)
                .unwrap()
                .is_allowed()
        );
        let given = limiter
            .refund_at(&mut con, receipt.unwrap(), t0 + w)
            .unwrap();
        if name == "fixed window" {
            // Counted in a window that has passed: nothing is owed.
            assert!(!given);
            assert_eq!(state(&mut con, &limiter.redis_key("k")), [1, t0 / w + 1]);
        } else {
            // Still weighing, as the previous window's count: it goes back.
            assert!(given);
            assert_eq!(state(&mut con, &limiter.redis_key("k")), [1, 0, t0 / w + 1]);
            // Two windows on, it would weigh nothing: declined.
            let (_, receipt) = limiter
                .try_acquire_n_refundable_at(&mut con, "k", 1, t0 + w)
                .unwrap();
            assert!(
                limiter
                    .try_acquire_n_at(&mut con, "k", 1, t0 + 3 * w)
                    .unwrap()
                    .is_allowed()
            );
            assert!(
                !limiter
                    .refund_at(&mut con, receipt.unwrap(), t0 + 3 * w)
                    .unwrap()
            );
            assert_eq!(state(&mut con, &limiter.redis_key("k")), [1, 0, t0 / w + 3]);
        }
    }
}

#[test]
fn a_refund_after_the_key_expired_declines() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    // On Redis' clock: each key is as good as fresh, and expires, within
    // 300 ms of its admission.
    let limiters = refund_limiters("expired");
    let mut receipts = Vec::new();
    for (_, limiter) in &limiters {
        let limiter = limiter.clone().with_expiry_slack(Duration::ZERO).unwrap();
        let (decision, receipt) = limiter.try_acquire_refundable(&mut con, "k").unwrap();
        assert!(decision.is_allowed());
        receipts.push((limiter, receipt.unwrap()));
    }
    let exists = |con: &mut dyn ConnectionLike, key: &[u8]| -> bool {
        redis::cmd("EXISTS").arg(key).query(con).expect("EXISTS")
    };
    for (limiter, receipt) in &receipts {
        // (A fixed window admitted just before its window ends expires at
        // once.)
        if !matches!(limiter.algorithm(), RedisAlgorithm::FixedWindow(_)) {
            assert!(exists(&mut con, receipt.key()), "{:?}", limiter.algorithm());
        }
    }
    // Past the latest expiry: the sliding window's, at the end of the window
    // after the admission's.
    thread::sleep(Duration::from_millis(700));
    for (limiter, receipt) in receipts {
        let key = receipt.key().to_vec();
        assert!(!exists(&mut con, &key));
        assert!(!limiter.refund(&mut con, receipt).unwrap());
        // Declining wrote nothing.
        assert!(!exists(&mut con, &key), "{:?}", limiter.algorithm());
    }
}

#[test]
fn a_refund_keeps_the_expiry_rule() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let now = redis_time(&mut con);
    for (name, limiter) in refund_limiters("expiry") {
        let limiter = limiter.with_expiry_slack(Duration::ZERO).unwrap();
        let key = limiter.redis_key("k");
        // Two permits spent and kept, one refunded: the key lives as long as
        // after the two alone.
        assert!(
            limiter
                .try_acquire_n_at(&mut con, "k", 2, now)
                .unwrap()
                .is_allowed()
        );
        let (_, receipt) = limiter
            .try_acquire_n_refundable_at(&mut con, "k", 1, now)
            .unwrap();
        let pttl = |con: &mut dyn ConnectionLike| -> i64 {
            redis::cmd("PTTL").arg(&key).query(con).unwrap()
        };
        let after_all = pttl(&mut con);
        assert!(
            limiter.refund_at(&mut con, receipt.unwrap(), now).unwrap(),
            "{name}"
        );
        let after_refund = pttl(&mut con);
        assert!(
            limiter
                .try_acquire_n_at(&mut con, "twin", 2, now)
                .unwrap()
                .is_allowed()
        );
        let twin: i64 = redis::cmd("PTTL")
            .arg(limiter.redis_key("twin"))
            .query(&mut con)
            .unwrap();
        // Never longer than before the refund (but for the milliseconds
        // between the two readings): a refund never delays fresh.
        assert!(
            after_refund > 0 && after_refund <= after_all + 20,
            "{name}: {after_refund} against {after_all}"
        );
        // Within the milliseconds the calls took.
        assert!(
            (after_refund - twin).abs() <= 50,
            "{name}: {after_refund} against {twin}"
        );
    }
}

#[test]
fn a_receipt_refunds_only_with_its_limit() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let quota = Quota::new(3, 1, 100 * MS).unwrap();
    let limiter = RedisLimiter::new("own", TokenBucket::new(quota)).unwrap();
    let other = RedisLimiter::new("own", Gcra::new(quota)).unwrap();
    let (_, receipt) = limiter.try_acquire_refundable(&mut con, "k").unwrap();
    let before = state(&mut con, &limiter.redis_key("k"));
    assert!(!other.refund(&mut con, receipt.unwrap()).unwrap());
    assert_eq!(state(&mut con, &limiter.redis_key("k")), before);
    // A key rewritten by something else fails the refund, as a decision.
    let (_, receipt) = limiter.try_acquire_refundable(&mut con, "k").unwrap();
    let _: () = redis::cmd("SET")
        .arg(limiter.redis_key("k"))
        .arg("x")
        .query(&mut con)
        .unwrap();
    assert!(matches!(
        limiter.refund(&mut con, receipt.unwrap()),
        Err(RedisLimitError::Redis(_))
    ));
}

#[test]
fn a_flushed_refund_script_is_loaded_again() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let limiter = RedisLimiter::new("flushed", FixedWindow::new(3, 60_000 * MS).unwrap()).unwrap();
    let (_, receipt) = limiter.try_acquire_n_refundable(&mut con, "k", 2).unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    assert!(limiter.refund(&mut con, receipt.unwrap()).unwrap());
    // Given back once: the key is fresh again, and three are admitted.
    assert_eq!(dbsize(&mut con), 0);
    for left in [2, 1, 0] {
        assert_eq!(
            limiter.try_acquire(&mut con, "k").unwrap(),
            Decision::Allowed { remaining: left }
        );
    }
}

#[test]
fn refunds_on_an_async_connection_from_another_task() {
    let Some(server) = server() else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let quota = Quota::new(2, 1, 60_000 * MS).unwrap();
    let limiter = Arc::new(RedisLimiter::new("async_refund", TokenBucket::new(quota)).unwrap());
    let con = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_secs(2))
        .unwrap()
        .reconnecting(server.client());
    runtime.block_on(async {
        let mut mine = con.clone();
        let (decision, receipt) = limiter
            .try_acquire_n_refundable_async(&mut mine, "k", 2)
            .await
            .unwrap();
        assert_eq!(decision, Decision::Allowed { remaining: 0 });
        // Settled by a task of its own, as a layer settles a response's cost.
        let (settler, mut theirs) = (Arc::clone(&limiter), con.clone());
        let receipt = receipt.unwrap();
        let given = tokio::spawn(async move { settler.refund_async(&mut theirs, receipt).await })
            .await
            .unwrap()
            .unwrap();
        assert!(given);
        assert_eq!(
            limiter.try_acquire_async(&mut mine, "k").await.unwrap(),
            Decision::Allowed { remaining: 1 }
        );
        let (_, receipt) = limiter
            .try_acquire_n_refundable_at_async(&mut mine, "at", 1, START_MICROS)
            .await
            .unwrap();
        assert!(
            limiter
                .refund_at_async(&mut mine, receipt.unwrap(), START_MICROS)
                .await
                .unwrap()
        );
    });
}

#[test]
fn guarded_refunds_go_to_whoever_admitted_and_are_counted() {
    let Some(server) = server() else { return };
    let port = server.port();
    let minute = 60_000 * MS;
    let global =
        RedisLimiter::new("gr", TokenBucket::new(Quota::new(5, 1, minute).unwrap())).unwrap();
    // The local limit on a clock of the test's: its share starts empty in a
    // degraded period, and the test refills it.
    let clock = turnstile::ManualClock::new();
    let local = KeyedLimiter::builder(Quota::new(2, 1, minute).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let backoff = 1_000 * MS;
    let guarded = Guarded::new(global, OnFailure::Local(local), backoff);
    let mut con = server.connection();

    // Redis admits, and takes the permit back.
    let (decision, receipt) = guarded.try_acquire_refundable(&mut con, "k").unwrap();
    assert_eq!(decision, Decision::Allowed { remaining: 4 });
    let receipt = receipt.unwrap();
    assert_eq!(
        (receipt.admitted_by(), receipt.permits()),
        (AdmittedBy::Redis, 1)
    );
    assert!(guarded.refund(&mut con, receipt));
    // A later admission on the key: the token bucket declines.
    let (_, first) = guarded.try_acquire_n_refundable(&mut con, "k", 2).unwrap();
    assert_eq!(
        guarded.try_acquire(&mut con, "k"),
        Ok(Decision::Allowed { remaining: 2 })
    );
    assert!(!guarded.refund(&mut con, first.unwrap()));
    let stats = guarded.stats();
    assert_eq!(
        (stats.refunded, stats.refund_declined, stats.failures),
        (1, 1, 0)
    );
    // A receipt admitted by Redis, held across the outage.
    let (_, held) = guarded.try_acquire_refundable(&mut con, "k").unwrap();
    let held = held.unwrap();

    drop(server); // killed
    let failed_at = Instant::now();
    // The failure: the local share, emptied, denies; two minutes refill it.
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_denied());
    clock.advance(2 * minute);
    // The local limit admits; its refund goes back to it, with no call.
    let (decision, local) = guarded.try_acquire_n_refundable(&mut con, "k", 2).unwrap();
    assert_eq!(decision, Decision::Allowed { remaining: 0 });
    let local = local.unwrap();
    assert_eq!(local.admitted_by(), AdmittedBy::Local);
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_denied());
    assert!(guarded.refund(&mut con, local));
    assert_eq!(
        guarded.try_acquire(&mut con, "k"),
        Ok(Decision::Allowed { remaining: 1 })
    );
    // Redis' receipt is not sent while backing off: declined.
    assert!(!guarded.refund(&mut con, held));
    // More than the local capacity but within Redis': denied (with the wait
    // until Redis is tried), with no receipt.
    let (denied, none) = guarded.try_acquire_n_refundable(&mut con, "k", 5).unwrap();
    assert!(denied.is_denied() && none.is_none());
    let stats = guarded.stats();
    assert_eq!(
        (stats.refunded, stats.refund_declined, stats.failures),
        (2, 2, 1)
    );
    assert!(
        failed_at.elapsed() < backoff,
        "the test was too slow to tell"
    );

    // A refund that fails counts as a failure and a declined refund. Redis is
    // back (empty) after the backoff; a receipt it made before it died fails
    // to refund against a dead one.
    let server = spawn_on(port).expect("redis-server restarts on its port");
    thread::sleep((backoff + 50 * MS).saturating_sub(failed_at.elapsed()));
    let (_, receipt) = guarded.try_acquire_refundable(&mut con, "k").unwrap();
    let receipt = receipt.unwrap();
    assert_eq!(receipt.admitted_by(), AdmittedBy::Redis);
    drop(server);
    assert!(!guarded.refund(&mut con, receipt));
    let stats = guarded.stats();
    assert_eq!(
        (stats.refunded, stats.refund_declined, stats.failures),
        (2, 3, 2)
    );
    assert!(guarded.is_backing_off());

    // A receipt of another Guarded declines.
    let other_local = KeyedLimiter::builder(Quota::new(2, 1, minute).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let other = Guarded::new(
        guarded.limiter().clone(),
        OnFailure::Local(other_local),
        backoff,
    );
    // Its failure empties its share; two minutes refill it.
    assert!(other.try_acquire(&mut con, "k").unwrap().is_denied());
    clock.advance(2 * minute);
    let (_, foreign) = other.try_acquire_refundable(&mut con, "k").unwrap();
    assert!(!guarded.refund(&mut con, foreign.unwrap()));
    assert_eq!(guarded.stats().refund_declined, 4);

    // Where operators see them: through the `metrics` facade.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        turnstile::metrics::describe();
        guarded.stats().publish("refunds");
    });
    let text = handle.render();
    for line in [
        r#"turnstile_redis_refunds_total{limiter="refunds",outcome="refunded"} 2"#,
        r#"turnstile_redis_refunds_total{limiter="refunds",outcome="declined"} 4"#,
        "# HELP turnstile_redis_refunds_total",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in:\n{text}"
        );
    }
}

#[test]
fn guarded_refunds_on_an_async_connection() {
    let Some(server) = server() else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let global = RedisLimiter::new("gra", SlidingWindow::new(2, 60_000 * MS).unwrap()).unwrap();
    let guarded = Arc::new(Guarded::fail_closed(global, 1_000 * MS));
    let con = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_secs(2))
        .unwrap()
        .reconnecting(server.client());
    runtime.block_on(async {
        let mut mine = con.clone();
        let (_, receipt) = guarded
            .try_acquire_n_refundable_async(&mut mine, "k", 2)
            .await
            .unwrap();
        let (settler, mut theirs) = (Arc::clone(&guarded), con.clone());
        let receipt = receipt.unwrap();
        let given = tokio::spawn(async move { settler.refund_async(&mut theirs, receipt).await })
            .await
            .unwrap();
        assert!(given);
        let (decision, _) = guarded
            .try_acquire_refundable_async(&mut mine, "k")
            .await
            .unwrap();
        assert_eq!(decision, Decision::Allowed { remaining: 1 });
    });
    assert_eq!(guarded.stats().refunded, 1);
}

/// Whether a refund of the admission that wrote `written` must go through,
/// by the rule of each algorithm, given the key's state now and whether
/// another admission wrote to the key since.
fn refund_expected(
    name: &str,
    written: &[u64],
    now: Option<&[u64]>,
    n: u64,
    wrote_since: bool,
) -> bool {
    let Some(now) = now else { return false };
    match name {
        "token bucket" | "gcra" => !wrote_since,
        "fixed window" => now[1] == written[1] && now[0] >= n,
        "sliding window" => {
            (now[2] == written[2] && now[0] >= n) || (now[2] == written[2] + 1 && now[1] >= n)
        }
        _ => unreachable!(),
    }
}

fn state_of(con: &mut dyn ConnectionLike, key: &[u8]) -> Option<Vec<u64>> {
    let value: Option<String> = redis::cmd("GET").arg(key).query(con).expect("GET");
    value.map(|v| {
        v.split(':')
            .map(|f| f.parse().expect("a whole number"))
            .collect()
    })
}

/// Random traces at explicit, non-decreasing times, over two keys asked the
/// same: `r`, which also takes refundable admissions and refunds them, and
/// its twin `t`, never asked those. A refund goes through exactly when its
/// algorithm's rule says so, and once one has gone through with no decision
/// told apart in between, the two keys decide alike (the same decisions, the
/// same `remaining`, the same waits) until the next refundable admission.
/// Where the two did part (a refund declined, a request admitted on one key
/// only), the twin is set to the refunded key's state to go on.
#[test]
fn refunded_keys_decide_as_twins_never_asked() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let mut checked = HashMap::<&str, [u32; 4]>::new();
    for seed in 1..=8u64 {
        for (name, limiter) in limiters_of(&format!("twins{seed}"), 3 + seed as u32 % 4) {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let (r, t) = (limiter.redis_key("r"), limiter.redis_key("t"));
            let mut now = START_MICROS + rng.below(1_000_000);
            // The receipt, whether `r` was written since, and whether the two
            // keys were told apart since.
            let mut pending: Option<(turnstile::redis::RedisReceipt, bool, bool)> = None;
            let (mut exact, mut declined, mut compared, mut permissive) = (0, 0, 0, 0);
            for step in 0..250 {
                // Mostly within a window; now and then past two of them.
                now += if rng.below(10) == 0 {
                    rng.below(1_500_000)
                } else {
                    rng.below(80_000)
                };
                let n = 1 + rng.below(3) as u32;
                let what = format!("{name}, seed {seed}, step {step}, at {now}");
                // A refund one step in eight: most refundable admissions see
                // other decisions, and windows move on, before their refund.
                let odds = if pending.is_some() { 8 } else { 4 };
                match (rng.below(odds), pending.take()) {
                    (0, None) => {
                        let (decision, receipt) = limiter
                            .try_acquire_n_refundable_at(&mut con, "r", n, now)
                            .unwrap();
                        assert_eq!(decision.is_allowed(), receipt.is_some(), "{what}");
                        pending = receipt.map(|receipt| (receipt, false, false));
                    }
                    (0, Some((receipt, wrote_since, parted))) => {
                        let written: Vec<u64> = receipt
                            .written()
                            .split(':')
                            .map(|f| f.parse().unwrap())
                            .collect();
                        let current = state_of(&mut con, &r);
                        let expected = refund_expected(
                            name,
                            &written,
                            current.as_deref(),
                            u64::from(receipt.permits()),
                            wrote_since,
                        );
                        let given = limiter.refund_at(&mut con, receipt, now).unwrap();
                        assert_eq!(given, expected, "{what}: {current:?} against {written:?}");
                        if given {
                            exact += 1;
                            // The windows' permissive refunds: after other
                            // admissions, or from the previous count.
                            let moved =
                                current.as_ref().is_some_and(|c| c.last() != written.last());
                            if wrote_since || moved {
                                permissive += 1;
                            }
                        } else {
                            declined += 1;
                        }
                        if !given || parted {
                            // Go on from the refunded key's state.
                            let value: Option<Vec<u8>> =
                                redis::cmd("GET").arg(&r).query(&mut con).unwrap();
                            let _: () = redis::cmd("DEL").arg(&t).query(&mut con).unwrap();
                            if let Some(value) = value {
                                let _: () = redis::cmd("SET")
                                    .arg(&t)
                                    .arg(value)
                                    .arg("PX")
                                    .arg(120_000)
                                    .query(&mut con)
                                    .unwrap();
                            }
                        }
                    }
                    (_, None) => {
                        let on_r = limiter.try_acquire_n_at(&mut con, "r", n, now).unwrap();
                        let on_t = limiter.try_acquire_n_at(&mut con, "t", n, now).unwrap();
                        assert_eq!(on_r, on_t, "{what}");
                        compared += 1;
                    }
                    (_, Some((receipt, wrote_since, parted))) => {
                        // The twin is asked only what the refunded key
                        // admitted: it is that key's history without the
                        // refundable admission, which the refund claims to
                        // leave.
                        let on_r = limiter.try_acquire_n_at(&mut con, "r", n, now).unwrap();
                        let mut parted_now = false;
                        if on_r.is_allowed() {
                            let on_t = limiter.try_acquire_n_at(&mut con, "t", n, now).unwrap();
                            // A twin with less counted admits whatever the
                            // refunded key does, but for a token bucket,
                            // whose refill grid the admission may have moved.
                            parted_now = on_t.is_denied();
                            assert!(!parted_now || name == "token bucket", "{what}");
                        }
                        pending = Some((
                            receipt,
                            wrote_since || on_r.is_allowed(),
                            parted || parted_now,
                        ));
                    }
                }
            }
            let entry = checked.entry(name).or_default();
            for (sum, count) in entry
                .iter_mut()
                .zip([exact, declined, compared, permissive])
            {
                *sum += count;
            }
        }
    }
    // Each algorithm saw refunds go through, refunds declined, and many
    // decisions compared; the windows, refunds after other admissions or
    // from the previous window's count.
    for (name, [exact, declined, compared, permissive]) in checked {
        let report = format!(
            "{name}: {exact} exact ({permissive} permissive), {declined} declined, {compared} compared"
        );
        println!("{report}");
        assert!(exact > 20 && declined > 3 && compared > 300, "{report}");
        assert_eq!(permissive > 10, name.contains("window"), "{report}");
    }
}

/// The text a Prometheus exporter would serve for `stats`, published as
/// `limiter`.
fn rendered(stats: GuardedStats, limiter: &str) -> String {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        turnstile::metrics::describe();
        stats.publish(limiter);
    });
    handle.render()
}

fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in:\n{text}"
        );
    }
}

/// A readiness check across an outage: `ping` answers with its round trip,
/// fails while Redis is gone (which opens a degraded period, and sets the
/// gauge), and ends the period when Redis answers again; blocking and
/// asynchronous alike.
#[test]
fn ping_and_the_degraded_gauge_follow_an_outage() {
    let Some(server) = server() else { return };
    let port = server.port();
    let global =
        RedisLimiter::new("ready", TokenBucket::new(Quota::per_second(100).unwrap())).unwrap();
    let backoff = 200 * MS;
    let guarded = Guarded::fail_closed(global, backoff);
    let mut con = server.connection();
    let rtt = guarded.ping(&mut con).expect("Redis answers");
    assert!(rtt < Duration::from_secs(2), "{rtt:?}");
    assert!(!guarded.is_degraded());
    assert_lines(
        &rendered(guarded.stats(), "ready"),
        &[
            r#"turnstile_redis_degraded{limiter="ready"} 0"#,
            r#"turnstile_redis_degraded_periods_total{limiter="ready"} 0"#,
            "# HELP turnstile_redis_degraded",
        ],
    );

    drop(server); // killed
    let err = guarded.ping(&mut con).expect_err("Redis is gone");
    assert!(matches!(err, RedisLimitError::Redis(_)), "{err}");
    assert!(guarded.is_degraded() && guarded.is_backing_off());
    // The backoff the failed ping began: the policy answers, without a call.
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_denied());
    assert!(guarded.ping(&mut con).is_err(), "a ping always calls");
    let stats = guarded.stats();
    assert_eq!(
        (
            stats.degraded,
            stats.degraded_periods,
            stats.failures,
            stats.fallbacks
        ),
        (true, 1, 2, 1)
    );
    assert_lines(
        &rendered(stats, "ready"),
        &[
            r#"turnstile_redis_degraded{limiter="ready"} 1"#,
            r#"turnstile_redis_degraded_periods_total{limiter="ready"} 1"#,
            r#"turnstile_redis_failures_total{limiter="ready"} 2"#,
        ],
    );

    let server = spawn_on(port).expect("redis-server restarts on its port");
    guarded.ping(&mut con).expect("Redis is back");
    assert!(!guarded.is_degraded() && !guarded.is_backing_off());
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_allowed());
    assert_lines(
        &rendered(guarded.stats(), "ready"),
        &[
            r#"turnstile_redis_degraded{limiter="ready"} 0"#,
            r#"turnstile_redis_degraded_periods_total{limiter="ready"} 1"#,
        ],
    );

    // The asynchronous form, on a connection that survives a restart.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut con = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_secs(2))
        .unwrap()
        .reconnecting(server.client());
    runtime.block_on(async {
        guarded.ping_async(&mut con).await.expect("Redis answers");
        drop(server);
        assert!(guarded.ping_async(&mut con).await.is_err());
        assert!(guarded.is_degraded());
        let _server = spawn_on(port).expect("redis-server restarts on its port");
        guarded.ping_async(&mut con).await.expect("Redis is back");
        assert!(!guarded.is_degraded());
    });
    assert_eq!(guarded.stats().degraded_periods, 2);
}

/// A token bucket's quota changed across a burst of 65,535, where its time
/// unit changes (1 µs to 2 µs), reads the time Redis stored as the same
/// instant: the tokens left stay what they were (never more than the new
/// capacity) and refill under the new quota. The time was stored in the
/// writer's units: raised, a used-up key was refused with a wait of 57
/// years (until its key expired); lowered, it came back full.
#[test]
fn a_token_bucket_whose_time_unit_changes_reads_its_stored_time_the_same() {
    let Some(server) = server() else { return };
    let mut con = server.plain();
    let small = |prefix| {
        RedisLimiter::new(
            prefix,
            TokenBucket::new(Quota::new(100, 1, Duration::from_secs(36)).unwrap()),
        )
        .unwrap()
    };
    // 100,000 at once, one more a millisecond: a 2 µs time unit.
    let large = |prefix| {
        RedisLimiter::new(
            prefix,
            TokenBucket::new(Quota::new(100_000, 1, Duration::from_millis(1)).unwrap()),
        )
        .unwrap()
    };
    assert_eq!(
        Quota::new(100_000, 1, Duration::from_millis(1))
            .unwrap()
            .time_unit(),
        Duration::from_micros(2)
    );
    // Raised: the used-up key has what the new quota refilled since its
    // first admission (one a millisecond), then waits for the next token.
    let began = Instant::now();
    let before = small("unit-raised");
    for _ in 0..100 {
        assert!(before.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    let after = large("unit-raised");
    let mut refilled = 0;
    let wait = loop {
        match after.try_acquire(&mut con, "k").unwrap() {
            Decision::Allowed { .. } => refilled += 1,
            Decision::Denied { retry_after } => break retry_after.duration(),
        }
    };
    let elapsed = began.elapsed().as_millis();
    assert!(
        refilled <= elapsed + 1,
        "{refilled} refilled in {elapsed} ms"
    );
    assert!(wait <= Duration::from_millis(1), "{wait:?}");
    thread::sleep(Duration::from_millis(3));
    assert!(after.try_acquire(&mut con, "k").unwrap().is_allowed());
    // Lowered: the used-up key stays used up, and waits one new period.
    let before = large("unit-lowered");
    assert!(
        before
            .try_acquire_n(&mut con, "k", 100_000)
            .unwrap()
            .is_allowed()
    );
    let after = small("unit-lowered");
    match after.try_acquire(&mut con, "k").unwrap() {
        Decision::Denied { retry_after } => {
            assert!(
                retry_after.duration() <= Duration::from_secs(36),
                "{retry_after:?}"
            )
        }
        admitted => panic!("a used-up key came back full: {admitted:?}"),
    }
}

/// A refund that Redis answers ends a degraded period, as any answered call
/// does ("until a call succeeds"): it left the limiter degraded until the
/// next decision or ping. (A timeout short of the run that backs off opens
/// the period without a backoff, so the refund is sent.)
#[test]
fn a_refund_that_redis_answers_ends_the_degraded_period() {
    let Some(server) = server() else { return };
    let global = RedisLimiter::new(
        "refund-ends",
        TokenBucket::new(Quota::per_hour(100).unwrap()),
    )
    .unwrap();
    let guarded = Guarded::fail_closed(global, 100 * MS);
    let mut con = Deadlines::default()
        .response(50 * MS)
        .unwrap()
        .blocking(server.client());
    let (decision, receipt) = guarded.try_acquire_refundable(&mut con, "k").unwrap();
    assert!(decision.is_allowed());
    let receipt = receipt.expect("an admission's receipt");
    let paused = server.pause(Duration::from_millis(300));
    assert!(guarded.ping(&mut con).is_err());
    assert!(guarded.is_degraded() && !guarded.is_backing_off());
    paused.wait();
    // The connection that timed out is dropped; a fresh one answers.
    let mut con = server.connection();
    assert!(guarded.refund(&mut con, receipt), "{:?}", guarded.stats());
    assert!(!guarded.is_degraded(), "{:?}", guarded.stats());
}
