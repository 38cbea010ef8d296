//! The HTTP listener against slow and idle clients: a request's head and
//! body each have a deadline, and the listeners hold a bounded number of
//! connections, so that neither a slowloris nor a flood of idle
//! connections takes the service's file descriptors or memory.

mod common;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use turnstile_server::server::ServeLimits;

use common::{Options, descriptor, overall_ok, request, start};

const YAML: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 100 }\n";

fn options(max_connections: usize, timeout: Duration) -> Options {
    let mut limits = ServeLimits::default();
    limits.max_connections = max_connections;
    limits.header_timeout = timeout;
    limits.body_timeout = timeout;
    Options {
        limits,
        ..Options::default()
    }
}

/// Read until the server closes the connection, for at most `within`:
/// what it sent, or `None` if it was still open then.
async fn until_closed(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut answer = Vec::new();
    match tokio::time::timeout(within, stream.read_to_end(&mut answer)).await {
        Ok(_) => Some(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_too_slowly_closes_its_connection() {
    let timeout = Duration::from_millis(300);
    let running = start(&[("d.yaml", YAML)], options(16, timeout)).await;
    let mut slow = TcpStream::connect(running.http).await.expect("connect");
    slow.write_all(b"POST /json HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("a part of the head");
    let began = Instant::now();
    let closed = until_closed(&mut slow, Duration::from_secs(10)).await;
    assert!(
        closed.is_some(),
        "a connection that never finished its head was still open after 10 s"
    );
    assert!(began.elapsed() >= timeout / 2, "closed before its deadline");
    // An idle connection (no byte sent) is closed the same way.
    let mut idle = TcpStream::connect(running.http).await.expect("connect");
    assert!(
        until_closed(&mut idle, Duration::from_secs(10))
            .await
            .is_some()
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_too_slowly_is_answered_408_and_closed() {
    let timeout = Duration::from_millis(300);
    let running = start(&[("d.yaml", YAML)], options(16, timeout)).await;
    let mut slow = TcpStream::connect(running.http).await.expect("connect");
    slow.write_all(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"domain\"")
        .await
        .expect("the head and a part of the body");
    let answer = until_closed(&mut slow, Duration::from_secs(10))
        .await
        .expect("answered and closed within 10 s");
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    // The service still answers.
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, text) = common::http(running.http, "POST", "/json", body).await;
    assert_eq!(status, 200, "{text}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_bound_wait_for_a_slot_and_grpc_is_untouched() {
    let timeout = Duration::from_millis(1_500);
    let mut running = start(&[("d.yaml", YAML)], options(2, timeout)).await;
    // Two connections that hold the HTTP listener's two slots.
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut held = TcpStream::connect(running.http).await.expect("connect");
        held.write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .expect("a part of the head");
        holders.push(held);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let began = Instant::now();
    let third = tokio::spawn(common::http(running.http, "GET", "/healthz", ""));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served while the bound's two were open"
    );
    // The gRPC listener has slots of its own.
    let response = running
        .decide(request("d", vec![descriptor(&[("k", "v")])]))
        .await;
    assert!(overall_ok(&response));
    // The holders' heads time out, their slots free, and the third is served.
    let (status, text) = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("served once a slot freed")
        .expect("the task");
    assert_eq!(status, 200, "{text}");
    assert!(began.elapsed() >= Duration::from_millis(500));
    drop(holders);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_connection_that_never_finishes_its_handshake_gives_its_slot_back() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let timeout = Duration::from_millis(500);
    // Two slots: the test's own client holds one, a stalled connection the
    // other.
    let running = start(&[("d.yaml", YAML)], options(2, timeout)).await;
    // A part of HTTP/2's preface, then nothing.
    let mut idle = TcpStream::connect(running.grpc).await.expect("connect");
    idle.write_all(b"PRI * HTTP/2.0\r\n")
        .await
        .expect("a part of the preface");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let began = Instant::now();
    let asked = tokio::spawn({
        let addr = running.grpc;
        async move {
            let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect");
            client
                .should_rate_limit(request("d", vec![descriptor(&[("k", "v")])]))
                .await
                .expect("an answer")
                .into_inner()
        }
    });
    let answer = tokio::time::timeout(Duration::from_secs(10), asked)
        .await
        .expect("answered once the idle connection's slot came back")
        .expect("the task");
    assert!(overall_ok(&answer));
    assert!(
        began.elapsed() >= timeout / 2,
        "served while both slots were held"
    );
    assert!(
        until_closed(&mut idle, Duration::from_secs(5))
            .await
            .is_some(),
        "the idle connection was closed"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_hold_only_what_they_sent() {
    let timeout = Duration::from_secs(2);
    let running = start(&[("d.yaml", YAML)], options(64, timeout)).await;
    // More slow senders than sixteen whole bodies' turns: each holds the
    // byte it sent, not a body's room.
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut stream = TcpStream::connect(running.http).await.expect("connect");
        stream
            .write_all(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            .await
            .expect("the head and a byte");
        slow.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, text) = common::http(running.http, "POST", "/json", body).await;
    assert_eq!(status, 200, "{text}");
    // A body larger than the message size is refused at its head.
    let mut large = TcpStream::connect(running.http).await.expect("connect");
    large
        .write_all(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
        .await
        .expect("the head");
    let answer = until_closed(&mut large, Duration::from_secs(5))
        .await
        .unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    drop(slow);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_cuts_what_outlasts_its_drain() {
    let mut options = options(16, Duration::from_secs(120));
    options.limits.drain_timeout = Duration::from_millis(300);
    let mut running = start(&[("d.yaml", YAML)], options).await;
    // A request whose body never ends: its deadline (120 s) is far past the
    // drain's.
    let mut stalled = TcpStream::connect(running.http).await.expect("connect");
    stalled
        .write_all(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .await
        .expect("the head and a byte");
    tokio::time::sleep(Duration::from_millis(100)).await;
    running.begin_shutdown();
    let stopped = tokio::time::timeout(Duration::from_secs(10), async {
        while !running.finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(stopped.is_ok(), "the shutdown waited past its drain");
    drop(stalled);
    running.stop().await;
}
