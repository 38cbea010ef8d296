//! The Redis backends: two replicas of the service, each in process on an
//! ephemeral port with a connection of its own, on one real `redis-server`
//! that each test starts on a free port and kills when done.
//!
//! Without `redis-server` on PATH each test says so and passes, unless
//! `TURNSTILE_REQUIRE_REDIS=1` is set, when it fails.

mod common;
#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/support/redis_server.rs"]
mod redis_server;
#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/support/redis_topology.rs"]
mod redis_topology;

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use turnstile::redis::Deadlines;
use turnstile_server::config::Config;
use turnstile_server::redis_backend::{FailurePolicy, RedisBackend, RedisMode, RedisOptions};
use turnstile_server::server::{DEFAULT_MAX_MESSAGE, serve};
use turnstile_server::service::{Bounds, RateLimitService};

use common::{descriptor, ok, overall_ok, request};
use redis_server::Server;

const SUITE: &str = "redis (turnstile-server)";

/// A replica: the service on 127.0.0.1:0 with its own Redis connection.
struct Replica {
    client: RateLimitServiceClient<Channel>,
    backend: RedisBackend,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Replica {
    async fn start(url: &str, yaml: &str, options: RedisOptions) -> Replica {
        Replica::start_with(url, yaml, options, false).await
    }

    /// [`start`](Self::start), with `with_stop_increments(stop_increments)`.
    async fn start_with(
        url: &str,
        yaml: &str,
        options: RedisOptions,
        stop_increments: bool,
    ) -> Replica {
        let backend = RedisBackend::connect(url, options)
            .await
            .expect("a URL of a server, a cluster or a Sentinel");
        let files = vec![("limits.yaml".to_string(), yaml.to_string())];
        let config = Config::from_files(&files, &backend).expect("a valid configuration");
        let service = Arc::new(
            RateLimitService::new(config, Bounds::default(), false)
                .with_overrides(Arc::new(backend.clone()), 16)
                .with_stop_increments(stop_increments),
        );
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = grpc.local_addr().expect("an address");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(
            service,
            grpc,
            None,
            DEFAULT_MAX_MESSAGE,
            async move {
                let _ = stopped.await;
            },
        ));
        let client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        Replica {
            client,
            backend,
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        let result = self.task.take().expect("running").await.expect("the task");
        assert!(result.is_ok(), "{result:?}");
    }
}

fn options(mode: RedisMode, on_failure: FailurePolicy, deadline: Duration) -> RedisOptions {
    RedisOptions {
        mode,
        on_failure,
        deadlines: Deadlines::default()
            .connect(deadline)
            .expect("a valid deadline")
            .response(deadline)
            .expect("a valid deadline"),
        replicas: 2,
        max_keys: 1_000,
        ..RedisOptions::default()
    }
}

/// What a load on both replicas admitted, per replica, and how long it ran.
struct Load {
    admitted: [u64; 2],
    asked: [u64; 2],
    /// From before the first request was sent to after the last answer:
    /// every decision falls within it.
    elapsed: Duration,
    /// The slowest answer.
    slowest: Duration,
    /// Answers that were gRPC errors.
    errors: u64,
}

impl Load {
    /// Print what the load admitted beside `bound`, and check that the
    /// replicas held one limit: every request answered, at most `bound`
    /// admitted and at least `least`, the limit reached (the load asked for
    /// more than `bound`), and both replicas admitting from it (one limit,
    /// not one each).
    fn holds(&self, what: &str, bound: u64, least: u64) {
        let admitted = self.admitted[0] + self.admitted[1];
        eprintln!(
            "{what}: admitted {admitted} ({:?}) of {:?} asked in {:?}; bound {bound}",
            self.admitted, self.asked, self.elapsed
        );
        assert_eq!(self.errors, 0, "{what}: every request is answered");
        assert!(admitted <= bound, "{what}: admitted {admitted} > {bound}");
        assert!(admitted >= least, "{what}: admitted {admitted} < {least}");
        assert!(
            self.asked[0] + self.asked[1] > bound,
            "{what}: the load did not reach the limit"
        );
        assert!(
            self.admitted.iter().all(|a| *a > 0),
            "{what}: {:?}",
            self.admitted
        );
    }
}

/// `tasks` concurrent streams per replica asking for `user`'s limit for
/// `run`.
async fn load(replicas: &[Replica; 2], user: &str, tasks: usize, run: Duration) -> Load {
    load_with(replicas, tasks, run, move || descriptor(&[("user", user)])).await
}

/// `tasks` concurrent streams per replica asking for `make()`'s descriptor
/// for `run`.
async fn load_with<F>(replicas: &[Replica; 2], tasks: usize, run: Duration, make: F) -> Load
where
    F: Fn() -> RateLimitDescriptor,
{
    let start = Instant::now();
    let mut handles = Vec::new();
    for (i, replica) in replicas.iter().enumerate() {
        for _ in 0..tasks {
            let mut client = replica.client.clone();
            let asked_for = make();
            handles.push(tokio::spawn(async move {
                let (mut admitted, mut asked, mut errors) = (0u64, 0u64, 0u64);
                let mut slowest = Duration::ZERO;
                while start.elapsed() < run {
                    let sent = Instant::now();
                    let answer = client
                        .should_rate_limit(request("api", vec![asked_for.clone()]))
                        .await;
                    slowest = slowest.max(sent.elapsed());
                    asked += 1;
                    match answer {
                        Ok(response) if overall_ok(response.get_ref()) => admitted += 1,
                        Ok(_) => {}
                        Err(_) => errors += 1,
                    }
                }
                (i, admitted, asked, errors, slowest)
            }));
        }
    }
    let mut result = Load {
        admitted: [0; 2],
        asked: [0; 2],
        elapsed: Duration::ZERO,
        slowest: Duration::ZERO,
        errors: 0,
    };
    for handle in handles {
        let (i, admitted, asked, errors, slowest) = handle.await.expect("a load task");
        result.admitted[i] += admitted;
        result.asked[i] += asked;
        result.errors += errors;
        result.slowest = result.slowest.max(slowest);
    }
    result.elapsed = start.elapsed();
    result
}

/// A token bucket of `rate` per second, burst `burst`, per user.
fn bucket_yaml(algorithm: &str, rate: u32, burst: u32) -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      \
         requests_per_unit: {rate}\n      algorithm: {algorithm}\n      burst: {burst}\n"
    )
}

