//! Exact and leased modes on a Redis Cluster and on a Sentinel-managed
//! primary (`turnstile::redis`), against real servers each test starts on
//! free ports of its own (`support/redis_topology.rs`): every call sent at
//! most once whatever the topology, and several limiter instances on one
//! key within the exact bound, a `SENTINEL FAILOVER` and a slot migration
//! mid-run included.
//!
//! Without `redis-server`, `redis-cli` or `redis-sentinel` on PATH each test
//! says so and passes, unless `TURNSTILE_REQUIRE_REDIS=1` is set, when it
//! fails.

#[allow(dead_code)]
#[path = "support/redis_server.rs"]
mod redis_server;
#[allow(dead_code)]
#[path = "support/redis_topology.rs"]
mod redis_topology;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redis::ConnectionLike;
use redis::cluster::ClusterClientBuilder;
use redis_topology::{evalsha_calls, pause, reset_stats};
use turnstile::redis::{Deadlines, Guarded, LeasedLimiter, RedisLimitError, RedisLimiter};
use turnstile::{Decision, Quota, TokenBucket};

const SUITE: &str = "topology";

/// Deadlines for the calls a test does not time out.
fn generous() -> Deadlines {
    Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_secs(2))
        .unwrap()
}

/// 20 ms per reply: shorter than the pauses below.
fn short() -> Deadlines {
    Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_millis(20))
        .unwrap()
}

/// 100 tokens, refilled at one an hour: every token taken shows.
fn slow_bucket(name: &str) -> RedisLimiter {
    RedisLimiter::new(
        name,
        TokenBucket::new(Quota::new(100, 1, Duration::from_secs(3_600)).unwrap()),
    )
    .unwrap()
}

/// The remaining tokens after one more admission.
fn remaining(limiter: &RedisLimiter, con: &mut dyn ConnectionLike, key: &str) -> u32 {
    match limiter.try_acquire(con, key).expect("Redis answers") {
        Decision::Allowed { remaining } => remaining,
        denied => panic!("denied: {denied:?}"),
    }
}

/// Pause the node on `node` for 200 ms, run `call` (20 ms deadline: it times
/// out, unless the connection retries it past the pause), wait for the pause
/// to end and whatever was sent to run, and return the call's outcome and how
/// many times the nodes on `ports` ran EVALSHA meanwhile.
fn paused_call(
    ports: &[u16],
    node: u16,
    call: impl FnOnce() -> Result<Decision, RedisLimitError>,
) -> (Result<Decision, RedisLimitError>, u64) {
    for port in ports {
        reset_stats(*port);
    }
    pause(node, Duration::from_millis(200));
    let outcome = call();
    // The pause ends after 200 ms, and Redis lets paused clients go on its
    // next tick; then whatever was sent runs.
    thread::sleep(Duration::from_millis(500));
    (outcome, ports.iter().map(|port| evalsha_calls(*port)).sum())
}

/// A paused call on one of the crate's connections: it times out, runs at
/// most once (none when the connection was closed before Redis read the
/// script), and takes as many tokens as it ran; the connection then works
/// again. `con` must have made a call already (connected, script loaded).
fn at_most_once(
    ports: &[u16],
    node: u16,
    warm: &mut dyn ConnectionLike,
    call: &mut dyn FnMut() -> Result<Decision, RedisLimitError>,
) {
    let limiter = slow_bucket("paused");
    let before = remaining(&limiter, warm, "k");
    let (outcome, runs) = paused_call(ports, node, &mut *call);
    assert!(
        matches!(&outcome, Err(RedisLimitError::Redis(e)) if e.is_timeout()),
        "the paused call times out: {outcome:?}"
    );
    assert!(runs <= 1, "the paused call ran {runs} times");
    let after = remaining(&limiter, warm, "k");
    eprintln!(
        "one paused call: {runs} runs, {} tokens taken",
        before - 1 - after
    );
    assert_eq!(
        before - 1 - after,
        runs as u32,
        "tokens taken by {runs} runs"
    );
    assert!(call().expect("the connection works again").is_allowed());
}

