//! The leased mode's decision while a lease is held, for callgrind:
//! `leased-hot keyed|held|held-refresher N`.
//!
//! No Redis runs: the leased limiter's calls go to [`LeaseServer`], a
//! connection that answers every lease script call as Redis does for a
//! bucket that never runs dry (the tokens asked for, all granted). Before
//! measuring, the key's lease is grown to the largest size, `MAX_LEASE`
//! tokens, and a whole one is held; the `N` decisions inside `measured` then
//! spend from it, and `N` is refused if they would take it below half of
//! that (where the prefetch mark may start to be checked against the fetch
//! latency). The program fails if any call reached the connection while
//! measured. `keyed` is the same `N` decisions of an in-process
//! `KeyedLimiter` on one key, with the leased limiter's clock (`RealClock`),
//! every one admitted.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::{ConnectionLike, RedisResult, Value};
use turnstile::redis::{Deadlines, LeasedBuilder, LeasedLimiter, MAX_LEASE, RedisLimiter};
use turnstile::{KeyedLimiter, Quota, TokenBucket};

use crate::measured;

/// A bucket that never runs dry here, and holds the largest lease.
fn plenty() -> Quota {
    Quota::per_second_with_burst(1_000_000_000, MAX_LEASE).expect("a valid quota")
}

/// A connection that answers each lease script call with every token it
/// asked for (`{want, 0, 0, 0}`, `want` its last argument), and counts the
/// calls.
#[derive(Default)]
struct LeaseServer {
    calls: Arc<AtomicU64>,
}

impl LeaseServer {
    /// The last argument of a command packed as RESP: the lease script's
    /// `want`.
    fn want(cmd: &[u8]) -> Option<i64> {
        let last = cmd
            .split(|&b| b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .rfind(|line| !line.is_empty())?;
        std::str::from_utf8(last).ok()?.parse().ok()
    }
}

impl ConnectionLike for LeaseServer {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        // Relaxed: a count read after the measured loop, on this thread.
        self.calls.fetch_add(1, Ordering::Relaxed);
        let want = Self::want(cmd).ok_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Client, "not a lease call"))
        })?;
        Ok(Value::Array(
            [want, 0, 0, 0].into_iter().map(Value::Int).collect(),
        ))
    }

    fn req_packed_commands(
        &mut self,
        _cmd: &[u8],
        _offset: usize,
        _count: usize,
    ) -> RedisResult<Vec<Value>> {
        Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "no pipelines here",
        )))
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

/// A leased limiter whose key `k` holds a whole lease of the largest size,
/// grown there through `con`.
fn held(con: &mut LeaseServer) -> Result<Arc<LeasedLimiter>, String> {
    let global =
        RedisLimiter::new("held", TokenBucket::new(plenty())).map_err(|e| e.to_string())?;
    let limiter = LeasedBuilder::new(global, MAX_LEASE)
        .map_err(|e| e.to_string())?
        .lifetime(Duration::from_secs(3_600))
        // No give-back pass (the refresher's, every idle time) takes the
        // lease while it is measured, however slowly (under callgrind).
        .idle(Duration::from_secs(3_600))
        .build()
        .map_err(|e| e.to_string())?;
    // Each pass spends what the key holds, which takes it below its mark:
    // the prefetch doubles the lease size (spent within a quarter of its
    // lifetime) and brings a whole lease of it.
    for _ in 0..64 {
        let have = limiter.held(b"k");
        if have == MAX_LEASE {
            return Ok(Arc::new(limiter));
        }
        let _ = limiter
            .try_acquire_n(con, b"k", have.max(1))
            .map_err(|e| e.to_string())?;
    }
    Err(format!(
        "the lease did not grow to {MAX_LEASE} tokens (holds {})",
        limiter.held(b"k")
    ))
}

/// `n` decisions on one key inside `measured`: an in-process keyed limiter
/// (`keyed`), or a leased limiter with a lease held, without a refresher
/// (`held`) or with one started (`held-refresher`).
pub(crate) fn run_leased_hot(who: &str, n: u64) -> ExitCode {
    if n > u64::from(MAX_LEASE / 2) {
        eprintln!(
            "N must be at most {}: the decisions spend one lease, above half of it",
            MAX_LEASE / 2
        );
        return ExitCode::FAILURE;
    }
    if who == "keyed" {
        let l = KeyedLimiter::<Vec<u8>>::new(plenty());
        let _ = l.try_acquire(&b"k"[..]);
        measured(n, || l.try_acquire(&b"k"[..]));
        return ExitCode::SUCCESS;
    }
    let mut con = LeaseServer::default();
    let limiter = match held(&mut con) {
        Ok(limiter) => limiter,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let _refresher = match who {
        "held" => None,
        "held-refresher" => {
            // Its connection connects on its first call, which never comes:
            // the measured decisions stay above the prefetch mark.
            let client = match redis::Client::open("redis://127.0.0.1:1/") {
                Ok(client) => client,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            match limiter.start_refresher(Deadlines::default().blocking(client)) {
                Ok(refresher) => refresher,
                Err(e) => {
                    eprintln!("no refresher thread: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        other => {
            eprintln!("unknown limiter {other:?}: keyed|held|held-refresher");
            return ExitCode::FAILURE;
        }
    };
    // Relaxed: counts written on this thread.
    let before = con.calls.load(Ordering::Relaxed);
    measured(n, || limiter.try_acquire(&mut con, b"k").ok());
    let calls = con.calls.load(Ordering::Relaxed) - before;
    let left = limiter.held(b"k");
    eprintln!("leased-hot {who}: {calls} calls while measured; {left} tokens held after");
    if calls != 0 || u64::from(left) + n != u64::from(MAX_LEASE) {
        eprintln!("the measured decisions did not all spend from the lease held");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
