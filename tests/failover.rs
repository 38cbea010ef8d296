//! The failover rule of the Redis modes (`Guarded`, `LeasedLimiter`) against
//! a real `redis-server` that each test starts on a free port of its own:
//! local shares that start empty in each degraded period, Redis charged for
//! what they admitted, and timeouts that start the backoff only three in a
//! row. Two replicas (threads with a limiter and a connection each, as
//! processes would have) through a `kill -9` and a restart, and through a
//! `SIGSTOP` and a `SIGCONT`, stay within the stated bound.
//!
//! Without `redis-server` on PATH each test says so and passes, unless
//! `TURNSTILE_REQUIRE_REDIS=1` is set (CI sets it), when it fails.

#[allow(dead_code)]
#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redis_server::{Server, spawn_on};
use turnstile::redis::{Deadlines, Guarded, LeasedBuilder, OnFailure, RedisLimiter};
use turnstile::{Decision, Quota, TokenBucket};

const MS: Duration = Duration::from_millis(1);
/// Replicas sharing the limit.
const N: u32 = 2;
/// The bucket: B = 300 tokens, r = 300 a second.
const B: f64 = 300.0;
const R: f64 = 300.0;
/// The largest lease in leased mode.
const LEASE: u32 = 16;

fn quota() -> Quota {
    Quota::new(300, 3, 10 * MS).unwrap()
}

fn server() -> Option<Server> {
    redis_server::server("failover")
}

fn deadlines() -> Deadlines {
    Deadlines::default()
        .connect(50 * MS)
        .unwrap()
        .response(50 * MS)
        .unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Exact,
    Leased,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// `kill -9`, and a new server on the port: Redis loses the key.
    Kill,
    /// `SIGSTOP`, then `SIGCONT`: Redis keeps the key, and hangs meanwhile.
    Stop,
}

/// How a run went: the admissions' times (since the start), and what the
/// limiters still owe Redis at the end.
struct Run {
    admitted: Vec<Duration>,
    owed: u64,
    failures: u64,
    fallbacks: u64,
    fault_at: Duration,
    healed_at: Duration,
    end: Duration,
}

/// Two replicas ask for one permit of key "k" as fast as they can (a 100 µs
/// pause between requests) for 1 s, then through the fault for 1 s, then for
/// 2 s after it ends.
fn run(mode: Mode, fault: Fault) -> Option<Run> {
    let server = server()?;
    let port = server.port();
    let global = RedisLimiter::new("failover", TokenBucket::new(quota())).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(N as usize + 1));
    let start = Instant::now();
    let threads: Vec<_> = (0..N)
        .map(|_| {
            let (global, stop, barrier) = (global.clone(), stop.clone(), barrier.clone());
            let client = server.client();
            thread::spawn(move || {
                let share = || OnFailure::local_share(quota(), N).unwrap();
                let backoff = 200 * MS;
                let mut con = deadlines().blocking(client);
                let mut admitted = Vec::new();
                barrier.wait();
                let stats = match mode {
                    Mode::Exact => {
                        let limiter = Guarded::new(global, share(), backoff);
                        while !stop.load(Ordering::Relaxed) {
                            if limiter.try_acquire(&mut con, "k").unwrap().is_allowed() {
                                admitted.push(start.elapsed());
                            }
                            thread::sleep(Duration::from_micros(100));
                        }
                        let s = limiter.stats();
                        (s.owed, s.failures, s.fallbacks)
                    }
                    Mode::Leased => {
                        let limiter = LeasedBuilder::new(global, LEASE)
                            .unwrap()
                            .on_failure(share(), backoff)
                            .build()
                            .unwrap();
                        while !stop.load(Ordering::Relaxed) {
                            if limiter.try_acquire(&mut con, "k").unwrap().is_allowed() {
                                admitted.push(start.elapsed());
                            }
                            thread::sleep(Duration::from_micros(100));
                        }
                        let s = limiter.stats();
                        (s.owed, s.failures, s.fallbacks)
                    }
                };
                (admitted, stats)
            })
        })
        .collect();
    barrier.wait();
    let begin = start.elapsed();
    thread::sleep(Duration::from_secs(1));
    let fault_at = start.elapsed();
    let server = match fault {
        Fault::Kill => {
            drop(server); // SIGKILL, then waited for
            thread::sleep(Duration::from_secs(1));
            spawn_on(port).expect("redis-server restarts on its port")
        }
        Fault::Stop => {
            server.stop();
            thread::sleep(Duration::from_secs(1));
            server.resume();
            server
        }
    };
    let healed_at = start.elapsed();
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let mut run = Run {
        admitted: Vec::new(),
        owed: 0,
        failures: 0,
        fallbacks: 0,
        fault_at: fault_at - begin,
        healed_at: healed_at - begin,
        end: Duration::ZERO,
    };
    for t in threads {
        let (admitted, (owed, failures, fallbacks)) = t.join().expect("no panic");
        run.admitted
            .extend(admitted.into_iter().map(|a| a.saturating_sub(begin)));
        run.owed += owed;
        run.failures += failures;
        run.fallbacks += fallbacks;
    }
    run.end = start.elapsed() - begin;
    drop(server);
    Some(run)
}