#[test]
fn a_timed_out_call_runs_at_most_once_on_a_cluster() {
    let Some(cluster) = redis_topology::cluster(SUITE) else {
        return;
    };
    let limiter = slow_bucket("paused");
    let node = cluster.node_of(&limiter.redis_key("k"));
    let mut warm = generous()
        .blocking_cluster(ClusterClientBuilder::new(cluster.nodes()))
        .unwrap();
    assert_eq!(remaining(&limiter, &mut warm, "k"), 99);

    // redis-rs's own blocking cluster connection, its retries as they come:
    // the script runs again after the timeout, and takes a token each time.
    let mut raw = ClusterClientBuilder::new(cluster.nodes())
        .response_timeout(Duration::from_millis(20))
        .build()
        .unwrap()
        .get_connection()
        .unwrap();
    let before = remaining(&limiter, &mut warm, "k");
    let (_, raw_runs) = paused_call(cluster.ports(), node, || limiter.try_acquire(&mut raw, "k"));
    let after = remaining(&limiter, &mut warm, "k");
    eprintln!(
        "redis-rs's blocking cluster connection: {raw_runs} runs of one paused call, {} tokens taken",
        before - 1 - after
    );
    assert!(
        raw_runs >= 2,
        "redis-rs's blocking cluster connection no longer resends a timed-out script \
         ({raw_runs} runs): the test cannot tell the fix from it"
    );

    // The crate's: at most once, one token at most.
    let mut con = short()
        .blocking_cluster(ClusterClientBuilder::new(cluster.nodes()))
        .unwrap();
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    at_most_once(cluster.ports(), node, &mut warm, &mut || {
        limiter.try_acquire(&mut con, "k")
    });
}

#[test]
fn a_timed_out_async_call_runs_at_most_once_on_a_cluster() {
    let Some(cluster) = redis_topology::cluster(SUITE) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limiter = slow_bucket("paused");
    let node = cluster.node_of(&limiter.redis_key("k"));
    let mut warm = generous()
        .blocking_cluster(ClusterClientBuilder::new(cluster.nodes()))
        .unwrap();
    assert_eq!(remaining(&limiter, &mut warm, "k"), 99);
    let mut con = runtime
        .block_on(short().async_cluster(ClusterClientBuilder::new(cluster.nodes())))
        .unwrap();
    // Loads the script on the async connection's nodes too.
    assert!(
        runtime
            .block_on(limiter.try_acquire_async(&mut con, "k"))
            .unwrap()
            .is_allowed()
    );
    at_most_once(cluster.ports(), node, &mut warm, &mut || {
        runtime.block_on(limiter.try_acquire_async(&mut con, "k"))
    });
}

#[test]
fn a_timed_out_call_runs_at_most_once_on_one_server() {
    let Some(server) = redis_server::server(SUITE) else {
        return;
    };
    let port = server.port();
    let limiter = slow_bucket("paused");
    let mut warm = server.connection();
    let mut con = short().blocking(server.client());
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    at_most_once(&[port], port, &mut warm, &mut || {
        limiter.try_acquire(&mut con, "k")
    });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut con = short().reconnecting(server.client());
    assert!(
        runtime
            .block_on(limiter.try_acquire_async(&mut con, "k"))
            .unwrap()
            .is_allowed()
    );
    at_most_once(&[port], port, &mut warm, &mut || {
        runtime.block_on(limiter.try_acquire_async(&mut con, "k"))
    });
}

