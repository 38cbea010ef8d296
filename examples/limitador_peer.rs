//! limitador (Kuadrant's rate limiter) beside exact and leased modes: one
//! limit, one key, one Redis, several replica processes (feature `limitador`
//! of `turnstile-dev`, which builds limitador 0.14.0 with its Redis storages).
//!
//! `cargo run --release -p turnstile-dev --features limitador --example
//! limitador_peer -- [--redis URL] [--replicas N] [--per-second R] [--lease L]
//! [--seconds S]` starts a `redis-server` on a free port (or uses the one at
//! URL) and runs each contender in turn, on a flushed Redis, as N replica
//! processes (this program again, with `--replica`), each with its own limiter
//! and its own connections, under the uneven load of the `distributed`
//! example (replica `i` spins `i * 2 µs` between requests), asking for one
//! permit of one key for S seconds (default 2):
//!
//! - exact mode: a `RedisLimiter` token bucket, one script per decision;
//! - leased mode: a `LeasedLimiter` over it, leases of up to L (default 1,000),
//!   with a refresher thread on a second connection;
//! - limitador's `RedisStorage` (blocking, a pool of connections): a script
//!   reads the counter, a second one increments it when admitted;
//! - limitador's `CachedRedisStorage` (`AsyncRateLimiter` on a tokio runtime
//!   with one worker, which runs its flushing task): counts in process,
//!   flushed to Redis every flushing period in batches, with its defaults (1 s,
//!   batches of 100) and with a period of 100 ms.
//!
//! The quota is the same for all: R per second (default 100,000). limitador's
//! limit is a fixed window of `max_value = R` per `seconds = 1`, which starts
//! at the counter's first increment; the token bucket is `Quota::per_second(R)`,
//! a burst of R refilled at R per second. Each contender is held to its own
//! algorithm's exact bound over the run's length T, read on Redis' clock from
//! before the replicas start to after the last one ends (no process holds
//! tokens and no key exists when it starts):
//!
//! - the token bucket: `B + r(T)`, with `B = R` and `r(T)` what the quota
//!   refills in T (whole periods, one more for the period the start fell in).
//!   Leased mode states `B + r(T) + N·(L + ⌊L/2⌋)` for any interval; over one
//!   that starts with no lease held it is `B + r(T)`, as exact mode's;
//! - the fixed window: `M·(⌊T/1 s⌋ + 1)` with `M = R` (its windows last 1 s
//!   and do not overlap, the first starting after the run's start), which is
//!   at most `B + r(T)`.
//!
//! It prints each replica's decisions per second, the admitted total against
//! both bounds, and the Redis calls per decision: the commands the replicas
//! sent (`EVALSHA`, `EVAL`, `PING`, `SCRIPT LOAD`, connection set-up), counted
//! by `INFO commandstats`, which lists the commands the scripts ran too.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use limitador::limit::{Context, Expression, Limit, Namespace, Predicate};
use limitador::storage::redis::{CachedRedisStorageBuilder, RedisStorage};
use limitador::{AsyncRateLimiter, RateLimiter};
use turnstile::redis::{Deadlines, LeasedBuilder, RedisLimiter};
use turnstile::{Quota, TokenBucket};

/// One contender: its name on the command line and in the output.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Contender {
    Exact,
    Leased,
    LimitadorRedis,
    /// With this flushing period, in milliseconds.
    LimitadorCached(u64),
}

impl Contender {
    fn all() -> [Contender; 5] {
        [
            Contender::Exact,
            Contender::Leased,
            Contender::LimitadorRedis,
            Contender::LimitadorCached(1_000),
            Contender::LimitadorCached(100),
        ]
    }

    fn arg(self) -> String {
        match self {
            Contender::Exact => "exact".into(),
            Contender::Leased => "leased".into(),
            Contender::LimitadorRedis => "limitador".into(),
            Contender::LimitadorCached(ms) => format!("cached:{ms}"),
        }
    }

    fn parse(s: &str) -> Option<Contender> {
        match s {
            "exact" => Some(Contender::Exact),
            "leased" => Some(Contender::Leased),
            "limitador" => Some(Contender::LimitadorRedis),
            _ => s
                .strip_prefix("cached:")
                .and_then(|ms| ms.parse().ok())
                .map(Contender::LimitadorCached),
        }
    }