/// The bound `B + r·T` in permits, for `T` the load's whole interval.
fn exact_bound(burst: u32, rate: u32, elapsed: Duration) -> u64 {
    u64::from(burst) + (f64::from(rate) * elapsed.as_secs_f64()).floor() as u64
}

/// The URL of a single server.
fn url(server: &Server) -> String {
    format!("redis://127.0.0.1:{}/", server.port())
}

async fn two_replicas(url: &str, yaml: &str, options: RedisOptions) -> [Replica; 2] {
    [
        Replica::start(url, yaml, options.clone()).await,
        Replica::start(url, yaml, options).await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_in_exact_mode_hold_one_limit() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let (rate, burst) = (20, 20);
    let yaml = bucket_yaml("token_bucket", rate, burst);
    let options = options(
        RedisMode::Exact,
        FailurePolicy::Closed,
        Duration::from_secs(2),
    );
    let replicas = two_replicas(&url(&server), &yaml, options).await;
    let load = load(&replicas, "alice", 4, Duration::from_millis(1_500)).await;
    // B + r·T.
    let bound = exact_bound(burst, rate, load.elapsed);
    load.holds("exact", bound, u64::from(burst));
    for replica in replicas {
        replica.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_in_leased_mode_hold_one_limit_within_the_lease_bound() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    for algorithm in ["token_bucket", "gcra"] {
        let (rate, burst) = (40, 40);
        let yaml = bucket_yaml(algorithm, rate, burst);
        let options = options(
            RedisMode::Leased,
            FailurePolicy::Closed,
            Duration::from_secs(2),
        );
        let replicas = two_replicas(&url(&server), &yaml, options).await;
        let lease = replicas[0].backend.lease_for(burst);
        assert!(lease > 1, "a lease of {lease}: the test would not lease");
        let user = format!("bob-{algorithm}");
        let load = load(&replicas, &user, 4, Duration::from_millis(1_500)).await;
        // B + r(T) + N·(L + ⌊L/2⌋), N = 2 replicas.
        let bound = exact_bound(burst, rate, load.elapsed) + 2 * u64::from(lease + lease / 2);
        load.holds(
            &format!("leased {algorithm}, lease {lease}"),
            bound,
            u64::from(burst),
        );
        for replica in replicas {
            replica.stop().await;
        }
    }
}

/// A descriptor's `hits_addend` of 0 checks the limit in Redis without
/// spending it, in both modes and for each algorithm: checks on one replica
/// leave the whole limit to the other, and once the other has spent it a
/// check on either is `OVER_LIMIT` (it was answered `OK` from what the
/// replica held before there was a read-only script).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_check_of_zero_hits_reads_the_limit_in_redis_and_spends_nothing() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let limit = 3;
    for mode in [RedisMode::Exact, RedisMode::Leased] {
        for (algorithm, unit) in [
            ("token_bucket", "minute"),
            ("gcra", "minute"),
            ("fixed_window", "hour"),
            ("sliding_window", "hour"),
        ] {
            let what = format!("{mode:?} {algorithm}");
            let yaml = format!(
                "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: {unit}\n      \
                 requests_per_unit: {limit}\n      algorithm: {algorithm}\n"
            );
            let options = options(mode, FailurePolicy::Closed, Duration::from_secs(2));
            let replicas = two_replicas(&url(&server), &yaml, options).await;
            let user = format!("carol-{mode:?}-{algorithm}");
            let ask = |replica: &Replica, hits: Option<u64>| {
                let mut client = replica.client.clone();
                let mut asked = descriptor(&[("user", &user)]);
                if let Some(hits) = hits {
                    asked = common::with_hits(asked, hits);
                }
                async move {
                    let response = client
                        .should_rate_limit(request("api", vec![asked]))
                        .await
                        .expect("an answer")
                        .into_inner();
                    ok(&response.statuses[0])
                }
            };
            for _ in 0..5 {
                assert!(
                    ask(&replicas[0], Some(0)).await,
                    "{what}: a check of a fresh limit"
                );
            }
            for i in 0..limit {
                assert!(
                    ask(&replicas[1], None).await,
                    "{what}: hit {i} after the checks"
                );
            }
            assert!(!ask(&replicas[1], None).await, "{what}: past the limit");
            assert!(
                !ask(&replicas[0], Some(0)).await,
                "{what}: a check on the replica that spent nothing"
            );
            assert!(
                !ask(&replicas[1], Some(0)).await,
                "{what}: a check on the replica that spent the limit"
            );
            for replica in replicas {
                replica.stop().await;
            }
        }
    }
}

/// A Redis that accepts connections but does not answer (`SIGSTOP`): the
/// limits share one connection, and after an attempt to connect fails none
/// is made for a backoff, so every limit's call fails at once (it was one
/// attempt, with its whole connect deadline, per limit called: a request
/// with 16 descriptors took half a second, three times over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_costs_one_attempt_to_connect_a_backoff_not_one_per_limit() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let mut yaml = String::from("domain: api\ndescriptors:\n");
    for i in 0..16 {
        yaml.push_str(&format!(
            "  - key: l{i}\n    rate_limit: {{ unit: second, requests_per_unit: 100 }}\n"
        ));
    }
    let options = RedisOptions {
        deadlines: Deadlines::default()
            .connect(Duration::from_millis(50))
            .expect("a valid deadline")
            .response(Duration::from_millis(10))
            .expect("a valid deadline"),
        backoff: Duration::from_secs(5),
        ..options(
            RedisMode::Exact,
            FailurePolicy::Closed,
            Duration::from_millis(50),
        )
    };
    let replica = Replica::start(&url(&server), &yaml, options).await;
    let all: Vec<_> = (0..16)
        .map(|i| descriptor(&[(&format!("l{i}"), "v")]))
        .collect();
    let ask = || {
        let mut client = replica.client.clone();
        let all = all.clone();
        async move {
            let start = Instant::now();
            let response = client
                .should_rate_limit(request("api", all))
                .await
                .expect("an answer, never a gRPC error")
                .into_inner();
            (response.overall_code, start.elapsed())
        }
    };
    assert_eq!(ask().await.0, 1, "OK while Redis answers");
    let connections = || -> u64 {
        let mut con = server.plain();
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut con)
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_connections_received")
    };
    let before = connections();
    server.stop();
    let mut took = Vec::new();
    for _ in 0..3 {
        took.push(ask().await.1);
    }
    server.resume();
    // The attempts made while Redis was stopped waited in its backlog.
    let attempts = connections() - before - 1;
    replica.stop().await;
    assert!(
        attempts <= 1,
        "{attempts} attempts to connect, each request {took:?}"
    );
    // One call past its deadline and one attempt to connect, not 16.
    assert!(
        took[0] < Duration::from_millis(400)
            && took[1..].iter().all(|t| *t < Duration::from_millis(100)),
        "{took:?}"
    );
}

