//! Bytes per key: the resident memory a keyed limiter adds for 1,000,000 u64 keys,
//! turnstile (token bucket, and each other algorithm) against governor's keyed
//! limiter (DashMap, with its default SipHash and with `ahash`), each measured in
//! a fresh process so none inherits another's heap.
//!
//! `cargo bench -p turnstile-bench --bench memory` (Linux: reads `VmRSS` from `/proc/self/status`).

use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::process::{Command, ExitCode};

use governor::clock::DefaultClock;
use governor::state::keyed::DashMapStateStore;

const KEYS: u64 = 1_000_000;

/// Resident set size in bytes, from `/proc/self/status`.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

const HOUR: std::time::Duration = std::time::Duration::from_secs(3_600);

/// 1,000 per hour.
fn per_hour() -> turnstile::Quota {
    turnstile::Quota::per_hour(1_000).expect("a valid quota")
}

/// `KEYS` keys in a keyed limiter running `algorithm`: the resident set after.
fn ours<A: turnstile::Algorithm>(algorithm: A) -> Option<u64> {
    let l = turnstile::KeyedBuilder::<u64, A>::new(algorithm)
        .max_keys(2 * KEYS as usize)
        .build()
        .expect("a valid configuration");
    (0..KEYS).for_each(|k| assert!(l.try_acquire(&k).is_allowed()));
    assert_eq!(l.len(), KEYS as usize);
    let after = rss_bytes();
    drop(l);
    after
}

/// 1,000 per hour, as [`per_hour`].
fn governor_quota() -> governor::Quota {
    governor::Quota::per_hour(NonZeroU32::new(1_000).expect("nonzero"))
}

/// `KEYS` keys in governor's keyed limiter on a DashMap hashed by `S`: the
/// resident set after.
fn theirs<S: BuildHasher + Clone>(
    l: governor::RateLimiter<
        u64,
        DashMapStateStore<u64, S>,
        DefaultClock,
        governor::middleware::NoOpMiddleware<<DefaultClock as governor::clock::Clock>::Instant>,
    >,
) -> Option<u64> {
    (0..KEYS).for_each(|k| assert!(l.check_key(&k).is_ok()));
    assert_eq!(l.len(), KEYS as usize);
    let after = rss_bytes();
    drop(l);
    after
}

/// Insert `KEYS` keys into one limiter and print the resident memory it added.
fn child(which: &str) -> ExitCode {
    let Some(before) = rss_bytes() else {
        eprintln!("memory: /proc/self/status is not readable here");
        return ExitCode::FAILURE;
    };
    let after = match which {
        "turnstile" => ours(turnstile::TokenBucket::new(per_hour())),
        "turnstile/fixed-window" => ours(turnstile::FixedWindow::new(1_000, HOUR).expect("valid")),
        "turnstile/sliding-window" => {
            ours(turnstile::SlidingWindow::new(1_000, HOUR).expect("valid"))
        }
        "turnstile/gcra" => ours(turnstile::Gcra::new(per_hour())),
        "governor" => theirs(governor::RateLimiter::dashmap_with_clock(
            governor_quota(),
            DefaultClock::default(),
        )),
        "governor-ahash" => theirs(governor::RateLimiter::dashmap_with_clock_and_hasher(
            governor_quota(),
            DefaultClock::default(),
            ahash::RandomState::new(),
        )),
        other => {
            eprintln!("memory: unknown limiter {other:?}");
            return ExitCode::FAILURE;
        }
    };
    let Some(after) = after else {
        return ExitCode::FAILURE;
    };
    println!("{}", after.saturating_sub(before));
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(args.get(i + 1).map_or("", String::as_str));
    }
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("memory: cannot find this executable to measure in a fresh process");
        return ExitCode::FAILURE;
    };
    println!("bytes per key, {KEYS} u64 keys, resident memory added (fresh process each):");
    let mut per_key = Vec::new();
    let all = [
        "turnstile",
        "governor",
        "governor-ahash",
        "turnstile/fixed-window",
        "turnstile/sliding-window",
        "turnstile/gcra",
    ];
    for which in all {
        let out = match Command::new(&exe).args(["--child", which]).output() {
            Ok(out) if out.status.success() => out,
            Ok(out) => {
                eprintln!(
                    "memory: {which} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("memory: cannot run {exe:?}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let bytes: u64 = match String::from_utf8_lossy(&out.stdout).trim().parse() {
            Ok(bytes) => bytes,
            Err(e) => {
                eprintln!("memory: {which} printed no byte count: {e}");
                return ExitCode::FAILURE;
            }
        };
        let each = bytes as f64 / KEYS as f64;
        println!("{which:<24} {bytes:>11} bytes  {each:6.1} bytes/key");
        per_key.push(each);
    }
    println!(
        "ratio turnstile / governor: {:.2}, turnstile / governor-ahash: {:.2}",
        per_key[0] / per_key[1],
        per_key[0] / per_key[2]
    );
    ExitCode::SUCCESS
}
