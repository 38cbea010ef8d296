//! Hot reload over real gRPC: a file changed while a load of concurrent
//! requests runs, a broken file, SIGHUP.

#![allow(missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{descriptor, ok, overall_ok, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::sync::oneshot;
use tonic::transport::Channel;
use turnstile::ManualClock;
use turnstile_server::backend::InProcess;
use turnstile_server::clock::ServiceClock;
use turnstile_server::reload::{DEFAULT_MAX_RETIRED, Reloader};
use turnstile_server::server::{DEFAULT_MAX_MESSAGE, serve};
use turnstile_server::service::{Bounds, RateLimitService};

const BEFORE: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1000000, algorithm: token_bucket }
  - key: kept
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: bucket
    rate_limit: { unit: minute, requests_per_unit: 10, algorithm: token_bucket }
  - key: window
    rate_limit: { unit: minute, requests_per_unit: 10 }
";

const AFTER: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1000000, algorithm: token_bucket }
  - key: kept
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: bucket
    rate_limit: { unit: minute, requests_per_unit: 20, algorithm: token_bucket }
  - key: window
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: added
    rate_limit: { unit: minute, requests_per_unit: 3 }
";

const BROKEN: &str = "\
domain: api
descriptors:
  - key: kept
    rate_limit: { unit: minute, requests_per_unit: lots }
";

/// A fresh directory under the target's temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("turnstile-reload-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Replace `dir/api.yaml` in one rename, as a deployment tool would.
fn write(dir: &Path, text: &str) {
    let staged = dir.join(".api.yaml.tmp");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, dir.join("api.yaml")).unwrap();
}

struct Served {
    client: RateLimitServiceClient<Channel>,
    service: Arc<RateLimitService>,
    reloader: Arc<Reloader>,
    stop: oneshot::Sender<()>,
    clock: ManualClock,
}

async fn serve_dir(dir: &Path, poll: Duration) -> Served {
    serve_dir_retiring(dir, poll, DEFAULT_MAX_RETIRED).await
}

/// [`serve_dir`], keeping the state of at most `max_retired` limits that
/// loads dropped.
async fn serve_dir_retiring(dir: &Path, poll: Duration, max_retired: usize) -> Served {
    let clock = ManualClock::new();
    let backend = InProcess::new(ServiceClock::manual(clock.clone()), 10_000);
    let reloader = Arc::new(Reloader::new(dir, Arc::new(backend)).with_max_retired(max_retired));
    let config = reloader.load().expect("a valid configuration");
    let service = Arc::new(RateLimitService::new(config, Bounds::default(), false));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let (watch_stop, watch_stopped) = oneshot::channel::<()>();
    tokio::spawn(
        Arc::clone(&reloader).watch(Arc::clone(&service), poll, async move {
            let _ = watch_stopped.await;
        }),
    );
    tokio::spawn(serve(
        Arc::clone(&service),
        grpc,
        None,
        DEFAULT_MAX_MESSAGE,
        async move {
            let _ = stopped.await;
            let _ = watch_stop.send(());
        },
    ));
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    Served {
        client,
        service,
        reloader,
        stop,
        clock,
    }
}

async fn one(client: &mut RateLimitServiceClient<Channel>, key: &str) -> RateLimitResponse {
    let r: RateLimitRequest = request("api", vec![descriptor(&[(key, "x")])]);
    client.should_rate_limit(r).await.unwrap().into_inner()
}

