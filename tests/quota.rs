//! Every invalid quota is refused at construction with a typed error that names
//! the value and the allowed range.

use std::time::Duration;

use turnstile::{Quota, QuotaError};

#[test]
fn zero_capacity_is_refused() {
    let err = Quota::new(0, 1, Duration::from_secs(1)).unwrap_err();
    assert_eq!(err, QuotaError::ZeroCapacity);
    assert!(
        err.to_string().contains("between 1 and 4294967295"),
        "{err}"
    );
    assert_eq!(
        Quota::per_second(10).unwrap().burst(0),
        Err(QuotaError::ZeroCapacity)
    );
}

#[test]
fn zero_amount_is_refused() {
    let err = Quota::new(1, 0, Duration::from_secs(1)).unwrap_err();
    assert_eq!(err, QuotaError::ZeroAmount);
    assert!(
        err.to_string().contains("between 1 and 4294967295"),
        "{err}"
    );
}

#[test]
fn zero_period_is_refused() {
    for err in [
        Quota::new(1, 1, Duration::ZERO).unwrap_err(),
        Quota::with_period(Duration::ZERO).unwrap_err(),
    ] {
        assert_eq!(err, QuotaError::ZeroPeriod);
        assert!(err.to_string().contains("at least 1 microsecond"), "{err}");
    }
}

#[test]
fn zero_rates_are_refused() {
    assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroRate));
    assert_eq!(Quota::per_minute(0), Err(QuotaError::ZeroRate));
    assert_eq!(Quota::per_hour(0), Err(QuotaError::ZeroRate));
    assert_eq!(Quota::per_day(0), Err(QuotaError::ZeroRate));
}

/// The message is true of every constructor that refuses a zero rate: the
/// `u32` ones go up to 4,294,967,295 per interval, `per_second_with_burst`
/// (a `u64`) up to about 6.56 × 10^10 per second.
#[test]
fn a_zero_rate_is_told_each_constructors_range() {
    let message = Quota::per_second_with_burst(0, 5).unwrap_err().to_string();
    assert_eq!(message, Quota::per_second(0).unwrap_err().to_string());
    assert!(message.contains("at least 1 per interval"), "{message}");
    assert!(!message.contains("between 1 and 4294967295"), "{message}");
    assert!(
        message.contains("6.56 × 10^10 per second for Quota::per_second_with_burst"),
        "{message}"
    );
    assert!(
        message.contains("4294967295 for Quota::per_second, per_minute, per_hour and per_day"),
        "{message}"
    );
}

#[test]
fn sub_microsecond_periods_are_refused_with_a_suggestion() {
    for (nanos, suggestion) in [(500, "1µs"), (1_500, "2µs"), (333_333_333, "333.334ms")] {
        let period = Duration::from_nanos(nanos);
        let err = Quota::new(1, 1, period).unwrap_err();
        assert_eq!(
            err,
            QuotaError::PeriodResolution {
                period,
                unit: Duration::from_micros(1)
            }
        );
        let text = err.to_string();
        assert!(text.contains(&format!("{period:?}")), "{text}");
        assert!(text.contains(suggestion), "{text}");
    }
    // Whole microseconds are fine.
    assert!(Quota::new(1, 1, Duration::from_micros(1)).is_ok());
}

#[test]
fn large_capacities_need_periods_in_their_coarser_unit() {
    // A million tokens take 20 bits, so the unit is 2^4 = 16 µs.
    let period = Duration::from_micros(1_000);
    let err = Quota::new(1_000_000, 1, period).unwrap_err();
    let unit = Duration::from_micros(16);
    assert_eq!(err, QuotaError::PeriodResolution { period, unit });
    let text = err.to_string();
    assert!(text.contains("16µs") && text.contains("1.008ms"), "{text}");
    let q = Quota::new(1_000_000, 16, Duration::from_micros(1_008)).unwrap();
    assert_eq!(q.time_unit(), unit);

    // Raising the burst past 65,535 re-checks the period against the new unit
    // (the burst is named: see `a_burst_whose_unit_does_not_divide_the_period_names_the_burst`).
    let err = Quota::per_second(7).unwrap().burst(1_000_000).unwrap_err();
    assert!(matches!(err, QuotaError::BurstResolution { .. }), "{err:?}");
    assert!(Quota::per_second(100).unwrap().burst(1_000_000).is_ok()); // 10 ms = 625 units
}

