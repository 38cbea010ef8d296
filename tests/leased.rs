//! Leased mode on Redis (`turnstile::redis::LeasedLimiter`), beside exact mode, against a real `redis-server`
//! that each test starts on a free port of its own and stops when done.
//!
//! Without `redis-server` on PATH each test says so and passes, unless
//! `TURNSTILE_REQUIRE_REDIS=1` is set (CI sets it), when it fails.
//!
//! The replicas here are threads, each with a connection and a limiter of its
//! own, as separate processes would have (`examples/distributed.rs` runs
//! processes).

#[allow(dead_code)]
#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redis::ConnectionLike;
use redis_server::{Paused, Server, spawn_on};
use turnstile::redis::{
    BlockingConnection, Deadlines, LeasedBuilder, LeasedLimiter, LeasedStats, MAX_LEASE, OnFailure,
    RedisAlgorithm, RedisConfigError, RedisLimiter,
};
use turnstile::{
    Clock, FixedWindow, Gcra, KeyedConfigError, KeyedLimiter, Quota, RealClock, SlidingWindow,
    TokenBucket,
};

/// A Redis token bucket named `name`: `capacity`, `amount` every `period`.
fn bucket(name: &str, capacity: u32, amount: u32, period: Duration) -> RedisLimiter {
    RedisLimiter::new(
        name,
        TokenBucket::new(Quota::new(capacity, amount, period).unwrap()),
    )
    .unwrap()
}

fn dbsize(con: &mut dyn ConnectionLike) -> i64 {
    redis::cmd("DBSIZE").query(con).expect("DBSIZE")
}

/// Redis' clock, in microseconds since the Unix epoch.
fn redis_time(con: &mut dyn ConnectionLike) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1_000_000 + micros
}

fn server() -> Option<Server> {
    redis_server::server("leased")
}

const MS: Duration = Duration::from_millis(1);

/// The tokens in a key's bucket, as the scripts store it (`tokens:time`).
fn bucket_tokens(con: &mut dyn ConnectionLike, key: &[u8]) -> Option<u64> {
    let value: Option<String> = redis::cmd("GET").arg(key).query(con).expect("GET");
    value.map(|v| v.split(':').next().unwrap().parse().unwrap())
}

/// A real clock read `offset` ahead: a replica whose clock is skewed.
#[derive(Debug)]
struct Skewed {
    real: RealClock,
    offset: u64,
}

impl Clock for Skewed {
    fn now(&self) -> u64 {
        self.real.now() + self.offset
    }
}

/// How a run of replicas went.
struct Run {
    admitted: u64,
    decisions: u64,
    redis_calls: u64,
    start_micros: u64,
    elapsed_micros: u64,
    /// Each admission's request and answer times on Redis' clock (µs),
    /// each within `error_micros`: it was decided between them.
    admissions: Vec<(u64, u64)>,
    error_micros: u64,
}

/// `replicas` threads, each with a connection and a limiter of its own, ask
/// for one permit of key "k" for 600 ms: replica 0 as fast as it can, replica
/// `i` pausing `i * 100 µs` between requests (uneven load). `leased`: leases
/// of at most that many tokens, each replica's clock skewed by `i` seconds;
/// `None`: exact mode. The time is Redis' own, read before and after.
fn replicas(server: &Server, name: &str, quota: Quota, replicas: u32, leased: Option<u32>) -> Run {
    replicas_of(
        server,
        name,
        TokenBucket::new(quota).into(),
        replicas,
        leased,
    )
}

/// [`replicas`] on a limit of any algorithm; `start_micros` in the run is
/// Redis' time when it began.
fn replicas_of(
    server: &Server,
    name: &str,
    algorithm: RedisAlgorithm,
    replicas: u32,
    leased: Option<u32>,
) -> Run {
    let global = RedisLimiter::new(name, algorithm).unwrap();
    let barrier = Arc::new(Barrier::new(replicas as usize + 1));
    let run = Duration::from_millis(600);
    let threads: Vec<_> = (0..replicas)
        .map(|i| {
            let global = global.clone();
            let barrier = barrier.clone();
            let mut con = server.connection();
            thread::spawn(move || {
                let limiter = leased.map(|lease| {
                    LeasedBuilder::new(global.clone(), lease)
                        .unwrap()
                        .clock(Skewed {
                            real: RealClock::default(),
                            offset: u64::from(i) * 1_000_000_000,
                        })
                        .build()
                        .unwrap()
                });
                let pause = Duration::from_micros(u64::from(i) * 100);
                barrier.wait();
                let until = Instant::now() + run;
                let (mut admitted, mut decisions) = (0u64, 0u64);
                let mut times = Vec::new();
                while Instant::now() < until {
                    let asked = Instant::now();
                    let decision = match &limiter {
                        Some(l) => l.try_acquire(&mut con, "k").unwrap(),
                        None => global.try_acquire(&mut con, "k").expect("a decision"),
                    };
                    decisions += 1;
                    admitted += u64::from(decision.is_allowed());
                    if decision.is_allowed() {
                        times.push((asked, Instant::now()));
                    }
                    if !pause.is_zero() {
                        thread::sleep(pause);
                    }
                }
                let calls = limiter
                    .as_ref()
                    .map_or(decisions, |l| l.stats().redis_calls());
                (admitted, decisions, calls, times)
            })
        })
        .collect();
    let mut clock = server.connection();
    // Connected and warm, so that the reading below is one round trip.
    redis_time(&mut clock);
    let before = Instant::now();
    let start = redis_time(&mut clock);
    let after = Instant::now();
    barrier.wait();
    let mut total = Run {
        admitted: 0,
        decisions: 0,
        redis_calls: 0,
        start_micros: start,
        elapsed_micros: 0,
        admissions: Vec::new(),
        error_micros: after.duration_since(before).as_micros() as u64 / 2 + 1,
    };
    // Redis read `start` between `before` and `after`: an instant maps to
    // Redis' clock within half that span.
    let middle = before + after.duration_since(before) / 2;
    for t in threads {
        let (admitted, decisions, calls, times) = t.join().expect("no panic");
        let redis = |at: Instant| start + at.duration_since(middle).as_micros() as u64;
        total.admissions.extend(
            times
                .into_iter()
                .map(|(asked, answered)| (redis(asked), redis(answered))),
        );
        total.admitted += admitted;
        total.decisions += decisions;
        total.redis_calls += calls;
    }
    total.elapsed_micros = redis_time(&mut clock) - start;
    total
}

/// 2, 4 and 8 replicas under uneven load on one key: exact mode admits at
/// most `capacity + refill(T)` over the run, leased mode at most that plus
/// `replicas × (L + ⌊L/2⌋)` (the most the replicas hold when the run begins;
/// every token spent was taken from the bucket first), with clocks skewed by
/// seconds.
#[test]
fn replicas_stay_within_the_stated_bounds() {
    let Some(server) = server() else { return };
    // 50 tokens, one a millisecond.
    let quota = Quota::new(50, 1, MS).unwrap();
    let lease = 16;
    for n in [2u32, 4, 8] {
        for mode in [None, Some(lease)] {
            let name = format!("r{n}-{}", mode.is_some());
            let run = replicas(&server, &name, quota, n, mode);
            // Refill counted in whole periods, plus one for the period the
            // start fell in.
            let refill = run.elapsed_micros / 1_000 + 1;
            let bound = 50 + refill + mode.map_or(0, |l| u64::from(n * (l + l / 2)));
            eprintln!(
                "{n} replicas, {}: {} decisions, {} admitted in {} us, bound {bound}, \
                 {} Redis calls",
                if mode.is_some() { "leased" } else { "exact" },
                run.decisions,
                run.admitted,
                run.elapsed_micros,
                run.redis_calls
            );
            assert!(run.admitted <= bound, "{name}: {} > {bound}", run.admitted);
            // It admitted the refills, not just the burst.
            assert!(run.admitted > 50 + refill / 2, "{name}: {}", run.admitted);
        }
    }
}

/// GCRA leases: a lease of `k` moves the TAT as `k` admissions would, so the
/// meter gives out at most `B + t/T` permits in any time `t` plus what is
/// given back, and the replicas admit at most `B + t/T + N·(L + ⌊L/2⌋)`,
/// the token bucket's leased bound with `r(t) = t/T`. 2, 4 and 8 replicas
/// under uneven load, clocks skewed by seconds; exact mode beside it.
#[test]
fn gcra_replicas_stay_within_the_leased_bound() {
    let Some(server) = server() else { return };
    // A burst of 50, one emission a millisecond.
    let gcra = Gcra::new(Quota::new(50, 1, MS).unwrap());
    let lease = 16;
    for n in [2u32, 4, 8] {
        for mode in [None, Some(lease)] {
            let name = format!("gcra{n}-{}", mode.is_some());
            let run = replicas_of(&server, &name, gcra.into(), n, mode);
            // t/T over the run, rounded up.
            let emitted = run.elapsed_micros.div_ceil(1_000);
            let bound = 50 + emitted + mode.map_or(0, |l| u64::from(n * (l + l / 2)));
            eprintln!(
                "GCRA, {n} replicas, {}: {} decisions, {} admitted in {} us, bound {bound}, \
                 {} Redis calls",
                if mode.is_some() { "leased" } else { "exact" },
                run.decisions,
                run.admitted,
                run.elapsed_micros,
                run.redis_calls
            );
            assert!(run.admitted <= bound, "{name}: {} > {bound}", run.admitted);
            // It admitted the emissions, not just the burst (a quarter of
            // them: a loaded machine runs few decisions in exact mode).
            assert!(run.admitted > 50 + emitted / 4, "{name}: {}", run.admitted);
            if mode.is_some() {
                // Leases amortize: far fewer calls than decisions.
                assert!(
                    run.redis_calls * 4 < run.decisions,
                    "{name}: {} calls for {} decisions",
                    run.redis_calls,
                    run.decisions
                );
            }
        }
    }
}

/// The windows' leases end with the window they were counted in, so every
/// permit is spent in the window that counted it: the replicas admit at most
/// `limit` per window they ran in, leased as exact, with no lease term (a
/// lease spent past its window would add up to `N·(L + ⌊L/2⌋)` per window:
/// 192 here, beside 50). Windows of 100 ms over a 600 ms run, 2, 4 and 8
/// replicas, clocks skewed by seconds.
#[test]
fn window_replicas_stay_within_the_windows_own_bound() {
    let Some(server) = server() else { return };
    let w = 100 * MS;
    let w_micros = 100_000;
    let lease = 16;
    let algorithms: [(&str, RedisAlgorithm); 2] = [
        ("fixed", FixedWindow::new(50, w).unwrap().into()),
        ("sliding", SlidingWindow::new(50, w).unwrap().into()),
    ];
    for (kind, algorithm) in algorithms {
        for n in [2u32, 4, 8] {
            for mode in [None, Some(lease)] {
                let name = format!("{kind}{n}-{}", mode.is_some());
                let run = replicas_of(&server, &name, algorithm, n, mode);
                let first = run.start_micros / w_micros;
                let last = (run.start_micros + run.elapsed_micros) / w_micros;
                let windows = last - first + 1;
                let bound = 50 * windows;
                eprintln!(
                    "{kind} window, {n} replicas, {}: {} decisions, {} admitted in {windows} \
                     windows, bound {bound}, {} Redis calls",
                    if mode.is_some() { "leased" } else { "exact" },
                    run.decisions,
                    run.admitted,
                    run.redis_calls
                );
                assert!(run.admitted <= bound, "{name}: {} > {bound}", run.admitted);
                // Window by window: the admissions surely decided inside
                // each (asked and answered in it, more than the time error
                // from its ends) are at most the limit. A lease spent past
                // its window would put its permits in the next window,
                // beside that window's own limit.
                let err = run.error_micros;
                let mut per_window = std::collections::BTreeMap::new();
                for &(asked, answered) in &run.admissions {
                    let window = asked.saturating_sub(err) / w_micros;
                    if window == (answered + err) / w_micros {
                        *per_window.entry(window).or_insert(0u32) += 1;
                    }
                }
                let most = per_window.values().copied().max().unwrap_or(0);
                assert!(
                    most <= 50,
                    "{name}: {most} admitted in one window (time error {err} us): \
                     {per_window:?}"
                );
                // It admitted in most windows, not just the first.
                assert!(
                    run.admitted > 50 * (windows - 2) / 2,
                    "{name}: {}",
                    run.admitted
                );
                if mode.is_some() {
                    assert!(
                        run.redis_calls * 2 < run.decisions,
                        "{name}: {} calls for {} decisions",
                        run.redis_calls,
                        run.decisions
                    );
                }
            }
        }
    }
}