/// A count reported after the fact that is larger than what is left uses
/// the limit in Redis up, in both modes: the next check on either replica
/// is `OVER_LIMIT` (a refused report that spent nothing left it open).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_report_larger_than_what_is_left_empties_the_limit_in_redis() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    for mode in [RedisMode::Exact, RedisMode::Leased] {
        for algorithm in ["fixed_window", "token_bucket"] {
            let what = format!("{mode:?} {algorithm}");
            let yaml = format!(
                "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      \
                 requests_per_unit: 100\n      algorithm: {algorithm}\n"
            );
            let options = options(mode, FailurePolicy::Closed, Duration::from_secs(2));
            let replicas = two_replicas(&url(&server), &yaml, options).await;
            let user = format!("dave-{mode:?}-{algorithm}");
            let ask = |replica: &Replica, hits: u64| {
                let mut client = replica.client.clone();
                let asked = common::with_hits(descriptor(&[("user", &user)]), hits);
                async move {
                    let response = client
                        .should_rate_limit(request("api", vec![asked]))
                        .await
                        .expect("an answer")
                        .into_inner();
                    ok(&response.statuses[0])
                }
            };
            assert!(ask(&replicas[0], 0).await, "{what}: a fresh limit");
            assert!(ask(&replicas[0], 60).await, "{what}: 60 of 100");
            assert!(ask(&replicas[1], 0).await, "{what}: 40 left");
            // In leased mode the replica now holds a lease, and the rest is
            // in Redis: both are spent by the refused report below.
            assert!(ask(&replicas[1], 1).await, "{what}: one more");
            assert!(
                !ask(&replicas[1], 60).await,
                "{what}: 60 more than the 39 left"
            );
            for (i, replica) in replicas.iter().enumerate() {
                assert!(!ask(replica, 0).await, "{what}: a check on replica {i}");
                assert!(!ask(replica, 1).await, "{what}: a hit on replica {i}");
            }
            for replica in replicas {
                replica.stop().await;
            }
        }
    }
}