    fn describe(self) -> String {
        match self {
            Contender::Exact => "turnstile exact mode (token bucket)".into(),
            Contender::Leased => "turnstile leased mode (token bucket, refresher)".into(),
            Contender::LimitadorRedis => "limitador RedisStorage (fixed window)".into(),
            Contender::LimitadorCached(ms) => {
                format!("limitador CachedRedisStorage, flush {ms} ms, batch 100 (fixed window)")
            }
        }
    }

    fn token_bucket(self) -> bool {
        matches!(self, Contender::Exact | Contender::Leased)
    }
}

/// The run's settings, the same in the coordinator and every replica.
#[derive(Clone, Copy)]
struct Settings {
    per_second: u32,
    lease: u32,
    run: Duration,
}

impl Settings {
    fn quota(self) -> Quota {
        Quota::per_second(self.per_second).unwrap_or_else(|e| fail(&format!("--per-second: {e}")))
    }

    fn limit(self) -> Limit {
        Limit::new(
            "peer",
            u64::from(self.per_second),
            1,
            Vec::<Predicate>::new(),
            Vec::<Expression>::new(),
        )
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2);
}

fn settings(args: &[String]) -> Settings {
    let number = |name: &str, default: u32| -> u32 {
        arg(args, name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| fail(&format!("{name} takes a whole number, not {v:?}")))
        })
    };
    let settings = Settings {
        per_second: number("--per-second", 100_000),
        lease: number("--lease", 1_000),
        run: Duration::from_secs(u64::from(number("--seconds", 2))),
    };
    let quota = settings.quota();
    if settings.lease == 0 || settings.lease > quota.capacity() {
        fail(&format!(
            "--lease must be from 1 to the bucket's capacity, {}",
            quota.capacity()
        ));
    }
    settings
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let settings = settings(&args);
    if let Some(i) = arg(&args, "--replica") {
        let contender = arg(&args, "--mode")
            .and_then(|m| Contender::parse(&m))
            .unwrap_or_else(|| fail("--mode: exact, leased, limitador or cached:MS"));
        replica(&args, i.parse().unwrap_or(0), contender, settings);
        return;
    }
    let replicas: u32 = arg(&args, "--replicas")
        .and_then(|n| n.parse().ok())
        .unwrap_or(4);
    let (url, mut server) = match arg(&args, "--redis") {
        Some(url) => (url, None),
        None => {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .spawn();
            let Ok(child) = child else {
                fail("redis-server did not start: install it, or pass --redis URL");
            };
            (format!("redis://127.0.0.1:{port}/"), Some(child))
        }
    };
    let client = redis::Client::open(url.as_str()).expect("a valid Redis URL");
    let start = Instant::now();
    let mut con = loop {
        match client.get_connection() {
            Ok(con) => break con,
            Err(e) if start.elapsed() > Duration::from_secs(5) => {
                stop(&mut server);
                fail(&format!("Redis at {url} does not answer: {e}"));
            }
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    };
    let quota = settings.quota();
    println!(
        "{replicas} replicas, one key, {} per second (token bucket: burst {}, {} every {:?}; \
         fixed window: {} per 1 s), leases of up to {}, {} s per contender; Redis at {url}\n",
        settings.per_second,
        quota.capacity(),
        quota.amount(),
        quota.period(),
        settings.per_second,
        settings.lease,
        settings.run.as_secs()
    );
    for contender in Contender::all() {
        run_contender(&args, &mut con, &url, replicas, contender, settings);
    }
    stop(&mut server);
}