/// A leased peek: the lease held here answers with no call, taking nothing;
/// beyond it, Redis' answer for the limit's own state (an exact process's
/// spending shows), again taking nothing; past the limit, a denial.
#[test]
fn a_leased_peek_answers_from_the_lease_held_or_from_redis_and_spends_nothing() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let global = bucket("peek", 10, 1, Duration::from_secs(3_600));
    let leased = LeasedBuilder::new(global.clone(), 4)
        .unwrap()
        .build()
        .unwrap();
    // Nothing held: Redis answers, and nothing is written.
    assert_eq!(
        leased.peek_n(&mut con, "k", 3),
        Ok(turnstile::Decision::Allowed { remaining: 7 })
    );
    assert_eq!(dbsize(&mut con), 0);
    // The first leases are small; a few requests grow one that lasts.
    for _ in 0..3 {
        if leased.held("k") == 0 {
            assert!(leased.try_acquire(&mut con, "k").unwrap().is_allowed());
        }
    }
    let held = leased.held("k");
    assert!(held >= 1, "a lease is held");
    let calls = leased.stats().lease_calls + leased.stats().exact_calls;
    let in_redis = bucket_tokens(&mut con, &global.redis_key("k"));
    for _ in 0..3 {
        assert_eq!(
            leased.peek_n(&mut con, "k", held),
            Ok(turnstile::Decision::Allowed { remaining: 0 })
        );
    }
    assert_eq!(leased.held("k"), held, "a peek spends nothing held");
    assert_eq!(
        leased.stats().lease_calls + leased.stats().exact_calls,
        calls
    );
    assert_eq!(bucket_tokens(&mut con, &global.redis_key("k")), in_redis);
    // Past what is held: Redis' own state, which an exact process spends.
    let left = u32::try_from(in_redis.expect("a state")).unwrap();
    assert!(leased.peek_n(&mut con, "k", held + 1).unwrap().is_allowed());
    for _ in 0..left {
        assert!(global.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    assert!(leased.peek_n(&mut con, "k", held + 1).unwrap().is_denied());
    assert_eq!(leased.held("k"), held);
    assert_eq!(
        leased.peek_n(&mut con, "k", 0),
        Err(turnstile::AcquireError::ZeroPermits)
    );
}

/// A peek answers what a request would at that moment where the word
/// decides: short of `n` in the lease held, with the rest in Redis, the
/// request leases what it lacks, and the peek asks Redis for that much (not
/// for all of `n`, which Redis no longer has).
#[test]
fn a_leased_peek_past_the_lease_held_asks_redis_for_what_it_lacks() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let global = bucket("peek-lack", 10, 1, Duration::from_secs(3_600));
    let leased = LeasedBuilder::new(global.clone(), 4)
        .unwrap()
        .build()
        .unwrap();
    for _ in 0..3 {
        if leased.held("k") == 0 {
            assert!(leased.try_acquire(&mut con, "k").unwrap().is_allowed());
        }
    }
    let held = leased.held("k");
    assert!(held >= 1);
    // Another (exact) process spends Redis down to one token.
    let key = global.redis_key("k");
    while bucket_tokens(&mut con, &key).unwrap() > 1 {
        assert!(global.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    let peeked = leased.peek_n(&mut con, "k", held + 1).unwrap();
    assert_eq!(
        bucket_tokens(&mut con, &key),
        Some(1),
        "a peek takes nothing"
    );
    let acquired = leased.try_acquire_n(&mut con, "k", held + 1).unwrap();
    assert!(
        peeked.is_allowed() && acquired.is_allowed(),
        "held {held}, Redis 1: the peek of {} answered {peeked:?}, the request {acquired:?}",
        held + 1
    );
    assert!(leased.peek_n(&mut con, "k", 1).unwrap().is_denied());
}

/// A denial kept in the key's word answers a request with no call, and a
/// peek the same: a refund to Redis meanwhile changes neither.
#[test]
fn a_leased_peek_answers_with_the_denial_kept_as_a_request_would() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let global = bucket("peek-kept", 100, 1, Duration::from_secs(3_600));
    let leased = LeasedBuilder::new(global.clone(), 64)
        .unwrap()
        .build()
        .unwrap();
    assert!(
        global
            .try_acquire_n(&mut con, "k", 99)
            .unwrap()
            .is_allowed()
    );
    let (last, receipt) = global.try_acquire_refundable(&mut con, "k").unwrap();
    assert!(last.is_allowed());
    // Redis is dry: the leased request is denied and the denial kept.
    assert!(leased.try_acquire(&mut con, "k").unwrap().is_denied());
    // The exact process gives its permit back: Redis holds one token.
    assert!(global.refund(&mut con, receipt.unwrap()).unwrap());
    assert_eq!(bucket_tokens(&mut con, &global.redis_key("k")), Some(1));
    let peeked = leased.peek_n(&mut con, "k", 1).unwrap();
    let acquired = leased.try_acquire_n(&mut con, "k", 1).unwrap();
    assert!(
        peeked.is_denied() && acquired.is_denied(),
        "peek {peeked:?}, request {acquired:?}"
    );
}

/// A GCRA lease moves the TAT by what it took and a give-back moves it back
/// by what was not spent: with no emission over the test, exact and leased
/// processes together admit exactly the burst, and what was given back is
/// there again for exact mode.
#[test]
fn gcra_exact_and_leased_share_one_limit_and_give_back() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    // A burst of 100, one emission an hour.
    let gcra = Gcra::new(Quota::new(100, 1, Duration::from_secs(3_600)).unwrap());
    let global = RedisLimiter::new("gcra-share", gcra).unwrap();
    let leased = LeasedBuilder::new(global.clone(), 8)
        .unwrap()
        .build()
        .unwrap();
    let mut admitted = 0;
    for i in 0..300 {
        let decision = if i % 3 == 0 {
            global.try_acquire(&mut con, "k").unwrap()
        } else {
            leased.try_acquire(&mut con, "k").unwrap()
        };
        admitted += u64::from(decision.is_allowed());
    }
    let held = u64::from(leased.held("k"));
    let back = leased.give_back_all(&mut con);
    assert_eq!(back, held);
    assert_eq!(admitted + back, 100, "admitted {admitted}, back {back}");
    // What was given back conforms again, and no more.
    let mut again = 0;
    for _ in 0..back + 5 {
        again += u64::from(global.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    assert_eq!(again, back);
}

/// A GCRA give-back never gives the meter more room than its burst: a lease
/// given back after time has drained the meter finds a fresh key (its TAT
/// not after now) and leaves it so, and exact mode then admits the burst and
/// what was emitted meanwhile, no more.
#[test]
fn a_gcra_give_back_after_the_meter_drained_adds_nothing() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    // A burst of 10, one emission every 10 ms.
    let gcra = Gcra::new(Quota::new(10, 1, 10 * MS).unwrap());
    let global = RedisLimiter::new("gcra-drained", gcra).unwrap();
    let leased = LeasedBuilder::new(global.clone(), 8)
        .unwrap()
        .build()
        .unwrap();
    for _ in 0..4 {
        assert!(leased.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    let held = u64::from(leased.held("k"));
    assert!(held > 0, "a lease is held");
    // 150 ms: 15 emissions, more than the burst: the meter is empty.
    thread::sleep(150 * MS);
    assert_eq!(leased.give_back_all(&mut con), held);
    let start = Instant::now();
    let mut admitted = 0u64;
    for _ in 0..40 {
        admitted += u64::from(global.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    let emitted = (start.elapsed().as_micros() as u64).div_ceil(10_000);
    assert!(
        (10..=10 + emitted).contains(&admitted),
        "{admitted} admitted, burst 10, {emitted} emitted"
    );
}

/// A window's give-back returns the unspent permits to the window the lease
/// was counted in, and only while the key still counts that window: with a
/// long window, exact and leased together admit exactly the limit, and what
/// was given back is there again; after the window has passed, a give-back
/// returns nothing (the permits count nowhere any more).
#[test]
fn window_leases_give_back_to_their_own_window_only() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let algorithms: [(&str, RedisAlgorithm); 2] = [
        (
            "fixed",
            FixedWindow::new(100, Duration::from_secs(3_600))
                .unwrap()
                .into(),
        ),
        (
            "sliding",
            SlidingWindow::new(100, Duration::from_secs(3_600))
                .unwrap()
                .into(),
        ),
    ];
    for (kind, algorithm) in algorithms {
        // Away from a window's end (the windows start at the Unix epoch).
        let into_hour = redis_time(&mut con) % 3_600_000_000;
        if into_hour > 3_590_000_000 {
            thread::sleep(Duration::from_micros(3_600_000_000 - into_hour + 1_000));
        }
        let global = RedisLimiter::new(&format!("{kind}-share"), algorithm).unwrap();
        let leased = LeasedBuilder::new(global.clone(), 8)
            .unwrap()
            .build()
            .unwrap();
        let mut admitted = 0;
        for i in 0..300 {
            let decision = if i % 3 == 0 {
                global.try_acquire(&mut con, "k").unwrap()
            } else {
                leased.try_acquire(&mut con, "k").unwrap()
            };
            admitted += u64::from(decision.is_allowed());
        }
        let held = u64::from(leased.held("k"));
        let back = leased.give_back_all(&mut con);
        assert_eq!(back, held, "{kind}");
        assert_eq!(
            admitted + back,
            100,
            "{kind}: admitted {admitted}, back {back}"
        );
        let mut again = 0;
        for _ in 0..back + 5 {
            again += u64::from(global.try_acquire(&mut con, "k").unwrap().is_allowed());
        }
        assert_eq!(again, back, "{kind}");
    }
    // Windows of 50 ms: a lease taken in one window and given back in a
    // later one finds the key counting that later window, and returns
    // nothing to it.
    for (kind, algorithm) in [
        (
            "fixed",
            RedisAlgorithm::from(FixedWindow::new(10, 50 * MS).unwrap()),
        ),
        ("sliding", SlidingWindow::new(10, 50 * MS).unwrap().into()),
    ] {
        let global = RedisLimiter::new(&format!("{kind}-late"), algorithm).unwrap();
        let leased = LeasedBuilder::new(global.clone(), 8)
            .unwrap()
            .lifetime(Duration::from_secs(1))
            .build()
            .unwrap();
        // The first request of a key takes a lease of one; spend to grow it.
        for _ in 0..4 {
            assert!(leased.try_acquire(&mut con, "k").unwrap().is_allowed());
        }
        let held = leased.held("k");
        // The lease ended with its window: nothing is held past it, and a
        // give-back has nothing to return.
        let now = redis_time(&mut con);
        thread::sleep(Duration::from_micros(50_000 - now % 50_000 + 5_000));
        assert_eq!(leased.held("k"), 0, "{kind}: {held} held past the window");
        assert_eq!(leased.give_back_all(&mut con), 0, "{kind}");
    }
}

/// Each algorithm leases with a local share for its failure policy
/// (`OnFailure::local_share_of`): with no Redis to reach, the requests are
/// answered by the share, which starts empty and admits what it refills, no
/// more than its rate allows over the run.
#[test]
fn every_algorithm_fails_open_to_its_local_share() {
    // Nothing listens on port 1: every call fails at once.
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let algorithms: [(&str, RedisAlgorithm); 4] = [
        (
            "token bucket",
            TokenBucket::new(Quota::per_second(100).unwrap()).into(),
        ),
        ("gcra", Gcra::new(Quota::per_second(100).unwrap()).into()),
        ("fixed", FixedWindow::new(100, 100 * MS).unwrap().into()),
        (
            "sliding",
            SlidingWindow::new(100, Duration::from_secs(1))
                .unwrap()
                .into(),
        ),
    ];
    for (kind, algorithm) in algorithms {
        let mut con = Deadlines::default().blocking(client.clone());
        let global = RedisLimiter::new("down", algorithm).unwrap();
        let leased = LeasedBuilder::new(global, 10)
            .unwrap()
            .on_failure(
                OnFailure::local_share_of(algorithm, 2).unwrap(),
                Duration::from_secs(10),
            )
            .build()
            .unwrap();
        let start = Instant::now();
        let mut admitted = 0u64;
        while start.elapsed() < 300 * MS {
            admitted += u64::from(leased.try_acquire(&mut con, "k").unwrap().is_allowed());
            thread::sleep(Duration::from_micros(200));
        }
        let elapsed = start.elapsed();
        let stats = leased.stats();
        // The share of 2 processes, from empty: one every 20 ms (a fixed
        // window's share: 50 at once every 100 ms, half the window's limit).
        let micros = elapsed.as_micros() as u64;
        let most = match kind {
            "fixed" => 50 * (micros / 100_000 + 1),
            _ => micros.div_ceil(20_000),
        };
        eprintln!(
            "{kind}: {admitted} admitted by the share in {elapsed:?}, at most {most}; {stats:?}"
        );
        assert!(stats.fallbacks > 0, "{kind}: {stats:?}");
        assert!(admitted <= most, "{kind}: {admitted} > {most}");
        assert!(admitted >= 1, "{kind}: the share admitted nothing");
    }
}

/// A request the local share refuses is told the wait until Redis is tried
/// again when the share's own is longer: the share starts empty in each
/// degraded period, so a bucket of 100 refilled one an hour, shared by two
/// processes, told two hours where Redis was tried after a second.
#[test]
fn a_share_denial_waits_no_longer_than_until_redis_is_tried_again() {
    // Nothing listens on port 1: every call fails at once.
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let mut con = Deadlines::default().blocking(client);
    let quota = Quota::new(100, 1, Duration::from_secs(3_600)).unwrap();
    let global = RedisLimiter::new("slow-refill", TokenBucket::new(quota)).unwrap();
    let backoff = Duration::from_secs(1);
    let leased = LeasedBuilder::new(global, 10)
        .unwrap()
        .on_failure(OnFailure::local_share(quota, 2).unwrap(), backoff)
        .build()
        .unwrap();
    let denied = leased.try_acquire(&mut con, "k").unwrap();
    let wait = denied.retry_after().expect("the share starts empty");
    assert!(
        wait.duration() <= backoff && wait.as_nanos() > 0,
        "{wait:?}, {:?}",
        leased.stats()
    );
    assert!(leased.stats().fallbacks > 0, "{:?}", leased.stats());
}

/// Every window has a local share, whatever its window and limit: a window
/// that is not a whole number of the bucket's time unit over the limit (3
/// per second, 7 per minute: 333,333.3 µs and 8.57 s a token; a million a
/// minute, whose bucket counts in 16 µs) used to be refused with
/// `PeriodResolution`, and fail-open could not be set up. The share's
/// refill is never faster than the window's limit over the processes.
#[test]
fn every_window_has_a_local_share() {
    let windows = [
        (3, Duration::from_secs(1)),
        (7, Duration::from_secs(60)),
        (100, Duration::from_nanos(1_000_000_001)),
        (1_000_000, Duration::from_secs(61)),
        (70_001, Duration::from_millis(1_333)),
        (u32::MAX >> 4, Duration::from_secs(20 * 86_400 + 1)),
    ];
    for (limit, window) in windows {
        for processes in [1, 2, 3] {
            let algorithms: [(&str, RedisAlgorithm); 2] = [
                ("sliding", SlidingWindow::new(limit, window).unwrap().into()),
                ("fixed", FixedWindow::new(limit, window).unwrap().into()),
            ];
            for (kind, algorithm) in algorithms {
                let share = OnFailure::local_share_of(algorithm, processes)
                    .unwrap_or_else(|e| panic!("{kind} {limit} per {window:?}: {e}"));
                let OnFailure::Local(share) = share else {
                    panic!("{kind}: not a local share");
                };
                let quota = share.algorithm().quota();
                // Tokens per second, the share's against the window's part.
                let ours = f64::from(quota.amount()) / quota.period().as_secs_f64();
                let theirs = f64::from(limit) / window.as_secs_f64() / f64::from(processes);
                assert!(
                    ours <= theirs * (1.0 + 1e-12),
                    "{kind} {limit} per {window:?} over {processes}: {ours}/s > {theirs}/s"
                );
                assert!(
                    quota.capacity() <= (limit / processes).max(1),
                    "{kind} {limit} over {processes}: a burst of {}",
                    quota.capacity()
                );
            }
        }
    }
}

/// A largest lease of 0, above the bucket's capacity, or above `MAX_LEASE`
/// (`u32::MAX` among them) is refused by `LeasedBuilder::new`, which used to
/// clamp it; no builder is made. No server is needed.
#[test]
fn a_lease_of_zero_or_above_the_capacity_or_max_lease_is_refused() {
    let global = bucket("lease-size", 100, 1, MS);
    assert_eq!(
        LeasedBuilder::new(global.clone(), 0).err(),
        Some(RedisConfigError::ZeroLease)
    );
    for max_lease in [101, MAX_LEASE, u32::MAX] {
        let err = LeasedLimiter::builder(global.clone(), max_lease).err();
        assert_eq!(
            err,
            Some(RedisConfigError::LeaseTooLarge {
                max_lease,
                capacity: 100,
                max: 100
            })
        );
        let text = err.unwrap().to_string();
        assert!(
            text.contains(&format!("max_lease is {max_lease} tokens"))
                && text.contains("between 1 and 100"),
            "{text}"
        );
    }
    // A bucket larger than a lease word holds: MAX_LEASE is the bound.
    let large = bucket(
        "lease-size-large",
        u32::MAX,
        1 << 16,
        Duration::from_micros(1 << 16),
    );
    assert_eq!(
        LeasedBuilder::new(large.clone(), u32::MAX).err(),
        Some(RedisConfigError::LeaseTooLarge {
            max_lease: u32::MAX,
            capacity: u32::MAX,
            max: MAX_LEASE
        })
    );
    assert!(LeasedBuilder::new(large, MAX_LEASE).is_ok());
    // The bounds themselves are accepted.
    for max_lease in [1, 100] {
        let limiter = LeasedBuilder::new(global.clone(), max_lease)
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(limiter.max_lease(), max_lease);
    }
}

/// A zero lease lifetime (it used to become 10 ms), or one outside 10 ms to
/// an hour, is reported by `build`, whatever the order of the setters, and
/// builds nothing.
#[test]
fn a_zero_lease_lifetime_is_refused_at_build() {
    let global = bucket("lifetime", 100, 1, MS);
    let range = |lifetime| RedisConfigError::LeaseLifetime {
        lifetime,
        min: Duration::from_millis(10),
        max: Duration::from_secs(3_600),
    };
    for lifetime in [
        Duration::ZERO,
        Duration::from_micros(9_999),
        Duration::from_secs(3_601),
    ] {
        let err = LeasedBuilder::new(global.clone(), 10)
            .unwrap()
            .lifetime(lifetime)
            .build()
            .err();
        assert_eq!(err, Some(range(lifetime)));
    }
    let err = LeasedBuilder::new(global.clone(), 10)
        .unwrap()
        .idle(Duration::ZERO)
        .lifetime(Duration::ZERO)
        .build()
        .err()
        .unwrap();
    assert_eq!(err, range(Duration::ZERO));
    assert!(err.to_string().contains("between 10ms and 3600s"), "{err}");
    for lifetime in [Duration::from_millis(10), Duration::from_secs(3_600)] {
        assert!(
            LeasedBuilder::new(global.clone(), 10)
                .unwrap()
                .lifetime(lifetime)
                .build()
                .is_ok()
        );
    }
}

/// An idle time longer than the lease lifetime (no lease would ever be
/// idle that long: it expires first) is reported by `build`, set before or
/// after the lifetime. An idle time equal to the lifetime is accepted, and
/// an unset one follows a short lifetime down.
#[test]
fn an_idle_time_longer_than_the_lifetime_is_refused_at_build() {
    let global = bucket("idle-lifetime", 100, 1, MS);
    let expected = RedisConfigError::IdleLongerThanLifetime {
        idle: Duration::from_secs(2),
        lifetime: Duration::from_secs(1),
    };
    let after = LeasedBuilder::new(global.clone(), 10)
        .unwrap()
        .lifetime(Duration::from_secs(1))
        .idle(Duration::from_secs(2))
        .build()
        .err();
    assert_eq!(after, Some(expected.clone()));
    let before = LeasedBuilder::new(global.clone(), 10)
        .unwrap()
        .idle(Duration::from_secs(2))
        .lifetime(Duration::from_secs(1))
        .build()
        .err();
    assert_eq!(before, Some(expected.clone()));
    let text = expected.to_string();
    assert!(
        text.contains("idle time of 2s is longer than the lease lifetime of 1s"),
        "{text}"
    );
    assert!(
        LeasedBuilder::new(global.clone(), 10)
            .unwrap()
            .lifetime(Duration::from_secs(1))
            .idle(Duration::from_secs(1))
            .build()
            .is_ok()
    );
    // The default idle time (250 ms) is not an error under a shorter lifetime.
    assert!(
        LeasedBuilder::new(global, 10)
            .unwrap()
            .lifetime(Duration::from_millis(20))
            .build()
            .is_ok()
    );
}

/// `max_keys(0)` (it used to be taken as 1) is refused by `build` with the
/// keyed map's own error, as `KeyedBuilder::max_keys(0)` is.
#[test]
fn a_max_keys_of_zero_is_refused_as_the_keyed_builder_refuses_it() {
    let global = bucket("max-keys", 100, 1, MS);
    let err = LeasedBuilder::new(global.clone(), 10)
        .unwrap()
        .max_keys(0)
        .build()
        .err();
    assert_eq!(
        err,
        Some(RedisConfigError::Keyed(KeyedConfigError::ZeroMaxKeys))
    );
    let keyed = KeyedLimiter::<u64>::builder(Quota::per_second(1).unwrap())
        .max_keys(0)
        .build()
        .err();
    assert_eq!(keyed, Some(KeyedConfigError::ZeroMaxKeys));
    assert!(err.unwrap().to_string().contains("max_keys is 0"));
    assert!(
        LeasedBuilder::new(global, 10)
            .unwrap()
            .max_keys(1)
            .build()
            .is_ok()
    );
}

/// While a lease is held, decisions make no call: at most one lease call per
/// `L` decisions, plus the few while the lease size grows to `L`.
#[test]
fn a_lease_of_l_tokens_costs_one_call_per_l_decisions() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let global = bucket("cost", 1_000_000, 10_000, 10 * MS);
    let limiter = LeasedBuilder::new(global, 100).unwrap().build().unwrap();
    let decisions = 20_000u64;
    for _ in 0..decisions {
        assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    let stats = limiter.stats();
    eprintln!("{decisions} decisions, {stats:?}");
    // Growing 1, 2, 4, ... 64, 100 costs 8 calls; then one per 100 (each
    // fetch brings a whole lease).
    assert!(stats.redis_calls() <= decisions / 100 + 8, "{stats:?}");
    assert_eq!(stats.failures, 0);
    // Published through the `metrics` facade, the same counts.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || stats.publish("leased"));
    let text = handle.render();
    for line in [
        format!(
            r#"turnstile_redis_calls_total{{limiter="leased",call="lease"}} {}"#,
            stats.lease_calls
        ),
        format!(
            r#"turnstile_redis_calls_total{{limiter="leased",call="exact"}} {}"#,
            stats.exact_calls
        ),
        r#"turnstile_redis_failures_total{limiter="leased"} 0"#.to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
}

/// Every count of `LeasedStats` is published under its own series, the
/// waits for a fetch in flight and the probes of a dry key included: each
/// field a different value, each found on its own line.
#[test]
fn every_leased_count_is_published_under_its_series() {
    let mut stats = LeasedStats::default();
    stats.lease_calls = 11;
    stats.give_back_calls = 12;
    stats.exact_calls = 13;
    stats.failures = 14;
    stats.fallbacks = 15;
    stats.degraded = true;
    stats.degraded_periods = 16;
    stats.fetch_waits = 17;
    stats.probes = 18;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || stats.publish("leased_counts"));
    let text = handle.render();
    for line in [
        r#"turnstile_redis_calls_total{limiter="leased_counts",call="lease"} 11"#,
        r#"turnstile_redis_calls_total{limiter="leased_counts",call="give_back"} 12"#,
        r#"turnstile_redis_calls_total{limiter="leased_counts",call="exact"} 13"#,
        r#"turnstile_redis_failures_total{limiter="leased_counts"} 14"#,
        r#"turnstile_redis_fallbacks_total{limiter="leased_counts"} 15"#,
        r#"turnstile_redis_degraded{limiter="leased_counts"} 1"#,
        r#"turnstile_redis_degraded_periods_total{limiter="leased_counts"} 16"#,
        r#"turnstile_redis_fetch_waits_total{limiter="leased_counts"} 17"#,
        r#"turnstile_redis_probes_total{limiter="leased_counts"} 18"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
}

/// Lease times count from the limiter's build, not from its clock's epoch
/// (the TSC's is the host's boot): on a clock already past 208 days, leases
/// still last and amortize their calls.
#[test]
fn leases_count_time_from_the_build_not_the_clock_epoch() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let clock = turnstile::ManualClock::new();
    clock.set_nanos((1 << 54) + 1_000_000_000);
    let global = bucket("epoch", 1_000_000, 10_000, 10 * MS);
    let limiter = LeasedBuilder::new(global, 100)
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    let decisions = 2_000u64;
    for _ in 0..decisions {
        assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
        clock.advance(Duration::from_micros(10));
    }
    let stats = limiter.stats();
    assert!(stats.redis_calls() <= decisions / 100 + 8, "{stats:?}");
}

/// Exact and leased processes share one bucket: with no refill, together they
/// admit exactly its capacity, and Redis' count agrees.
#[test]
fn exact_and_leased_share_one_limit() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let global = bucket("share", 100, 1, Duration::from_secs(3_600));
    let leased = LeasedBuilder::new(global.clone(), 8)
        .unwrap()
        .build()
        .unwrap();
    let mut admitted = 0;
    for i in 0..300 {
        let decision = if i % 3 == 0 {
            global.try_acquire(&mut con, "k").unwrap()
        } else {
            leased.try_acquire(&mut con, "k").unwrap()
        };
        admitted += u32::from(decision.is_allowed());
    }
    // Tokens still leased are not admitted yet: give them back.
    let back = leased.give_back_all(&mut con);
    assert_eq!(
        u64::from(admitted) + back,
        100,
        "admitted {admitted}, back {back}"
    );
    assert_eq!(
        bucket_tokens(&mut con, &global.redis_key("k")).unwrap_or(100),
        back
    );
}

/// `SCRIPT FLUSH` between leases: the next lease call loads the script again
/// (`NOSCRIPT` means nothing ran) and counts once.
#[test]
fn a_flushed_lease_script_is_loaded_again_and_counted_once() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let global = bucket("flush", 1_000, 1, Duration::from_secs(3_600));
    let limiter = LeasedBuilder::new(global.clone(), 32)
        .unwrap()
        .build()
        .unwrap();
    let mut admitted = 0u64;
    for i in 0..200 {
        if i % 40 == 0 {
            let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
        }
        admitted += u64::from(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    assert_eq!(admitted, 200);
    let stats = limiter.stats();
    let left = bucket_tokens(&mut con, &global.redis_key("k")).unwrap();
    assert_eq!(left, 1_000 - stats.tokens_leased, "{stats:?}");
    assert_eq!(stats.tokens_leased, admitted + u64::from(limiter.held("k")));
}

/// Leases given back, or left to expire, leave no key once the bucket would
/// be full again.
#[test]
fn idle_leases_are_given_back_or_expire_and_leave_no_key() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    // 10 tokens, one per 30 ms: full again 300 ms after the last spend.
    let global = bucket("idle", 10, 1, 30 * MS);
    // Idle time on a clock of the test's own: a stall of the test's thread
    // does not make a lease idle before its time.
    let clock = turnstile::ManualClock::new();
    let limiter = LeasedBuilder::new(global.clone(), 8)
        .unwrap()
        .idle(50 * MS)
        .lifetime(Duration::from_secs(5))
        .clock(clock.clone())
        .build()
        .unwrap();
    let gone = |con: &mut BlockingConnection, keys: &[&str]| {
        // `EXISTS` sees a key past its expiry as gone (and deletes it, where
        // Redis' background expiry gets to it within 100 ms or so).
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| global.redis_key(k)).collect();
        let exists: i64 = redis::cmd("EXISTS").arg(&keys).query(con).unwrap();
        exists == 0 && dbsize(con) == 0
    };
    for key in ["given", "kept"] {
        for _ in 0..4 {
            assert!(limiter.try_acquire(&mut con, key).unwrap().is_allowed());
        }
    }
    assert!(limiter.held("given") > 0);
    // Not idle yet: nothing given back.
    assert!(limiter.give_back_all(&mut con) > 0);
    assert_eq!(limiter.held("given"), 0);
    assert_eq!(limiter.held("kept"), 0);
    // Take leases again, let one idle out and give it back; the other is
    // kept (refreshed) until it expires.
    for _ in 0..2 {
        assert!(limiter.try_acquire(&mut con, "given").unwrap().is_allowed());
    }
    assert_eq!(limiter.give_back_idle(&mut con), 0, "not idle yet");
    clock.advance(60 * MS);
    assert!(limiter.give_back_idle(&mut con) > 0);
    assert_eq!(limiter.held("given"), 0);
    assert!(limiter.stats().tokens_given_back > 0);
    // A full bucket after a give-back is deleted; these are not full, but
    // once their fill time has passed both keys are gone.
    thread::sleep(Duration::from_millis(400));
    assert!(gone(&mut con, &["given", "kept"]));
    // A lease taken and simply dropped (it expires here) leaves no key either.
    let other = LeasedBuilder::new(global.clone(), 8)
        .unwrap()
        .lifetime(20 * MS)
        .build()
        .unwrap();
    assert!(other.try_acquire(&mut con, "dropped").unwrap().is_allowed());
    drop(other);
    thread::sleep(Duration::from_millis(400));
    assert!(gone(&mut con, &["dropped"]));
}

/// The asynchronous API decides from the lease without a call, as the
/// blocking one.
#[test]
fn the_async_api_spends_leases_as_the_blocking_one() {
    let Some(server) = server() else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let global = bucket("async", 40, 1, Duration::from_secs(3_600));
    let limiter = LeasedBuilder::new(global, 16).unwrap().build().unwrap();
    let client = server.client();
    runtime.block_on(async {
        let mut con = Deadlines::default()
            .connect(Duration::from_secs(2))
            .unwrap()
            .response(Duration::from_secs(2))
            .unwrap()
            .multiplexed(&client)
            .await
            .unwrap();
        let mut admitted = 0;
        for _ in 0..60 {
            admitted += u32::from(
                limiter
                    .try_acquire_async(&mut con, "k")
                    .await
                    .unwrap()
                    .is_allowed(),
            );
        }
        assert_eq!(admitted, 40);
        let stats = limiter.stats();
        assert!(stats.redis_calls() < 20, "{stats:?}");
        // The denial Redis gave is kept: the last requests made no call.
        let denied = limiter.try_acquire_async(&mut con, "k").await.unwrap();
        assert!(denied.is_denied());
        assert_eq!(limiter.stats().redis_calls(), stats.redis_calls());
    });
}

/// What one replica saw in the outage test.
#[derive(Debug, Default)]
struct Outage {
    slowest: Duration,
    /// Admitted from requests that began after the server was dead, before
    /// it was back.
    admitted_while_down: u64,
    /// Admitted by the failure policy (the local share), over the whole
    /// run: a false failure before the kill on a loaded machine may draw
    /// from the share too, so this, not a count from the kill, is the share
    /// spent.
    admitted_by_the_policy: u64,
    /// From the restart to the first lease Redis granted.
    back_after: Option<Duration>,
}

/// Where the outage test is, as its main thread sets it.
#[derive(Clone, Copy, Default)]
struct Phase {
    /// Once the server's process was reaped.
    down: Option<Instant>,
    /// Once the new server answered.
    up: Option<Instant>,
    stop: bool,
}

fn outage_replica(
    limiter: &LeasedLimiter,
    con: &mut BlockingConnection,
    phase: &std::sync::Mutex<Phase>,
) -> Outage {
    let mut seen = Outage::default();
    loop {
        if phase.lock().unwrap().stop {
            return seen;
        }
        let before = limiter.stats();
        let start = Instant::now();
        let decision = limiter.try_acquire(con, "k").unwrap();
        let took = start.elapsed();
        seen.slowest = seen.slowest.max(took);
        if decision.is_allowed() && limiter.stats().fallbacks > before.fallbacks {
            seen.admitted_by_the_policy += 1;
        }
        let now = *phase.lock().unwrap();
        if now.up.is_none() && decision.is_allowed() && now.down.is_some_and(|t| start > t) {
            seen.admitted_while_down += 1;
        }
        if let Some(up) = now.up
            && seen.back_after.is_none()
            && start > up
            && limiter.stats().lease_calls > before.lease_calls
        {
            seen.back_after = Some(Instant::now() - up);
        }
        thread::sleep(Duration::from_micros(200));
    }
}

/// `kill -9` of Redis mid-run, and a restart on the same port: no request
/// waits past its deadlines (a call that connects and finds the scripts gone
/// may take the connect deadline and three response deadlines, 200 ms here;
/// plus scheduling on a loaded machine); failing closed admits only the
/// tokens leased before the kill; failing open admits the local share; both
/// take leases from Redis again within 1 s of the restart.
#[test]
fn redis_killed_mid_run_fails_as_configured_and_recovers() {
    let Some(server) = server() else { return };
    let port = server.port();
    // 1,000 a second, a burst of 100: never the limit here, so every denial
    // is the failure policy's.
    let quota = Quota::new(100, 1, MS).unwrap();
    let global = RedisLimiter::new("kill", TokenBucket::new(quota)).unwrap();
    let lease = 16;
    let backoff = 200 * MS;
    let deadline = 50 * MS;
    let closed = LeasedBuilder::new(global.clone(), lease)
        .unwrap()
        .on_failure(OnFailure::Deny, backoff)
        .build()
        .unwrap();
    // The local share: 5 tokens, refilled 20 a second. It starts empty in
    // each degraded period (the failover rule): it admits what refills.
    let share_rate = 20.0;
    let share = Quota::new(5, 1, 50 * MS).unwrap();
    let open = LeasedBuilder::new(global, lease)
        .unwrap()
        .on_failure(OnFailure::local_share(share, 1).unwrap(), backoff)
        .build()
        .unwrap();
    let phase = std::sync::Mutex::new(Phase::default());
    let deadlines = Deadlines::default()
        .connect(deadline)
        .unwrap()
        .response(deadline)
        .unwrap();
    let client = server.client();
    let set = |change: &dyn Fn(&mut Phase)| change(&mut phase.lock().unwrap());
    let (seen_closed, seen_open, server) = thread::scope(|s| {
        let closed_thread = s.spawn(|| {
            let mut con = deadlines.blocking(client.clone());
            outage_replica(&closed, &mut con, &phase)
        });
        let open_thread = s.spawn(|| {
            let mut con = deadlines.blocking(client.clone());
            outage_replica(&open, &mut con, &phase)
        });
        thread::sleep(Duration::from_millis(400));
        drop(server); // SIGKILL, then waited for
        set(&|p| p.down = Some(Instant::now()));
        thread::sleep(Duration::from_millis(600));
        let server = spawn_on(port).expect("redis-server restarts on its port");
        set(&|p| p.up = Some(Instant::now()));
        // Both replicas run on for a second and a half after the restart,
        // however long it took.
        thread::sleep(Duration::from_millis(1_500));
        set(&|p| p.stop = true);
        (
            closed_thread.join().unwrap(),
            open_thread.join().unwrap(),
            server,
        )
    });
    eprintln!("fail closed: {seen_closed:?}\nfail open: {seen_open:?}");
    let times = *phase.lock().unwrap();
    let down_for = times.up.unwrap() - times.down.unwrap();
    for (seen, limiter) in [(&seen_closed, &closed), (&seen_open, &open)] {
        assert!(
            seen.slowest < deadline * 4 + 100 * MS,
            "a request took {:?}",
            seen.slowest
        );
        let back = seen.back_after.expect("Redis granted leases again");
        assert!(back < Duration::from_secs(1), "back after {back:?}");
        let stats = limiter.stats();
        assert!(stats.failures >= 1 && stats.fallbacks >= 1, "{stats:?}");
    }
    // Failing closed: only what was leased before the kill.
    assert!(
        seen_closed.admitted_while_down <= u64::from(lease + lease / 2),
        "{seen_closed:?}"
    );
    // Failing open: the leases held, plus what the local share refilled
    // while degraded, never its stored burst of 5: it starts empty in each
    // degraded period (at most one token's fraction more per period). The
    // periods are counted over the run (a false failure before the kill
    // opens one too); the time is the kill's to the first lease after the
    // restart, when the last period ends.
    let open_stats = open.stats();
    let degraded = (down_for + seen_open.back_after.unwrap()).as_secs_f64();
    let refilled = share_rate * degraded + open_stats.degraded_periods as f64;
    assert!(
        seen_open.admitted_by_the_policy as f64 <= refilled,
        "{seen_open:?}, {open_stats:?}, degraded {degraded:.3} s"
    );
    assert!(seen_open.admitted_by_the_policy >= 1, "{seen_open:?}");
    assert_eq!(seen_closed.admitted_by_the_policy, 0, "{seen_closed:?}");
    assert!(
        seen_open.admitted_while_down as f64
            <= f64::from(lease + lease / 2) + share_rate * down_for.as_secs_f64() + 2.0,
        "{seen_open:?}"
    );
    // What the share admitted was charged to Redis once it answered.
    assert_eq!(open_stats.owed, 0, "{open_stats:?}");
    drop(server);
}

/// What a local share admitted while Redis was down is charged to Redis
/// once it answers, on a limit the load never reaches: the key's next
/// request after its leases runs an exact call, before leases resume. (The
/// debt was paid only on the path of a dry bucket: on this limit it was
/// owed for good.)
#[test]
fn a_local_debt_is_paid_before_leases_resume_on_a_limit_never_reached() {
    let Some(server) = server() else { return };
    let port = server.port();
    // 100,000 a second: one replica at most 5,000 a second never drains it.
    let quota = Quota::new(1_000, 100, MS).unwrap();
    let global = RedisLimiter::new("debt", TokenBucket::new(quota)).unwrap();
    let share = Quota::new(5, 1, 50 * MS).unwrap();
    let open = LeasedBuilder::new(global, 16)
        .unwrap()
        .on_failure(OnFailure::local_share(share, 1).unwrap(), 200 * MS)
        .build()
        .unwrap();
    let phase = std::sync::Mutex::new(Phase::default());
    let deadlines = Deadlines::default()
        .connect(50 * MS)
        .unwrap()
        .response(50 * MS)
        .unwrap();
    let client = server.client();
    let set = |change: &dyn Fn(&mut Phase)| change(&mut phase.lock().unwrap());
    let (seen, server) = thread::scope(|s| {
        let replica = s.spawn(|| {
            let mut con = deadlines.blocking(client.clone());
            outage_replica(&open, &mut con, &phase)
        });
        thread::sleep(Duration::from_millis(300));
        drop(server); // SIGKILL, then waited for
        set(&|p| p.down = Some(Instant::now()));
        thread::sleep(Duration::from_millis(600));
        let server = spawn_on(port).expect("redis-server restarts on its port");
        set(&|p| p.up = Some(Instant::now()));
        thread::sleep(Duration::from_millis(1_000));
        set(&|p| p.stop = true);
        (replica.join().unwrap(), server)
    });
    let stats = open.stats();
    eprintln!("{seen:?}\n{stats:?}");
    assert!(
        seen.admitted_by_the_policy >= 1,
        "the share admitted: {seen:?}"
    );
    assert!(seen.back_after.is_some(), "leases again: {seen:?}");
    assert_eq!(stats.owed, 0, "{stats:?}");
    drop(server);
}

/// A limit of capacity 1 (so leases of 1): the exact call that pays a debt
/// asks for the whole capacity, and no debt fits beside it. What the local
/// share admitted while Redis was out is paid all the same, as it goes:
/// every request is denied until the debt is paid, and then leases resume.
/// (Claimed beside the request, the debt was 0 every time: each exact call
/// was admitted alone, and the key owed for good.)
#[test]
fn a_debt_is_paid_by_requests_for_the_whole_capacity() {
    let Some(server) = server() else { return };
    // One token, refilled every 20 ms, in Redis and in the local share.
    let quota = Quota::new(1, 1, 20 * MS).unwrap();
    let global = RedisLimiter::new("whole", TokenBucket::new(quota)).unwrap();
    // No backoff: each request tries Redis, as a probe.
    let limiter = LeasedBuilder::new(global, 1)
        .unwrap()
        .on_failure(OnFailure::local_share(quota, 1).unwrap(), Duration::ZERO)
        .build()
        .unwrap();
    let mut con = server.connection();
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());

    // Redis is out: the local share starts empty, then admits its refill.
    let mut down = redis_server::FailingAfter(Duration::ZERO);
    let mut local_admitted = 0;
    let start = Instant::now();
    while start.elapsed() < 150 * MS {
        local_admitted += u64::from(limiter.try_acquire(&mut down, "k").unwrap().is_allowed());
        thread::sleep(2 * MS);
    }
    assert!(local_admitted >= 2, "{local_admitted}");
    assert_eq!(limiter.stats().owed, local_admitted);

    // Redis answers again: each token it gives the key pays the debt, and
    // no request is admitted until nothing is owed.
    let start = Instant::now();
    while limiter.stats().owed > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the debt is never paid: {:?}",
            limiter.stats()
        );
        let decision = limiter.try_acquire(&mut con, "k").unwrap();
        assert!(
            decision.is_denied(),
            "admitted while the key owes: {:?}",
            limiter.stats()
        );
        thread::sleep(5 * MS);
    }
    assert!(!limiter.is_degraded());
    // Paid: the key's next token admits, from a lease.
    thread::sleep(25 * MS);
    let leases = limiter.stats().lease_calls;
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    assert_eq!(limiter.stats().lease_calls, leases + 1);
}

