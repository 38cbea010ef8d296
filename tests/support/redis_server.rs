//! A `redis-server` of a test's own, for the suites that run against a real
//! Redis: started on a free port, killed (by the process id it was started
//! with) when dropped. Without `redis-server` on PATH a test says so and
//! passes, unless `TURNSTILE_REQUIRE_REDIS=1` is set (CI sets it), when it
//! fails.

use std::io::Write;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::Client;

/// A `redis-server` of the test's own, killed (`SIGKILL`, by the process id
/// it was started with) when dropped.
pub struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stop the server's process (`SIGSTOP`): connections stay open and
    /// commands queue, unanswered, until [`resume`](Self::resume).
    pub fn stop(&self) {
        self.signal("-STOP");
    }

    /// Let a [`stop`](Self::stop)ped server run again (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} of the test server");
    }

    pub fn client(&self) -> Client {
        Client::open(format!("redis://127.0.0.1:{}/", self.port)).expect("a valid address")
    }

    /// A connection with deadlines generous enough for a loaded CI machine.
    pub fn connection(&self) -> turnstile::redis::BlockingConnection {
        turnstile::redis::Deadlines::default()
            .connect(Duration::from_secs(2))
            .expect("valid deadlines")
            .response(Duration::from_secs(2))
            .expect("valid deadlines")
            .blocking(self.client())
    }

    /// Holds every client's commands for `time` (`CLIENT PAUSE ... ALL`: no
    /// reply comes until it ends, as if Redis hung). In effect when this
    /// returns, whatever the scheduling, where a `DEBUG SLEEP` sent from
    /// another thread has begun only at some later point.
    pub fn pause(&self, time: Duration) -> Paused {
        let mut con = self.plain();
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(time.as_millis() as u64)
            .arg("ALL")
            .query(&mut con)
            .expect("the test server pauses");
        Paused { con }
    }

    /// A plain connection for looking at the server's state.
    pub fn plain(&self) -> redis::Connection {
        self.client()
            .get_connection()
            .expect("the test server answers")
    }
}

/// A pause of the server's clients ([`Server::pause`]).
#[must_use = "a pause ends on its own; `wait` for it where the test needs Redis back"]
pub struct Paused {
    con: redis::Connection,
}

impl Paused {
    /// Wait until the server answers again: the pause is over (Redis lets
    /// paused clients go on its next tick, up to 100 ms after the pause's
    /// time), or the server is gone.
    pub fn wait(mut self) {
        let _: redis::RedisResult<String> = redis::cmd("PING").query(&mut self.con);
    }
}

/// Whether `redis-server` is on PATH: when it is not, say that `suite` did
/// not run (the test passes), or fail when it is required.
pub fn redis_server_found(suite: &str) -> bool {
    let required = std::env::var("TURNSTILE_REQUIRE_REDIS").is_ok_and(|v| v == "1");
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            !required,
            "TURNSTILE_REQUIRE_REDIS=1 but redis-server is not on PATH: \
             install it (apt-get install redis-server)"
        );
        // Straight to stderr, past the test harness's capture, so that the
        // line shows although the test passes.
        let _ = writeln!(
            std::io::stderr(),
            "the {suite} suite did not run: redis-server is not on PATH. Install it \
             (apt-get install redis-server) and run `cargo test -p turnstile-dev --test {suite}`; \
             TURNSTILE_REQUIRE_REDIS=1 makes its absence a failure"
        );
    }
    found
}

/// A server on `port`, once it answers; `None` if it exits first (the port
/// was taken) or does not answer within 5 s.
pub fn spawn_on(port: u16) -> Option<Server> {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    let mut server = Server { child, port };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = server.child.try_wait() {
            return None;
        }
        // The server that answers must be this one: another test's may hold
        // the port, and this one then exits.
        if let Ok(mut con) = server.client().get_connection()
            && let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut con)
        {
            let id = format!("process_id:{}", server.child.id());
            if info.lines().any(|l| l.trim() == id) {
                return Some(server);
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Start a server on a free port, or say why `suite` cannot run: `None`
/// (the test passes) when `redis-server` is missing, a failure when it is
/// required.
pub fn server(suite: &str) -> Option<Server> {
    if !redis_server_found(suite) {
        return None;
    }
    // A free port, taken again by the server; another process may take it in
    // between, so try a few.
    for _ in 0..5 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        if let Some(server) = spawn_on(port) {
            return Some(server);
        }
    }
    panic!("redis-server did not start on any of 5 ports");
}

/// A connection to a Redis that never answers well: every call takes its
/// duration (zero: fails at once, as an unreachable server), then fails
/// with an I/O error.
pub struct FailingAfter(pub Duration);

impl redis::ConnectionLike for FailingAfter {
    fn req_packed_command(&mut self, _: &[u8]) -> redis::RedisResult<redis::Value> {
        thread::sleep(self.0);
        Err(std::io::Error::other("unreachable").into())
    }
    fn req_packed_commands(
        &mut self,
        _: &[u8],
        _: usize,
        _: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        thread::sleep(self.0);
        Err(std::io::Error::other("unreachable").into())
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
