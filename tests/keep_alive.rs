//! A denied request whose body the layer never read must not break the
//! client's keep-alive connection. Over real TCP, on one connection: an
//! admitted request, a denied one (with or without a body), then a third. A
//! denial of a request with a body carries `Connection: close`, arrives whole,
//! and the server then closes; a denial without a body keeps the connection,
//! and the third request is answered on it.
//!
//! The layers run behind `axum::serve` (hyper 1.x through hyper-util), where
//! the unread body used to end the connection after a response that promised
//! keep-alive (see `close_if_body_unread` in `src/http/tower/denial.rs`).
//! The Redis layer's cases need `redis-server`: without it on PATH they say
//! so and pass, unless `TURNSTILE_REQUIRE_REDIS=1` is set.

#[allow(dead_code)]
#[path = "support/redis_server.rs"]
mod redis_server;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing;
use http::header::HeaderName;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use turnstile::RateLimiter;
use turnstile::redis::{Deadlines, Guarded, OnFailure, RedisLimiter, RedisRateLimitLayer};
use turnstile::tower::{ApiKeyHeader, Global, Limits, RateLimitLayer};
use turnstile::{Gate, KeyedLimiter, Quota, TokenBucket};

/// Long enough for a loaded machine; a hang is a failure, not a stuck suite.
const PATIENCE: Duration = Duration::from_secs(10);

/// A router answering "ok" to any method on `/`.
fn app() -> Router {
    Router::new().route("/", routing::any(|| async { "ok" }))
}

/// Serve `app` with `axum::serve` on an ephemeral port.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A server whose every request shares one allowance of 1 an hour: the first
/// is admitted, the rest are 429.
async fn one_allowed() -> SocketAddr {
    let gate = Gate::new(KeyedLimiter::<()>::new(Quota::per_hour(1).unwrap()));
    serve(app().layer(RateLimitLayer::new(gate, Global))).await
}

/// What the denied request carries.
#[derive(Clone, Copy, Debug)]
enum Body {
    /// No body, no framing field.
    None,
    /// `Content-Length: n` and n bytes.
    Sized(usize),
    /// `Transfer-Encoding: chunked`, n bytes in chunks of at most 8 KiB.
    Chunked(usize),
}

impl Body {
    fn request(self, method: &str, extra: &str) -> Vec<u8> {
        let mut raw = format!("{method} / HTTP/1.1\r\nHost: test\r\n{extra}").into_bytes();
        match self {
            Body::None => raw.extend_from_slice(b"\r\n"),
            Body::Sized(n) => {
                raw.extend_from_slice(format!("Content-Length: {n}\r\n\r\n").as_bytes());
                raw.resize(raw.len() + n, b'x');
            }
            Body::Chunked(n) => {
                raw.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                let mut left = n;
                while left > 0 {
                    let chunk = left.min(8192);
                    raw.extend_from_slice(format!("{chunk:x}\r\n").as_bytes());
                    raw.resize(raw.len() + chunk, b'x');
                    raw.extend_from_slice(b"\r\n");
                    left -= chunk;
                }
                raw.extend_from_slice(b"0\r\n\r\n");
            }
        }
        raw
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    }
}

/// Read one whole response (framed by `Content-Length`, as the handler's and
/// the layers' are): an error if the connection ends or resets before it.
async fn read_reply(reader: &mut BufReader<OwnedReadHalf>) -> io::Result<Reply> {
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("status line {line:?}"),
            )
        })?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let field = line.trim_end();
        if field.is_empty() {
            break;
        }
        if let Some((name, value)) = field.split_once(':') {
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    let reply = Reply { status, headers };
    let length: usize = reply
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| io::Error::other("a response without Content-Length"))?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    Ok(reply)
}

/// How the connection fared after the denial.
#[derive(Debug, PartialEq, Eq)]
enum After {
    /// The third request was answered on the same connection.
    KeptAlive,
    /// The denial said `Connection: close`, and the server then closed.
    Closed,
}

async fn send(writer: &mut OwnedWriteHalf, raw: &[u8]) {
    writer.write_all(raw).await.expect("write");
}

async fn reply(reader: &mut BufReader<OwnedReadHalf>) -> Reply {
    timeout(PATIENCE, read_reply(reader))
        .await
        .expect("a reply in time")
        .expect("a whole reply, not a reset before it")
}

/// On one connection to `addr`: `admitted` (answered 200), then `denied`
/// (answered `status`, read whole), then, if the denial did not close the
/// connection, a third request (answered whole).
async fn exchange(addr: SocketAddr, admitted: &[u8], denied: Vec<u8>, status: u16) -> After {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    send(&mut writer, admitted).await;
    assert_eq!(reply(&mut reader).await.status, 200);

    // The body is written while the reply is read: a server that answers
    // first and stops reading must not deadlock the test.
    let sending = tokio::spawn(async move {
        let written = writer.write_all(&denied).await;
        (writer, written)
    });
    let denial = reply(&mut reader).await;
    assert_eq!(denial.status, status);
    if denial.closes() {
        // The server closes once the denial is sent: the denial arrived
        // whole (above), and the next read is the end of the stream. hyper
        // shuts its side down (a FIN) before it drops the socket, so any
        // reset the kernel sends for body bytes the server never read comes
        // after that end, not in place of it.
        let mut rest = Vec::new();
        let end = timeout(PATIENCE, reader.read_to_end(&mut rest))
            .await
            .expect("the server closes in time");
        assert_eq!(end.expect("a clean end of stream, not a reset"), 0);
        assert!(
            rest.is_empty(),
            "{} bytes after a closing response",
            rest.len()
        );
        // The body's write may have failed (broken pipe, reset): the client
        // was told to stop.
        let _ = sending.await;
        return After::Closed;
    }
    let (mut writer, written) = sending.await.expect("the writer task");
    written.expect("the body written on a kept connection");
    send(&mut writer, b"GET / HTTP/1.1\r\nHost: test\r\n\r\n").await;
    let third = reply(&mut reader).await;
    assert!(!third.closes());
    After::KeptAlive
}