/// In leased mode a report larger than what is left spends the lease the
/// replica holds and what Redis holds: a replica whose lease had grown
/// spent only its lease, and went on admitting what Redis still had (87
/// of them in one run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leased_report_spends_the_lease_held_and_what_redis_holds() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      \
                requests_per_unit: 1000\n      algorithm: fixed_window\n";
    let options = options(
        RedisMode::Leased,
        FailurePolicy::Closed,
        Duration::from_secs(2),
    );
    let replicas = two_replicas(&url(&server), yaml, options).await;
    let ask = |replica: &Replica, hits: u64| {
        let mut client = replica.client.clone();
        let asked = common::with_hits(descriptor(&[("user", "erin")]), hits);
        async move {
            let response = client
                .should_rate_limit(request("api", vec![asked]))
                .await
                .expect("an answer")
                .into_inner();
            ok(&response.statuses[0])
        }
    };
    // Replica 0's lease grows; replica 1 spends most of the rest.
    for _ in 0..40 {
        assert!(ask(&replicas[0], 1).await);
    }
    assert!(ask(&replicas[1], 850).await);
    // More than all that is left, in replica 0's lease and in Redis.
    assert!(!ask(&replicas[0], 200).await);
    let mut admitted = [0u32; 2];
    for (i, replica) in replicas.iter().enumerate() {
        for _ in 0..50 {
            if ask(replica, 1).await {
                admitted[i] += 1;
            }
        }
    }
    for replica in replicas {
        replica.stop().await;
    }
    assert_eq!(admitted, [0, 0], "hits admitted after the report");
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` on the Redis backends: a
/// request whose user is over its limit spends nothing of its path's limit
/// in Redis, in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_stop_increments_a_refused_request_spends_nothing_in_redis() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  \
                - key: path\n    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}\n";
    for mode in [RedisMode::Exact, RedisMode::Leased] {
        let options = options(mode, FailurePolicy::Closed, Duration::from_secs(2));
        let replica = Replica::start_with(&url(&server), yaml, options, true).await;
        let path = format!("/{mode:?}");
        let mut client = replica.client.clone();
        let mut ask = async |user: &str| {
            let user = format!("{user}-{mode:?}");
            let asked = vec![
                descriptor(&[("user", &user)]),
                descriptor(&[("path", &path)]),
            ];
            client
                .should_rate_limit(request("api", asked))
                .await
                .expect("an answer")
                .into_inner()
        };
        let first = ask("dave").await;
        assert!(overall_ok(&first), "{mode:?}: {first:?}");
        for _ in 0..10 {
            let refused = ask("dave").await;
            assert!(
                !overall_ok(&refused) && ok(&refused.statuses[1]),
                "{mode:?}: {refused:?}"
            );
        }
        // The path's 5: 1 spent by dave's one admission, so 4 more users.
        for i in 0..4 {
            assert!(
                overall_ok(&ask(&format!("user{i}")).await),
                "{mode:?}: user {i}"
            );
        }
        assert!(
            !overall_ok(&ask("erin").await),
            "{mode:?}: the path is spent"
        );
        replica.stop().await;
    }
}

/// With the setting, failing open through an outage: the checks answer from
/// the local share (its first check of the outage empties it, as a request
/// would), so requests are admitted once it refills, as without the
/// setting. (When only a spending request emptied the share, the checks
/// denied for the whole outage and nothing was admitted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_stop_increments_a_fail_open_outage_admits_from_the_share() {
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n  \
                - key: path\n    rate_limit: {unit: second, requests_per_unit: 100}\n";
    let mut admitted_by_setting = Vec::new();
    for stop in [false, true] {
        let Some(server) = redis_server::server(SUITE) else {
            return;
        };
        let options = RedisOptions {
            backoff: Duration::from_millis(100),
            ..options(
                RedisMode::Exact,
                FailurePolicy::Open,
                Duration::from_millis(200),
            )
        };
        let replica = Replica::start_with(&url(&server), yaml, options, stop).await;
        let mut client = replica.client.clone();
        let ask = || {
            request(
                "api",
                vec![
                    descriptor(&[("user", "alice")]),
                    descriptor(&[("path", "/")]),
                ],
            )
        };
        let first = client.should_rate_limit(ask()).await.expect("an answer");
        assert!(overall_ok(first.get_ref()));
        drop(server);
        let start = Instant::now();
        let mut admitted = 0;
        while start.elapsed() < Duration::from_millis(1_500) {
            let r = client.should_rate_limit(ask()).await.expect("an answer");
            admitted += u32::from(overall_ok(r.get_ref()));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        admitted_by_setting.push(admitted);
        replica.stop().await;
    }
    assert!(
        admitted_by_setting.iter().all(|a| *a > 0),
        "admitted through the outage without and with the setting: {admitted_by_setting:?}"
    );
}

/// A descriptor answered by its check reports what its limit has now, on
/// Redis as in process (not what one more hit would leave).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_on_redis_reports_the_remaining_as_in_process() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  \
                - key: path\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    let mut seen = Vec::new();
    for mode in [RedisMode::Exact, RedisMode::Leased] {
        let options = options(mode, FailurePolicy::Closed, Duration::from_secs(2));
        let replica = Replica::start_with(&url(&server), yaml, options, true).await;
        let mut client = replica.client.clone();
        let path = format!("/{mode:?}");
        let ask = || {
            request(
                "api",
                vec![
                    descriptor(&[("user", &format!("frank-{mode:?}"))]),
                    descriptor(&[("path", &path)]),
                ],
            )
        };
        let first = client.should_rate_limit(ask()).await.expect("an answer");
        assert!(overall_ok(first.get_ref()), "{mode:?}");
        let refused = client.should_rate_limit(ask()).await.expect("an answer");
        let refused = refused.into_inner();
        assert!(
            !overall_ok(&refused) && ok(&refused.statuses[1]),
            "{mode:?}"
        );
        seen.push(refused.statuses[1].limit_remaining);
        replica.stop().await;
    }
    // Exact: the limit's 9 left in Redis. Leased: what this replica holds
    // of its lease (the backend's documented remaining), at most that.
    assert_eq!(seen[0], 9, "exact: {seen:?}");
    assert!(seen[1] <= 9, "leased: {seen:?}");
}

/// Redis killed while both replicas serve: each request is answered by the
/// policy (no gRPC error) within the deadlines, fail closed denying what no
/// lease covers, fail open admitting no more than the replica's share.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_mid_run_is_answered_by_the_policy_within_the_deadline() {
    for (mode, policy) in [
        (RedisMode::Exact, FailurePolicy::Closed),
        (RedisMode::Exact, FailurePolicy::Open),
        (RedisMode::Leased, FailurePolicy::Closed),
        (RedisMode::Leased, FailurePolicy::Open),
    ] {
        let Some(server) = redis_server::server(SUITE) else {
            return;
        };
        let (rate, burst) = (10, 40);
        let yaml = bucket_yaml("token_bucket", rate, burst);
        let deadline = Duration::from_millis(200);
        let replicas = two_replicas(&url(&server), &yaml, options(mode, policy, deadline)).await;
        let before = load(&replicas, "carol", 2, Duration::from_millis(300)).await;
        assert_eq!(before.errors, 0);
        assert!(before.admitted.iter().sum::<u64>() > 0);
        // Killed (SIGKILL) while both replicas are under load.
        let killer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(server);
        });
        let across = load(&replicas, "carol", 2, Duration::from_millis(600)).await;
        killer.await.expect("the kill");
        // After it: the policy alone.
        let during = load(&replicas, "carol", 2, Duration::from_millis(800)).await;
        eprintln!(
            "{mode:?}/{policy:?} after the kill: admitted {:?} of {:?}, slowest {:?}",
            during.admitted, during.asked, during.slowest
        );
        assert_eq!(
            across.errors + during.errors,
            0,
            "{mode:?}/{policy:?}: every request is answered"
        );
        // A request makes at most one call (connect and response deadlines),
        // or waits for another's fetch at most one response deadline; the
        // margin is the gRPC round trip on a loaded machine.
        let limit = 2 * deadline + Duration::from_millis(500);
        assert!(
            across.slowest.max(during.slowest) <= limit,
            "{mode:?}/{policy:?}: an answer took {:?}, over {limit:?}",
            across.slowest.max(during.slowest)
        );
        let admitted: u64 = during.admitted.iter().sum();
        // A replica's leases: at most L + ⌊L/2⌋ each, spent after the kill.
        let lease = replicas[0].backend.lease_for(burst);
        let held = match mode {
            RedisMode::Exact => 0,
            RedisMode::Leased => 2 * u64::from(lease + lease / 2),
        };
        match policy {
            FailurePolicy::Closed => assert!(
                admitted <= held,
                "{mode:?}: fail closed admitted {admitted} with Redis gone (leases held: {held})"
            ),
            FailurePolicy::Open => {
                // Each replica's share: B/2 tokens, r/2 per second, from empty
                // at the start of the outage (the failover rule), so at most
                // r/2 · T each beyond what leases held.
                let share =
                    2 * (f64::from(rate) / 2.0 * during.elapsed.as_secs_f64()).ceil() as u64;
                assert!(
                    admitted <= held + u64::from(burst) + share,
                    "{mode:?}: fail open admitted {admitted}"
                );
                assert!(
                    during.asked.iter().sum::<u64>() > admitted,
                    "{mode:?}: the share limits what is admitted"
                );
            }
        }
        // What Redis did is counted, for `/metrics`.
        for replica in &replicas {
            let counts = replica.backend.health().counts();
            assert!(
                counts.failures > 0 && counts.fallbacks > 0 && counts.degraded_periods > 0,
                "{mode:?}/{policy:?}: {counts:?}"
            );
        }
        for replica in replicas {
            replica.stop().await;
        }
    }
}

#[tokio::test]
async fn a_url_of_another_form_is_refused_with_what_to_give() {
    for url in [
        "http://127.0.0.1:6379",
        "redis+sentinel://127.0.0.1:26379",
        "redis+cluster://",
    ] {
        let error = RedisBackend::connect(url, RedisOptions::default())
            .await
            .expect_err("refused");
        assert!(error.to_string().contains("redis://HOST:PORT"), "{error}");
    }
}

/// The forms the environment's Redis variables give are taken: a Unix
/// socket, and credentials before a Sentinel list (the primary's). Neither
/// connects before its first call.
#[tokio::test]
async fn a_unix_socket_and_a_sentinels_credentials_are_taken() {
    for url in [
        "redis+unix:///nonexistent/redis.sock",
        "redis+unix:///nonexistent/redis.sock?user=u&pass=p%20w",
        "redis+sentinel://u:p%40ss@127.0.0.1:1,127.0.0.1:2/mymaster",
        "redis+sentinel://:secret@127.0.0.1:1/mymaster",
    ] {
        assert!(
            RedisBackend::connect(url, RedisOptions::default())
                .await
                .is_ok(),
            "{url}"
        );
    }
    let error = RedisBackend::connect("redis+sentinel://u:p@/mymaster", RedisOptions::default())
        .await
        .expect_err("no Sentinel named");
    assert!(error.to_string().contains("no Sentinel named"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_has_keys_of_its_own_under_the_prefix() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let yaml = bucket_yaml("gcra", 5, 5);
    let options = options(
        RedisMode::Exact,
        FailurePolicy::Closed,
        Duration::from_secs(2),
    );
    let mut replica = Replica::start(&url(&server), &yaml, options).await;
    let answer = replica
        .client
        .should_rate_limit(request("api", vec![descriptor(&[("user", "dave")])]))
        .await
        .expect("an answer")
        .into_inner();
    assert!(ok(&answer.statuses[0]));
    let mut con = server.plain();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
    assert_eq!(keys, vec!["turnstile-rls:gcra:api.user:4:dave".to_string()]);
    replica.stop().await;
}

/// The fixed window keeps its own bound in leased mode, with no lease term:
/// a lease counts its permits in the window that granted it and ends with
/// that window, so the replicas together admit at most `limit` in each
/// window the load touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_leased_replicas_keep_the_fixed_windows_bound() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let limit = 40;
    let yaml = format!(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      \
         requests_per_unit: {limit}\n      algorithm: fixed_window\n"
    );
    let options = options(
        RedisMode::Leased,
        FailurePolicy::Closed,
        Duration::from_secs(2),
    );
    let replicas = two_replicas(&url(&server), &yaml, options).await;
    assert!(replicas[0].backend.lease_for(limit) > 1);
    let unix_secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
    };
    // Windows sit on whole seconds of Redis' clock, this machine's clock.
    let first = unix_secs();
    let load = load(&replicas, "erin", 4, Duration::from_millis(1_500)).await;
    let windows = unix_secs() - first + 1;
    let admitted = load.admitted[0] + load.admitted[1];
    let bound = u64::from(limit) * windows;
    eprintln!(
        "leased fixed_window: admitted {admitted} ({:?}) of {:?} over {windows} windows; bound {bound}",
        load.admitted, load.asked
    );
    assert_eq!(load.errors, 0);
    assert!(
        admitted <= bound,
        "admitted {admitted} > {limit} × {windows} windows"
    );
    assert!(admitted >= u64::from(limit), "admitted {admitted}");
    assert!(load.asked[0] + load.asked[1] > bound);
    for replica in replicas {
        replica.stop().await;
    }
}

/// Two replicas on a real three-primary Redis Cluster, given as
/// `redis+cluster://` with every node: one limit in exact and in leased mode,
/// within its bound, every request answered, the scripts run on the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_a_redis_cluster_hold_one_limit() {
    let Some(cluster) = redis_topology::cluster(SUITE) else {
        return;
    };
    let nodes: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    let url = format!("redis+cluster://{}", nodes.join(","));
    for mode in [RedisMode::Exact, RedisMode::Leased] {
        let (rate, burst) = (40, 40);
        let yaml = bucket_yaml("token_bucket", rate, burst);
        let options = options(mode, FailurePolicy::Closed, Duration::from_secs(2));
        for port in cluster.ports() {
            redis_topology::reset_stats(*port);
        }
        let replicas = two_replicas(&url, &yaml, options).await;
        let lease = match mode {
            RedisMode::Leased => replicas[0].backend.lease_for(burst),
            RedisMode::Exact => 0,
        };
        let user = format!("carol-{mode:?}");
        let load = load(&replicas, &user, 4, Duration::from_millis(1_500)).await;
        // B + r(T), and N·(L + ⌊L/2⌋) more in leased mode (N = 2 replicas).
        let bound = exact_bound(burst, rate, load.elapsed) + 2 * u64::from(lease + lease / 2);
        let scripts: u64 = cluster
            .ports()
            .iter()
            .map(|port| redis_topology::evalsha_calls(*port))
            .sum();
        let what = format!("cluster, {mode:?}, lease {lease}, {scripts} scripts");
        load.holds(&what, bound, u64::from(burst));
        assert!(scripts > 0, "{mode:?}: no script ran on the cluster");
        for replica in replicas {
            replica.stop().await;
        }
    }
}

