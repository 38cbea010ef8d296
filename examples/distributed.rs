//! One limit shared by several processes through Redis, in exact mode and in
//! leased mode.
//!
//! `cargo run --release --example distributed -- [--redis URL] [--replicas N]`
//! starts a `redis-server` on a free port (or uses the one at URL), then runs
//! N replica processes (this program again, with `--replica`), each with its
//! own connection, under uneven load (replica `i` works `i * 2 µs`, spinning,
//! between requests) against one key's limit of 100,000 per second with a
//! burst of 1,000, for 2 s per mode. It prints each replica's decisions per second, the
//! admitted total against the bound (exact: `B + r(T)`; leased: `B + r(T) +
//! N·(L + L/2)`), and the Redis calls per decision. Last, a timed loop: one decision
//! while a lease is held against one in-process keyed decision.

use std::hint::black_box;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use turnstile::redis::{Deadlines, LeasedBuilder, RedisLimiter};
use turnstile::{KeyedLimiter, Quota, TokenBucket};

const CAPACITY: u32 = 1_000;
const PER_SECOND: u32 = 100_000;
const LEASE: u32 = 1_000;
const RUN: Duration = Duration::from_secs(2);

fn quota() -> Quota {
    Quota::per_second(PER_SECOND)
        .and_then(|q| q.burst(CAPACITY))
        .expect("a valid quota")
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--replica") {
        replica(&args);
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
                eprintln!("redis-server did not start: install it, or pass --redis URL");
                std::process::exit(1);
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
                eprintln!("Redis at {url} does not answer: {e}");
                stop(&mut server);
                std::process::exit(1);
            }
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    };
    println!(
        "{replicas} replicas, one key, {PER_SECOND} per second, burst {CAPACITY}, \
         leases of up to {LEASE}, {} s per mode; Redis at {url}\n",
        RUN.as_secs()
    );
    for mode in ["exact", "leased"] {
        let _: redis::RedisResult<()> = redis::cmd("FLUSHALL").query(&mut con);
        let _: redis::RedisResult<()> = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut con);
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).expect("TIME");
        let begin = secs * 1_000_000 + micros;
        let children: Vec<Child> = (0..replicas)
            .map(|i| {
                Command::new(&args[0])
                    .args(["--replica", &i.to_string(), "--mode", mode, "--redis", &url])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("the replica starts")
            })
            .collect();
        let (mut admitted, mut decisions) = (0u64, 0u64);
        println!("{mode} mode:");
        for mut child in children {
            let out = child.stdout.take().expect("piped");
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                // "replica i: decisions admitted seconds"
                let fields: Vec<&str> = line.split_whitespace().collect();
                if let [_, i, d, a, s] = fields.as_slice() {
                    let (d, a, s): (u64, u64, f64) = (
                        d.parse().unwrap_or(0),
                        a.parse().unwrap_or(0),
                        s.parse().unwrap_or(1.0),
                    );
                    decisions += d;
                    admitted += a;
                    println!(
                        "  replica {i} {:>12.0} decisions/s, {a} admitted",
                        d as f64 / s
                    );
                }
            }
            let _ = child.wait();
        }
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).expect("TIME");
        let elapsed = secs * 1_000_000 + micros - begin;
        // 100,000 per second is one token per 10 µs; one period more for
        // the one the start fell in.
        let refill = elapsed / 10 + 1;
        let extra = if mode == "leased" {
            u64::from(replicas * (LEASE + LEASE / 2))
        } else {
            0
        };
        let bound = u64::from(CAPACITY) + refill + extra;
        let calls = script_calls(&mut con);
        println!(
            "  admitted {admitted} of bound {bound} (B + r(T){}) over {:.3} s; \
             {calls} Redis script calls for {decisions} decisions: {:.5} per decision\n",
            if extra > 0 { " + N·(L + L/2)" } else { "" },
            elapsed as f64 / 1e6,
            calls as f64 / decisions.max(1) as f64
        );
    }
    held_lease_cost(&client);
    stop(&mut server);
}

