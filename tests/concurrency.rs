//! The concurrency limiter (bulkhead): permits released on drop, never more than
//! the limit in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use turnstile::{AcquireError, ConcurrencyLimiter, QuotaError};

#[test]
fn permits_are_released_on_drop() {
    let bulkhead = ConcurrencyLimiter::new(3).unwrap();
    let two = bulkhead.try_acquire_n(2).unwrap().expect("2 of 3");
    assert_eq!((bulkhead.in_flight(), bulkhead.available()), (2, 1));
    assert!(bulkhead.try_acquire_n(2).unwrap().is_none(), "only 1 free");
    let one = bulkhead.try_acquire().expect("the last one");
    assert!(bulkhead.try_acquire().is_none());
    assert_eq!(two.permits(), 2);
    drop(two);
    assert_eq!(bulkhead.in_flight(), 1);
    drop(one);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.limit(), 3);
}

#[test]
fn a_panicking_call_still_releases_its_permit() {
    let bulkhead = Arc::new(ConcurrencyLimiter::new(1).unwrap());
    let worker = {
        let bulkhead = bulkhead.clone();
        std::thread::spawn(move || {
            let _permit = bulkhead.try_acquire_owned().expect("free");
            panic!("the call failed");
        })
    };
    assert!(worker.join().is_err());
    assert_eq!(bulkhead.in_flight(), 0);
    assert!(bulkhead.try_acquire().is_some());
}

#[test]
fn bad_limits_and_requests_are_typed_errors() {
    assert_eq!(
        ConcurrencyLimiter::new(0).unwrap_err(),
        QuotaError::ZeroLimit
    );
    let bulkhead = Arc::new(ConcurrencyLimiter::new(2).unwrap());
    assert_eq!(
        bulkhead.try_acquire_n(0).unwrap_err(),
        AcquireError::ZeroPermits
    );
    assert_eq!(
        bulkhead.try_acquire_n_owned(3).unwrap_err(),
        AcquireError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        }
    );
    assert_eq!(bulkhead.in_flight(), 0);
    let owned = bulkhead.try_acquire_n_owned(2).unwrap().expect("both");
    assert_eq!(owned.permits(), 2);
    assert!(bulkhead.try_acquire_owned().is_none());
}

/// Threads on both cores acquire, hold briefly and release; an independent
/// counter of holders never exceeds the limit, and every permit comes back.
#[test]
fn never_more_than_the_limit_in_flight() {
    const LIMIT: u32 = 3;
    let bulkhead = Arc::new(ConcurrencyLimiter::new(LIMIT).unwrap());
    let holders = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (bulkhead, holders, peak) = (bulkhead.clone(), holders.clone(), peak.clone());
            std::thread::spawn(move || {
                let mut ran = 0u32;
                for _ in 0..50_000 {
                    if let Some(permit) = bulkhead.try_acquire() {
                        let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        std::hint::spin_loop();
                        holders.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                        ran += 1;
                    }
                }
                ran
            })
        })
        .collect();
    let ran: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(peak.load(Ordering::SeqCst) <= LIMIT);
    assert!(ran > 0);
    assert_eq!(bulkhead.in_flight(), 0, "every permit came back");
}