/// Runs one contender's replicas on a flushed Redis and prints its figures.
fn run_contender(
    args: &[String],
    con: &mut redis::Connection,
    url: &str,
    replicas: u32,
    contender: Contender,
    settings: Settings,
) {
    let _: redis::RedisResult<()> = redis::cmd("FLUSHALL").query(con);
    let _: redis::RedisResult<()> = redis::cmd("CONFIG").arg("RESETSTAT").query(con);
    let begin = redis_micros(con);
    let children: Vec<Child> = (0..replicas)
        .map(|i| {
            Command::new(&args[0])
                .args(["--replica", &i.to_string(), "--mode", &contender.arg()])
                .args(["--redis", url])
                .args(["--per-second", &settings.per_second.to_string()])
                .args(["--lease", &settings.lease.to_string()])
                .args(["--seconds", &settings.run.as_secs().to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("the replica starts")
        })
        .collect();
    let (mut admitted, mut decisions, mut errors) = (0u64, 0u64, 0u64);
    println!("{}:", contender.describe());
    for mut child in children {
        let out = child.stdout.take().expect("piped");
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            // "replica i decisions admitted seconds errors"
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let [_, i, d, a, s, e] = fields.as_slice() {
                let (d, a, s, e): (u64, u64, f64, u64) = (
                    d.parse().unwrap_or(0),
                    a.parse().unwrap_or(0),
                    s.parse().unwrap_or(1.0),
                    e.parse().unwrap_or(0),
                );
                decisions += d;
                admitted += a;
                errors += e;
                println!(
                    "  replica {i} {:>12.0} decisions/s, {a} admitted{}",
                    d as f64 / s,
                    if e > 0 {
                        format!(", {e} errors")
                    } else {
                        String::new()
                    }
                );
            }
        }
        let _ = child.wait();
    }
    let elapsed = redis_micros(con).saturating_sub(begin);
    let quota = settings.quota();
    // The token bucket: its burst and whole refill periods, one more for the
    // period the start fell in.
    let period = u64::try_from(quota.period().as_micros()).unwrap_or(u64::MAX);
    let bucket = u64::from(quota.capacity()) + u64::from(quota.amount()) * (elapsed / period + 1);
    // The fixed window: windows of 1 s that do not overlap.
    let window = u64::from(settings.per_second) * (elapsed / 1_000_000 + 1);
    let held = if contender.token_bucket() {
        bucket
    } else {
        window
    };
    let over = admitted.saturating_sub(held);
    let by_name = commands(con);
    // What the replicas sent: `INFO commandstats` also counts the commands
    // that the scripts run (`GET`, `INCRBY`, ...), which are no round trips.
    let sent = |name: &str| {
        [
            "evalsha", "eval", "ping", "script|", "hello", "client|", "select",
        ]
        .iter()
        .any(|c| name == *c || (c.ends_with('|') && name.starts_with(c)))
    };
    let commands: u64 = by_name
        .iter()
        .filter(|(name, _)| sent(name))
        .map(|(_, calls)| calls)
        .sum();
    let by_name: Vec<String> = by_name
        .iter()
        .map(|(name, calls)| format!("{name} {calls}"))
        .collect();
    println!(
        "  admitted {admitted} over {:.3} s: B + r(T) = {bucket} ({:.3}), fixed window \
         M·(⌊T/1 s⌋ + 1) = {window} ({:.3}); held to {}: {}",
        elapsed as f64 / 1e6,
        admitted as f64 / bucket as f64,
        admitted as f64 / window as f64,
        if contender.token_bucket() {
            "B + r(T)"
        } else {
            "the fixed window's"
        },
        if over > 0 {
            format!("over by {over} ({:.1}%)", over as f64 * 100.0 / held as f64)
        } else {
            "within".to_string()
        }
    );
    println!(
        "  {} decisions/s in all; {commands} Redis calls for {decisions} decisions \
         ({:.5} per decision; by command, the scripts' own included: {}){}\n",
        (decisions as f64 / (elapsed as f64 / 1e6)).round(),
        commands as f64 / decisions.max(1) as f64,
        by_name.join(", "),
        if errors > 0 {
            format!("; {errors} errors")
        } else {
            String::new()
        }
    );
}

/// Redis' clock, in microseconds.
fn redis_micros(con: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1_000_000 + micros
}

/// The commands since the last `CONFIG RESETSTAT`, but this program's own
/// (`INFO`, `CONFIG`, `FLUSHALL`, `TIME`): each command's name and calls
/// (those a script ran included).
fn commands(con: &mut redis::Connection) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .unwrap_or_default();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .filter(|(name, _)| {
            !["info", "flushall", "time"].contains(&name.as_str()) && !name.starts_with("config")
        })
        .collect()
}