/// Two replicas on a Sentinel-managed primary, given as `redis+sentinel://`,
/// in exact mode failing closed, through a `SENTINEL FAILOVER` mid-run:
/// every request answered (no gRPC error: a failed call is a denial by the
/// policy), the limit held within the bound a failover allows, and the
/// service deciding on the new primary afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_through_sentinel_hold_one_limit_across_a_failover() {
    let Some(sentinel) = redis_topology::sentinel(SUITE) else {
        return;
    };
    let sentinel = Arc::new(sentinel);
    let address = sentinel.sentinel_address();
    let host = address.trim_start_matches("redis://").trim_end_matches('/');
    let url = format!("redis+sentinel://{host}/{}", redis_topology::SERVICE);
    let (rate, burst) = (40, 40);
    let yaml = bucket_yaml("token_bucket", rate, burst);
    let options = options(
        RedisMode::Exact,
        FailurePolicy::Closed,
        Duration::from_millis(500),
    );
    let replicas = two_replicas(&url, &yaml, options).await;
    let original = sentinel.primary();
    let watcher = Arc::clone(&sentinel);
    // The failover, 300 ms into the load; how long from its start until the
    // old primary stopped taking writes.
    let failover = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(300));
        watcher.failover();
        let start = Instant::now();
        while watcher.current_primary() == original {
            assert!(start.elapsed() < Duration::from_secs(10), "no failover");
            std::thread::sleep(Duration::from_millis(50));
        }
        while !redis_topology::is_replica(original) {
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "the old primary stays one"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        start.elapsed()
    });
    let load = load(&replicas, "dave", 4, Duration::from_secs(5)).await;
    let split = failover.await.expect("the failover");
    assert_eq!(sentinel.current_primary(), sentinel.replica());
    // Sentinel replicates asynchronously and demotes the old primary some
    // time after promoting the replica: what the old one took meanwhile is
    // lost, so a failover adds at most B + r(split) to B + r(T) (as the
    // crate's own test of a failover states). (Writes the old primary takes
    // after the load cannot add admissions.)
    let window = split.min(load.elapsed);
    let bound = exact_bound(burst, rate, load.elapsed) + exact_bound(burst, rate, window);
    load.holds(
        &format!("sentinel failover, old primary demoted {split:?} after it began"),
        bound,
        u64::from(burst),
    );
    // The old primary demoted, both replicas decide on the new one: a new
    // user's limit holds its exact bound there, and its state is there.
    let after = self::load(&replicas, "erin", 4, Duration::from_millis(1_500)).await;
    let bound = exact_bound(burst, rate, after.elapsed);
    after.holds("after the failover", bound, u64::from(burst));
    for replica in replicas {
        replica.stop().await;
    }
    let mut con = redis_topology::plain(sentinel.replica()).expect("the new primary");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*erin*")
        .query(&mut con)
        .expect("KEYS");
    assert!(!keys.is_empty(), "the new primary holds erin's state");
}

