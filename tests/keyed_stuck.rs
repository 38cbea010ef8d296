//! A reader stuck while pinned holds back only what it must: its own
//! limiter's rebuild (decisions on that shard go on under its lock, and new
//! keys past 7/8 of the table are refused after a bounded wait), never
//! another limiter's grace periods.
//!
//! The reader is stuck inside a key's `Eq`, which runs pinned during a
//! lookup; each part of the test runs on a thread joined with a timeout, so
//! that a hang (what the code before per-limiter grace periods and rebuilds
//! that wait for no reader did here) fails the test instead of stalling it.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use turnstile::{KeyedDecision, KeyedLimiter, ManualClock, Quota, TokenBucket};

/// The key whose comparison, on the stuck thread, blocks.
const STUCK: u64 = 0;

static ENTERED: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);

thread_local! {
    static IS_STUCK_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[derive(Clone, Debug)]
struct Key(u64);

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        if IS_STUCK_THREAD.with(std::cell::Cell::get) && (self.0 == STUCK || other.0 == STUCK) {
            ENTERED.store(true, Ordering::SeqCst);
            let start = Instant::now();
            while !RELEASE.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(120) {
                thread::sleep(Duration::from_millis(1));
            }
        }
        self.0 == other.0
    }
}

impl Eq for Key {}

type Limiter = KeyedLimiter<Key, TokenBucket, ManualClock>;

fn limiter(max_keys: usize) -> (Arc<Limiter>, ManualClock) {
    let clock = ManualClock::new();
    let limiter =
        KeyedLimiter::<Key>::builder(Quota::new(1_000, 1, Duration::from_secs(1)).unwrap())
            .clock(clock.clone())
            .shards(1)
            .max_keys(max_keys)
            .build()
            .unwrap();
    (Arc::new(limiter), clock)
}

/// Run `f` on a thread of its own; fail if it has not returned in `limit`.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, result) = mpsc::channel();
    thread::spawn(move || {
        let _ = done.send(f());
    });
    result.recv_timeout(limit).unwrap_or_else(|_| {
        panic!("{what} did not finish in {limit:?}: a stuck reader held it back")
    })
}

#[test]
fn a_reader_stuck_while_pinned_holds_back_only_its_own_limiters_rebuild() {
    let (a, _a_clock) = limiter(10_000);
    // The stuck key and four more: 5 of the smallest table's 8 slots.
    for id in 0..5 {
        assert!(a.try_acquire(&Key(id)).is_allowed());
    }
    let stuck = {
        let a = Arc::clone(&a);
        thread::spawn(move || {
            IS_STUCK_THREAD.with(|s| s.set(true));
            a.try_acquire(&Key(STUCK))
        })
    };
    let start = Instant::now();
    while !ENTERED.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the reader never got stuck"
        );
        thread::sleep(Duration::from_millis(1));
    }

    // Another limiter grows, sweeps, shrinks and frees while the reader is
    // pinned in `a`: its grace periods do not wait for it.
    within(
        Duration::from_secs(60),
        "another limiter's rebuilds and frees",
        || {
            let (b, clock) = limiter(5_000);
            for id in 1..=5_000 {
                assert!(b.try_acquire(&Key(id)).is_allowed(), "key {id}");
            }
            clock.advance(Duration::from_secs(10));
            assert_eq!(b.sweep(), 5_000);
            b.sweep(); // frees what the first unlinked
            assert_eq!(b.len(), 0);
            // Limbo was freed: the whole bound is there for new keys at once.
            for id in 10_001..=15_000 {
                assert!(b.try_acquire(&Key(id)).is_allowed(), "key {id}");
            }
            assert!(b.try_acquire(&Key(20_000)).is_key_limit());
        },
    );

    // In `a`, the sixth key starts a rebuild that must wait for the stuck
    // reader: decisions on held keys go on (under the shard's lock), new
    // keys fill the closed table to 7/8 and are then refused, each after a
    // bounded wait.
    let a2 = Arc::clone(&a);
    let (admitted, refused) = within(
        Duration::from_secs(60),
        "the stuck limiter's other work",
        move || {
            for id in 1..5 {
                assert_eq!(
                    a2.try_acquire(&Key(id)),
                    KeyedDecision::Allowed { remaining: 998 },
                    "key {id}"
                );
            }
            let (mut admitted, mut refused) = (0, 0);
            for id in 100..110 {
                match a2.try_acquire(&Key(id)) {
                    KeyedDecision::Allowed { .. } => admitted += 1,
                    KeyedDecision::KeyLimit { .. } => refused += 1,
                    other => panic!("key {id}: {other:?}"),
                }
            }
            for id in 1..5 {
                assert_eq!(
                    a2.try_acquire(&Key(id)),
                    KeyedDecision::Allowed { remaining: 997 },
                    "key {id}, while the rebuild waits"
                );
            }
            (admitted, refused)
        },
    );
    assert_eq!(
        admitted, 2,
        "new keys into the closed table up to 7/8 of 8 slots"
    );
    assert_eq!(refused, 8, "new keys past 7/8 while the rebuild waits");

    // The reader moves on; the next writer finishes the rebuild.
    RELEASE.store(true, Ordering::SeqCst);
    assert_eq!(
        stuck.join().unwrap(),
        KeyedDecision::Allowed { remaining: 998 }
    );
    let a3 = Arc::clone(&a);
    within(
        Duration::from_secs(60),
        "new keys once the reader is gone",
        move || {
            for id in 200..300 {
                assert!(a3.try_acquire(&Key(id)).is_allowed(), "key {id}");
            }
        },
    );
    assert_eq!(a.len(), 5 + 2 + 100);
}