/// What a replica may hold that no bound of exact mode counts: in leased
/// mode, its lease (`L + ⌊L/2⌋`); and one token more for the fraction of a
/// token a local share's refill may hold when it is emptied.
fn slack(mode: Mode) -> f64 {
    let lease = match mode {
        Mode::Exact => 0,
        Mode::Leased => LEASE + LEASE / 2,
    };
    f64::from(N * (lease + 1))
}

/// The bound across the fault: over the whole run of length `T`, with the
/// fault from `f` to `u` (`D = u - f`),
///
/// - Redis keeps the key (`SIGSTOP`): `B + r·T + owed + N·slack`;
/// - Redis loses it (`kill -9`, restart): the restarted bucket is full, so
///   `2B + r·(T - D) + owed + N·slack`, which is within `B + r·T` once the
///   outage lasts a fill time (`D ≥ B/r`, 1 s here);
///
/// and over the fault itself, all local: `r·D + N·slack`.
fn check(mode: Mode, fault: Fault) {
    let Some(run) = run(mode, fault) else { return };
    let total = run.admitted.len() as f64;
    let t = run.end.as_secs_f64();
    let d = (run.healed_at - run.fault_at).as_secs_f64();
    let during = run
        .admitted
        .iter()
        .filter(|a| **a > run.fault_at && **a <= run.healed_at)
        .count() as f64;
    let bound = match fault {
        Fault::Stop => B + R * t,
        Fault::Kill => 2.0 * B + R * (t - d),
    } + run.owed as f64
        + slack(mode);
    let exact = B + R * t;
    eprintln!(
        "{mode:?}, {fault:?}: {total} admitted over {t:.2} s (bound {bound:.0}, exact mode's \
         B + r·T {exact:.0}); {during} in the {d:.2} s of the fault (bound {:.0}); owed {}, \
         failures {}, fallbacks {}",
        R * d + slack(mode),
        run.owed,
        run.failures,
        run.fallbacks,
    );
    assert!(
        run.failures >= 1 && run.fallbacks >= 1,
        "the fault was seen"
    );
    assert!(
        during <= R * d + slack(mode),
        "{during} admitted during the fault"
    );
    assert!(total <= bound, "{total} admitted, bound {bound:.0}");
    // The replicas asked for far more than the bucket gives: they got most
    // of what exact mode would give, not nothing.
    assert!(total >= 0.5 * R * t, "{total} admitted over {t:.2} s");
}

#[test]
fn exact_mode_through_a_kill_and_a_restart_stays_within_the_failover_bound() {
    check(Mode::Exact, Fault::Kill);
}

#[test]
fn leased_mode_through_a_kill_and_a_restart_stays_within_the_failover_bound() {
    check(Mode::Leased, Fault::Kill);
}

#[test]
fn exact_mode_through_sigstop_and_sigcont_stays_within_the_failover_bound() {
    check(Mode::Exact, Fault::Stop);
}

#[test]
fn leased_mode_through_sigstop_and_sigcont_stays_within_the_failover_bound() {
    check(Mode::Leased, Fault::Stop);
}

/// A Redis slow past the deadline once (a 120 ms `CLIENT PAUSE` against a
/// 50 ms deadline) is not declared dead: the call that timed out is answered
/// by the policy (its local share empty: a false failure admits nothing
/// locally), and the next request calls Redis again. Three timeouts in a row
/// start the backoff; the next answered call ends it.
#[test]
fn a_slow_reply_is_one_strike_and_three_in_a_row_start_the_backoff() {
    let Some(server) = server() else { return };
    let global = RedisLimiter::new("strikes", TokenBucket::new(quota())).unwrap();
    let share = OnFailure::local_share(quota(), N).unwrap();
    let limiter = Guarded::new(global, share, Duration::from_secs(5));
    assert_eq!(limiter.timeouts(), 3);
    let mut con = deadlines().blocking(server.client());
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());

    let paused = server.pause(120 * MS);
    let decision = limiter.try_acquire(&mut con, "k").unwrap();
    assert!(decision.is_denied(), "the share starts empty: {decision:?}");
    assert!(!limiter.is_backing_off(), "one timeout is one strike");
    paused.wait();
    assert!(
        limiter.try_acquire(&mut con, "k").unwrap().is_allowed(),
        "Redis decides again at once"
    );
    let stats = limiter.stats();
    assert_eq!((stats.failures, stats.fallbacks, stats.owed), (1, 1, 0));
    assert!(!stats.degraded);

    // Three in a row: the backoff; the next request is not sent. (The
    // share, emptied again by this period, admits what it refills meanwhile.)
    let paused = server.pause(400 * MS);
    for i in 0..3 {
        assert!(!limiter.is_backing_off(), "{i} timeouts");
        let _ = limiter.try_acquire(&mut con, "k").unwrap();
    }
    assert!(limiter.is_backing_off());
    let start = Instant::now();
    let _ = limiter.try_acquire(&mut con, "k").unwrap();
    assert!(start.elapsed() < 50 * MS, "no call while backing off");
    let stats = limiter.stats();
    assert_eq!((stats.failures, stats.fallbacks), (4, 5));
    paused.wait();
    assert!(limiter.ping(&mut con).is_ok());
    assert!(!limiter.is_backing_off() && !limiter.is_degraded());
}