/// A key that holds something other than this limiter's state fails its
/// own calls only: Redis answered, so no backoff starts and no degraded
/// period opens, other keys still take leases, and a give-back pass that
/// meets such a key goes on to the others.
#[test]
fn a_key_holding_a_foreign_value_fails_alone() {
    let Some(server) = server() else { return };
    let global = bucket("p3", 100_000, 100, MS);
    let backoff = Duration::from_secs(5);
    let limiter = LeasedBuilder::new(global.clone(), 16)
        .unwrap()
        .on_failure(OnFailure::Deny, backoff)
        .build()
        .unwrap();
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
    assert!(limiter.try_acquire(&mut con, "alice").unwrap().is_allowed());
    for (at, key) in ["evil", "list"].into_iter().enumerate() {
        // Its own request is answered by the policy (fail closed: denied,
        // until Redis is tried again), and counted as a failure.
        let denied = limiter.try_acquire(&mut con, key).unwrap();
        assert_eq!(denied.retry_after().map(|w| w.duration()), Some(backoff));
        let stats = limiter.stats();
        assert_eq!(
            (stats.failures, stats.fallbacks),
            (at as u64 + 1, at as u64 + 1)
        );
        assert!(!limiter.is_backing_off(), "{key}");
        assert!(!limiter.is_degraded(), "{key}");
        assert_eq!(stats.degraded_periods, 0);
        // A key that holds no lease yet still takes one from Redis.
        let leases = limiter.stats().lease_calls;
        let other = format!("bob{at}");
        assert!(limiter.try_acquire(&mut con, &other).unwrap().is_allowed());
        assert_eq!(limiter.stats().lease_calls, leases + 1);
    }

    // Leases on 10 keys, one of which something else then overwrites: the
    // give-back fails for that key alone, and the others go back.
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    warm(&limiter, &mut con, &keys, 4);
    let _: () = redis::cmd("SET")
        .arg(global.redis_key("k3"))
        .arg("x")
        .query(&mut plain)
        .unwrap();
    let failures = limiter.stats().failures;
    limiter.give_back_all(&mut con);
    assert_eq!(limiter.stats().failures, failures + 1);
    assert!(!limiter.is_backing_off() && !limiter.is_degraded());
    for key in &keys {
        assert_eq!(limiter.held(key), 0, "{key} kept its lease");
    }
}

