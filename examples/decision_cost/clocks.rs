//! The clock modes: `clock` (readings or decisions on one clock, for
//! callgrind) and `paired-clocks` (every clock, in alternating blocks).

use std::hint::black_box;
use std::process::ExitCode;

use crate::{ALLOW_RATE, measured};

/// One clock's readings (`read`) or admitted token-bucket decisions on it
/// (`decide`), `n` of them inside `measured`.
pub(crate) fn run_clock(what: &str, which: &str, n: u64) -> ExitCode {
    use turnstile::{Clock, CoarseClock, MonotonicClock, Quota, RateLimiter, RealClock, TscClock};
    fn run<C: Clock>(what: &str, clock: C, n: u64) -> ExitCode {
        match what {
            "read" => measured(n, || clock.now()),
            "decide" => {
                let quota = Quota::per_second(ALLOW_RATE).expect("a valid quota");
                let l = RateLimiter::with_clock(quota, clock);
                let _ = l.try_acquire();
                measured(n, || l.try_acquire());
            }
            other => {
                eprintln!("unknown {other:?}: read or decide");
                return ExitCode::FAILURE;
            }
        }
        ExitCode::SUCCESS
    }
    match which {
        "tsc" => run(what, TscClock::new(), n),
        "real" => {
            let real = RealClock::new();
            eprintln!("RealClock reads {:?}", real.source());
            run(what, real, n)
        }
        "monotonic" => run(what, MonotonicClock::new(), n),
        "coarse" => run(what, CoarseClock::new().expect("upkeep thread"), n),
        other => {
            eprintln!("unknown clock {other:?}: tsc, real, monotonic or coarse");
            ExitCode::FAILURE
        }
    }
}

/// Each clock's reading and admitted decision, timed in alternating blocks.
pub(crate) fn run_paired_clocks() {
    use turnstile::{Clock, CoarseClock, MonotonicClock, Quota, RateLimiter, RealClock, TscClock};
    const BLOCK: u32 = 200_000;
    // The one-time costs: quanta's calibration, then the start-up check.
    let start = std::time::Instant::now();
    let tsc = TscClock::new();
    let calibrated = start.elapsed();
    let real = RealClock::new();
    println!(
        "first TscClock::new (quanta's calibration): {calibrated:.2?}; then the first \
         RealClock::new (the check): {:.2?}; RealClock reads {:?}",
        start.elapsed() - calibrated,
        real.source()
    );
    let (os, coarse) = (
        MonotonicClock::new(),
        CoarseClock::new().expect("upkeep thread"),
    );
    let quota = Quota::per_second(ALLOW_RATE).expect("a valid quota");
    let (l_tsc, l_real, l_os, l_coarse) = (
        RateLimiter::with_clock(quota, tsc.clone()),
        RateLimiter::with_clock(quota, real.clone()),
        RateLimiter::with_clock(quota, os),
        RateLimiter::with_clock(quota, coarse.clone()),
    );
    type Case<'a> = (&'static str, Box<dyn FnMut() + 'a>);
    let mut cases: Vec<Case<'_>> = vec![
        ("read tsc", Box::new(|| _ = black_box(tsc.now()))),
        ("read real", Box::new(|| _ = black_box(real.now()))),
        ("read monotonic", Box::new(|| _ = black_box(os.now()))),
        ("read coarse", Box::new(|| _ = black_box(coarse.now()))),
        (
            "decide tsc",
            Box::new(|| _ = black_box(l_tsc.try_acquire())),
        ),
        (
            "decide real",
            Box::new(|| _ = black_box(l_real.try_acquire())),
        ),
        (
            "decide monotonic",
            Box::new(|| _ = black_box(l_os.try_acquire())),
        ),
        (
            "decide coarse",
            Box::new(|| _ = black_box(l_coarse.try_acquire())),
        ),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..51 {
        for (i, (_, f)) in cases.iter_mut().enumerate() {
            let start = std::time::Instant::now();
            for _ in 0..BLOCK {
                f();
            }
            times[i].push(start.elapsed().as_nanos() as f64 / f64::from(BLOCK));
        }
    }
    for ((name, _), t) in cases.iter().zip(&mut times) {
        t.sort_by(f64::total_cmp);
        println!("{name:>18}: {:6.2} ns (median block)", t[t.len() / 2]);
    }
}
