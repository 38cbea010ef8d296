//! The example server, started in-process on an ephemeral port and driven with
//! real HTTP/1.1 requests over TCP: statuses, headers, and that the handlers
//! ran only for admitted requests.

#[path = "../examples/shared/server.rs"]
mod server;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

/// Send raw request bytes on a fresh connection and read the whole reply.
async fn send(addr: SocketAddr, request: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete response");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

async fn get(addr: SocketAddr, path: &str, extra: &str) -> Reply {
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{extra}\r\n");
    send(addr, request.as_bytes()).await
}

async fn start() -> (SocketAddr, Arc<server::Handled>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let handled = Arc::new(server::Handled::default());
    let app = server::app(handled.clone());
    tokio::spawn(async move { server::serve(listener, app).await });
    (addr, handled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_limits_over_real_http() {
    let (addr, handled) = start().await;
    for left in [2, 1, 0] {
        let reply = get(addr, "/api", "x-api-key: k_1\r\n").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.body, "api: served\n");
        assert_eq!(reply.headers["ratelimit-policy"], "\"api\";q=3;w=30");
        assert_eq!(reply.headers["ratelimit"], format!("\"api\";r={left}"));
        assert!(!reply.headers.contains_key("retry-after"));
    }
    let denied = get(addr, "/api", "x-api-key: k_1\r\n").await;
    assert_eq!(denied.status, 429);
    // The next token is due 10 s after the first request: the header rounds
    // the wait up, so it says 10 (9 only if this took over a second).
    let secs: u64 = denied.headers["retry-after"].parse().unwrap();
    assert!((9..=10).contains(&secs), "{secs}");
    assert_eq!(denied.headers["ratelimit"], format!("\"api\";r=0;t={secs}"));
    assert_eq!(denied.body, "");
    // Another key has its own allowance.
    assert_eq!(get(addr, "/api", "x-api-key: k_2\r\n").await.status, 200);
    // The handler ran for the admitted requests only.
    assert_eq!(handled.api.load(Ordering::Relaxed), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_usable_key_is_401_and_never_reaches_the_handler() {
    let (addr, handled) = start().await;
    let long = format!("x-api-key: {}\r\n", "k".repeat(129));
    for extra in ["", "x-api-key:\r\n", "x-api-key:    \r\n", long.as_str()] {
        let reply = get(addr, "/api", extra).await;
        assert_eq!(reply.status, 401, "{extra:?}");
    }
    // A header value that is not visible ASCII: no key, not a 500.
    let reply = send(
        addr,
        b"GET /api HTTP/1.1\r\nHost: test\r\nConnection: close\r\nx-api-key: \xff\xfe\r\n\r\n",
    )
    .await;
    assert_eq!(reply.status, 401);
    assert_eq!(handled.api.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_peer_address_limits_ignore_forged_forwarded_headers() {
    let (addr, handled) = start().await;
    let mut statuses = Vec::new();
    for i in 0..7 {
        // A client claiming a new address each time is still one peer.
        let forged = format!("x-forwarded-for: 198.51.100.{i}\r\n");
        statuses.push(get(addr, "/public", &forged).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(handled.public.load(Ordering::Relaxed), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_per_connection_share_one_limit_under_concurrency() {
    let (addr, handled) = start().await;
    // 20 concurrent connections for one key: axum clones the service for each,
    // and exactly the 3 the bucket holds are served.
    let replies = futures_join(addr, 20).await;
    let ok = replies.iter().filter(|&&s| s == 200).count();
    assert_eq!(ok, 3, "{replies:?}");
    assert!(replies.iter().all(|&s| s == 200 || s == 429), "{replies:?}");
    assert_eq!(handled.api.load(Ordering::Relaxed), 3);
}

async fn futures_join(addr: SocketAddr, n: usize) -> Vec<u16> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move { get(addr, "/api", "x-api-key: shared\r\n").await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.expect("a request task"));
    }
    statuses
}

/// A flood of distinct API keys fills the `/api` limiter; with the server idle
/// afterwards, its own sweeper reclaims every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_is_reclaimed_while_the_server_is_idle() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let handled = Arc::new(server::Handled::default());
    let settings = server::Settings {
        api: turnstile::Quota::new(2, 1, std::time::Duration::from_millis(20)).unwrap(),
        sweep_every: std::time::Duration::from_millis(10),
        ..server::Settings::default()
    };
    let (app, gates) = server::app_with(handled.clone(), settings);
    tokio::spawn(async move { server::serve(listener, app).await });
    for i in 0..300 {
        let reply = get(addr, "/api", &format!("x-api-key: flood-{i}\r\n")).await;
        assert_eq!(reply.status, 200);
    }
    assert_eq!(handled.api.load(Ordering::Relaxed), 300);
    let limiter = gates.api.limiter();
    assert!(limiter.stats().admitted >= 300);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !limiter.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} keys still held",
            limiter.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(limiter.stats().evicted >= 300);
}