/// EVALSHA and EVAL calls since the last `CONFIG RESETSTAT`.
fn script_calls(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

fn stop(server: &mut Option<Child>) {
    if let Some(child) = server {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// One replica process: ask for one permit of key "k" for `RUN`, working
/// `i * 2 µs` between requests, and print `replica i decisions admitted
/// seconds`.
fn replica(args: &[String]) {
    let i: u64 = arg(args, "--replica")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let leased = arg(args, "--mode").as_deref() == Some("leased");
    let url = arg(args, "--redis").unwrap_or_default();
    let client = redis::Client::open(url.as_str()).expect("a valid Redis URL");
    let mut con = Deadlines::default()
        .response(Duration::from_millis(50))
        .expect("a valid deadline")
        .blocking(client);
    let global = RedisLimiter::new("distributed", TokenBucket::new(quota())).expect("exact");
    let limiter = Arc::new(
        LeasedBuilder::new(global.clone(), LEASE)
            .expect("a token bucket")
            .build()
            .expect("a leased limiter"),
    );
    // Prefetches on a connection of their own, off the request path.
    let refresher_con = Deadlines::default()
        .response(Duration::from_millis(50))
        .expect("a valid deadline")
        .blocking(redis::Client::open(url.as_str()).expect("a valid Redis URL"));
    let _refresher = if leased {
        limiter.start_refresher(refresher_con).expect("a thread")
    } else {
        None
    };
    let pause = Duration::from_micros(i * 2);
    let (mut decisions, mut admitted) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < RUN {
        let allowed = if leased {
            limiter
                .try_acquire(&mut con, "k")
                .is_ok_and(|d| d.is_allowed())
        } else {
            global
                .try_acquire(&mut con, "k")
                .is_ok_and(|d| d.is_allowed())
        };
        decisions += 1;
        admitted += u64::from(allowed);
        // The request's work: a spin, not a sleep, whose wake-up would
        // take longer than the work.
        let worked = Instant::now();
        while worked.elapsed() < pause {
            std::hint::spin_loop();
        }
    }
    println!(
        "replica {i} {decisions} {admitted} {:.6}",
        start.elapsed().as_secs_f64()
    );
}

/// A decision while a lease is held against an in-process keyed decision, in
/// one timed loop each (one thread, 2 million decisions, best of 5).
fn held_lease_cost(client: &redis::Client) {
    let mut con = Deadlines::default()
        .response(Duration::from_millis(50))
        .expect("a valid deadline")
        .blocking(client.clone());
    let _: redis::RedisResult<()> = redis::cmd("FLUSHALL").query(&mut con);
    // A limit that never runs dry here: leases of 1,000 from a bucket of a
    // billion a second.
    let plenty = Quota::per_second_with_burst(1_000_000_000, 1_000_000).expect("a valid quota");
    let global = RedisLimiter::new("cost", TokenBucket::new(plenty)).expect("exact");
    // With leases of L = 1,000 (prefetch calls included) and of the largest
    // size (a decision while a lease is held: a call per 4 million).
    let limiter = LeasedBuilder::new(global.clone(), LEASE)
        .expect("a token bucket")
        .lifetime(Duration::from_secs(60))
        .build()
        .expect("a leased limiter");
    // The largest lease this bucket allows: its capacity is below MAX_LEASE.
    let largest = LeasedBuilder::new(global, turnstile::redis::MAX_LEASE.min(plenty.capacity()))
        .expect("a token bucket and a lease within its capacity")
        .lifetime(Duration::from_secs(60))
        .build()
        .expect("a leased limiter");
    let keyed = KeyedLimiter::<Vec<u8>>::new(plenty);
    let n = 2_000_000u32;
    let (mut leased_best, mut keyed_best, mut held_best) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..n {
            black_box(largest.try_acquire(&mut con, black_box(b"k")).ok());
        }
        held_best = held_best.min(start.elapsed().as_nanos() as f64 / f64::from(n));
        let start = Instant::now();
        for _ in 0..n {
            black_box(limiter.try_acquire(&mut con, black_box(b"k")).ok());
        }
        leased_best = leased_best.min(start.elapsed().as_nanos() as f64 / f64::from(n));
        let start = Instant::now();
        for _ in 0..n {
            let _ = black_box(keyed.try_acquire(black_box(&b"k"[..])));
        }
        keyed_best = keyed_best.min(start.elapsed().as_nanos() as f64 / f64::from(n));
    }
    let stats = limiter.stats();
    println!(
        "one in-process keyed decision: {keyed_best:.1} ns; one decision while a lease is \
         held: {held_best:.1} ns ({:.2}x; leases of {}, {} calls); with leases of {LEASE}, \
         prefetch calls included: {leased_best:.1} ns ({:.2}x); {} Redis calls for {} \
         decisions ({:.5} per decision, 1/L = {:.5})",
        held_best / keyed_best,
        largest.max_lease(),
        largest.stats().redis_calls(),
        leased_best / keyed_best,
        stats.redis_calls(),
        5 * n,
        stats.redis_calls() as f64 / f64::from(5 * n),
        1.0 / f64::from(LEASE)
    );
}