/// With a refresher thread, prefetches are made on its connection, and idle
/// leases go back by themselves.
/// Dropping a refresher's handle wakes its thread: it does not wait out the
/// idle time (a minute here) before it stops.
#[test]
fn dropping_a_refresher_stops_its_thread_without_waiting_out_the_idle_time() {
    let Some(server) = server() else { return };
    let global = bucket("refresher-drop", 100, 1, Duration::from_secs(60));
    let limiter = Arc::new(
        LeasedBuilder::new(global, 64)
            .unwrap()
            // An idle time of at most the lifetime: both a minute.
            .lifetime(Duration::from_secs(60))
            .idle(Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    let refresher = limiter
        .start_refresher(server.connection())
        .unwrap()
        .expect("the first refresher");
    thread::sleep(20 * MS);
    let began = Instant::now();
    drop(refresher);
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
}

#[test]
fn a_refresher_prefetches_off_the_request_path_and_gives_back_idle_leases() {
    let Some(server) = server() else { return };
    let global = bucket("refresher", 100_000, 1, Duration::from_secs(60));
    let limiter = Arc::new(
        LeasedBuilder::new(global.clone(), 64)
            .unwrap()
            .idle(30 * MS)
            .build()
            .unwrap(),
    );
    let refresher = limiter
        .start_refresher(server.connection())
        .unwrap()
        .expect("the first refresher");
    assert!(
        limiter
            .start_refresher(server.connection())
            .unwrap()
            .is_none()
    );
    let mut con = server.connection();
    let mut admitted = 0u64;
    for _ in 0..5_000 {
        admitted += u64::from(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
        // Time for the refresher to answer now and then.
        thread::sleep(Duration::from_micros(20));
    }
    // A lease held (the last may have been spent to the last token).
    for _ in 0..100 {
        if limiter.held("k") > 0 {
            break;
        }
        admitted += u64::from(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
        thread::sleep(MS);
    }
    assert!(limiter.held("k") > 0);
    assert!(admitted > 4_900, "{admitted}");
    // Idle: the refresher gives the lease back.
    let start = Instant::now();
    // The word is emptied before the give-back's call returns.
    while (limiter.held("k") > 0 || limiter.stats().give_back_calls == 0)
        && start.elapsed() < Duration::from_secs(2)
    {
        thread::sleep(10 * MS);
    }
    drop(refresher);
    let stats = limiter.stats();
    assert_eq!(limiter.held("k"), 0, "{stats:?}");
    assert!(stats.tokens_given_back > 0, "{stats:?}");
    let mut plain = server.connection();
    // What Redis gave out is what was admitted: the leases kept, and the
    // exact calls of requests that missed while the refresher fetched.
    let spent = stats.tokens_leased - stats.tokens_given_back + stats.exact_calls;
    assert_eq!(spent, admitted, "{stats:?}");
    assert_eq!(
        bucket_tokens(&mut plain, &global.redis_key("k")),
        Some(100_000 - spent),
        "{stats:?}"
    );
}

/// Threads sharing one limiter: one fetch at a time per key, the others
/// spend or ask Redis for their own permits, and nothing is counted twice:
/// what was admitted is what Redis gave out less what is still held.
#[test]
fn threads_sharing_a_limiter_spend_each_token_once() {
    let Some(server) = server() else { return };
    // 2,000 tokens and no refill to speak of.
    let global = bucket("threads", 2_000, 1, Duration::from_secs(60));
    let limiter = LeasedBuilder::new(global.clone(), 64)
        .unwrap()
        .build()
        .unwrap();
    let barrier = Barrier::new(4);
    let admitted: u64 = thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let mut con = server.connection();
                let (limiter, barrier) = (&limiter, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut admitted = 0u64;
                    for _ in 0..1_000 {
                        admitted +=
                            u64::from(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
                    }
                    admitted
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    let stats = limiter.stats();
    let held = u64::from(limiter.held("k"));
    let mut con = server.connection();
    let left = bucket_tokens(&mut con, &global.redis_key("k")).unwrap_or(2_000);
    eprintln!("{admitted} admitted, {held} held, {left} left in Redis, {stats:?}");
    assert_eq!(admitted, 2_000 - left - held, "{stats:?}");
    assert!(admitted <= 2_000);
    // 4,000 asked for 2,000 tokens: all of them went, to admissions or the
    // lease held.
    assert!(left < 64, "{left} left");
}

/// A Redis that hangs (not dead): the lease call gives up at its deadline,
/// the request is answered by the policy, and Redis is not called during the
/// backoff.
#[test]
fn a_hung_redis_costs_one_deadline_then_the_backoff_answers() {
    let Some(server) = server() else { return };
    let global = bucket("hung", 100, 1, Duration::from_secs(60));
    // The backoff at the first timeout (by default, the third in a row;
    // tests/failover.rs counts them).
    let limiter = LeasedBuilder::new(global, 8)
        .unwrap()
        .on_failure(OnFailure::Deny, Duration::from_secs(5))
        .timeouts_to_back_off(1)
        .build()
        .unwrap();
    let deadline = 50 * MS;
    let mut con = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(deadline)
        .unwrap()
        .blocking(server.client());
    // A lease held for "warm" (the size grows 1, 2, 4, 8 over the first
    // requests).
    for _ in 0..20 {
        assert!(limiter.try_acquire(&mut con, "warm").unwrap().is_allowed());
        if limiter.held("warm") >= 2 {
            break;
        }
    }
    assert!(limiter.held("warm") >= 2);
    let sleeper = hang(&server, 0.5);
    let start = Instant::now();
    // A new key: no lease, so a call, which times out.
    let denied = limiter.try_acquire(&mut con, "new").unwrap();
    let took = start.elapsed();
    assert!(denied.is_denied());
    assert!(took < deadline + 150 * MS, "took {took:?}");
    // During the backoff: no call (a call would time out, a second
    // failure), so not a deadline's wait.
    let start = Instant::now();
    assert!(limiter.try_acquire(&mut con, "new").unwrap().is_denied());
    let took = start.elapsed();
    let stats = limiter.stats();
    assert_eq!((stats.failures, stats.fallbacks), (1, 2), "{stats:?}");
    assert!(took < deadline, "took {took:?}");
    // The lease held for "warm" is still spent while Redis is out.
    assert!(limiter.try_acquire(&mut con, "warm").unwrap().is_allowed());
    sleeper.wait();
}

/// The refresher as a tokio task: prefetches on its own connection, idle
/// leases given back by it.
#[test]
fn an_async_refresher_task_prefetches_and_gives_back() {
    let Some(server) = server() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let global = bucket("task", 100_000, 1, Duration::from_secs(60));
    let limiter = Arc::new(
        LeasedBuilder::new(global.clone(), 64)
            .unwrap()
            .idle(30 * MS)
            // The connections' response deadline.
            .fetch_wait(Duration::from_secs(2))
            .build()
            .unwrap(),
    );
    let client = server.client();
    let deadlines = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_secs(2))
        .unwrap();
    let (admitted, stats) = runtime.block_on(async {
        let task_con = deadlines.multiplexed(&client).await.unwrap();
        let task = limiter.start_refresher_async(task_con).expect("the first");
        let mut con = deadlines.multiplexed(&client).await.unwrap();
        let mut admitted = 0u64;
        for i in 0..5_000 {
            let decision = limiter.try_acquire_async(&mut con, "k").await.unwrap();
            admitted += u64::from(decision.is_allowed());
            if i % 50 == 0 {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
        // A lease held (the last may have been spent to the last token).
        for _ in 0..100 {
            if limiter.held("k") > 0 {
                break;
            }
            let decision = limiter.try_acquire_async(&mut con, "k").await.unwrap();
            admitted += u64::from(decision.is_allowed());
            tokio::time::sleep(MS).await;
        }
        assert!(limiter.held("k") > 0);
        // Idle: the task gives the lease back.
        let start = Instant::now();
        // The word is emptied before the give-back's call returns.
        while (limiter.held("k") > 0 || limiter.stats().give_back_calls == 0)
            && start.elapsed() < Duration::from_secs(2)
        {
            tokio::time::sleep(10 * MS).await;
        }
        task.abort();
        (admitted, limiter.stats())
    });
    assert!(admitted > 4_900, "{admitted}");
    assert_eq!(limiter.held("k"), 0, "{stats:?}");
    assert!(stats.tokens_given_back > 0, "{stats:?}");
    let spent = stats.tokens_leased - stats.tokens_given_back + stats.exact_calls;
    assert_eq!(spent, admitted, "{stats:?}");
    let mut con = server.connection();
    assert_eq!(
        bucket_tokens(&mut con, &global.redis_key("k")),
        Some(100_000 - spent),
        "{stats:?}"
    );
}

/// Holds every command to the Redis of `server` for `secs`
/// ([`Server::pause`]); in effect when it returns.
fn hang(server: &Server, secs: f64) -> Paused {
    server.pause(Duration::from_secs_f64(secs))
}

/// Warm `keys`: each takes leases until it holds at least `min` tokens.
fn warm(limiter: &LeasedLimiter, con: &mut dyn ConnectionLike, keys: &[String], min: u32) {
    for key in keys {
        for _ in 0..200 {
            if limiter.held(key) >= min {
                break;
            }
            assert!(limiter.try_acquire(&mut *con, key).unwrap().is_allowed());
        }
        assert!(limiter.held(key) >= min, "{key}: {}", limiter.held(key));
    }
}

/// Prefetches still queued when a refresher stops (its handle dropped while
/// its connection hangs) release their keys: the keys' next requests take
/// leases, not an exact call each for ever (which they did when the queued
/// claims were dropped with the queue).
#[test]
fn a_stopped_refresher_releases_the_prefetches_it_had_queued() {
    let Some(server) = server() else { return };
    let global = bucket("refresher-stopped", 100_000, 100, MS);
    let limiter = Arc::new(
        LeasedBuilder::new(global, 64)
            .unwrap()
            // No idle give-back in the test's time: an idle time of a
            // minute, and a lifetime as long (an idle time may not exceed it).
            .lifetime(Duration::from_secs(60))
            .idle(Duration::from_secs(60))
            .on_failure(OnFailure::Deny, 100 * MS)
            .build()
            .unwrap(),
    );
    let mut con = server.connection();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    warm(&limiter, &mut con, &keys, 32);
    // The refresher's connection, connected before Redis hangs.
    let mut refresher_con = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(200 * MS)
        .unwrap()
        .blocking(server.client());
    let _: () = redis::cmd("PING").query(&mut refresher_con).unwrap();
    let refresher = limiter
        .start_refresher(refresher_con)
        .unwrap()
        .expect("the first refresher");
    let sleeper = hang(&server, 0.6);
    // Spend every key to just past its low-water mark (the prefetch queued)
    // and not to empty (which would call Redis here).
    for key in &keys {
        while limiter.held(key) > 2 {
            assert!(limiter.try_acquire(&mut con, key).unwrap().is_allowed());
        }
    }
    // The refresher is stuck in its first fetch; dropping it waits for that
    // call's deadline, then stops the thread with the rest still queued.
    drop(refresher);
    sleeper.wait();
    thread::sleep(150 * MS); // the backoff after the refresher's failure
    let before = limiter.stats();
    let mut admitted = 0;
    for _ in 0..20 {
        for key in &keys {
            admitted += u32::from(limiter.try_acquire(&mut con, key).unwrap().is_allowed());
        }
    }
    let after = limiter.stats();
    assert_eq!(admitted, 400, "{after:?}");
    let exact = after.exact_calls - before.exact_calls;
    let leases = after.lease_calls - before.lease_calls;
    assert!(
        exact < keys.len() as u64,
        "{exact} exact calls, {leases} lease calls: keys left claimed"
    );
    assert!(leases >= keys.len() as u64, "{leases} lease calls");
}

/// The async refresher aborted with prefetches queued: the same.
#[test]
fn an_aborted_refresher_task_releases_the_prefetches_it_had_queued() {
    let Some(server) = server() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let global = bucket("task-aborted", 100_000, 100, MS);
    let limiter = Arc::new(
        LeasedBuilder::new(global, 64)
            .unwrap()
            // No idle give-back in the test's time: an idle time of a
            // minute, and a lifetime as long (an idle time may not exceed it).
            .lifetime(Duration::from_secs(60))
            .idle(Duration::from_secs(60))
            .on_failure(OnFailure::Deny, 100 * MS)
            .build()
            .unwrap(),
    );
    let mut con = server.connection();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    warm(&limiter, &mut con, &keys, 32);
    let client = server.client();
    let deadlines = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_secs(5))
        .unwrap();
    let task_con = runtime.block_on(deadlines.multiplexed(&client)).unwrap();
    let task = runtime
        .block_on(async { limiter.start_refresher_async(task_con) })
        .expect("the first");
    let sleeper = hang(&server, 0.6);
    for key in &keys {
        while limiter.held(key) > 2 {
            assert!(limiter.try_acquire(&mut con, key).unwrap().is_allowed());
        }
    }
    // Aborted with one fetch in flight (Redis is asleep) and the rest queued.
    task.abort();
    let _ = runtime.block_on(task);
    sleeper.wait();
    let before = limiter.stats();
    let mut admitted = 0;
    for _ in 0..20 {
        for key in &keys {
            admitted += u32::from(limiter.try_acquire(&mut con, key).unwrap().is_allowed());
        }
    }
    let after = limiter.stats();
    assert_eq!(admitted, 400, "{after:?}");
    let exact = after.exact_calls - before.exact_calls;
    assert_eq!(exact, 0, "{after:?}: keys left claimed");
}

/// A give-back pass against a hung Redis stops at its first failure (the
/// backoff it starts), instead of paying a deadline for every key.
#[test]
fn a_give_back_pass_stops_at_the_first_failure() {
    let Some(server) = server() else { return };
    let global = bucket("give-back-hung", 100_000, 100, MS);
    let limiter = LeasedBuilder::new(global, 64)
        .unwrap()
        .on_failure(OnFailure::Deny, Duration::from_secs(5))
        .build()
        .unwrap();
    let mut con = server.connection();
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    warm(&limiter, &mut con, &keys, 4);
    let mut short = Deadlines::default()
        .connect(50 * MS)
        .unwrap()
        .response(50 * MS)
        .unwrap()
        .blocking(server.client());
    let _: () = redis::cmd("PING").query(&mut short).unwrap();
    let sleeper = hang(&server, 1.5);
    let start = Instant::now();
    let given = limiter.give_back_all(&mut short);
    let took = start.elapsed();
    let stats = limiter.stats();
    // The leases not reached are kept, for a later pass.
    let held: u32 = keys.iter().map(|k| limiter.held(k)).sum();
    sleeper.wait();
    assert_eq!(given, 0);
    assert_eq!(stats.failures, 1, "{stats:?}");
    // One deadline paid (the failure count), then the pass stopped: well
    // short of the pause, which 40 deadlines would outlast.
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(held >= 4 * (keys.len() as u32 - 1), "{held}");
}

/// A connection that runs `hook` just before sending its first script call.
struct BeforeScript<F: FnMut()> {
    inner: BlockingConnection,
    hook: Option<F>,
}

impl<F: FnMut()> BeforeScript<F> {
    fn fire(&mut self, command: &[u8]) {
        if command.windows(7).any(|w| w == b"EVALSHA")
            && let Some(mut hook) = self.hook.take()
        {
            hook();
        }
    }
}

impl<F: FnMut()> ConnectionLike for BeforeScript<F> {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        self.fire(cmd);
        self.inner.req_packed_command(cmd)
    }
    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        self.fire(cmd);
        self.inner.req_packed_commands(cmd, offset, count)
    }
    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
    fn check_connection(&mut self) -> bool {
        self.inner.check_connection()
    }
    fn is_open(&self) -> bool {
        self.inner.is_open()
    }
}

/// A request for 2 that finds 1 token here asks Redis for a lease; when the
/// token it counted on is gone by the time the lease comes (expired here, or
/// spent by another request), it is denied, and never with a wait of 0
/// (`Retry-After: 0` would say it was due already).
#[test]
fn a_miss_whose_held_tokens_went_meanwhile_is_denied_with_a_wait() {
    let Some(server) = server() else { return };
    for spend_instead in [false, true] {
        let name = format!("race-{spend_instead}");
        let global = bucket(&name, 10, 1, Duration::from_secs(10));
        let clock = turnstile::ManualClock::new();
        let limiter = LeasedBuilder::new(global.clone(), 8)
            .unwrap()
            .lifetime(Duration::from_secs(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut con = server.connection();
        // A lease of 1, spent; a lease of 2, one spent: 1 held here.
        assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
        assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
        assert_eq!(limiter.held("k"), 1);
        // The bucket in Redis down to 1 token.
        while global.try_acquire(&mut con, "k").unwrap().remaining() != Some(1) {}
        let mut other = server.connection();
        let mut hooked = BeforeScript {
            inner: server.connection(),
            hook: Some(|| {
                if spend_instead {
                    // Another request spends the held token.
                    assert!(limiter.try_acquire(&mut other, "k").unwrap().is_allowed());
                } else {
                    // The lease expires.
                    clock.advance(Duration::from_secs(2));
                }
            }),
        };
        let decision = limiter.try_acquire_n(&mut hooked, "k", 2).unwrap();
        let turnstile::Decision::Denied { retry_after } = decision else {
            panic!("{decision:?}");
        };
        assert!(retry_after.as_nanos() > 0, "{decision:?}");
        assert!(retry_after.header_secs() >= 1);
    }
}

/// A request for more than the tokens held here, on a bucket that is dry: it
/// is denied with Redis' wait for what it lacks beyond them, and the tokens
/// stay here (for smaller requests, and for its retry), so that the retry
/// after that wait is admitted. They were dropped with the denial before,
/// and the retry was denied again.
#[test]
fn a_denied_miss_keeps_the_tokens_held_here_for_its_retry() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let global = bucket("dry-miss", 10, 1, Duration::from_millis(500));
    let limiter = LeasedBuilder::new(global.clone(), 8)
        .unwrap()
        .lifetime(Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..4 {
        assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    }
    let held = limiter.held("k");
    assert!(held >= 2, "held {held}");
    // Another process empties the bucket.
    while global.try_acquire(&mut con, "k").unwrap().is_allowed() {}
    let decision = limiter.try_acquire_n(&mut con, "k", held + 1).unwrap();
    let turnstile::Decision::Denied { retry_after } = decision else {
        panic!("{decision:?}");
    };
    assert_eq!(limiter.held("k"), held, "the held tokens stay");
    // The wait is for what it lacks beyond them (one token), or a quarter
    // lease (2 of L = 8) if more: at most two refills, where the whole
    // request would wait `held + 1`.
    assert!(
        retry_after.duration() <= Duration::from_millis(1_000) + 10 * MS,
        "{retry_after:?}"
    );
    // A smaller request spends from them, with no call.
    let calls = limiter.stats().redis_calls();
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    assert_eq!(limiter.stats().redis_calls(), calls);
    assert_eq!(limiter.held("k"), held - 1);
    thread::sleep(retry_after.duration() + 20 * MS);
    // The retry now lacks two: one more refill.
    thread::sleep(Duration::from_millis(500));
    let retried = limiter.try_acquire_n(&mut con, "k", held + 1).unwrap();
    assert!(retried.is_allowed(), "{retried:?}");
}

/// A denial kept in a key's word answers the requests its wait covers (for
/// as many permits as Redis was asked to have, or fewer) with no call; a
/// larger request asks Redis for its own wait, which it keeps to, and the
/// kept denial, which ends sooner, stays for the small ones. The larger
/// request was answered with the small one's wait before: a client told to
/// come back then was denied again.
#[test]
fn a_kept_denial_answers_only_requests_its_wait_covers() {
    let Some(server) = server() else { return };
    let mut con = server.connection();
    let period = Duration::from_millis(500);
    let global = bucket("kept-size", 10, 1, period);
    let limiter = LeasedBuilder::new(global.clone(), 8)
        .unwrap()
        .lifetime(Duration::from_secs(60))
        .build()
        .unwrap();
    // Another process empties the bucket.
    while global.try_acquire(&mut con, "k").unwrap().is_allowed() {}
    let emptied = Instant::now();
    // A new key's lease is one token: the wait is for one refill.
    let small = limiter.try_acquire(&mut con, "k").unwrap();
    let turnstile::Decision::Denied { retry_after: small } = small else {
        panic!("{small:?}");
    };
    assert!(small.duration() <= period + 10 * MS, "{small:?}");
    let calls = limiter.stats().redis_calls();
    // The next small request: the kept denial, no call.
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_denied());
    assert_eq!(limiter.stats().redis_calls(), calls);
    // Four permits: Redis' own wait, for four refills less what has passed
    // since the bucket was emptied (less than one refill then).
    let large = limiter.try_acquire_n(&mut con, "k", 4).unwrap();
    let asked = emptied.elapsed();
    let turnstile::Decision::Denied { retry_after: large } = large else {
        panic!("{large:?}");
    };
    assert_eq!(limiter.stats().redis_calls(), calls + 1);
    assert!(
        large.duration() + asked > 3 * period,
        "{large:?} after {asked:?}"
    );
    // The small requests keep the sooner denial, with no call.
    let again = limiter.try_acquire(&mut con, "k").unwrap();
    let turnstile::Decision::Denied { retry_after: again } = again else {
        panic!("{again:?}");
    };
    assert!(again.duration() <= small.duration(), "{again:?}");
    assert_eq!(limiter.stats().redis_calls(), calls + 1);
    // Back after its wait, the large request is admitted.
    thread::sleep(large.duration() + 20 * MS);
    let retried = limiter.try_acquire_n(&mut con, "k", 4).unwrap();
    assert!(retried.is_allowed(), "{retried:?}");
}

/// A readiness check and the degraded gauge of a leased limiter across an
/// outage: `ping` (blocking and asynchronous) fails while Redis is gone and
/// succeeds once it is back; `is_degraded` and
/// `turnstile_redis_degraded{limiter}` are 1 from the first failed call to
/// the first success, and the period is counted once.
#[test]
fn ping_and_the_degraded_gauge_follow_an_outage() {
    let Some(server) = server() else { return };
    let port = server.port();
    let backoff = 200 * MS;
    let limiter = LeasedBuilder::new(bucket("ready", 100, 100, Duration::from_secs(1)), 8)
        .unwrap()
        .on_failure(OnFailure::Deny, backoff)
        .build()
        .unwrap();
    let render = |limiter: &LeasedLimiter| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            turnstile::metrics::describe();
            limiter.stats().publish("leased_ready");
        });
        handle.render()
    };
    let has = |text: &str, line: &str| text.lines().any(|l| l.starts_with(line));
    let gauge = |value| format!(r#"turnstile_redis_degraded{{limiter="leased_ready"}} {value}"#);
    let mut con = server.connection();
    limiter.ping(&mut con).expect("Redis answers");
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    assert!(!limiter.is_degraded());
    let text = render(&limiter);
    assert!(has(&text, &gauge(0)), "{text}");

    drop(server); // killed
    assert!(limiter.ping(&mut con).is_err());
    assert!(limiter.is_degraded());
    // A key with no lease held here gets the policy's answer, with no call
    // during the backoff the failed ping began.
    assert!(limiter.try_acquire(&mut con, "new").unwrap().is_denied());
    let stats = limiter.stats();
    assert_eq!(
        (stats.degraded, stats.degraded_periods, stats.failures),
        (true, 1, 1)
    );
    let text = render(&limiter);
    assert!(has(&text, &gauge(1)), "{text}");
    assert!(
        has(
            &text,
            r#"turnstile_redis_degraded_periods_total{limiter="leased_ready"} 1"#
        ),
        "{text}"
    );

    let server = spawn_on(port).expect("redis-server restarts on its port");
    let rtt = limiter.ping(&mut con).expect("Redis is back");
    assert!(rtt < Duration::from_secs(2), "{rtt:?}");
    assert!(!limiter.is_degraded() && !limiter.is_backing_off());
    assert!(limiter.try_acquire(&mut con, "new").unwrap().is_allowed());
    let text = render(&limiter);
    assert!(has(&text, &gauge(0)), "{text}");

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
        limiter.ping_async(&mut con).await.expect("Redis answers");
        drop(server);
        assert!(limiter.ping_async(&mut con).await.is_err());
        assert!(limiter.is_degraded());
        let _server = spawn_on(port).expect("redis-server restarts on its port");
        limiter.ping_async(&mut con).await.expect("Redis is back");
        assert!(!limiter.is_degraded());
    });
    assert_eq!(limiter.stats().degraded_periods, 2);
}

/// How the processes of a fairness run went: each one's decisions and
/// admissions, and the probes its limiter made.
struct Shares {
    decisions: Vec<u64>,
    admitted: Vec<u64>,
    probes: Vec<u64>,
}

/// `pauses.len()` processes (threads, each with its own `LeasedLimiter` and
/// connection, or exact mode for `lease: None`) ask for one permit of key
/// "k" of one bucket for `run`, process `i` sleeping `pauses[i]` between
/// requests (none: flat out).
fn shares(
    server: &Server,
    name: &str,
    quota: Quota,
    lease: Option<u32>,
    pauses: &[Duration],
) -> Shares {
    let global = RedisLimiter::new(name, TokenBucket::new(quota)).unwrap();
    let run = Duration::from_millis(1_500);
    let barrier = Arc::new(Barrier::new(pauses.len()));
    let threads: Vec<_> = pauses
        .iter()
        .map(|&pause| {
            let (global, barrier) = (global.clone(), barrier.clone());
            let mut con = server.connection();
            thread::spawn(move || {
                let limiter = lease.map(|l| {
                    LeasedBuilder::new(global.clone(), l)
                        .unwrap()
                        .build()
                        .unwrap()
                });
                barrier.wait();
                let until = Instant::now() + run;
                let (mut decisions, mut admitted) = (0u64, 0u64);
                while Instant::now() < until {
                    let decision = match &limiter {
                        Some(l) => l.try_acquire(&mut con, "k").unwrap(),
                        None => global.try_acquire(&mut con, "k").expect("a decision"),
                    };
                    decisions += 1;
                    admitted += u64::from(decision.is_allowed());
                    if !pause.is_zero() {
                        thread::sleep(pause);
                    }
                }
                (decisions, admitted, limiter.map_or(0, |l| l.stats().probes))
            })
        })
        .collect();
    let mut shares = Shares {
        decisions: Vec::new(),
        admitted: Vec::new(),
        probes: Vec::new(),
    };
    for t in threads {
        let (d, a, p) = t.join().expect("no panic");
        shares.decisions.push(d);
        shares.admitted.push(a);
        shares.probes.push(p);
    }
    shares
}

fn share(part: u64, all: &[u64]) -> f64 {
    part as f64 / all.iter().sum::<u64>().max(1) as f64
}

/// The fairness property of leased mode: when every process asks for more
/// than the key refills, each process's share of the admissions follows its
/// share of the requests, as in exact mode: a process's calls to a dry key
/// (one per `L` requests its kept denial answers, besides one per wait)
/// come in proportion to its requests, and the refill goes to the call that
/// finds it. Four processes on one key of a real `redis-server`, twice: one
/// flat out beside three that pause 20 µs between requests, then all four
/// flat out. Each process's share of the admissions is within
/// `FAIR_SHARE_BOUND` of its share of the requests, and in the first run the
/// busiest gets more than any other.
///
/// The slower processes sleep between requests rather than spin: four
/// spinning threads and `redis-server` on a two-core machine measure the
/// scheduler (whose thread runs when a refill lands), not the limiter; the
/// processes of a real deployment do not share one machine's cores.
#[test]
fn flat_out_processes_share_a_dry_key_in_proportion_to_demand() {
    const FAIR_SHARE_BOUND: f64 = 0.2;
    let Some(server) = server() else { return };
    // 2,000 per second, bursts of 100; leases of up to 64: dry under the
    // requests of four processes even on a loaded machine.
    let quota = Quota::per_second(2_000).unwrap().burst(100).unwrap();
    let pause = 20 * Duration::from_micros(1);
    let runs = [
        ("one-busy", [Duration::ZERO, pause, pause, pause]),
        ("all-busy", [Duration::ZERO; 4]),
    ];
    for (name, pauses) in runs {
        for (mode, lease) in [("exact", None), ("leased", Some(64))] {
            let run = shares(
                &server,
                &format!("fair-{name}-{mode}"),
                quota,
                lease,
                &pauses,
            );
            let demand: Vec<f64> = run
                .decisions
                .iter()
                .map(|&d| share(d, &run.decisions))
                .collect();
            let got: Vec<f64> = run
                .admitted
                .iter()
                .map(|&a| share(a, &run.admitted))
                .collect();
            eprintln!(
                "{name}, {mode}: decisions {:?}, admitted {:?}, probes {:?}; \
                 demand shares {demand:.3?}, admission shares {got:.3?}",
                run.decisions, run.admitted, run.probes
            );
            if lease.is_none() {
                continue;
            }
            // Everyone asked for more than the refill: the bucket was dry.
            let total: u64 = run.admitted.iter().sum();
            assert!(total < run.decisions.iter().sum::<u64>() / 2, "{total}");
            for (i, (got, demand)) in got.iter().zip(&demand).enumerate() {
                assert!(
                    (got - demand).abs() <= FAIR_SHARE_BOUND,
                    "{name}: process {i} got {got:.3} of the admissions for {demand:.3} \
                     of the requests"
                );
            }
            if pauses[1..].iter().all(|p| !p.is_zero()) {
                for i in 1..pauses.len() {
                    assert!(got[0] > got[i], "{name}: {got:?}");
                }
                // Its calls came from its requests: it probed most.
                assert!(
                    run.probes[0] > run.probes[1..].iter().copied().max().unwrap(),
                    "{name}: {:?}",
                    run.probes
                );
            }
        }
    }
}

/// `holds_nothing` says when a limiter can be dropped and made again later
/// without losing a count: not while a lease is held (its tokens were taken
/// from Redis), not while Redis fails (the local share's state and what it
/// owes Redis), and yes once the leases have expired, for a leased limiter
/// and a guarded (exact) one alike.
#[test]
fn a_limiter_holds_nothing_only_once_its_leases_expired_and_redis_answers() {
    use turnstile::redis::Guarded;

    let Some(server) = server() else {
        return;
    };
    let mut con = server.connection();
    let leased = LeasedBuilder::new(bucket("held", 100, 100, Duration::from_secs(1)), 10)
        .unwrap()
        .lifetime(Duration::from_millis(200))
        .idle(Duration::from_millis(100))
        .build()
        .unwrap();
    assert!(leased.holds_nothing(), "a new limiter");
    assert!(leased.try_acquire(&mut con, "k").unwrap().is_allowed());
    assert!(leased.try_acquire(&mut con, "k").unwrap().is_allowed());
    assert!(leased.held("k") > 0);
    assert!(!leased.holds_nothing(), "a lease taken is held");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(leased.held("k"), 0);
    assert!(leased.holds_nothing(), "the lease expired");

    let guarded = Guarded::new(
        bucket("held-exact", 100, 100, Duration::from_secs(1)),
        OnFailure::local_share(Quota::per_second(100).unwrap(), 2).unwrap(),
        Duration::from_secs(10),
    );
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_allowed());
    assert!(guarded.holds_nothing(), "the counts are in Redis");

    // Redis unreachable: the local shares answer, and hold what a new
    // limiter would not have.
    let down = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let mut dead = Deadlines::default().blocking(down);
    let _ = guarded.try_acquire(&mut dead, "k");
    assert!(guarded.is_degraded());
    assert!(!guarded.holds_nothing(), "degraded");
    let leased = LeasedBuilder::new(bucket("held-down", 100, 100, Duration::from_secs(1)), 10)
        .unwrap()
        .on_failure(
            OnFailure::local_share(Quota::per_second(100).unwrap(), 2).unwrap(),
            Duration::from_secs(10),
        )
        .build()
        .unwrap();
    let _ = leased.try_acquire(&mut dead, "k");
    assert!(leased.is_degraded());
    assert!(!leased.holds_nothing(), "degraded");
}

