//! A Redis Cluster and a Sentinel-managed primary of a test's own, started
//! from `redis-server`, `redis-cli` and `redis-sentinel` on free ports in a
//! directory of their own, and killed (by the process ids they were started
//! with) when dropped. Without the binaries a test says so and passes,
//! unless `TURNSTILE_REQUIRE_REDIS=1` is set, when it fails. Needs
//! `support/redis_server.rs` as the module `redis_server`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::redis_server::redis_server_found;

/// Whether `binary` runs; when it does not, as `redis_server_found` says.
fn found(binary: &str, suite: &str) -> bool {
    if !redis_server_found(suite) {
        return false;
    }
    let ok = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let required = std::env::var("TURNSTILE_REQUIRE_REDIS").is_ok_and(|v| v == "1");
    assert!(
        ok || !required,
        "TURNSTILE_REQUIRE_REDIS=1 but {binary} is not on PATH: install it \
         (apt-get install redis-server redis-sentinel redis-tools)"
    );
    if !ok {
        eprintln!("the {suite} suite did not run: {binary} is not on PATH");
    }
    ok
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A directory of the test's own under the system's temporary one.
fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "turnstile-{what}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Processes killed (by id) when dropped, and their directory removed.
struct Processes {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn redis_server(dir: &std::path::Path, port: u16, extra: &[&str]) -> Child {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts")
}

/// Wait until `port` answers `PING`.
fn answers(port: u16) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if let Ok(mut con) = plain(port)
            && redis::cmd("PING").query::<String>(&mut con).is_ok()
        {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A plain connection to the server on `port`.
pub fn plain(port: u16) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
        .get_connection_with_timeout(Duration::from_secs(2))
}

/// How many times `port`'s server ran EVALSHA since its stats were reset
/// (`INFO commandstats`, `cmdstat_evalsha:calls=N`).
pub fn evalsha_calls(port: u16) -> u64 {
    let mut con = plain(port).expect("the node answers");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// Whether `port`'s server is a replica now (`ROLE`).
pub fn is_replica(port: u16) -> bool {
    let Ok(mut con) = plain(port) else {
        return false;
    };
    let role: redis::RedisResult<Vec<redis::Value>> = redis::cmd("ROLE").query(&mut con);
    matches!(role.as_deref(), Ok([redis::Value::BulkString(role), ..]) if role == b"slave")
}

/// `CONFIG RESETSTAT` on `port`'s server.
pub fn reset_stats(port: u16) {
    let mut con = plain(port).expect("the node answers");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .expect("RESETSTAT");
}

/// Hold every client of `port`'s server for `time` (`CLIENT PAUSE ... ALL`).
pub fn pause(port: u16, time: Duration) {
    let mut con = plain(port).expect("the node answers");
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(time.as_millis() as u64)
        .arg("ALL")
        .query(&mut con)
        .expect("CLIENT PAUSE");
}

/// A three-primary Redis Cluster, no replicas.
pub struct Cluster {
    ports: Vec<u16>,
    _processes: Processes,
}

impl Cluster {
    /// The nodes' ports.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The nodes' addresses, for a `ClusterClientBuilder`.
    pub fn nodes(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect()
    }

    /// The port of the node that serves `key`'s slot.
    pub fn node_of(&self, key: &[u8]) -> u16 {
        self.slot_of(key).0
    }

    /// How many slots `redis-cli --cluster reshard` moves from `key`'s node
    /// before it has moved `key`'s: it takes the node's slots in order.
    pub fn slots_through(&self, key: &[u8]) -> u32 {
        let (_, first, slot) = self.slot_of(key);
        u32::try_from(slot - first + 1).expect("a slot count")
    }

    /// The node serving `key`'s slot, the first slot of its range, and the slot.
    fn slot_of(&self, key: &[u8]) -> (u16, i64, i64) {
        let mut con = plain(self.ports[0]).expect("the node answers");
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut con)
            .expect("KEYSLOT");
        let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut con)
            .expect("SLOTS");
        for range in slots {
            let redis::Value::Array(items) = range else {
                continue;
            };
            let (Some(redis::Value::Int(first)), Some(redis::Value::Int(last))) =
                (items.first(), items.get(1))
            else {
                continue;
            };
            if (*first..=*last).contains(&slot)
                && let Some(redis::Value::Array(node)) = items.get(2)
                && let Some(redis::Value::Int(port)) = node.get(1)
            {
                return (u16::try_from(*port).expect("a port"), *first, slot);
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// Move `count` slots from the node on `from` to the node on `to`
    /// (`redis-cli --cluster reshard`), while the cluster serves.
    pub fn reshard(&self, from: u16, to: u16, count: u32) -> std::process::Output {
        let id = |port: u16| -> String {
            let mut con = plain(port).expect("the node answers");
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut con)
                .expect("MYID")
        };
        Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args(["--cluster-from", &id(from), "--cluster-to", &id(to)])
            .args(["--cluster-slots", &count.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli runs")
    }
}

/// Start a three-primary cluster, or `None` (the test passes) when the
/// binaries are missing and not required.
pub fn cluster(suite: &str) -> Option<Cluster> {
    if !found("redis-cli", suite) {
        return None;
    }
    let dir = scratch("cluster");
    let mut processes = Processes {
        children: Vec::new(),
        dir: dir.clone(),
    };
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    for port in &ports {
        let node_dir = dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).expect("a node directory");
        processes.children.push(redis_server(
            &node_dir,
            *port,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ],
        ));
    }
    for port in &ports {
        assert!(answers(*port), "cluster node {port} did not start");
    }
    let output = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(ports.iter().map(|port| format!("127.0.0.1:{port}")))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli runs");
    assert!(
        output.status.success(),
        "redis-cli --cluster create failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    // Every node agrees before the test starts.
    let start = Instant::now();
    'wait: while start.elapsed() < Duration::from_secs(10) {
        for port in &ports {
            let mut con = plain(*port).expect("the node answers");
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut con)
                .expect("CLUSTER INFO");
            if !info.contains("cluster_state:ok") {
                thread::sleep(Duration::from_millis(50));
                continue 'wait;
            }
        }
        return Some(Cluster {
            ports,
            _processes: processes,
        });
    }
    panic!("the cluster did not become ready");
}

/// The Sentinel service name of [`sentinel`]'s primary.
pub const SERVICE: &str = "turnstile";

/// A primary, its replica, and one Sentinel watching them.
pub struct Sentinel {
    primary: u16,
    replica: u16,
    sentinel: u16,
    _processes: Processes,
}

impl Sentinel {
    /// The Sentinel's address, for a `SentinelClient`.
    pub fn sentinel_address(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.sentinel)
    }

    /// The primary's port at the start.
    pub fn primary(&self) -> u16 {
        self.primary
    }

    /// The replica's port at the start.
    pub fn replica(&self) -> u16 {
        self.replica
    }

    /// The port of the server the Sentinel names as primary now.
    pub fn current_primary(&self) -> u16 {
        let mut con = plain(self.sentinel).expect("the sentinel answers");
        let (_, port): (String, String) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(SERVICE)
            .query(&mut con)
            .expect("the primary's address");
        port.parse().expect("a port")
    }

    /// `SENTINEL FAILOVER`: the replica becomes the primary.
    pub fn failover(&self) {
        let mut con = plain(self.sentinel).expect("the sentinel answers");
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(SERVICE)
            .query(&mut con)
            .expect("SENTINEL FAILOVER");
    }

    /// A `SentinelClient` for the primary.
    pub fn client(&self) -> redis::sentinel::SentinelClient {
        redis::sentinel::SentinelClient::build(
            vec![self.sentinel_address()],
            SERVICE.to_owned(),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .expect("a sentinel client")
    }
}

/// Start a primary, a replica in sync with it and a Sentinel that knows
/// both, or `None` (the test passes) when the binaries are missing and not
/// required.
pub fn sentinel(suite: &str) -> Option<Sentinel> {
    if !found("redis-sentinel", suite) {
        return None;
    }
    let dir = scratch("sentinel");
    let mut processes = Processes {
        children: Vec::new(),
        dir: dir.clone(),
    };
    let (primary, replica, sentinel) = (free_port(), free_port(), free_port());
    processes.children.push(redis_server(&dir, primary, &[]));
    assert!(answers(primary), "the primary did not start");
    let replica_dir = dir.join("replica");
    std::fs::create_dir_all(&replica_dir).expect("a replica directory");
    processes.children.push(redis_server(
        &replica_dir,
        replica,
        &["--replicaof", "127.0.0.1", &primary.to_string()],
    ));
    assert!(answers(replica), "the replica did not start");
    // In sync before the Sentinel starts: it fails over only to a replica
    // it has seen.
    let start = Instant::now();
    loop {
        let mut con = plain(replica).expect("the replica answers");
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut con)
            .expect("INFO");
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the replica did not sync"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let config = dir.join("sentinel.conf");
    std::fs::write(
        &config,
        format!(
            "port {sentinel}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor {SERVICE} 127.0.0.1 {primary} 1\n\
             sentinel down-after-milliseconds {SERVICE} 1000\n\
             sentinel failover-timeout {SERVICE} 5000\n",
            dir.display()
        ),
    )
    .expect("the sentinel's configuration");
    processes.children.push(
        Command::new("redis-sentinel")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-sentinel starts"),
    );
    assert!(answers(sentinel), "the sentinel did not start");
    // The Sentinel has found the replica (it can fail over to it).
    let start = Instant::now();
    loop {
        let mut con = plain(sentinel).expect("the sentinel answers");
        let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(SERVICE)
            .query(&mut con)
            .unwrap_or_default();
        if !replicas.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the sentinel did not find the replica"
        );
        thread::sleep(Duration::from_millis(100));
    }
    Some(Sentinel {
        primary,
        replica,
        sentinel,
        _processes: processes,
    })
}
