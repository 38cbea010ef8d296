//! The direct (unkeyed) limiter against governor's, in the same groups so that
//! every figure is a ratio from one run.
//!
//! `cargo bench -p turnstile-bench --bench direct`
//!
//! - `direct_allow`: every check is admitted (a bucket too big to run dry).
//! - `direct_live`: the allow path of a `LiveTokenBucket` beside a `TokenBucket` of
//!   the same quota (what supporting live reconfiguration costs), and on the
//!   coarse clock a second `TokenBucket` after both (`turnstile-again`: the
//!   noise in a ratio of two identical limiters).
//! - `direct_deny`: every check is denied (a bucket emptied first, refilling once
//!   an hour). turnstile's `try_acquire` denial includes the exact wait;
//!   governor's check defers it, so `governor/precise+wait` adds the call a
//!   429's `Retry-After` needs, and `turnstile-check` is turnstile's `check`,
//!   which defers the wait too (`NotYet::retry_after` computes it when asked);
//!   `turnstile-live/coarse` is a `LiveTokenBucket`'s denial.
//!
//! Each with the precise clock (quanta's TSC for both) and the coarse clock
//! (turnstile's `CoarseClock`, governor's `QuantaUpkeepClock`, both 1 ms).
//!
//! These are governor's fastest direct configurations: it provides one state
//! store for a direct limiter (one `AtomicU64`), `NoOpMiddleware` is its
//! cheapest middleware, and its fastest clocks are the two above (its other
//! real clocks, `MonotonicClock` and `SystemClock`, read the OS clock, slower
//! than quanta's TSC; see `clock_read`).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::clock::{Clock as _, QuantaUpkeepClock};

const ALLOW_RATE: u32 = 1_000_000_000;
const COARSE: Duration = Duration::from_millis(1);

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("nonzero")
}

fn direct_allow(c: &mut Criterion) {
    let mut group = c.benchmark_group("direct_allow");

    let ours = turnstile::RateLimiter::new(turnstile::Quota::per_second(ALLOW_RATE).unwrap());
    group.bench_function("turnstile/precise", |b| {
        b.iter(|| black_box(ours.try_acquire()))
    });
    assert!(
        ours.try_acquire().is_allowed(),
        "the allow bench must allow"
    );

    let theirs = governor::RateLimiter::direct(governor::Quota::per_second(nonzero(ALLOW_RATE)));
    group.bench_function("governor/precise", |b| b.iter(|| black_box(theirs.check())));
    assert!(theirs.check().is_ok(), "the allow bench must allow");

    let coarse = turnstile::CoarseClock::with_resolution(COARSE).unwrap();
    let ours = turnstile::RateLimiter::with_clock(
        turnstile::Quota::per_second(ALLOW_RATE).unwrap(),
        coarse,
    );
    group.bench_function("turnstile/coarse", |b| {
        b.iter(|| black_box(ours.try_acquire()))
    });
    assert!(
        ours.try_acquire().is_allowed(),
        "the allow bench must allow"
    );

    let upkeep = QuantaUpkeepClock::from_interval(COARSE).unwrap();
    let theirs = governor::RateLimiter::direct_with_clock(
        governor::Quota::per_second(nonzero(ALLOW_RATE)),
        upkeep,
    );
    group.bench_function("governor/coarse", |b| b.iter(|| black_box(theirs.check())));
    assert!(theirs.check().is_ok(), "the allow bench must allow");

    group.finish();
}

/// What supporting live reconfiguration costs when no change happens: the
/// same quota in a `TokenBucket` and in a `LiveTokenBucket`, every check
/// admitted, governor beside them.
fn direct_live(c: &mut Criterion) {
    let mut group = c.benchmark_group("direct_live");
    let quota = turnstile::Quota::per_second(ALLOW_RATE).unwrap();
    let coarse = turnstile::CoarseClock::with_resolution(COARSE).unwrap();

    let plain = turnstile::RateLimiter::new(quota);
    let live = turnstile::RateLimiter::live(quota).unwrap();
    let plain_coarse = turnstile::RateLimiter::with_clock(quota, coarse.clone());
    let live_coarse = turnstile::RateLimiter::from_parts(
        turnstile::LiveTokenBucket::new(quota).unwrap(),
        coarse.clone(),
    );
    let theirs = governor::RateLimiter::direct(governor::Quota::per_second(nonzero(ALLOW_RATE)));

    // In a loop, as a service calls it: the limiter reached afresh each time
    // (`black_box(&limiter)`), so no parameter is read once for the loop.
    group.bench_function("turnstile/precise", |b| {
        b.iter(|| black_box(&plain).try_acquire())
    });
    group.bench_function("turnstile-live/precise", |b| {
        b.iter(|| black_box(&live).try_acquire())
    });
    group.bench_function("governor/precise", |b| {
        b.iter(|| black_box(&theirs).check())
    });
    group.bench_function("turnstile/coarse", |b| {
        b.iter(|| black_box(&plain_coarse).try_acquire())
    });
    group.bench_function("turnstile-live/coarse", |b| {
        b.iter(|| black_box(&live_coarse).try_acquire())
    });
    // A second plain bucket, measured after the live one: the ratio of the
    // two plain ones is what the machine's noise alone makes of a 1.00.
    let plain_again = turnstile::RateLimiter::with_clock(quota, coarse);
    group.bench_function("turnstile-again/coarse", |b| {
        b.iter(|| black_box(&plain_again).try_acquire())
    });
    // As `direct_allow` measures: the compiler may keep a plain limiter's
    // parameters in registers across the loop; a live one's are atomics,
    // read every time.
    group.bench_function("turnstile/precise-hoisted", |b| {
        b.iter(|| black_box(plain.try_acquire()))
    });
    group.bench_function("turnstile-live/precise-hoisted", |b| {
        b.iter(|| black_box(live.try_acquire()))
    });
    assert!(plain.try_acquire().is_allowed(), "the bench must allow");
    assert!(live.try_acquire().is_allowed(), "the bench must allow");
    assert!(
        plain_coarse.try_acquire().is_allowed(),
        "the bench must allow"
    );
    assert!(
        live_coarse.try_acquire().is_allowed(),
        "the bench must allow"
    );
    group.finish();
}