/// A request that waited for its key's fetch, whose call then timed out
/// (the first timeout: no backoff yet), is answered by the failure policy,
/// as the fetch's own request is and as its own call timing out would be.
/// It used to get a denial with a wait of 1 ns (`Retry-After: 1`) where the
/// policy says to deny for the backoff (or, failing open, to ask the local
/// share).
#[test]
fn a_waiter_on_a_fetch_that_timed_out_is_answered_by_the_policy() {
    let Some(server) = server() else { return };
    let global = bucket("waited-timeout", 1_000, 1, MS);
    let backoff = Duration::from_secs(5);
    let limiter = Arc::new(
        LeasedBuilder::new(global, 16)
            .unwrap()
            .on_failure(OnFailure::Deny, backoff)
            .fetch_wait(Duration::from_secs(2))
            .build()
            .unwrap(),
    );
    let deadlines = Deadlines::default()
        .connect(Duration::from_secs(1))
        .unwrap()
        .response(300 * MS)
        .unwrap();
    let mut first = deadlines.blocking(server.client());
    let mut second = deadlines.blocking(server.client());
    let _: () = redis::cmd("PING").query(&mut first).unwrap();
    let _: () = redis::cmd("PING").query(&mut second).unwrap();
    let sleeper = hang(&server, 1.0);
    let fetcher = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.try_acquire(&mut first, "k").unwrap())
    };
    // The fetch is claimed and in flight: the second request waits for it.
    thread::sleep(100 * MS);
    let waited = limiter.try_acquire(&mut second, "k").unwrap();
    let fetched = fetcher.join().unwrap();
    sleeper.wait();
    let stats = limiter.stats();
    assert_eq!(stats.fetch_waits, 1, "{stats:?}");
    assert_eq!(stats.failures, 1, "{stats:?}");
    assert!(!limiter.is_backing_off(), "one timeout does not back off");
    let by_policy = turnstile::Decision::Denied {
        retry_after: turnstile::RetryAfter::from_nanos(backoff.as_nanos() as u64),
    };
    assert_eq!(fetched, by_policy);
    assert_eq!(waited, by_policy, "{stats:?}");
    assert_eq!(stats.fallbacks, 2, "{stats:?}");
}