fn stop(server: &mut Option<Child>) {
    if let Some(child) = server {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Decisions, admissions and errors of one replica.
#[derive(Default)]
struct Tally {
    decisions: u64,
    admitted: u64,
    errors: u64,
}

impl Tally {
    /// Counts one decision, then spins the request's work: a spin, not a
    /// sleep, whose wake-up would take longer than the work.
    fn record(&mut self, answer: Result<bool, ()>, work: Duration) {
        self.decisions += 1;
        match answer {
            Ok(allowed) => self.admitted += u64::from(allowed),
            Err(()) => self.errors += 1,
        }
        let worked = Instant::now();
        while worked.elapsed() < work {
            std::hint::spin_loop();
        }
    }
}

/// One replica process: ask for one permit of the one key for the run,
/// working `i * 2 µs` between requests, and print `replica i decisions
/// admitted seconds errors`.
fn replica(args: &[String], i: u64, contender: Contender, settings: Settings) {
    let url = arg(args, "--redis").unwrap_or_default();
    let work = Duration::from_micros(i * 2);
    let mut tally = Tally::default();
    let start;
    match contender {
        Contender::Exact | Contender::Leased => {
            let connect = || {
                Deadlines::default()
                    .response(Duration::from_millis(50))
                    .expect("a valid deadline")
                    .blocking(redis::Client::open(url.as_str()).expect("a valid Redis URL"))
            };
            let mut con = connect();
            let global = RedisLimiter::new("peer", TokenBucket::new(settings.quota()))
                .expect("a valid limit");
            let leased = Arc::new(
                LeasedBuilder::new(global.clone(), settings.lease)
                    .expect("a token bucket")
                    .build()
                    .expect("a leased limiter"),
            );
            // Prefetches on a connection of its own, off the request path.
            let _refresher = if contender == Contender::Leased {
                leased.start_refresher(connect()).expect("a thread")
            } else {
                None
            };
            start = Instant::now();
            while start.elapsed() < settings.run {
                let answer = if contender == Contender::Leased {
                    leased
                        .try_acquire(&mut con, "k")
                        .map(|d| d.is_allowed())
                        .map_err(|_| ())
                } else {
                    global
                        .try_acquire(&mut con, "k")
                        .map(|d| d.is_allowed())
                        .map_err(|_| ())
                };
                tally.record(answer, work);
            }
        }
        Contender::LimitadorRedis => {
            let storage = RedisStorage::new(&url).unwrap_or_else(|e| fail(&e));
            let limiter = RateLimiter::new_with_storage(Box::new(storage));
            limiter.add_limit(settings.limit());
            let namespace = Namespace::from("peer");
            let ctx = Context::default();
            start = Instant::now();
            while start.elapsed() < settings.run {
                let answer = limiter.check_rate_limited_and_update(&namespace, &ctx, 1);
                tally.record(answer.map(|r| !r.limited).map_err(|_| ()), work);
            }
        }
        Contender::LimitadorCached(flush_ms) => {
            // One worker runs the storage's flushing task; the requests run
            // on this thread (`block_on`), as leased mode's run beside its
            // refresher thread.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a tokio runtime");
            start = runtime.block_on(async {
                let storage = CachedRedisStorageBuilder::new(&url)
                    .flushing_period(Duration::from_millis(flush_ms))
                    .build()
                    .await
                    .unwrap_or_else(|e| fail(&format!("limitador's cached storage: {e}")));
                let limiter = AsyncRateLimiter::new_with_storage(Box::new(storage));
                limiter.add_limit(settings.limit());
                let namespace = Namespace::from("peer");
                let ctx = Context::default();
                let start = Instant::now();
                while start.elapsed() < settings.run {
                    let answer = limiter
                        .check_rate_limited_and_update(&namespace, &ctx, 1)
                        .await;
                    tally.record(answer.map(|r| !r.limited).map_err(|_| ()), work);
                }
                start
            });
        }
    }
    println!(
        "replica {i} {} {} {:.6} {}",
        tally.decisions,
        tally.admitted,
        start.elapsed().as_secs_f64(),
        tally.errors
    );
}
