//! Measurements that criterion cannot make well: instruction counts under
//! callgrind, where timings are too noisy to compare, and timings in alternating
//! blocks, so that both sides of a ratio see the same machine (see
//! BENCHMARKS.md).
//!
//! Run it under the bench profile, so that it is built as the benchmarks are
//! (fat LTO, one codegen unit, every crate in the build):
//!
//! ```text
//! cargo run --profile bench --example decision_cost              # lists the modes
//! cargo run --profile bench --example decision_cost -- paired-keyed
//! ```
//!
//! The bench profile writes to `target/release/`, as `--release` does, so under
//! callgrind build it first and run the binary there (a later `--release`
//! build overwrites it with the release profile's):
//!
//! ```text
//! cargo build --profile bench --example decision_cost
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect='*measured*' \
//!     target/release/examples/decision_cost deny turnstile precise 1000000
//! ```
//!
//! Modes (with no arguments, the program prints this list):
//!
//! - `allow|deny turnstile|turnstile-check|governor|governor+wait precise|coarse N`:
//!   `N` direct decisions inside `measured` (`turnstile-check` is `check`, whose
//!   denial defers the wait; `governor+wait` is governor's check plus the
//!   wait a 429 needs; precise only). Divide callgrind's `Collected` count by `N`.
//! - `paired`: turnstile's and governor's direct limiters timed in alternating
//!   blocks of 200,000 decisions, 101 blocks each, the median block of each and
//!   their ratio: on a machine whose speed drifts, alternating keeps both sides
//!   under the same conditions.
//! - `neighbours`: one direct limiter's size, and two threads deciding on two
//!   adjacent limiters, then on one (what sharing a cache line costs).
//! - `paired-keyed`: the same for the keyed limiters (turnstile, governor,
//!   governor with `ahash`, and the floor of `shared/floor.rs`): 1,000,000 keys
//!   visited in a shuffled order, and one hot key, each with precise and coarse
//!   clocks (blocks of 100,000 checks, 41 blocks each); then one thread against
//!   two on disjoint keys.
//! - `paired-algorithms`: each algorithm's direct decision against governor's
//!   GCRA in alternating blocks, coarse clocks.
//! - `algorithm allow|deny|deny-check|allow-call|deny-call token-bucket|live-token-bucket|fixed-window|sliding-window|gcra|live-gcra|live-fixed-window|live-sliding-window|warm-up|warm-up-warm|governor N`:
//!   one algorithm's direct decision on a manual clock (governor's GCRA on its
//!   fake clock), so that callgrind counts the algorithm without a clock read;
//!   `deny-check` denies through `check`, whose wait is worked out only when
//!   asked; `allow-call` and `deny-call` make each decision behind a call of
//!   its own (not for `warm-up-warm` and `governor`), so that no parameter stays in a
//!   register from one decision to the next.
//! - `keyed-hot turnstile|turnstile-tiered|turnstile-admitted|turnstile-admitted-coarse|floor-admitted-coarse N`:
//!   N decisions on one key, on a keyed limiter or on per-key quotas
//!   (`Tiered`, two tiers), for callgrind; the first two on a quota that denies
//!   most of them, `turnstile-admitted` (precise clock) and
//!   `turnstile-admitted-coarse` on one that admits every check, as the
//!   `keyed_hot_key` benchmark does, and `floor-admitted-coarse` the floor
//!   (see `paired-keyed`) on the same quota.
//! - `keyed-1m turnstile|turnstile-tiered|governor|governor-ahash|floor N`: fills a keyed limiter
//!   (or the floor) with 1,000,000 keys, then makes `N` checks in a shuffled
//!   order inside `measured`; under callgrind with `--cache-sim=yes` it counts
//!   cache misses per check.
//! - `keyed-new turnstile|governor|governor-ahash N`: `N` checks inside
//!   `measured`, each of a key never seen before, from an empty limiter (coarse
//!   clocks): the inserts and the tables' growth of `keyed_new_keys`.
//! - `clock read|decide tsc|real|monotonic|coarse N`: `N` readings of one
//!   clock, or `N` admitted token-bucket decisions on it, inside `measured`.
//! - `paired-clocks`: each clock's reading and admitted decision, timed in
//!   alternating blocks of 200,000 (51 blocks each), the median block of each.
//! - `paired-layer`: the layer cases in pairs (three limits in one `Limits`
//!   layer against one limit, without and with the `RateLimit` fields; one
//!   limit against tower_governor), every request admitted, timed in 101
//!   alternating blocks of 2,000 requests each (the responses kept until the
//!   block's time is read, as criterion's `iter_batched` keeps them): each
//!   side's median time per request and the median and quartiles of the
//!   per-block ratios.
//! - `leased-hot keyed|held|held-refresher N`: `N` decisions on one key inside
//!   `measured`: a Redis leased limiter while a lease of the largest size is
//!   held (no Redis: a connection of the program's own answers the lease
//!   calls made before measuring), without a refresher or with one started,
//!   and an in-process keyed limiter on the same clock (`RealClock`), every
//!   decision admitted. `N` at most 4,194,303 (half the largest lease).
//! - `layer bare|turnstile-admitted|turnstile-denied|turnstile-fields-admitted|combined3-admitted|combined3-denied|combined3-nofields-admitted|combined1-nofields-admitted|stacked3-admitted|stacked3-denied|tower_governor-admitted|tower_governor-denied N`:
//!   sends `N` requests through an axum router, bare or behind a rate-limiting
//!   layer (callgrind: `--toggle-collect='*requests_measured*'`).

