//! Rare events through `tracing` (feature `tracing`): a full key bound and a
//! misconfigured layer are logged once, not once a request, and a full sweep
//! logs its summary.
//!
//! One test in a binary of its own, on one thread, with a global subscriber:
//! `tracing` caches each call site's interest process-wide, and a scoped
//! subscriber racing call sites that other tests' threads register could
//! miss events.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{Service, ServiceBuilder, service_fn};
use turnstile::tower::{PeerIp, RateLimitLayer};
use turnstile::{Gate, KeyedLimiter, ManualClock, Quota};

/// Counts events by level.
#[derive(Clone, Default)]
struct Events {
    error: Arc<AtomicU32>,
    warn: Arc<AtomicU32>,
    debug: Arc<AtomicU32>,
}

impl tracing::Subscriber for Events {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let counter = match *event.metadata().level() {
            tracing::Level::ERROR => &self.error,
            tracing::Level::WARN => &self.warn,
            tracing::Level::DEBUG => &self.debug,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn rare_events_are_logged_once_not_once_a_request() {
    let events = Events::default();
    tracing::subscriber::set_global_default(events.clone()).expect("the only subscriber");
    a_full_key_bound_logs_once_a_second(&events);
    a_misconfiguration_is_logged_once_per_layer(&events);
}

fn a_full_key_bound_logs_once_a_second(events: &Events) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64>::builder(Quota::per_minute(3).unwrap())
        .clock(clock.clone())
        .max_keys(2)
        .build()
        .unwrap();
    let _ = limiter.try_acquire(&1);
    let _ = limiter.try_acquire(&2);
    for key in 3..1_003 {
        assert!(limiter.try_acquire(&key).is_key_limit());
    }
    let warned = || events.warn.load(Ordering::Relaxed);
    assert_eq!(warned(), 1, "a thousand refusals, one line");
    clock.advance(Duration::from_millis(999));
    assert!(limiter.try_acquire(&5_000).is_key_limit());
    assert_eq!(warned(), 1, "within the second");
    clock.advance(Duration::from_millis(1));
    assert!(limiter.try_acquire(&5_001).is_key_limit());
    assert_eq!(warned(), 2, "a second later, one more");
    // A full sweep logs its summary at debug level.
    let before = events.debug.load(Ordering::Relaxed);
    clock.advance(Duration::from_secs(60));
    assert_eq!(limiter.sweep(), 2);
    assert_eq!(events.debug.load(Ordering::Relaxed), before + 1);
}

/// A layer that needs the peer address, on requests without it: every one is
/// a 500, and each layer (with its clones) logs it once.
fn a_misconfiguration_is_logged_once_per_layer(events: &Events) {
    let layer = RateLimitLayer::new(
        Gate::new(KeyedLimiter::new(Quota::per_minute(5).unwrap())),
        PeerIp::new(),
    );
    let other = RateLimitLayer::new(
        Gate::new(KeyedLimiter::new(Quota::per_minute(5).unwrap())),
        PeerIp::new(),
    );
    let before = events.error.load(Ordering::Relaxed);
    let mut statuses = Vec::new();
    for layer in [&layer, &layer, &other] {
        let mut service = ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(|_: Request<()>| async {
                Ok::<_, Infallible>(Response::new("served".to_string()))
            }));
        for _ in 0..3 {
            // The layer decides in `call`; a denial's future is ready at once.
            let mut future = std::pin::pin!(service.call(Request::new(())));
            let waker = std::task::Waker::noop();
            match future
                .as_mut()
                .poll(&mut std::task::Context::from_waker(waker))
            {
                std::task::Poll::Ready(Ok(response)) => statuses.push(response.status()),
                other => panic!("a denial is ready at once: {:?}", other.is_ready()),
            }
        }
    }
    assert!(
        statuses
            .iter()
            .all(|&s| s == StatusCode::INTERNAL_SERVER_ERROR),
        "{statuses:?}"
    );
    assert_eq!(
        events.error.load(Ordering::Relaxed) - before,
        2,
        "once for each of the two layers"
    );
    assert_eq!(layer.stats().misconfigured, 6);
    assert_eq!(other.stats().misconfigured, 3);
}