#[test]
fn a_timed_out_call_runs_at_most_once_on_a_sentinel_primary() {
    let Some(sentinel) = redis_topology::sentinel(SUITE) else {
        return;
    };
    let primary = sentinel.primary();
    let limiter = slow_bucket("paused");
    let mut warm = generous().sentinel(sentinel.client());
    let mut con = short().sentinel(sentinel.client());
    assert!(limiter.try_acquire(&mut con, "k").unwrap().is_allowed());
    at_most_once(&[primary], primary, &mut warm, &mut || {
        limiter.try_acquire(&mut con, "k")
    });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut con = short().reconnecting_sentinel(sentinel.client());
    assert!(
        runtime
            .block_on(limiter.try_acquire_async(&mut con, "k"))
            .unwrap()
            .is_allowed()
    );
    at_most_once(&[primary], primary, &mut warm, &mut || {
        runtime.block_on(limiter.try_acquire_async(&mut con, "k"))
    });
}

/// A bucket of 50 that refills 20 a second.
fn quota() -> Quota {
    Quota::new(50, 20, Duration::from_secs(1)).unwrap()
}

/// The most a bucket of `quota()` gives out over `elapsed`: B + r(T).
fn exact_bound(elapsed: Duration) -> u64 {
    50 + (elapsed.as_secs_f64() * 20.0).ceil() as u64
}