#[path = "../shared/floor.rs"]
mod floor;
#[path = "../shared/keys.rs"]
mod keys;
#[path = "../shared/layer.rs"]
mod layer;

mod algorithms;
mod clocks;
mod direct;
mod keyed;
mod leased;
mod router;

use algorithms::{run_algorithm, run_paired_algorithms};
use clocks::{run_clock, run_paired_clocks};
use direct::{run_neighbours, run_paired};
use keyed::{run_keyed_hot, run_keyed_million, run_keyed_new, run_paired_keyed};
use leased::run_leased_hot;
use router::{run_layer, run_paired_layer};

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

const ALLOW_RATE: u32 = 1_000_000_000;

#[inline(never)]
fn measured<T>(n: u64, mut decide: impl FnMut() -> T) {
    for _ in 0..n {
        black_box(decide());
    }
}

/// The modes, one line each: printed with no arguments (or `--help`), and on
/// stderr after a malformed command line.
const MODES: &str = "\
usage: decision_cost MODE ARGS (cargo run --profile bench --example decision_cost -- MODE ARGS)
  allow|deny turnstile|turnstile-check|governor|governor+wait precise|coarse N: N direct decisions inside `measured`, for callgrind
  paired: direct limiters, turnstile against governor, timed in alternating blocks
  neighbours: one direct limiter's size, and two threads on two adjacent limiters, then on one
  paired-keyed: keyed limiters (turnstile, governor, governor-ahash, floor) on 1M keys and a hot key, then 2-thread scaling
  paired-algorithms: each algorithm against governor's GCRA, direct, coarse clocks, alternating blocks
  algorithm allow|deny|deny-check|allow-call|deny-call token-bucket|live-token-bucket|fixed-window|sliding-window|gcra|live-gcra|live-fixed-window|live-sliding-window|warm-up|warm-up-warm|governor N: N decisions on a manual clock inside `measured`
  keyed-1m turnstile|turnstile-tiered|governor|governor-ahash|floor N: 1,000,000 keys, then N shuffled checks inside `measured`
  keyed-new turnstile|governor|governor-ahash N: N checks of keys never seen before, from an empty limiter, inside `measured`
  keyed-hot turnstile|turnstile-tiered|turnstile-admitted|turnstile-admitted-coarse|floor-admitted-coarse N: N decisions on one key inside `measured` (tiered: two tiers, per-key quotas; admitted: every check admitted, as in the keyed_hot_key benchmark)
  leased-hot keyed|held|held-refresher N: N decisions on one key inside `measured`: leased with a lease held (no Redis), without and with a refresher, and in-process keyed
  layer bare|turnstile-admitted|turnstile-denied|turnstile-fields-admitted|combined3-admitted|combined3-denied|combined3-nofields-admitted|combined1-nofields-admitted|stacked3-admitted|stacked3-denied|tower_governor-admitted|tower_governor-denied N: N requests through an axum router
  clock read|decide tsc|real|monotonic|coarse N: N readings of a clock, or N admitted decisions on it, inside `measured`
  paired-clocks: each clock's reading and admitted decision, timed in alternating blocks
  paired-layer: the layer cases in pairs (three limits against one, one against tower_governor), timed in alternating blocks";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || matches!(args.as_slice(), [a] if a == "-h" || a == "--help") {
        println!("{MODES}");
        return ExitCode::SUCCESS;
    }
    if let [mode, who, n] = args.as_slice()
        && mode == "keyed-1m"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_keyed_million(who, n);
    }
    if let [mode, who, n] = args.as_slice()
        && mode == "keyed-new"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_keyed_new(who, n);
    }
    if let [mode, who, n] = args.as_slice()
        && mode == "keyed-hot"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_keyed_hot(who, n);
    }
    if let [mode, who, n] = args.as_slice()
        && mode == "leased-hot"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_leased_hot(who, n);
    }
    if let [mode, which, n] = args.as_slice()
        && mode == "layer"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_layer(which, n);
    }
    if let [mode, path, which, n] = args.as_slice()
        && mode == "algorithm"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_algorithm(path, which, n);
    }
    if let [mode, what, which, n] = args.as_slice()
        && mode == "clock"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_clock(what, which, n);
    }
    match args.first().map(String::as_str) {
        Some("paired-clocks") => {
            run_paired_clocks();
            return ExitCode::SUCCESS;
        }
        Some("paired") => {
            run_paired();
            return ExitCode::SUCCESS;
        }
        Some("neighbours") => {
            run_neighbours();
            return ExitCode::SUCCESS;
        }
        Some("paired-keyed") => {
            run_paired_keyed();
            return ExitCode::SUCCESS;
        }
        Some("paired-algorithms") => {
            run_paired_algorithms();
            return ExitCode::SUCCESS;
        }
        Some("paired-layer") => {
            run_paired_layer();
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let [path, who, clock, n] = args.as_slice() else {
        eprintln!("{MODES}");
        return ExitCode::FAILURE;
    };
    let Ok(n) = n.parse::<u64>() else {
        eprintln!("N must be a number, not {n:?}");
        return ExitCode::FAILURE;
    };
    let allow = match path.as_str() {
        "allow" => true,
        "deny" => false,
        other => {
            eprintln!("unknown path {other:?}: allow or deny");
            return ExitCode::FAILURE;
        }
    };
    let ours_quota = if allow {
        turnstile::Quota::per_second(ALLOW_RATE)
    } else {
        turnstile::Quota::per_hour(1)
    }
    .expect("a valid quota");
    let nz = |n| NonZeroU32::new(n).expect("nonzero");
    let theirs_quota = if allow {
        governor::Quota::per_second(nz(ALLOW_RATE))
    } else {
        governor::Quota::per_hour(nz(1))
    };
    match (who.as_str(), clock.as_str()) {
        ("turnstile", "precise") => {
            let l = turnstile::RateLimiter::new(ours_quota);
            let _ = l.try_acquire();
            measured(n, || l.try_acquire());
        }
        ("turnstile", "coarse") => {
            let coarse = turnstile::CoarseClock::new().expect("upkeep thread");
            let l = turnstile::RateLimiter::with_clock(ours_quota, coarse);
            let _ = l.try_acquire();
            measured(n, || l.try_acquire());
        }
        ("turnstile-check", "precise") => {
            let l = turnstile::RateLimiter::new(ours_quota);
            let _ = l.check();
            measured(n, || l.check().is_ok());
        }
        ("turnstile-check", "coarse") => {
            let coarse = turnstile::CoarseClock::new().expect("upkeep thread");
            let l = turnstile::RateLimiter::with_clock(ours_quota, coarse);
            let _ = l.check();
            measured(n, || l.check().is_ok());
        }
        ("governor", "precise") => {
            let l = governor::RateLimiter::direct(theirs_quota);
            let _ = l.check();
            measured(n, || l.check());
        }
        ("governor+wait", "precise") => {
            // A 429 needs the wait, which governor computes from a second reading.
            use governor::clock::Clock as _;
            let clock = governor::clock::DefaultClock::default();
            let l = governor::RateLimiter::direct(theirs_quota);
            let _ = l.check();
            measured(n, || l.check().map_err(|e| e.wait_time_from(clock.now())));
        }
        ("governor", "coarse") => {
            let upkeep =
                governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                    .expect("upkeep thread");
            let l = governor::RateLimiter::direct_with_clock(theirs_quota, upkeep);
            let _ = l.check();
            measured(n, || l.check());
        }
        other => {
            eprintln!(
                "unknown limiter {other:?}: turnstile|turnstile-check|governor|governor+wait, \
                 precise|coarse"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