fn direct_deny(c: &mut Criterion) {
    let mut group = c.benchmark_group("direct_deny");

    let ours = turnstile::RateLimiter::new(turnstile::Quota::per_hour(1).unwrap());
    assert!(ours.try_acquire().is_allowed());
    group.bench_function("turnstile/precise", |b| {
        b.iter(|| black_box(ours.try_acquire()))
    });
    assert!(ours.try_acquire().is_denied(), "the deny bench must deny");
    // `check` defers the wait, as governor's check does.
    group.bench_function("turnstile-check/precise", |b| {
        b.iter(|| black_box(ours.check().is_ok()))
    });

    let theirs = governor::RateLimiter::direct(governor::Quota::per_hour(nonzero(1)));
    assert!(theirs.check().is_ok());
    group.bench_function("governor/precise", |b| b.iter(|| black_box(theirs.check())));
    assert!(theirs.check().is_err(), "the deny bench must deny");
    // governor's denial defers the wait; a 429 needs it, which takes a second
    // clock reading. turnstile's denial carries the exact wait already.
    let clock = governor::clock::DefaultClock::default();
    group.bench_function("governor/precise+wait", |b| {
        b.iter(|| black_box(theirs.check().map_err(|n| n.wait_time_from(clock.now()))))
    });

    let coarse = turnstile::CoarseClock::with_resolution(COARSE).unwrap();
    let ours =
        turnstile::RateLimiter::with_clock(turnstile::Quota::per_hour(1).unwrap(), coarse.clone());
    assert!(ours.try_acquire().is_allowed());
    group.bench_function("turnstile/coarse", |b| {
        b.iter(|| black_box(ours.try_acquire()))
    });
    assert!(ours.try_acquire().is_denied(), "the deny bench must deny");
    group.bench_function("turnstile-check/coarse", |b| {
        b.iter(|| black_box(ours.check().is_ok()))
    });
    // The same denial on a live bucket (quota changeable while serving).
    let live = turnstile::RateLimiter::from_parts(
        turnstile::LiveTokenBucket::new(turnstile::Quota::per_hour(1).unwrap()).unwrap(),
        coarse,
    );
    assert!(live.try_acquire().is_allowed());
    group.bench_function("turnstile-live/coarse", |b| {
        b.iter(|| black_box(live.try_acquire()))
    });
    assert!(live.try_acquire().is_denied(), "the deny bench must deny");

    // quanta allows one upkeep thread per process; `direct_allow`'s stopped when
    // its clock was dropped, so this one can start.
    let theirs = governor::RateLimiter::direct_with_clock(
        governor::Quota::per_hour(nonzero(1)),
        QuantaUpkeepClock::from_interval(COARSE).unwrap(),
    );
    assert!(theirs.check().is_ok());
    group.bench_function("governor/coarse", |b| b.iter(|| black_box(theirs.check())));
    assert!(theirs.check().is_err(), "the deny bench must deny");

    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = direct_allow, direct_live, direct_deny, clocks
}
criterion_main!(benches);

fn clocks(c: &mut Criterion) {
    use turnstile::Clock;
    let mut group = c.benchmark_group("clock_read");
    let real = turnstile::RealClock::new();
    group.bench_function("turnstile/real", |b| b.iter(|| black_box(real.now())));
    let q = quanta::Clock::new();
    group.bench_function("quanta/raw", |b| b.iter(|| black_box(q.raw())));
    let coarse = turnstile::CoarseClock::new().unwrap();
    group.bench_function("turnstile/coarse", |b| b.iter(|| black_box(coarse.now())));
    group.bench_function("std/instant", |b| {
        b.iter(|| black_box(std::time::Instant::now()))
    });
    group.finish();
}
