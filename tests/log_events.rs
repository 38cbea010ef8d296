//! Rare events through `tracing` (feature `tracing`): a full key bound and a
//! misconfigured layer are logged once, not once a request, and a full sweep
//! logs its summary; a failing Redis is logged once per degraded period (a
//! `warn` when it begins, an `info` when it ends), against a real
//! `redis-server` that is killed and started again (without one on PATH that
//! part says so and passes, unless `TURNSTILE_REQUIRE_REDIS=1`).
//!
//! One test in a binary of its own, on one thread, with a global subscriber:
//! `tracing` caches each call site's interest process-wide, and a scoped
//! subscriber racing call sites that other tests' threads register could
//! miss events.

#[allow(dead_code)]
#[path = "support/redis_server.rs"]
mod redis_server;

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use tower::{Service, ServiceBuilder, service_fn};
use turnstile::redis::{Deadlines, Guarded, LeasedBuilder, OnFailure, RedisLimiter};
use turnstile::tower::{PeerIp, RateLimitLayer};
use turnstile::{Gate, KeyedLimiter, ManualClock, Quota, TokenBucket};

/// Counts events by level, and keeps the `warn` and `info` lines (level,
/// fields, message).
#[derive(Clone, Default)]
struct Events {
    error: Arc<AtomicU32>,
    warn: Arc<AtomicU32>,
    info: Arc<AtomicU32>,
    debug: Arc<AtomicU32>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Events {
    fn warned(&self) -> u32 {
        self.warn.load(Ordering::Relaxed)
    }
    fn informed(&self) -> u32 {
        self.info.load(Ordering::Relaxed)
    }
    /// The last line kept.
    fn last(&self) -> String {
        self.lines
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    }
}

/// An event's fields as `name=value` pairs.
struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
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
        let level = *event.metadata().level();
        let counter = match level {
            tracing::Level::ERROR => &self.error,
            tracing::Level::WARN => &self.warn,
            tracing::Level::INFO => &self.info,
            tracing::Level::DEBUG => &self.debug,
            _ => return,
        };
        if level == tracing::Level::WARN || level == tracing::Level::INFO {
            let mut line = Line(level.to_string());
            event.record(&mut line);
            self.lines.lock().unwrap().push(line.0);
        }
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
    a_redis_unreachable_at_start_up_is_logged_and_degraded(&events);
    a_redis_outage_logs_once_when_it_begins_and_once_when_it_ends(&events);
    a_flapping_redis_logs_at_most_one_period_a_second(&events);
}

/// A connection whose calls fail and succeed in turn: a flapping Redis.
struct Flapping {
    calls: u32,
}

impl redis::ConnectionLike for Flapping {
    fn req_packed_command(&mut self, _: &[u8]) -> redis::RedisResult<redis::Value> {
        self.calls += 1;
        if self.calls % 2 == 1 {
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into())
        } else {
            Ok(redis::Value::SimpleString("PONG".into()))
        }
    }
    fn req_packed_commands(
        &mut self,
        _: &[u8],
        _: usize,
        _: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported).into())
    }
    fn get_db(&self) -> i64 {
        0
    }
    fn check_connection(&mut self) -> bool {
        true
    }
    fn is_open(&self) -> bool {
        true
    }
}

/// Failures and successes in turn: each failure after a success opens a
/// period (counted), but a period that begins within a second of the last
/// logged one is not logged, nor is its end.
fn a_flapping_redis_logs_at_most_one_period_a_second(events: &Events) {
    let global =
        RedisLimiter::new("flapping", TokenBucket::new(Quota::per_second(10).unwrap())).unwrap();
    let guarded = Guarded::fail_closed(global, Duration::ZERO);
    let mut con = Flapping { calls: 0 };
    let before = (events.warned(), events.informed());
    let start = Instant::now();
    for _ in 0..10 {
        assert!(guarded.ping(&mut con).is_err());
        assert!(guarded.is_degraded());
        assert!(guarded.ping(&mut con).is_ok());
        assert!(!guarded.is_degraded());
    }
    assert!(start.elapsed() < Duration::from_secs(1), "too slow to tell");
    assert_eq!(guarded.stats().degraded_periods, 10);
    assert_eq!(
        (events.warned(), events.informed()),
        (before.0 + 1, before.1 + 1)
    );
    // A second after the last logged one, the next period is logged, with
    // the periods left unlogged since.
    thread::sleep(Duration::from_secs(1).saturating_sub(start.elapsed()) + 10 * MS);
    assert!(guarded.ping(&mut con).is_err());
    assert_eq!(events.warned(), before.0 + 2);
    assert!(
        events.last().contains("unlogged_periods=9"),
        "{}",
        events.last()
    );
    assert!(guarded.ping(&mut con).is_ok());
    assert_eq!(events.informed(), before.1 + 2);
}