/// Run `replicas` threads, each deciding on a connection of its own from
/// `connect`, as fast as they can on one key for `run`; `during` runs on
/// this thread meanwhile. Returns the admissions and the time taken.
fn hammer<Con: ConnectionLike + Send + 'static>(
    replicas: usize,
    run: Duration,
    connect: impl Fn() -> Con,
    decide: impl Fn(usize, &mut Con) -> Decision + Send + Sync + 'static,
    during: impl FnOnce(),
) -> (u64, Duration) {
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(replicas + 1));
    let decide = Arc::new(decide);
    let threads: Vec<_> = (0..replicas)
        .map(|replica| {
            let mut con = connect();
            let (admitted, stop, start, decide) = (
                Arc::clone(&admitted),
                Arc::clone(&stop),
                Arc::clone(&start),
                Arc::clone(&decide),
            );
            thread::spawn(move || {
                start.wait();
                // Relaxed: a flag and a count, read after the join.
                while !stop.load(Ordering::Relaxed) {
                    if decide(replica, &mut con).is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    during();
    let left = run.saturating_sub(began.elapsed());
    thread::sleep(left);
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a replica thread");
    }
    // Joined: every admission is counted.
    (admitted.load(Ordering::Relaxed), began.elapsed())
}

#[test]
fn replicas_on_a_cluster_stay_within_the_exact_bound_through_a_slot_migration() {
    let Some(cluster) = redis_topology::cluster(SUITE) else {
        return;
    };
    let limiter = RedisLimiter::new("bound537", TokenBucket::new(quota())).unwrap();
    let key = "k";
    let from = cluster.node_of(&limiter.redis_key(key));
    let to = *cluster.ports().iter().find(|p| **p != from).unwrap();
    let guarded: Arc<Vec<Guarded>> = Arc::new(
        (0..3)
            .map(|_| Guarded::fail_closed(limiter.clone(), Duration::from_millis(50)))
            .collect(),
    );
    let nodes = cluster.nodes();
    let limits = Arc::clone(&guarded);
    let (admitted, elapsed) = hammer(
        3,
        Duration::from_secs(3),
        || {
            Deadlines::default()
                .connect(Duration::from_secs(1))
                .unwrap()
                .response(Duration::from_millis(500))
                .unwrap()
                .blocking_cluster(ClusterClientBuilder::new(nodes.clone()))
                .unwrap()
        },
        move |replica, con| {
            limits[replica]
                .try_acquire(con, key)
                .expect("only AcquireErrors, and one permit always fits")
        },
        || {
            thread::sleep(Duration::from_millis(300));
            // The key's slot moves (and the slots before it on its node)
            // while the replicas decide.
            let output = cluster.reshard(from, to, cluster.slots_through(&limiter.redis_key(key)));
            assert!(
                output.status.success(),
                "reshard failed: {}",
                String::from_utf8_lossy(&output.stdout)
            );
        },
    );
    assert_ne!(
        cluster.node_of(&limiter.redis_key(key)),
        from,
        "the key's slot moved"
    );
    let bound = exact_bound(elapsed);
    let failures: u64 = guarded.iter().map(|g| g.stats().failures).sum();
    eprintln!(
        "cluster, slot migration: admitted {admitted} of at most {bound} in {elapsed:?}; {failures} failures"
    );
    assert!(
        admitted <= bound,
        "admitted {admitted} > B + r(T) = {bound}"
    );
    assert!(
        admitted >= 50,
        "the bucket's burst was admitted: {admitted}"
    );
    // Redis decides again after the migration.
    let mut con = generous()
        .blocking_cluster(ClusterClientBuilder::new(cluster.nodes()))
        .unwrap();
    let _decided = limiter
        .try_acquire(&mut con, key)
        .expect("the key is served by its new node");
}

/// A key of `limiter`'s served by the node on `port`.
fn key_on(cluster: &redis_topology::Cluster, limiter: &RedisLimiter, port: u16) -> String {
    (0..10_000)
        .map(|i| format!("k{i}"))
        .find(|key| cluster.node_of(&limiter.redis_key(key)) == port)
        .expect("some key on every node")
}

/// A slot moved while two of a blocking cluster connection's three node
/// connections are left unusable by timed-out calls: the call that meets
/// the `MOVED` refreshes the slots and is decided. redis-rs's refresh asks
/// its nodes in its map's order and gave up at the first error, so a
/// connection whose map put an unusable node first failed the call, and
/// every later redirection (the node's slots gone, no call reached it to
/// replace it). Eight connections, each with its own map order: on the old
/// code all eight pass one time in 6,561.
#[test]
fn a_slot_refresh_passes_over_node_connections_left_unusable() {
    let Some(cluster) = redis_topology::cluster(SUITE) else {
        return;
    };
    // Without a hash tag: its keys spread over the nodes.
    let limiter = slow_bucket("refresh").with_prefix("rl:refresh:");
    let moved = "k";
    let from = cluster.node_of(&limiter.redis_key(moved));
    let others: Vec<u16> = cluster
        .ports()
        .iter()
        .copied()
        .filter(|p| *p != from)
        .collect();
    let broken: Vec<String> = others
        .iter()
        .map(|port| key_on(&cluster, &limiter, *port))
        .collect();
    let mut cons: Vec<_> = (0..8)
        .map(|_| {
            short()
                .blocking_cluster(ClusterClientBuilder::new(cluster.nodes()))
                .unwrap()
        })
        .collect();
    for con in &mut cons {
        for key in broken.iter().map(String::as_str).chain([moved]) {
            assert!(limiter.try_acquire(con, key).unwrap().is_allowed());
        }
    }
    // Both other nodes held: a call to each, on every connection, times out
    // (20 ms) and leaves that node's connection unusable.
    for port in &others {
        pause(*port, Duration::from_millis(1_500));
    }
    let began = Instant::now();
    for con in &mut cons {
        for key in &broken {
            let outcome = limiter.try_acquire(con, key);
            assert!(
                matches!(&outcome, Err(RedisLimitError::Redis(e)) if e.is_timeout()),
                "a held node times out: {outcome:?}"
            );
        }
    }
    assert!(
        began.elapsed() < Duration::from_millis(1_500),
        "every timeout came inside the pause: {:?}",
        began.elapsed()
    );
    thread::sleep(
        Duration::from_millis(1_500).saturating_sub(began.elapsed()) + Duration::from_millis(300),
    );
    let output = cluster.reshard(
        from,
        others[0],
        cluster.slots_through(&limiter.redis_key(moved)),
    );
    assert!(
        output.status.success(),
        "reshard failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(cluster.node_of(&limiter.redis_key(moved)), others[0]);
    for (i, con) in cons.iter_mut().enumerate() {
        let outcome = limiter.try_acquire(con, moved);
        assert!(
            matches!(outcome, Ok(Decision::Allowed { .. })),
            "connection {i}: the redirected call after a refresh: {outcome:?}"
        );
        // The unusable connections were replaced: every node answers.
        for key in &broken {
            assert!(limiter.try_acquire(con, key).unwrap().is_allowed());
        }
    }
}

#[test]
fn replicas_on_a_sentinel_primary_stay_within_the_exact_bound_through_a_failover() {
    let Some(sentinel) = redis_topology::sentinel(SUITE) else {
        return;
    };
    let limiter = RedisLimiter::new("bound", TokenBucket::new(quota())).unwrap();
    let key = "k";
    let guarded: Arc<Vec<Guarded>> = Arc::new(
        (0..2)
            .map(|_| Guarded::fail_closed(limiter.clone(), Duration::from_millis(50)))
            .collect(),
    );
    let limits = Arc::clone(&guarded);
    let clients: Vec<_> = (0..2).map(|_| sentinel.client()).collect();
    let clients = std::sync::Mutex::new(clients);
    let original = sentinel.primary();
    let demoted = AtomicBool::new(false);
    let split = std::sync::Mutex::new(Duration::ZERO);
    let (admitted, elapsed) = hammer(
        2,
        Duration::from_secs(5),
        || {
            let client = clients.lock().unwrap().pop().unwrap();
            Deadlines::default()
                .connect(Duration::from_millis(500))
                .unwrap()
                .response(Duration::from_millis(500))
                .unwrap()
                .sentinel(client)
        },
        move |replica, con| {
            limits[replica]
                .try_acquire(con, key)
                .expect("only AcquireErrors, and one permit always fits")
        },
        || {
            thread::sleep(Duration::from_millis(300));
            sentinel.failover();
            let start = Instant::now();
            // From the failover's start until the old primary is demoted,
            // both may take writes, and the old one's are lost.
            while sentinel.current_primary() == original {
                assert!(start.elapsed() < Duration::from_secs(10), "no failover");
                thread::sleep(Duration::from_millis(50));
            }
            // Until the Sentinel demotes the old primary it takes writes
            // (which its resync to the new one then discards); once it is a
            // replica, the limiters' calls there are refused (READONLY) and
            // their connections ask the Sentinel again.
            while !redis_topology::is_replica(original) {
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "the old primary stays one"
                );
                thread::sleep(Duration::from_millis(50));
            }
            // Relaxed: read by this thread after `hammer` returns.
            demoted.store(true, Ordering::Relaxed);
            *split.lock().unwrap() = start.elapsed();
            // The replicas go on deciding on the new primary.
            thread::sleep(Duration::from_millis(1_500));
        },
    );
    assert_eq!(sentinel.current_primary(), sentinel.replica());
    // Relaxed: set by this thread.
    assert!(
        demoted.load(Ordering::Relaxed),
        "the old primary was demoted mid-run"
    );
    // Sentinel replicates asynchronously and demotes the old primary only
    // some time after promoting the replica: the writes the old one took
    // meanwhile are lost, and the new primary decides on the bucket as it
    // was at the promotion. So a failover adds at most what the old primary
    // could give out over that window, B + r(split), to B + r(T).
    let split = *split.lock().unwrap();
    let bound = exact_bound(elapsed) + exact_bound(split);
    let failures: u64 = guarded.iter().map(|g| g.stats().failures).sum();
    eprintln!(
        "sentinel failover: admitted {admitted} of at most {bound} in {elapsed:?} \
         (old primary demoted {split:?} after the failover began); {failures} failures"
    );
    assert!(
        admitted <= bound,
        "admitted {admitted} > 2B + r(T) + r(split) = {bound}"
    );
    assert!(
        admitted >= 50,
        "the bucket's burst was admitted: {admitted}"
    );
    // The replicas' connections found the new primary: the key's state is there.
    let mut con = redis_topology::plain(sentinel.replica()).unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg(limiter.redis_key(key))
        .query(&mut con)
        .unwrap();
    assert!(exists, "the new primary holds the key");
    let mut con = generous().sentinel(sentinel.client());
    let _decided = limiter
        .try_acquire(&mut con, key)
        .expect("the new primary decides");
}

/// Leased mode on a cluster: the refresher takes a cluster connection, and
/// the replicas stay within B + r(T) + N·(L + ⌊L/2⌋).
#[test]
fn leased_replicas_on_a_cluster_stay_within_their_bound() {
    let Some(cluster) = redis_topology::cluster(SUITE) else {
        return;
    };
    let global = RedisLimiter::new("leased", TokenBucket::new(quota())).unwrap();
    let lease = 8;
    let replicas = 3;
    let connect = || {
        generous()
            .blocking_cluster(ClusterClientBuilder::new(cluster.nodes()))
            .unwrap()
    };
    let limiters: Vec<Arc<LeasedLimiter>> = (0..replicas)
        .map(|_| {
            Arc::new(
                LeasedLimiter::builder(global.clone(), lease)
                    .unwrap()
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let refreshers: Vec<_> = limiters
        .iter()
        .map(|limiter| {
            let con = connect();
            assert!(con.deadlines().response_timeout() >= Duration::from_secs(1));
            limiter
                .start_refresher(con)
                .unwrap()
                .expect("the first refresher")
        })
        .collect();
    let limits = Arc::new(limiters.clone());
    let (admitted, elapsed) = hammer(
        replicas,
        Duration::from_secs(2),
        connect,
        move |replica, con| limits[replica].try_acquire(con, "k").unwrap(),
        || {},
    );
    drop(refreshers);
    let bound = exact_bound(elapsed) + replicas as u64 * u64::from(lease + lease / 2);
    let calls: u64 = limiters.iter().map(|l| l.stats().lease_calls).sum();
    eprintln!(
        "leased on a cluster: admitted {admitted} of at most {bound} in {elapsed:?}; {calls} lease calls"
    );
    assert!(admitted <= bound, "admitted {admitted} > {bound}");
    assert!(
        admitted >= 50,
        "the bucket's burst was admitted: {admitted}"
    );
    assert!(calls > 0, "the leases came from the cluster");
}

/// The tower layer takes a cluster connection and a Sentinel one.
#[test]
fn the_layer_takes_cluster_and_sentinel_connections() {
    use turnstile::redis::{AsyncRedisConnection, RedisRateLimitLayer};
    use turnstile::tower::ApiKeyHeader;

    let Some(cluster) = redis_topology::cluster(SUITE) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let con = runtime
        .block_on(generous().async_cluster(ClusterClientBuilder::new(cluster.nodes())))
        .unwrap();
    let extractor = ApiKeyHeader::new(http::header::HeaderName::from_static("x-api-key"));
    let limit = Guarded::fail_closed(slow_bucket("layer"), Duration::from_secs(1));
    let layer = RedisRateLimitLayer::new(limit, con.clone(), extractor.clone());
    assert!(layer.connection().as_cluster().is_some());
    assert_eq!(layer.connection().deadlines(), generous());
    // A decision through the layer's connection reaches the cluster.
    let mut shared = layer.connection().clone();
    let decision = runtime
        .block_on(slow_bucket("layer").try_acquire_async(&mut shared, "k"))
        .unwrap();
    assert_eq!(decision, Decision::Allowed { remaining: 99 });

    let Some(sentinel) = redis_topology::sentinel(SUITE) else {
        return;
    };
    let con = generous().reconnecting_sentinel(sentinel.client());
    let limit = Guarded::fail_closed(slow_bucket("layer"), Duration::from_secs(1));
    let layer = RedisRateLimitLayer::new(limit, con, extractor);
    assert!(layer.connection().as_reconnecting().is_some());
    let mut shared = layer.connection().clone();
    let decision = runtime
        .block_on(slow_bucket("layer").try_acquire_async(&mut shared, "k"))
        .unwrap();
    assert_eq!(decision, Decision::Allowed { remaining: 99 });
}