/// `burst(u32::MAX)` on a per-second quota: the period (10 ms) was valid, the
/// capacity's 65.536 ms time unit does not divide it, so the error names the
/// burst and the largest one the period allows, and no quota is built.
#[test]
fn a_burst_whose_unit_does_not_divide_the_period_names_the_burst() {
    let per_second = Quota::per_second(100).unwrap();
    let result = per_second.burst(u32::MAX);
    // 10 ms = 2^4 * 625 µs: capacities of up to 20 bits (16 µs units) fit.
    assert_eq!(
        result,
        Err(QuotaError::BurstResolution {
            capacity: u32::MAX,
            unit: Duration::from_micros(1 << 16),
            period: Duration::from_millis(10),
            max: (1 << 20) - 1,
        })
    );
    let text = result.unwrap_err().to_string();
    assert!(
        text.contains("burst (capacity) of 4294967295")
            && text.contains("between 1 and 1048575")
            && text.contains("65.536ms"),
        "{text}"
    );
    // The largest burst named is accepted, one more is not.
    assert_eq!(
        per_second.burst((1 << 20) - 1).unwrap().capacity(),
        (1 << 20) - 1
    );
    assert!(matches!(
        per_second.burst(1 << 20),
        Err(QuotaError::BurstResolution { max: 1_048_575, .. })
    ));
    // With a period of whole 65.536 ms units, u32::MAX is judged on its fill
    // time alone, which names the capacity too.
    let coarse = Quota::new(1, 1, Duration::from_micros(1 << 16)).unwrap();
    assert!(matches!(
        coarse.burst(u32::MAX),
        Err(QuotaError::FillTimeTooLong {
            capacity: u32::MAX,
            ..
        })
    ));
}