/// A fetch wait beyond what a clock reading can hold (`Duration::MAX`) is
/// no deadline but the fetch's own end: the request that waits for another's
/// fetch panicked adding it to the clock.
#[test]
fn a_fetch_wait_of_duration_max_waits_for_the_fetch_without_a_panic() {
    use redis_server::FailingAfter as Slow;
    let global = bucket("fetch-wait-max", 100, 100, Duration::from_secs(1));
    let limiter = Arc::new(
        LeasedBuilder::new(global, 10)
            .unwrap()
            .fetch_wait(Duration::MAX)
            .build()
            .unwrap(),
    );
    let fetcher = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.try_acquire(&mut Slow(Duration::from_millis(500)), "k"))
    };
    // The fetcher's call (500 ms) is in flight: this request waits for it.
    thread::sleep(Duration::from_millis(100));
    let waiter = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.try_acquire(&mut Slow(Duration::ZERO), "k"))
    };
    let waited = waiter.join();
    let fetched = fetcher.join();
    assert!(waited.is_ok(), "the waiting request panicked");
    assert!(fetched.is_ok());
    assert!(limiter.stats().fetch_waits >= 1, "{:?}", limiter.stats());
}

/// A refresher's give-back pass makes the prefetches queued meanwhile
/// between its calls: a key in use whose prefetch was queued behind a pass
/// over thousands of idle keys (one call each) ran dry and was answered by
/// the failure policy, with Redis healthy (the pass made every give-back
/// before it looked at its queue again).
#[test]
fn a_give_back_pass_makes_the_prefetches_queued_meanwhile() {
    let Some(server) = server() else { return };
    let global = bucket(
        "give-back-pass",
        1_000_000,
        1_000_000,
        Duration::from_secs(1),
    );
    let limiter = Arc::new(
        LeasedBuilder::new(global, 64)
            .unwrap()
            // Leases that last the test, given back once idle 30 ms.
            .lifetime(Duration::from_secs(60))
            .idle(30 * MS)
            // A request that finds the hot key dry with its fetch queued
            // waits up to 200 ms for it: a pass makes its prefetches within
            // a call or two (200 ms leaves room for a loaded machine), and
            // the pass itself takes far longer (6,000 calls).
            .fetch_wait(200 * MS)
            .on_failure(OnFailure::Deny, 100 * MS)
            .build()
            .unwrap(),
    );
    let mut con = server.connection();
    // Cold keys, each holding a lease the pass will give back.
    let cold: Vec<String> = (0..6_000).map(|i| format!("cold{i}")).collect();
    warm(&limiter, &mut con, &cold, 1);
    let refresher = limiter
        .start_refresher(server.connection())
        .unwrap()
        .expect("the first refresher");
    thread::sleep(40 * MS);
    // A hot key spent while the pass runs: each crossing of its low-water
    // mark queues a prefetch behind the pass.
    let before = limiter.stats();
    let began = Instant::now();
    let mut denied = 0;
    // Until no give-back has been made for 200 ms (the cold keys are back).
    let mut last = (0, Instant::now());
    while began.elapsed() < Duration::from_secs(20) {
        denied += u32::from(!limiter.try_acquire(&mut con, "hot").unwrap().is_allowed());
        thread::sleep(Duration::from_micros(20));
        let calls = limiter.stats().give_back_calls - before.give_back_calls;
        if calls != last.0 {
            last = (calls, Instant::now());
        } else if calls > 0 && last.1.elapsed() > 200 * MS {
            break;
        }
    }
    let after = limiter.stats();
    drop(refresher);
    assert!(
        after.give_back_calls - before.give_back_calls >= 5_000,
        "the pass did not run: {after:?}"
    );
    assert_eq!(after.failures, 0, "{after:?}");
    assert_eq!(
        (denied, after.fallbacks - before.fallbacks),
        (0, 0),
        "the hot key was answered by the policy: {after:?}"
    );
}

/// A give-back that Redis answers ends a degraded period, as any answered
/// call does: it left the limiter degraded until the next lease or ping.
/// (A timeout short of the run that backs off opens the period without a
/// backoff, so the give-back pass still calls.)
#[test]
fn a_give_back_that_redis_answers_ends_the_degraded_period() {
    let Some(server) = server() else { return };
    let limiter = LeasedBuilder::new(
        bucket("give-back-ends", 100, 100, Duration::from_secs(1)),
        8,
    )
    .unwrap()
    .on_failure(OnFailure::Deny, 100 * MS)
    .build()
    .unwrap();
    let mut con = Deadlines::default()
        .response(50 * MS)
        .unwrap()
        .blocking(server.client());
    warm(&limiter, &mut con, &["k".to_string()], 2);
    let paused = hang(&server, 0.3);
    assert!(limiter.ping(&mut con).is_err());
    assert!(limiter.is_degraded() && !limiter.is_backing_off());
    paused.wait();
    // The connection that timed out is dropped; a fresh one answers.
    let mut con = server.connection();
    assert!(limiter.give_back_all(&mut con) > 0, "{:?}", limiter.stats());
    assert!(!limiter.is_degraded(), "{:?}", limiter.stats());
}