/// A descriptor's `limit` override on two replicas in exact mode: one limit
/// in Redis, made by each replica's backend under the same key, so the two
/// admit the override's quota once between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_override_is_one_limit_across_replicas() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let yaml = bucket_yaml("token_bucket", 1_000, 1_000);
    let options = options(
        RedisMode::Exact,
        FailurePolicy::Closed,
        Duration::from_secs(2),
    );
    let replicas = two_replicas(&url(&server), &yaml, options).await;
    let hour = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
            / 3_600
    };
    let before = hour();
    let load = load_with(&replicas, 4, Duration::from_millis(1_000), || {
        let mut d = descriptor(&[("tenant", "t1")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 10,
            unit: RateLimitUnit::Hour as i32,
        });
        d
    })
    .await;
    let after = hour();
    let admitted = load.admitted[0] + load.admitted[1];
    eprintln!(
        "override across replicas: admitted {admitted} ({:?}) of {:?}",
        load.admitted, load.asked
    );
    assert_eq!(load.errors, 0);
    if before == after {
        // One window of an hour: 10 between both replicas, not 10 each.
        assert_eq!(admitted, 10);
    } else {
        assert!(admitted <= 20, "admitted {admitted} over two windows");
    }
    for replica in replicas {
        replica.stop().await;
    }
}