#[test]
fn fill_times_the_word_cannot_measure_are_refused() {
    // u32::MAX tokens: 32 bits of time in units of 65,536 µs, so half the span is
    // 2^31 units = 2^47 µs (~4.46 years).
    let unit = Duration::from_micros(1 << 16);
    let max = Duration::from_micros(1 << 47);
    let err = Quota::new(u32::MAX, 1, unit).unwrap_err();
    assert_eq!(
        err,
        QuotaError::FillTimeTooLong {
            capacity: u32::MAX,
            fill_time: unit * u32::MAX,
            max,
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("4294967295 tokens") && text.contains(&format!("{max:?}")),
        "{text}"
    );

    // Exactly at the limit is accepted: 2^31 periods of one unit.
    let at_limit = Quota::new(u32::MAX, 2, unit).unwrap();
    assert_eq!(at_limit.fill_time(), max);
    assert_eq!(at_limit.max_fill_time(), max);

    // A burst can push a valid refill past the limit.
    let one_per_2_20_micros = Quota::new(1, 1, Duration::from_micros(1 << 20)).unwrap();
    assert!(matches!(
        one_per_2_20_micros.burst(1 << 30),
        Err(QuotaError::FillTimeTooLong { .. })
    ));
}

#[test]
fn absurd_periods_are_refused_not_panicked_on() {
    for period in [
        Duration::from_secs(u64::MAX),
        Duration::from_secs(u64::MAX / 2),
        Duration::from_secs(1 << 62),
    ] {
        let err = Quota::new(1, 1, period).unwrap_err();
        assert!(
            matches!(err, QuotaError::FillTimeTooLong { .. }),
            "{period:?}: {err:?}"
        );
        assert!(!err.to_string().is_empty());
    }
    // Duration::MAX has a sub-microsecond part as well: the fill time is still
    // the fault, reported as asked, not a resolution error about a period
    // clamped to u64 microseconds.
    let err = Quota::new(1, 1, Duration::MAX).unwrap_err();
    assert_eq!(
        err,
        QuotaError::FillTimeTooLong {
            capacity: 1,
            fill_time: Duration::MAX,
            max: Quota::per_second(1).unwrap().max_fill_time(),
        }
    );
    assert!(!err.to_string().is_empty());
}

#[test]
fn a_period_beyond_u64_microseconds_is_a_fill_time_error_for_every_capacity() {
    // Capacities whose time unit is coarser than 1 µs used to get a resolution
    // error naming a period that was never asked for (the clamped one) and
    // suggesting another that was no valid period either.
    for capacity in [1, 65_535, 65_536, 1 << 20, u32::MAX] {
        let period = Duration::from_secs(u64::MAX);
        let err = Quota::new(capacity, 1, period).unwrap_err();
        let QuotaError::FillTimeTooLong {
            capacity: c,
            fill_time,
            max,
        } = err
        else {
            panic!("capacity {capacity}: {err:?}");
        };
        assert_eq!(c, capacity);
        assert!(fill_time >= period, "{fill_time:?}");
        assert_eq!(max, Quota::per_second(capacity).unwrap().max_fill_time());
    }
}

#[test]
fn constructors_read_like_the_domain() {
    let q = Quota::per_second(100).unwrap().burst(20).unwrap();
    assert_eq!(
        (q.capacity(), q.amount(), q.period()),
        (20, 1, Duration::from_millis(10))
    );

    let q = Quota::per_minute(60).unwrap();
    assert_eq!(
        (q.capacity(), q.amount(), q.period()),
        (60, 1, Duration::from_secs(1))
    );

    let q = Quota::per_hour(1).unwrap();
    assert_eq!(
        (q.capacity(), q.amount(), q.period()),
        (1, 1, Duration::from_secs(3_600))
    );

    let q = Quota::with_period(Duration::from_millis(250)).unwrap();
    assert_eq!(
        (q.capacity(), q.amount(), q.period()),
        (1, 1, Duration::from_millis(250))
    );
    assert_eq!(q.fill_time(), Duration::from_millis(250));

    // Rates that do not divide a second are rounded to never exceed the rate.
    let q = Quota::per_second(3).unwrap();
    assert_eq!(
        (q.amount(), q.period()),
        (1, Duration::from_micros(333_334))
    );
    let q = Quota::per_second(u32::MAX).unwrap();
    assert_eq!(q.time_unit(), Duration::from_micros(65_536));
    assert!(q.amount() > 1 && q.period() == q.time_unit(), "{q:?}");
}

#[test]
fn max_fill_time_is_half_the_time_field_and_never_under_4_46_years() {
    let cases = [
        (1, 1u64 << 62),
        (1_023, 1 << 53),
        (65_535, 1 << 47),
        (1 << 20, 1 << 47),
        (u32::MAX, 1 << 47),
    ];
    for (capacity, half) in cases {
        let q = Quota::new(capacity, capacity, Duration::from_micros(1 << 22)).unwrap();
        assert_eq!(
            q.max_fill_time(),
            Duration::from_micros(half),
            "capacity {capacity}"
        );
    }
}

// Large rates: `Quota::per_second_with_burst`, up to 10^10 per second and
// bursts up to `u32::MAX`.

/// The quota's refill as `(amount · 10^6, period in µs)`: its rate per
/// second is the first over the second, compared with a rate `r` as
/// `first` against `r · second`.
fn rate_of(q: &Quota) -> (u128, u128) {
    (u128::from(q.amount()) * 1_000_000, q.period().as_micros())
}

#[test]
fn ten_billion_per_second_is_exact_at_every_burst_that_can_keep_it() {
    let rate = 10_000_000_000u64;
    // From the smallest burst that holds a microsecond's tokens to the largest.
    for burst in [
        10_000,
        65_535,
        65_536,
        1 << 20,
        (1 << 24) - 1,
        1 << 30,
        u32::MAX - 1,
        u32::MAX,
    ] {
        let q = Quota::per_second_with_burst(rate, burst).unwrap();
        assert_eq!(q.capacity(), burst);
        let (tokens, micros) = rate_of(&q);
        // amount / period = rate, exactly.
        assert_eq!(tokens, u128::from(rate) * micros, "burst {burst}: {q:?}");
        assert!(
            u64::from(q.amount()) <= u64::from(burst),
            "a refill fits: {q:?}"
        );
        assert_eq!(q.period().as_micros() % q.time_unit().as_micros(), 0);
    }
    let q = Quota::per_second_with_burst(rate, u32::MAX).unwrap();
    assert_eq!(q.amount(), 655_360_000);
    assert_eq!(q.period(), Duration::from_micros(65_536));
}

#[test]
fn a_burst_too_small_for_the_rate_is_refused_with_the_smallest_that_works() {
    for rate in [
        10_000_000_000u64,
        1_000_000_000,
        999_999_937,
        4_294_967_296,
        65_000_000_000,
    ] {
        let Err(QuotaError::BurstBelowRate {
            min_burst, burst, ..
        }) = Quota::per_second_with_burst(rate, 1)
        else {
            panic!("{rate}/s kept by a burst of 1");
        };
        assert_eq!(burst, 1);
        let min = u32::try_from(min_burst).expect("a burst can keep it");
        let kept = Quota::per_second_with_burst(rate, min).unwrap();
        // Never faster than asked, within 0.1%.
        let (tokens, micros) = rate_of(&kept);
        let asked = u128::from(rate) * micros;
        assert!(tokens <= asked && tokens * 1_000 >= asked * 999, "{kept:?}");
        let below = Quota::per_second_with_burst(rate, min - 1).unwrap_err();
        assert!(
            matches!(below, QuotaError::BurstBelowRate { .. }),
            "{rate}: {below}"
        );
        assert!(
            below.to_string().contains(&format!("keeps it is {min}")),
            "{below}"
        );
    }
}

#[test]
fn a_rate_no_burst_can_keep_is_refused_and_says_so() {
    // At `u32::MAX` a unit is 65.536 ms: at most u32::MAX tokens per unit,
    // which is within 0.1% of rates up to a thousandth above it.
    let max_rate = u64::from(u32::MAX) * 1_000_000 / 65_536;
    assert!(Quota::per_second_with_burst(max_rate, u32::MAX).is_ok());
    assert!(Quota::per_second_with_burst(max_rate + max_rate / 2_000, u32::MAX).is_ok());
    for rate in [max_rate + max_rate / 500, 100_000_000_000, u64::MAX] {
        let err = Quota::per_second_with_burst(rate, u32::MAX).unwrap_err();
        let QuotaError::BurstBelowRate { min_burst, .. } = err else {
            panic!("{rate}: {err:?}");
        };
        assert!(min_burst > u64::from(u32::MAX), "{rate}: {min_burst}");
        assert!(err.to_string().contains("no burst can keep"), "{err}");
    }
}

#[test]
fn large_rate_refills_round_down_within_a_thousandth_where_they_are_not_exact() {
    for (rate, burst) in [
        (999_999_937u64, 1_000u32),
        (999_999_937, 65_535),
        (3_333_333_333, 1 << 22),
        (7_777_777_777, u32::MAX),
        (12_345_678_901, 1 << 28),
        (1, 1),
        (3, 3),
    ] {
        let q = Quota::per_second_with_burst(rate, burst).unwrap();
        let (tokens, micros) = rate_of(&q);
        let asked = u128::from(rate) * micros;
        // amount / period against rate, cross-multiplied.
        assert!(tokens <= asked, "too fast: {q:?}");
        assert!(tokens * 1_000 >= asked * 999, "too slow: {rate}/s, {q:?}");
        assert!(u64::from(q.amount()) <= u64::from(burst), "{q:?}");
    }
    // 999,999,937 per second in a bucket of 1,000: 999 a microsecond.
    let q = Quota::per_second_with_burst(999_999_937, 1_000).unwrap();
    assert_eq!((q.amount(), q.period()), (999, Duration::from_micros(1)));
}

/// `per_second_with_burst` finds the shortest refill that fits the bucket
/// and keeps the rate (never above it, within 0.1%), checked against a
/// search of every batch: for a burst below 65,536 (a 1 µs unit) every
/// refill that keeps the rate, `a` tokens every `p` µs, has one at least as
/// short among `a` tokens every `ceil(a / rate)`, for `a` up to the burst.
/// 5,001 per second in a bucket of 5 is one token every 200 µs (0.02% slow);
/// it was refused, naming 6 as the smallest burst.
#[test]
fn small_bursts_get_the_shortest_refill_that_keeps_the_rate() {
    let q = Quota::per_second_with_burst(5_001, 5).unwrap();
    assert_eq!((q.amount(), q.period()), (1, Duration::from_micros(200)));
    let q = Quota::per_second_with_burst(5_001, 1).unwrap();
    assert_eq!((q.amount(), q.period()), (1, Duration::from_micros(200)));
    let rates = (1..=20_000u64)
        .step_by(97)
        .chain(4_990..=5_010)
        .chain(65_530..=65_540)
        .chain([99_999, 123_457, 299_999, 1_000_003]);
    for rate in rates {
        for burst in [1u32, 2, 5, 64, 1_000] {
            let shortest = (1..=u64::from(burst))
                .map(|a| (a, (a * 1_000_000).div_ceil(rate)))
                .filter(|&(a, p)| {
                    let (tokens, asked) =
                        (u128::from(a) * 1_000_000, u128::from(rate) * u128::from(p));
                    tokens <= asked && tokens * 1_000 >= asked * 999
                })
                .map(|(_, p)| p)
                .min();
            match (shortest, Quota::per_second_with_burst(rate, burst)) {
                (Some(p), Ok(q)) => {
                    assert_eq!(
                        q.period(),
                        Duration::from_micros(p),
                        "{rate}/s, burst {burst}: {q:?}"
                    );
                    let (tokens, micros) = rate_of(&q);
                    let asked = u128::from(rate) * micros;
                    assert!(tokens <= asked && tokens * 1_000 >= asked * 999, "{q:?}");
                    assert!(q.amount() <= burst, "{q:?}");
                }
                (None, Err(QuotaError::BurstBelowRate { min_burst, .. })) => {
                    assert!(min_burst > u64::from(burst), "{rate}/s: {min_burst}");
                    let min = u32::try_from(min_burst).unwrap();
                    assert!(
                        Quota::per_second_with_burst(rate, min).is_ok(),
                        "{rate}/s, {min}"
                    );
                }
                (shortest, got) => {
                    panic!("{rate}/s, burst {burst}: shortest {shortest:?}, got {got:?}")
                }
            }
        }
    }
}

#[test]
fn rates_that_are_whole_tokens_per_millisecond_are_exact() {
    for (rate, burst) in [
        (1_000u64, 1_000u32),
        (1_000_000, 64 * 1024),
        (1_000_000_000, 1 << 20),
        (5_000_000_000, 1 << 24),
        (8_000, 1),
    ] {
        let q = Quota::per_second_with_burst(rate, burst);
        let Ok(q) = q else {
            // A burst of 1 holds one token: 8,000/s needs a refill of 8 a ms.
            assert_eq!(burst, 1, "{rate}/{burst}: {q:?}");
            continue;
        };
        let (tokens, micros) = rate_of(&q);
        assert_eq!(tokens, u128::from(rate) * micros, "{rate}/{burst}: {q:?}");
        assert!(
            q.period() <= Duration::from_millis(1).max(q.time_unit()),
            "{q:?}"
        );
    }
}

#[test]
fn zero_rate_and_zero_burst_are_refused_for_large_rates_too() {
    assert_eq!(
        Quota::per_second_with_burst(0, 10),
        Err(QuotaError::ZeroRate)
    );
    assert_eq!(
        Quota::per_second_with_burst(10, 0),
        Err(QuotaError::ZeroCapacity)
    );
    // A large burst at a low rate takes longer to fill than the word measures.
    assert!(matches!(
        Quota::per_second_with_burst(1, u32::MAX),
        Err(QuotaError::FillTimeTooLong { .. })
    ));
}

#[test]
fn a_ten_gigabyte_a_second_bucket_refills_exactly_its_rate() {
    use turnstile::{ManualClock, RateLimiter};
    let clock = ManualClock::new();
    let quota = Quota::per_second_with_burst(10_000_000_000, u32::MAX).unwrap();
    let limiter = RateLimiter::with_clock(quota, clock.clone());
    assert!(limiter.try_acquire_n(u32::MAX).unwrap().is_allowed());
    assert_eq!(limiter.remaining(), 0);
    // Six time units of 65.536 ms: 10^10 bytes a second for 393.216 ms.
    let unit = quota.time_unit();
    assert_eq!(unit, Duration::from_micros(65_536));
    clock.advance(unit * 6);
    let expected = 10_000_000_000u64 * 393_216 / 1_000_000;
    assert_eq!(u64::from(limiter.remaining()), expected);
    // The wait for a whole bucket from here is exact: the units that bring
    // the rest.
    let missing = u64::from(u32::MAX) - expected;
    let units = missing.div_ceil(655_360_000);
    let wait = limiter
        .try_acquire_n(u32::MAX)
        .unwrap()
        .retry_after()
        .expect("not full yet");
    assert_eq!(wait.duration(), unit * u32::try_from(units).unwrap());
}

/// A refill larger than the bucket is refused: the token bucket would drop
/// what it cannot hold and run below the rate asked for, while GCRA of the
/// same quota kept it. A high rate refills in batches, so a small burst is
/// asked with `per_second_with_burst`, which picks a refill that fits.
#[test]
fn a_refill_larger_than_the_bucket_is_refused() {
    assert_eq!(
        Quota::new(1, 10, Duration::from_secs(1)),
        Err(QuotaError::AmountAboveCapacity {
            capacity: 1,
            amount: 10,
            period: Duration::from_secs(1)
        })
    );
    let fast = Quota::per_second(1_000_000).unwrap();
    assert_eq!(
        (fast.amount(), fast.period()),
        (16, Duration::from_micros(16))
    );
    let err = fast.burst(10).unwrap_err();
    assert!(matches!(
        err,
        QuotaError::AmountAboveCapacity {
            capacity: 10,
            amount: 16,
            ..
        }
    ));
    assert!(err.to_string().contains("per_second_with_burst"), "{err}");
    let small = Quota::per_second_with_burst(1_000_000, 10).unwrap();
    assert_eq!(
        (small.capacity(), small.amount(), small.period()),
        (10, 1, Duration::from_micros(1))
    );
    // A refill as large as the bucket is a fixed window's: accepted.
    assert!(Quota::new(10, 10, Duration::from_secs(1)).is_ok());
}

#[test]
fn a_burst_too_large_for_its_time_unit_names_the_bursts_that_work() {
    // 5 × 10^10 per second: 50,000 tokens a microsecond. A burst of 10^8
    // counts time in units of 2^11 µs, whose refill overflows it; the
    // bursts of the microsecond unit keep the rate.
    let err = Quota::per_second_with_burst(50_000_000_000, 100_000_000).unwrap_err();
    let QuotaError::BurstBelowRate { min_burst, .. } = err else {
        panic!("{err:?}");
    };
    assert!(min_burst < 65_535, "{min_burst}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("between {min_burst} and 65535")),
        "{message}"
    );
    assert!(!message.contains("smallest burst"), "{message}");
    for burst in [min_burst as u32, 60_000, 65_535] {
        assert!(
            Quota::per_second_with_burst(50_000_000_000, burst).is_ok(),
            "{burst}"
        );
    }
}

#[test]
fn quota_errors_read_as_one_sentence_without_runs_of_spaces() {
    let errors = [
        Quota::new(5, 10, Duration::from_millis(1)).unwrap_err(),
        Quota::per_second_with_burst(50_000_000_000, 100_000_000).unwrap_err(),
        Quota::per_second_with_burst(10_000_000_000, 1).unwrap_err(),
        Quota::per_second_with_burst(u64::MAX, u32::MAX).unwrap_err(),
        turnstile::SlidingWindow::new(u32::MAX, Duration::from_secs(1)).unwrap_err(),
    ];
    for err in errors {
        let message = err.to_string();
        assert!(!message.contains("  "), "{message:?}");
    }
}