/// Wait until the service has counted `succeeded` reloads and `failed`
/// errors (at most 10 s).
async fn wait_reloads(service: &RateLimitService, succeeded: u64, failed: u64) {
    let start = Instant::now();
    while service.metrics().reloads() != (succeeded, failed) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "reloads {:?}, waiting for ({succeeded}, {failed})",
            service.metrics().reloads()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_under_load_reloads_keeping_state() {
    let dir = temp_dir("load");
    write(&dir, BEFORE);
    let mut rls = serve_dir(&dir, Duration::from_millis(50)).await;
    for _ in 0..4 {
        for key in ["kept", "bucket", "window"] {
            assert!(overall_ok(&one(&mut rls.client, key).await));
        }
    }
    assert_eq!(
        one(&mut rls.client, "kept").await.statuses[0].limit_remaining,
        5
    );

    // A load of concurrent requests across the reloads: none may fail.
    let running = Arc::new(AtomicBool::new(true));
    let answered = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for task in 0..16 {
        let (mut client, running, answered) = (
            rls.client.clone(),
            Arc::clone(&running),
            Arc::clone(&answered),
        );
        load.push(tokio::spawn(async move {
            let mut i = 0u64;
            while running.load(Ordering::Relaxed) {
                let value = format!("{task}-{}", i % 8);
                let r = request("api", vec![descriptor(&[("user", &value)])]);
                let response = client.should_rate_limit(r).await?.into_inner();
                assert!(overall_ok(&response), "{response:?}");
                answered.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            Ok::<(), tonic::Status>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    write(&dir, AFTER);
    wait_reloads(&rls.service, 1, 0).await;
    // Unchanged: the same state, its count kept (5 left, now 4).
    assert_eq!(
        one(&mut rls.client, "kept").await.statuses[0].limit_remaining,
        4
    );
    // A token bucket's quota raised: its 6 tokens kept (within the new 20).
    let r = one(&mut rls.client, "bucket").await;
    assert_eq!(limit_and_left(&r), (20, 5));
    // A fixed window's quota raised: the 6 it had left kept (within the
    // new 20), not a fresh window.
    let r = one(&mut rls.client, "window").await;
    assert_eq!(limit_and_left(&r), (20, 5));
    // A new limit applies at once.
    for left in (0..3).rev() {
        assert_eq!(
            one(&mut rls.client, "added").await.statuses[0].limit_remaining,
            left
        );
    }
    assert!(!overall_ok(&one(&mut rls.client, "added").await));

    tokio::time::sleep(Duration::from_millis(200)).await;
    write(&dir, BROKEN);
    wait_reloads(&rls.service, 1, 1).await;
    // Nothing changed: the old limits, and their counts, are in force.
    assert_eq!(
        one(&mut rls.client, "kept").await.statuses[0].limit_remaining,
        3
    );
    assert!(!overall_ok(&one(&mut rls.client, "added").await));
    let r = one(&mut rls.client, "bucket").await;
    assert_eq!(limit_and_left(&r), (20, 4));
    // Polls of the same broken files count it once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rls.service.metrics().reloads(), (1, 1));

    // Fixed again: reloaded, counts still kept.
    write(&dir, AFTER);
    wait_reloads(&rls.service, 2, 1).await;
    assert_eq!(
        one(&mut rls.client, "kept").await.statuses[0].limit_remaining,
        2
    );

    running.store(false, Ordering::Relaxed);
    for task in load {
        task.await.unwrap().expect("no request of the load failed");
    }
    assert!(answered.load(Ordering::Relaxed) > 0);
    let _ = rls.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The first status's `requests_per_unit` and `limit_remaining`.
fn limit_and_left(r: &RateLimitResponse) -> (u32, u32) {
    let status = &r.statuses[0];
    let limit = status.current_limit.as_ref().expect("a limit applied");
    (limit.requests_per_unit, status.limit_remaining)
}

#[tokio::test]
async fn a_token_bucket_lowered_keeps_at_most_the_new_capacity() {
    let dir = temp_dir("lower");
    write(&dir, AFTER);
    let mut rls = serve_dir(&dir, Duration::from_millis(20)).await;
    // 20 → spend 2 (18 left); lowered to 10: min(18, 10) = 10.
    for _ in 0..2 {
        assert!(ok(&one(&mut rls.client, "bucket").await.statuses[0]));
    }
    write(&dir, BEFORE);
    wait_reloads(&rls.service, 1, 0).await;
    assert_eq!(
        one(&mut rls.client, "bucket").await.statuses[0].limit_remaining,
        9
    );
    let _ = rls.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Limits of 4 a `unit` for each algorithm other than the token bucket, one
/// to be lowered and one to be raised.
fn per_algorithm(unit: &str, low: u32, high: u32) -> String {
    let mut text = String::from("domain: api\ndescriptors:\n");
    for algorithm in ["gcra", "fixed_window", "sliding_window"] {
        for (name, rate) in [("low", low), ("high", high)] {
            text.push_str(&format!(
                "  - key: {algorithm}_{name}\n    rate_limit: {{ unit: {unit}, requests_per_unit: {rate}, algorithm: {algorithm} }}\n"
            ));
        }
    }
    text
}

async fn one_value(
    client: &mut RateLimitServiceClient<Channel>,
    key: &str,
    value: &str,
) -> RateLimitResponse {
    let r: RateLimitRequest = request("api", vec![descriptor(&[(key, value)])]);
    client.should_rate_limit(r).await.unwrap().into_inner()
}

/// GCRA and both windows keep every key's state through a reload that
/// changes their quota, as the token bucket does: a key that used up its
/// allowance before is still refused after, whether the quota was lowered
/// or raised, and a key that used part of it has only what it had left,
/// up to the new quota. (The clock is frozen: nothing refills.) In every
/// unit, a week, month (30 days) and year (365 days) among them.
#[tokio::test]
async fn every_algorithm_keeps_its_keys_through_a_changed_quota() {
    for unit in ["minute", "week", "month", "year"] {
        let dir = temp_dir(&format!("algorithms-{unit}"));
        write(&dir, &per_algorithm(unit, 4, 4));
        let mut rls = serve_dir(&dir, Duration::from_millis(20)).await;
        for algorithm in ["gcra", "fixed_window", "sliding_window"] {
            for name in ["low", "high"] {
                let key = format!("{algorithm}_{name}");
                // "spent": exhausted; "part": one of four spent.
                for _ in 0..4 {
                    assert!(overall_ok(&one_value(&mut rls.client, &key, "spent").await));
                }
                assert!(!overall_ok(
                    &one_value(&mut rls.client, &key, "spent").await
                ));
                let part = one_value(&mut rls.client, &key, "part").await;
                assert_eq!(part.statuses[0].limit_remaining, 3, "{key}");
            }
        }
        write(&dir, &per_algorithm(unit, 2, 8));
        wait_reloads(&rls.service, 1, 0).await;
        for algorithm in ["gcra", "fixed_window", "sliding_window"] {
            for (name, rate) in [("low", 2), ("high", 8)] {
                let key = format!("{algorithm}_{name}");
                let spent = one_value(&mut rls.client, &key, "spent").await;
                assert!(
                    !overall_ok(&spent),
                    "{key}: an exhausted key admitted after the reload"
                );
                assert_eq!(
                    spent.statuses[0]
                        .current_limit
                        .as_ref()
                        .unwrap()
                        .requests_per_unit,
                    rate,
                    "{key}"
                );
                assert_eq!(spent.statuses[0].limit_remaining, 0, "{key}");
                // 3 left, at most the new quota: min(3, 2) = 2 or min(3, 8) = 3;
                // one more spent.
                let part = one_value(&mut rls.client, &key, "part").await;
                assert!(overall_ok(&part), "{key}");
                assert_eq!(part.statuses[0].limit_remaining, 3.min(rate) - 1, "{key}");
                // A key first seen after the reload: the new quota whole.
                let new = one_value(&mut rls.client, &key, "new").await;
                assert_eq!(new.statuses[0].limit_remaining, rate - 1, "{key}");
            }
        }
        let _ = rls.stop.send(());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[tokio::test]
async fn an_unreadable_directory_keeps_the_configuration_and_counts_once() {
    let dir = temp_dir("gone");
    write(&dir, AFTER);
    let mut rls = serve_dir(&dir, Duration::from_millis(20)).await;
    assert_eq!(
        one(&mut rls.client, "added").await.statuses[0].limit_remaining,
        2
    );
    // Gone at once (a rename is atomic): removed file by file, a poll
    // between could see a directory whose file had just gone, another
    // broken version, counted on its own.
    let away = dir.with_extension("away");
    std::fs::rename(&dir, &away).unwrap();
    std::fs::remove_dir_all(&away).unwrap();
    let start = Instant::now();
    while rls.service.metrics().reloads().1 == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "never counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // One error per version seen, not one per poll (ten polls since): the
    // directory gone, and at most one more if a poll read the directory
    // just before the rename and its file just after (another error).
    let (loaded, failed) = rls.service.metrics().reloads();
    assert_eq!(loaded, 0);
    assert!((1..=2).contains(&failed), "{failed} errors counted");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        rls.service.metrics().reloads(),
        (0, failed),
        "one error per version"
    );
    assert_eq!(
        one(&mut rls.client, "added").await.statuses[0].limit_remaining,
        1
    );
    // Back: loaded again, the limit's count kept. Written beside it and
    // renamed into place: made in place, a poll between the directory and
    // its file saw an empty directory, another version, counted on its own.
    let back = dir.with_extension("back");
    std::fs::create_dir_all(&back).unwrap();
    write(&back, AFTER);
    std::fs::rename(&back, &dir).unwrap();
    wait_reloads(&rls.service, 1, failed).await;
    assert_eq!(
        one(&mut rls.client, "added").await.statuses[0].limit_remaining,
        0
    );
    let _ = rls.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `domain: api` with a limit per `(key, requests_per_unit, algorithm)`,
/// each a minute's.
fn limits(limits: &[(&str, u32, &str)]) -> String {
    let mut text = String::from("domain: api\ndescriptors:\n");
    for (key, rate, algorithm) in limits {
        text.push_str(&format!(
            "  - key: {key}\n    rate_limit: {{ unit: minute, requests_per_unit: {rate}, algorithm: {algorithm} }}\n"
        ));
    }
    text
}

/// Spend `n` of `key`'s allowance (value `x`), each admitted.
async fn spend(client: &mut RateLimitServiceClient<Channel>, key: &str, n: usize) {
    for _ in 0..n {
        assert!(overall_ok(&one(client, key).await), "{key}");
    }
}

/// Wait until `reloader` holds `retired` limits that loads dropped (at most
/// 10 s).
async fn wait_retired(reloader: &Reloader, retired: usize) {
    let start = Instant::now();
    while reloader.retired() != retired {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} retired, waiting for {retired}",
            reloader.retired()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A limit that one load drops (deleted, or set to `requests_per_unit: 0`)
/// and the next brings back keeps its keys' counts: unchanged, the same
/// state; with its quota changed, converted as a limit kept in force is.
/// Before, each came back with every key at its full allowance.
#[tokio::test]
async fn a_limit_dropped_and_restored_keeps_its_counts() {
    let dir = temp_dir("restored");
    let before = limits(&[
        ("gone", 4, "fixed_window"),
        ("zeroed", 4, "fixed_window"),
        ("bucket", 4, "token_bucket"),
        ("gcra", 4, "gcra"),
    ]);
    write(&dir, &before);
    let mut rls = serve_dir(&dir, Duration::from_millis(20)).await;
    for key in ["gone", "zeroed", "bucket", "gcra"] {
        spend(&mut rls.client, key, 3).await;
    }

    // One load drops them: `gone`, `bucket` and `gcra` deleted, `zeroed` at 0.
    write(
        &dir,
        &limits(&[("zeroed", 0, "fixed_window"), ("kept", 4, "fixed_window")]),
    );
    wait_reloads(&rls.service, 1, 0).await;
    assert!(!overall_ok(&one(&mut rls.client, "zeroed").await));
    let r = one(&mut rls.client, "gone").await;
    assert!(r.statuses[0].current_limit.is_none(), "no limit: {r:?}");

    // The next brings them back: `gone` and `zeroed` as they were, the
    // bucket's and GCRA's quota raised.
    write(
        &dir,
        &limits(&[
            ("gone", 4, "fixed_window"),
            ("zeroed", 4, "fixed_window"),
            ("bucket", 8, "token_bucket"),
            ("gcra", 8, "gcra"),
        ]),
    );
    wait_reloads(&rls.service, 2, 0).await;
    for (key, limit) in [("gone", 4), ("zeroed", 4), ("bucket", 8), ("gcra", 8)] {
        // 1 left before the first load: 1 left now, whatever the quota.
        let r = one(&mut rls.client, key).await;
        assert!(overall_ok(&r), "{key}: {r:?}");
        assert_eq!(limit_and_left(&r), (limit, 0), "{key}");
        assert!(!overall_ok(&one(&mut rls.client, key).await), "{key}");
        // A value first seen now: the whole allowance.
        let new = one_value(&mut rls.client, key, "new").await;
        assert_eq!(limit_and_left(&new), (limit, limit - 1), "{key}");
    }
    assert_eq!(rls.reloader.retired(), 0, "every one restored");
    let _ = rls.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same through a load of an empty directory (its file moved away and
/// back, as a deployment that empties the directory before it writes the
/// new files can do between two polls).
#[tokio::test]
async fn limits_keep_their_counts_through_an_empty_directory() {
    let dir = temp_dir("emptied");
    write(&dir, AFTER);
    let mut rls = serve_dir(&dir, Duration::from_millis(20)).await;
    spend(&mut rls.client, "kept", 7).await;
    spend(&mut rls.client, "added", 2).await;

    let away = dir.join("api.yaml.away");
    std::fs::rename(dir.join("api.yaml"), &away).unwrap();
    wait_reloads(&rls.service, 1, 0).await;
    let r = one(&mut rls.client, "kept").await;
    assert!(r.statuses[0].current_limit.is_none(), "no limit: {r:?}");
    // The two that hold a count; the three no key used are not kept.
    assert_eq!(rls.reloader.retired(), 2);

    std::fs::rename(&away, dir.join("api.yaml")).unwrap();
    wait_reloads(&rls.service, 2, 0).await;
    assert_eq!(limit_and_left(&one(&mut rls.client, "kept").await), (10, 2));
    assert_eq!(limit_and_left(&one(&mut rls.client, "added").await), (3, 0));
    assert!(!overall_ok(&one(&mut rls.client, "added").await));
    let _ = rls.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A retired limit is kept only while it holds a count: one whose keys have
/// all refilled is dropped at the next poll, and one that held no key when
/// its load dropped it is never kept. Brought back, either starts whole,
/// which is what its keys would have had.
#[tokio::test]
async fn a_retired_limit_whose_keys_refilled_is_dropped() {
    let dir = temp_dir("reclaimed");
    let before = limits(&[
        ("spent", 4, "fixed_window"),
        ("unused", 4, "fixed_window"),
        ("stays", 4, "fixed_window"),
    ]);
    write(&dir, &before);
    let mut rls = serve_dir(&dir, Duration::from_millis(20)).await;
    spend(&mut rls.client, "spent", 3).await;

    write(&dir, &limits(&[("stays", 4, "fixed_window")]));
    wait_reloads(&rls.service, 1, 0).await;
    assert_eq!(rls.reloader.retired(), 1, "`unused` held no key");
    // Polls while the window lasts keep it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rls.reloader.retired(), 1);

    // The window passes: the key is whole again, and a poll drops the limit.
    rls.clock.advance(Duration::from_secs(60));
    wait_retired(&rls.reloader, 0).await;
    write(&dir, &before);
    wait_reloads(&rls.service, 2, 0).await;
    assert_eq!(limit_and_left(&one(&mut rls.client, "spent").await), (4, 3));
    let _ = rls.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

/// At most `with_max_retired` limits are kept retired: past it, the one
/// retired longest ago is forgotten and comes back fresh; the others keep
/// their counts.
#[tokio::test]
async fn retired_limits_are_bounded_oldest_first() {
    let dir = temp_dir("bounded");
    let all = [
        ("a", 4, "fixed_window"),
        ("b", 4, "fixed_window"),
        ("c", 4, "fixed_window"),
    ];
    write(&dir, &limits(&all));
    let mut rls = serve_dir_retiring(&dir, Duration::from_millis(20), 2).await;
    for (key, _, _) in all {
        spend(&mut rls.client, key, 3).await;
    }
    // Dropped one load after another: `a`, then `b`, then `c`.
    for (loads, left) in [(1, 1), (2, 2), (3, 3)] {
        write(&dir, &limits(&all[loads..]));
        wait_reloads(&rls.service, loads as u64, 0).await;
        assert_eq!(rls.reloader.retired(), left.min(2), "after {loads} loads");
    }
    write(&dir, &limits(&all));
    wait_reloads(&rls.service, 4, 0).await;
    // `a`, the oldest, forgotten: fresh. `b` and `c`: 1 left, as before.
    assert_eq!(limit_and_left(&one(&mut rls.client, "a").await), (4, 3));
    for key in ["b", "c"] {
        assert_eq!(
            limit_and_left(&one(&mut rls.client, key).await),
            (4, 0),
            "{key}"
        );
        assert!(!overall_ok(&one(&mut rls.client, key).await), "{key}");
    }
    let _ = rls.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A configuration refused leaves the retired limits as they were: one
/// that brings a limit back with a lowered quota, refused for an error
/// elsewhere, neither takes the state nor converts it (converted, 3 left of
/// 4 would be 2 of 2, a full key, and 4 of 4 when raised back).
#[tokio::test]
async fn a_refused_configuration_leaves_retired_limits_alone() {
    let dir = temp_dir("refused");
    let before = limits(&[("gone", 4, "fixed_window"), ("stays", 4, "fixed_window")]);
    write(&dir, &before);
    let mut rls = serve_dir(&dir, Duration::from_millis(20)).await;
    spend(&mut rls.client, "gone", 1).await;
    write(&dir, &limits(&[("stays", 4, "fixed_window")]));
    wait_reloads(&rls.service, 1, 0).await;
    assert_eq!(rls.reloader.retired(), 1);

    let refused = limits(&[("gone", 2, "fixed_window"), ("stays", 4, "fixed_window")])
        + "  - key: broken\n    rate_limit: { unit: minute, requests_per_unit: lots }\n";
    write(&dir, &refused);
    wait_reloads(&rls.service, 1, 1).await;
    assert_eq!(rls.reloader.retired(), 1);

    write(&dir, &before);
    wait_reloads(&rls.service, 2, 1).await;
    assert_eq!(limit_and_left(&one(&mut rls.client, "gone").await), (4, 2));
    let _ = rls.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `*.yaml` link whose target is gone (a file renamed from under it) is
/// a broken configuration: the limits stay in force with their counts, and
/// it is counted once, not once per poll.
#[cfg(unix)]
#[tokio::test]
async fn a_dangling_link_keeps_the_configuration_and_counts_once() {
    let dir = temp_dir("link");
    let target = dir.join("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("api.yaml"), AFTER).unwrap();
    std::os::unix::fs::symlink("target/api.yaml", dir.join("api.yaml")).unwrap();
    let mut rls = serve_dir(&dir, Duration::from_millis(20)).await;
    spend(&mut rls.client, "added", 2).await;

    std::fs::rename(target.join("api.yaml"), target.join("api.old")).unwrap();
    wait_reloads(&rls.service, 0, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rls.service.metrics().reloads(), (0, 1), "once");
    assert_eq!(limit_and_left(&one(&mut rls.client, "added").await), (3, 0));
    assert!(!overall_ok(&one(&mut rls.client, "added").await));
    let _ = rls.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}