/// The service's binary on a directory of one configuration file, its
/// stderr read line by line; killed, and the directory removed, when
/// dropped.
struct Binary {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    dir: std::path::PathBuf,
    runtime: tokio::runtime::Runtime,
    /// The HTTP listener, from the line that names it.
    http: std::net::SocketAddr,
}

const ONE_KEY: &str = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;

impl Binary {
    /// Start it with only `envs` in its environment, `yaml` as its
    /// configuration (in a directory named after `tag`) and `args` after
    /// the listeners', and wait for the line that names them.
    fn start(tag: &str, yaml: &str, envs: &[(&str, String)], args: &[&str]) -> Binary {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};

        let dir = std::env::temp_dir().join(format!("turnstile-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        std::fs::write(dir.join("d.yaml"), yaml).expect("a file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_turnstile-server"))
            .env_clear()
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .arg("--config")
            .arg(&dir)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary");
        let stderr = BufReader::new(child.stderr.take().expect("its stderr"));
        let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if lines_tx.send(line).is_err() {
                    return;
                }
            }
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let mut binary = Binary {
            child,
            lines,
            dir,
            runtime,
            http: ([127, 0, 0, 1], 0).into(),
        };
        binary.http = binary
            .wait_for("HTTP on ")
            .rsplit_once("HTTP on ")
            .expect("the listener")
            .1
            .parse()
            .expect("an address");
        binary
    }