const ADMITTED: &[u8] = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n";

const BODIES: [Body; 6] = [
    Body::Sized(16),
    Body::Sized(64 * 1024),
    Body::Sized(1024 * 1024),
    Body::Chunked(16),
    Body::Chunked(64 * 1024),
    Body::Chunked(1024 * 1024),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denial_of_a_request_with_a_body_closes_the_connection_cleanly() {
    for body in BODIES {
        let addr = one_allowed().await;
        let after = exchange(addr, ADMITTED, body.request("POST", ""), 429).await;
        assert_eq!(after, After::Closed, "{body:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denial_without_a_body_keeps_the_connection() {
    for (method, body) in [
        ("GET", Body::None),
        ("POST", Body::None),
        ("POST", Body::Sized(0)),
    ] {
        let addr = one_allowed().await;
        let after = exchange(addr, ADMITTED, body.request(method, ""), 429).await;
        assert_eq!(after, After::KeptAlive, "{method} {body:?}");
    }
}

/// The connection stays usable for as many bodiless denials as the client
/// sends: no `Connection: close` on any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_denials_in_a_row_share_one_connection() {
    let addr = one_allowed().await;
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    for status in [200, 429, 429, 429, 429] {
        send(&mut writer, ADMITTED).await;
        let reply = reply(&mut reader).await;
        assert_eq!(reply.status, status);
        assert!(!reply.closes());
    }
}

/// The layer's 401 (no key) is a denial like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_request_with_a_body_closes_too() {
    let layer = RateLimitLayer::per_key(
        ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
        Quota::per_hour(10).unwrap(),
    );
    let addr = serve(app().layer(layer)).await;
    let admitted = b"GET / HTTP/1.1\r\nHost: test\r\nx-api-key: k_1\r\n\r\n";
    for body in [Body::Sized(64 * 1024), Body::Chunked(16)] {
        let after = exchange(addr, admitted, body.request("POST", ""), 401).await;
        assert_eq!(after, After::Closed, "{body:?}");
    }
    let after = exchange(addr, admitted, Body::None.request("GET", ""), 401).await;
    assert_eq!(after, After::KeptAlive);
}

/// The combined layer's denials (429 and 401) close the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combined_layer_denials_close_only_with_a_body() {
    for body in [Body::Sized(64 * 1024), Body::Chunked(16)] {
        let layer = Limits::builder()
            .limit("all", Global, RateLimiter::new(Quota::per_hour(1).unwrap()))
            .unwrap()
            .build()
            .unwrap();
        let addr = serve(app().layer(layer)).await;
        let after = exchange(addr, ADMITTED, body.request("POST", ""), 429).await;
        assert_eq!(after, After::Closed, "{body:?}");
    }
    let layer = Limits::builder()
        .limit("all", Global, RateLimiter::new(Quota::per_hour(1).unwrap()))
        .unwrap()
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;
    let after = exchange(addr, ADMITTED, Body::None.request("GET", ""), 429).await;
    assert_eq!(after, After::KeptAlive);
}

/// The Redis layer, in exact mode (its 429 is built after the round trip,
/// in the response future) and on a request without a key (its 401 is built
/// in `call`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_layer_denials_close_only_with_a_body() {
    let Some(server) = redis_server::server("keep_alive") else {
        return;
    };
    let connection = || {
        Deadlines::default()
            .connect(Duration::from_secs(2))
            .unwrap()
            .response(Duration::from_secs(2))
            .unwrap()
            .reconnecting(server.client())
    };
    let limit = |prefix: &str| {
        Guarded::<TokenBucket>::new(
            RedisLimiter::new(prefix, TokenBucket::new(Quota::per_hour(1).unwrap())).unwrap(),
            OnFailure::Deny,
            Duration::from_secs(1),
        )
    };

    for (i, (body, after)) in BODIES
        .iter()
        .map(|b| (*b, After::Closed))
        .chain([
            (Body::None, After::KeptAlive),
            (Body::Sized(0), After::KeptAlive),
        ])
        .enumerate()
    {
        let layer = RedisRateLimitLayer::new(limit(&format!("global{i}")), connection(), Global);
        let addr = serve(app().layer(layer)).await;
        let got = exchange(addr, ADMITTED, body.request("POST", ""), 429).await;
        assert_eq!(got, after, "{body:?}");
    }

    let layer = RedisRateLimitLayer::new(
        limit("keys"),
        connection(),
        ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    );
    let addr = serve(app().layer(layer)).await;
    // A key of its own for each connection's admitted request: one an hour.
    let admitted = |key: &str| format!("GET / HTTP/1.1\r\nHost: test\r\nx-api-key: {key}\r\n\r\n");
    let unkeyed = Body::Sized(64 * 1024).request("POST", "");
    let after = exchange(addr, admitted("k_1").as_bytes(), unkeyed, 401).await;
    assert_eq!(after, After::Closed);
    let unkeyed = Body::None.request("GET", "");
    let after = exchange(addr, admitted("k_2").as_bytes(), unkeyed, 401).await;
    assert_eq!(after, After::KeptAlive);
}
