//! False failures under CPU load: a healthy Redis, a host kept busy.
//!
//! `cargo run --release --example false_failures -- [--spinners K]
//! [--deadline-ms D] [--secs S]` starts a `redis-server` on a free port, `K`
//! threads that spin (4 by default: more than the cores of a small CI
//! machine), and then, in each mode (exact with `Guarded`, leased with
//! leases of 16), two replicas (threads with a limiter and a connection each)
//! failing open to a local share, asking flat out for one key of a bucket of
//! 300 tokens refilled 300 a second, each call with a response deadline of
//! `D` ms (20 by default), for `S` seconds (5 by default). Redis never
//! fails: every failure is false. It prints, per replica, the calls that
//! failed, the decisions the policy made (for each failed call, and for every
//! request that a lease cannot serve during a backoff), and the admitted
//! total against the bound (B + r·T, plus the leases held in leased mode).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use turnstile::redis::{Deadlines, Guarded, LeasedBuilder, OnFailure, RedisLimiter};
use turnstile::{Quota, TokenBucket};

const REPLICAS: u32 = 2;
const LEASE: u32 = 16;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One replica's counts.
#[derive(Default)]
struct Seen {
    admitted: u64,
    decisions: u64,
    failures: u64,
    fallbacks: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let spinners: usize = arg(&args, "--spinners")
        .and_then(|n| n.parse().ok())
        .unwrap_or(4);
    let deadline = Duration::from_millis(
        arg(&args, "--deadline-ms")
            .and_then(|n| n.parse().ok())
            .unwrap_or(20),
    );
    let secs: u64 = arg(&args, "--secs")
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let Ok(child) = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
    else {
        eprintln!("redis-server did not start: install it");
        std::process::exit(1);
    };
    let _server = Server(child);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let start = Instant::now();
    while client.get_connection().is_err() {
        assert!(start.elapsed() < Duration::from_secs(5), "Redis answers");
        thread::sleep(Duration::from_millis(20));
    }
    let load = Arc::new(AtomicBool::new(true));
    let spin: Vec<_> = (0..spinners)
        .map(|_| {
            let load = load.clone();
            thread::spawn(move || {
                let mut x = 0u64;
                while load.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    println!(
        "{REPLICAS} replicas, {spinners} spinning threads, {} ms response deadline, {secs} s per mode",
        deadline.as_millis()
    );
    for mode in ["exact", "leased"] {
        measure(mode, &client, deadline, Duration::from_secs(secs));
    }
    load.store(false, Ordering::Relaxed);
    for s in spin {
        s.join().unwrap();
    }
}

fn measure(mode: &str, client: &redis::Client, deadline: Duration, run: Duration) {
    let quota = Quota::new(300, 3, Duration::from_millis(10)).unwrap();
    let global = RedisLimiter::new(&format!("false-{mode}"), TokenBucket::new(quota)).unwrap();
    let deadlines = Deadlines::default()
        .connect(deadline)
        .unwrap()
        .response(deadline)
        .unwrap();
    let barrier = Arc::new(Barrier::new(REPLICAS as usize + 1));
    let threads: Vec<_> = (0..REPLICAS)
        .map(|_| {
            let (global, barrier) = (global.clone(), barrier.clone());
            let mut con = deadlines.blocking(client.clone());
            let mode = mode.to_string();
            thread::spawn(move || {
                let share = OnFailure::local_share(quota, REPLICAS).unwrap();
                let backoff = Duration::from_secs(1);
                let mut seen = Seen::default();
                barrier.wait();
                let until = Instant::now() + run;
                if mode == "exact" {
                    let limiter = Guarded::new(global, share, backoff);
                    while Instant::now() < until {
                        let d = limiter.try_acquire(&mut con, "k").unwrap();
                        seen.admitted += u64::from(d.is_allowed());
                        seen.decisions += 1;
                        thread::sleep(Duration::from_micros(200));
                    }
                    let s = limiter.stats();
                    (seen.failures, seen.fallbacks) = (s.failures, s.fallbacks);
                } else {
                    let limiter = LeasedBuilder::new(global, LEASE)
                        .unwrap()
                        .on_failure(share, backoff)
                        .build()
                        .unwrap();
                    while Instant::now() < until {
                        let d = limiter.try_acquire(&mut con, "k").unwrap();
                        seen.admitted += u64::from(d.is_allowed());
                        seen.decisions += 1;
                        thread::sleep(Duration::from_micros(200));
                    }
                    let s = limiter.stats();
                    (seen.failures, seen.fallbacks) = (s.failures, s.fallbacks);
                }
                seen
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let seen: Vec<Seen> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let t = start.elapsed().as_secs_f64();
    let held = if mode == "leased" {
        f64::from(REPLICAS * (LEASE + LEASE / 2))
    } else {
        0.0
    };
    let bound = 300.0 + 300.0 * t + held;
    let admitted: u64 = seen.iter().map(|s| s.admitted).sum();
    for (i, s) in seen.iter().enumerate() {
        println!(
            "{mode:>6} replica {i}: {} decisions, {} failed calls, {} decided by the policy",
            s.decisions, s.failures, s.fallbacks,
        );
    }
    println!(
        "{mode:>6}: {admitted} admitted over {t:.2} s against a bound of {bound:.0} ({:+.1}%)",
        (admitted as f64 / bound - 1.0) * 100.0
    );
}