/// What the local share admitted is charged to Redis by the key's next
/// decision there: a restarted (empty, so full) bucket is not full of
/// tokens nobody drew.
#[test]
fn recovery_charges_redis_for_what_the_local_share_admitted() {
    let Some(server) = server() else { return };
    let port = server.port();
    // 10 tokens, 1 a second in Redis; locally (one replica) the same, and a
    // refill of 1 per 20 ms for the test's share.
    let global = RedisLimiter::new(
        "charge",
        TokenBucket::new(Quota::new(10, 1, Duration::from_secs(1)).unwrap()),
    )
    .unwrap();
    let local = turnstile::KeyedLimiter::new(Quota::new(10, 1, 20 * MS).unwrap());
    let backoff = Duration::from_secs(60);
    let limiter = Guarded::new(global, OnFailure::Local(local), backoff);
    let mut con = deadlines().blocking(server.client());
    assert_eq!(
        limiter.try_acquire(&mut con, "k").unwrap(),
        Decision::Allowed { remaining: 9 }
    );
    drop(server); // killed: the call fails at once, and the backoff starts
    let down = Instant::now();
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_denied());
    assert!(limiter.is_backing_off());
    // The share was emptied by the first local decision: 1 per 20 ms.
    thread::sleep(110 * MS);
    let mut local_admitted = 0u32;
    while limiter.try_acquire(&mut con, "k").unwrap().is_allowed() {
        local_admitted += 1;
    }
    let refilled = (down.elapsed().as_secs_f64() / 0.020).floor() as u32 + 1;
    assert!(
        (1..=refilled).contains(&local_admitted),
        "{local_admitted} admitted locally in {:?}",
        down.elapsed()
    );
    assert_eq!(limiter.stats().owed, u64::from(local_admitted));

    let _server = spawn_on(port).expect("redis-server restarts on its port");
    limiter.ping(&mut con).expect("Redis is back");
    // The restarted bucket is full (10); the next decision takes its permit
    // and the debt.
    assert_eq!(
        limiter.try_acquire(&mut con, "k").unwrap(),
        Decision::Allowed {
            remaining: 10 - 1 - local_admitted
        }
    );
    assert_eq!(limiter.stats().owed, 0);
}

/// Paying as it goes, a request asks Redis for the debt alone (at most its
/// own permits): asked for all of them, Redis was charged a request of 5 to
/// pay a debt of 1, and 4 permits went to nobody.
#[test]
fn paying_as_it_goes_charges_redis_the_debt_alone() {
    let Some(server) = server() else { return };
    let mut live = deadlines().blocking(server.client());
    // Nothing listens on port 1: a call there fails at once.
    let mut dead = deadlines().blocking(redis::Client::open("redis://127.0.0.1:1/").unwrap());
    let global = RedisLimiter::new(
        "as-it-goes",
        TokenBucket::new(Quota::new(10, 10, Duration::from_secs(1)).unwrap()),
    )
    .unwrap();
    let direct = global.clone();
    let local = turnstile::KeyedLimiter::new(Quota::new(1, 1, MS).unwrap());
    let limiter = Guarded::new(global, OnFailure::Local(local), Duration::ZERO);
    // A local admission while Redis fails: 1 owed. (The share is emptied at
    // the degraded period's start and refills 1 a millisecond.)
    let _ = limiter.try_acquire(&mut dead, "k");
    let start = Instant::now();
    while limiter.stats().owed == 0 && start.elapsed() < Duration::from_secs(2) {
        thread::sleep(2 * MS);
        let _ = limiter.try_acquire(&mut dead, "k");
    }
    assert_eq!(limiter.stats().owed, 1);
    // Redis back, with 1 token left: the request and the debt (2) are
    // denied, and the key pays as it goes.
    assert!(
        direct
            .try_acquire_n(&mut live, "k", 9)
            .unwrap()
            .is_allowed()
    );
    assert!(limiter.try_acquire(&mut live, "k").unwrap().is_denied());
    assert_eq!(limiter.stats().owed, 1);
    // Full again (10): a request of 5 pays the debt, and only the debt.
    thread::sleep(Duration::from_millis(1_100));
    assert_eq!(
        limiter.try_acquire_n(&mut live, "k", 5).unwrap(),
        Decision::Denied {
            retry_after: turnstile::RetryAfter::from_nanos(1)
        }
    );
    assert_eq!(limiter.stats().owed, 0);
    assert_eq!(
        direct.try_acquire_n(&mut live, "k", 9).unwrap(),
        Decision::Allowed { remaining: 0 },
        "Redis was charged the debt of 1 alone"
    );
}