/// Nothing listens on port 1 (privileged and unused): the first decision's
/// call fails, and that shows at once.
fn a_redis_unreachable_at_start_up_is_logged_and_degraded(events: &Events) {
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let mut con = Deadlines::default()
        .connect(Duration::from_millis(200))
        .unwrap()
        .blocking(client);
    let global = RedisLimiter::new(
        "unreached",
        TokenBucket::new(Quota::per_second(10).unwrap()),
    )
    .unwrap();
    let guarded = Guarded::fail_closed(global.clone(), Duration::from_secs(60));
    let before = (events.warned(), events.informed());
    assert!(!guarded.is_degraded(), "nothing known before a call");
    for _ in 0..10 {
        assert!(guarded.try_acquire(&mut con, "k").unwrap().is_denied());
    }
    assert!(guarded.is_degraded());
    assert!(guarded.ping(&mut con).is_err());
    assert_eq!(
        (events.warned(), events.informed()),
        (before.0 + 1, before.1)
    );
    let line = events.last();
    assert!(line.starts_with("WARN"), "{line}");
    for field in [
        r#"limiter=turnstile:{unreached}:"#,
        "mode=\"exact\"",
        "policy=\"deny\"",
        "backoff_ms=60000",
        "error=",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    let stats = guarded.stats();
    assert_eq!(
        (stats.degraded, stats.degraded_periods, stats.failures),
        (true, 1, 2),
        "the first call and the ping; the backoff skipped the rest"
    );
    // The same for a leased limiter: its own period, its own line.
    let leased = LeasedBuilder::new(global, 8)
        .unwrap()
        .on_failure(OnFailure::Deny, Duration::from_secs(60))
        .build()
        .unwrap();
    assert!(!leased.is_degraded());
    for _ in 0..10 {
        assert!(leased.try_acquire(&mut con, "k").unwrap().is_denied());
    }
    assert!(leased.is_degraded());
    assert_eq!(events.warned(), before.0 + 2);
    assert!(
        events.last().contains("mode=\"leased\""),
        "{}",
        events.last()
    );
}

/// A real Redis, killed and started again on its port: exact and leased
/// mode each log one `warn` at the first failure, none for the failures
/// during the backoff or the probe after it, and one `info` at the first
/// success, with how long it lasted and what the policy decided meanwhile.
fn a_redis_outage_logs_once_when_it_begins_and_once_when_it_ends(events: &Events) {
    let Some(server) = redis_server::server("log_events") else {
        return;
    };
    let port = server.port();
    let mut con = server.connection();
    let global = RedisLimiter::new(
        "outage",
        TokenBucket::new(Quota::per_second(1_000).unwrap()),
    )
    .unwrap();
    let backoff = Duration::from_millis(300);
    let local = KeyedLimiter::new(Quota::per_second(100).unwrap());
    let guarded = Guarded::new(global.clone(), OnFailure::Local(local), backoff);
    let leased = LeasedBuilder::new(global, 4)
        .unwrap()
        .on_failure(OnFailure::Deny, backoff)
        .build()
        .unwrap();
    assert!(guarded.ping(&mut con).is_ok());
    assert!(leased.ping(&mut con).is_ok());
    assert!(guarded.try_acquire(&mut con, "k").unwrap().is_allowed());
    assert!(leased.try_acquire(&mut con, "k").unwrap().is_allowed());
    let before = (events.warned(), events.informed());

    drop(server); // killed, by its process id
    let failed_at = Instant::now();
    // Each decided by the failure policy: the local share, which starts
    // empty in each degraded period (the failover rule), so it answers
    // without admitting much; what matters here is the one line.
    for _ in 0..50 {
        let _ = guarded.try_acquire(&mut con, "k").unwrap();
        let _ = leased.try_acquire(&mut con, "other");
    }
    assert!(guarded.stats().fallbacks >= 50, "{:?}", guarded.stats());
    assert!(guarded.is_degraded() && leased.is_degraded());
    assert_eq!(
        events.warned(),
        before.0 + 2,
        "one line each, not one a request"
    );
    // After the backoff the probes fail too: the same period, no new line.
    thread::sleep((backoff + 50 * MS).saturating_sub(failed_at.elapsed()));
    let _ = guarded.try_acquire(&mut con, "k").unwrap();
    let _ = leased.try_acquire(&mut con, "other");
    assert!(guarded.ping(&mut con).is_err());
    assert!(leased.ping(&mut con).is_err());
    assert_eq!(events.warned(), before.0 + 2);
    assert_eq!(events.informed(), before.1);
    assert_eq!(guarded.stats().degraded_periods, 1);
    assert_eq!(leased.stats().degraded_periods, 1);

    let _server = redis_server::spawn_on(port).expect("redis-server restarts on its port");
    // The first success ends the period: a ping (a readiness probe) or a
    // decision's probe.
    let rtt = guarded.ping(&mut con).expect("Redis is back");
    assert!(rtt < Duration::from_secs(2), "{rtt:?}");
    assert!(!guarded.is_degraded());
    assert_eq!(events.informed(), before.1 + 1);
    let line = events.last();
    assert!(line.starts_with("INFO"), "{line}");
    let fallbacks = guarded.stats().fallbacks;
    for field in [
        r#"limiter=turnstile:{outage}:"#,
        "mode=\"exact\"",
        "degraded_ms=",
        "failures=",
        &format!("fallbacks={fallbacks}"),
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    thread::sleep(backoff + 50 * MS);
    let _ = leased.try_acquire(&mut con, "other");
    assert!(!leased.is_degraded());
    assert_eq!(events.informed(), before.1 + 2);
    assert!(
        events.last().contains("mode=\"leased\""),
        "{}",
        events.last()
    );
    // Healthy again: calls log nothing.
    for _ in 0..10 {
        let _ = guarded.try_acquire(&mut con, "k");
        let _ = leased.try_acquire(&mut con, "other");
    }
    assert_eq!(
        (events.warned(), events.informed()),
        (before.0 + 2, before.1 + 2)
    );
}

const MS: Duration = Duration::from_millis(1);

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