    /// The next line of stderr that holds `what`, within 10 s.
    fn wait_for(&self, what: &str) -> String {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line with {what:?} ({e})"),
            }
        }
    }

    /// `method path` over HTTP: the status and the body.
    fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.runtime
            .block_on(common::http(self.http, method, path, body))
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The value of the series `name` in Prometheus text.
fn series(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
}

const PER_SECOND: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 100 }\n";

/// The binary pings Redis at start-up, says when Redis starts failing, and
/// counts the failures and the policy's decisions in `/metrics`.
#[test]
fn the_binary_logs_and_counts_what_redis_does() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    // A deadline a loaded machine keeps: the first call must not time out
    // (the share it would fall back to starts empty).
    let binary = Binary::start(
        "redis-health",
        PER_SECOND,
        &[],
        &[
            "--redis",
            &url(&server),
            "--redis-mode",
            "exact",
            "--redis-deadline",
            "1000",
        ],
    );
    binary.wait_for("Redis answers (PING in");
    let (status, text) = binary.http("POST", "/json", ONE_KEY);
    assert_eq!(status, 200, "{text}");
    let (_, metrics) = binary.http("GET", "/metrics", "");
    assert_eq!(series(&metrics, "turnstile_rls_redis_failures_total"), 0);
    drop(server);
    // Redis gone: answered by the policy (open: the share, from empty).
    let (status, text) = binary.http("POST", "/json", ONE_KEY);
    assert!(status == 200 || status == 429, "{status}: {text}");
    let warning = binary.wait_for("Redis is failing");
    assert!(warning.contains("--on-redis-failure open"), "{warning}");
    let (_, metrics) = binary.http("GET", "/metrics", "");
    assert!(
        series(&metrics, "turnstile_rls_redis_failures_total") >= 1,
        "{metrics}"
    );
    assert!(
        series(&metrics, "turnstile_rls_redis_fallbacks_total") >= 1,
        "{metrics}"
    );
    assert_eq!(
        series(&metrics, "turnstile_rls_redis_failing_limits"),
        1,
        "{metrics}"
    );
    assert!(metrics.contains("# TYPE turnstile_rls_redis_failing_limits gauge"));
}

/// A limit whose call failed, and that gets no request after, is told that
/// Redis answers again: the binary pings for it, says so, and the gauge of
/// failing limits goes back to 0.
#[test]
fn the_binary_says_when_redis_answers_again_with_no_request() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let binary = Binary::start(
        "redis-again",
        PER_SECOND,
        &[],
        &[
            "--redis",
            &url(&server),
            "--redis-mode",
            "exact",
            "--redis-deadline",
            "300",
        ],
    );
    binary.wait_for("Redis answers (PING in");
    // Redis hangs (SIGSTOP): the call runs past its deadline.
    server.stop();
    let result = std::panic::catch_unwind(|| {
        let (status, text) = binary.http("POST", "/json", ONE_KEY);
        assert!(status == 200 || status == 429, "{status}: {text}");
        binary.wait_for("Redis is failing");
    });
    // Redis runs again, and no request comes.
    server.resume();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    binary.wait_for("Redis answers again");
    let (_, metrics) = binary.http("GET", "/metrics", "");
    assert_eq!(
        series(&metrics, "turnstile_rls_redis_failing_limits"),
        0,
        "{metrics}"
    );
}

/// The binary started from envoyproxy/ratelimit's environment counts in the
/// Redis its variables name (they were reported as not read, and each
/// replica counted on its own); `--redis off` keeps the counts in process.
#[test]
fn the_binary_counts_in_the_redis_the_variables_name() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let keys = || -> Vec<String> {
        let mut con = server.plain();
        redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS")
    };
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    let envs = [
        ("REDIS_SOCKET_TYPE", "tcp".to_string()),
        ("REDIS_URL", format!("127.0.0.1:{}", server.port())),
    ];
    for (extra, counted_in_redis) in [(&["--redis", "off"][..], false), (&[][..], true)] {
        let mut args = vec!["--redis-mode", "exact", "--redis-deadline", "1000"];
        args.extend_from_slice(extra);
        let binary = Binary::start("redis-env", yaml, &envs, &args);
        let (status, text) = binary.http("POST", "/json", ONE_KEY);
        assert_eq!(status, 200, "{text}");
        assert_eq!(
            !keys().is_empty(),
            counted_in_redis,
            "{extra:?}: {:?}",
            keys()
        );
    }
}
