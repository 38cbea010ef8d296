//! The example server, started in-process on an ephemeral port and driven with
//! real HTTP/1.1 requests over TCP: statuses, headers (the `RateLimit` fields
//! parsed as the structured-field Lists they are), and that the handlers ran
//! only for admitted requests; and the layer's hooks (a global key, RFC 7239
//! `Forwarded`, a missing peer address) on small routers served alike.

#[path = "../examples/shared/server.rs"]
mod server;

#[allow(dead_code)]
#[path = "support/fields.rs"]
mod fields;

use fields::{names, param, parse_list as list};

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use turnstile::tower::{ForwardedFor, Global, IpNet, PeerIp, RateLimitLayer};
use turnstile::{Gate, KeyedLimiter, Quota};

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
    start_with(server::Settings::default()).await
}

async fn start_with(settings: server::Settings) -> (SocketAddr, Arc<server::Handled>) {
    let handled = Arc::new(server::Handled::default());
    let (app, _) = server::app_with(handled.clone(), settings);
    (serve(app).await, handled)
}

/// Serve `app` as the example does, on an ephemeral port.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { server::serve(listener, app).await });
    addr
}

async fn request(addr: SocketAddr, method: &str, path: &str, extra: &str) -> Reply {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: 0\r\n{extra}\r\n"
    );
    send(addr, request.as_bytes()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_limits_over_real_http() {
    let (addr, handled) = start().await;
    for left in [2, 1, 0] {
        let reply = get(addr, "/api", "x-api-key: k_1\r\n").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.body, "api: served\n");
        // One item per limit, the key's own first: derived from the quotas.
        assert_eq!(
            reply.headers["ratelimit-policy"],
            "\"api.free\";q=3;w=30, \"ip\";q=1000;w=10, \"all\";q=10000;w=10"
        );
        let value = list(&reply.headers["ratelimit"]);
        assert_eq!(names(&value), ["api.free", "ip", "all"]);
        assert_eq!(value[0].1, BTreeMap::from([("r".to_owned(), left)]));
        assert!(!reply.headers.contains_key("retry-after"));
    }
    let denied = get(addr, "/api", "x-api-key: k_1\r\n").await;
    assert_eq!(denied.status, 429);
    // The next token is due 10 s after the first request: the header rounds
    // the wait up, so it says 10 (9 only if this took over a second).
    let secs: i64 = denied.headers["retry-after"].parse().unwrap();
    assert!((9..=10).contains(&secs), "{secs}");
    let value = list(&denied.headers["ratelimit"]);
    assert_eq!(param(&value, "api.free", "r"), Some(0));
    assert_eq!(param(&value, "api.free", "t"), Some(secs));
    // RFC 9457 problem details from the app's denial hook.
    assert_eq!(denied.headers["content-type"], "application/problem+json");
    assert_eq!(
        denied.body,
        format!(
            "{{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"retry after {secs} s\"}}"
        )
    );
    // Another key has its own allowance.
    assert_eq!(get(addr, "/api", "x-api-key: k_2\r\n").await.status, 200);
    // The handler ran for the admitted requests only.
    assert_eq!(handled.api.load(Ordering::Relaxed), 4);
}

/// One combined layer, three limits told apart over real HTTP: each key is
/// told its own tier's policy, a 429 carries one item per limit, and a
/// request the per-key limit refuses spends nothing in the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_per_address_and_global_limits_in_one_layer_over_real_http() {
    // The per-address and global limits refill too slowly to move during the
    // test: what they hold is exact.
    let hourly = |n| Quota::new(n, 1, Duration::from_secs(3600)).unwrap();
    let settings = server::Settings {
        api_per_ip: hourly(50),
        api_global: hourly(100),
        ..server::Settings::default()
    };
    let handled = Arc::new(server::Handled::default());
    let (app, gates) = server::app_with(handled.clone(), settings);
    let addr = serve(app).await;

    let paid = get(addr, "/api", "x-api-key: k_paid_1\r\n").await;
    assert_eq!(paid.status, 200);
    let (policy, value) = (
        list(&paid.headers["ratelimit-policy"]),
        list(&paid.headers["ratelimit"]),
    );
    assert_eq!(names(&policy), ["api.paid", "ip", "all"]);
    assert_eq!(names(&value), ["api.paid", "ip", "all"]);
    assert_eq!(param(&policy, "api.paid", "q"), Some(30));
    assert_eq!(param(&policy, "api.paid", "w"), Some(30));
    assert_eq!(param(&value, "api.paid", "r"), Some(29));
    assert_eq!(param(&value, "ip", "r"), Some(49));
    assert_eq!(param(&value, "all", "r"), Some(99));

    for (left, all) in [(2, 98), (1, 97), (0, 96)] {
        let free = get(addr, "/api", "x-api-key: k_free_1\r\n").await;
        assert_eq!(free.status, 200);
        let (policy, value) = (
            list(&free.headers["ratelimit-policy"]),
            list(&free.headers["ratelimit"]),
        );
        assert_eq!(names(&policy), ["api.free", "ip", "all"]);
        assert_eq!(param(&policy, "api.free", "q"), Some(3));
        assert_eq!(param(&policy, "api.free", "w"), Some(30));
        assert_eq!(param(&value, "api.free", "r"), Some(left));
        assert_eq!(param(&value, "all", "r"), Some(all));
    }
    assert_eq!(gates.api_global.remaining(), 96);

    // The free key's fourth: refused by its own limit, told by all three.
    let denied = get(addr, "/api", "x-api-key: k_free_1\r\n").await;
    assert_eq!(denied.status, 429);
    let (policy, value) = (
        list(&denied.headers["ratelimit-policy"]),
        list(&denied.headers["ratelimit"]),
    );
    assert_eq!(names(&policy), ["api.free", "ip", "all"]);
    assert_eq!(names(&value), ["api.free", "ip", "all"]);
    let secs: i64 = denied.headers["retry-after"].parse().unwrap();
    assert_eq!(param(&value, "api.free", "r"), Some(0));
    assert_eq!(
        param(&value, "api.free", "t"),
        Some(secs),
        "its wait is the answer's"
    );
    // The other limits admitted it, then took nothing: what they held before.
    assert_eq!(param(&value, "ip", "r"), Some(46));
    assert_eq!(param(&value, "ip", "t"), None);
    assert_eq!(param(&value, "all", "r"), Some(96));
    assert_eq!(gates.api_global.remaining(), 96);
    assert_eq!(gates.api_ips.remaining(&"127.0.0.1".parse().unwrap()), 46);
    for (name, params) in &value {
        assert!(
            params["r"] <= param(&policy, name, "q").unwrap(),
            "{name}: r above q"
        );
    }

    // The paid key is untouched by the free key's refusal.
    let paid = get(addr, "/api", "x-api-key: k_paid_1\r\n").await;
    assert_eq!(paid.status, 200);
    let value = list(&paid.headers["ratelimit"]);
    assert_eq!(param(&value, "api.paid", "r"), Some(28));
    assert_eq!(param(&value, "all", "r"), Some(95));
    assert_eq!(gates.api_keys.tier_name("k_paid_1"), "paid");
    assert_eq!(gates.api_keys.len(), 2);
    assert_eq!(handled.api.load(Ordering::Relaxed), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_usable_key_is_401_and_never_reaches_the_handler() {
    let (addr, handled) = start().await;
    let long = format!("x-api-key: {}\r\n", "k".repeat(129));
    for extra in [
        "",
        "x-api-key:\r\n",
        "x-api-key:    \r\n",
        long.as_str(),
        // Not well formed: the app's validator refuses it.
        "x-api-key: k 1\r\n",
    ] {
        let reply = get(addr, "/api", extra).await;
        assert_eq!(reply.status, 401, "{extra:?}");
        // RFC 9110: a 401 carries a challenge.
        assert_eq!(
            reply.headers["www-authenticate"],
            "ApiKey header=\"x-api-key\""
        );
        assert_eq!(reply.headers["content-type"], "application/problem+json");
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
    // Every flood key is a free one: the free tier holds them.
    let per_key = &gates.api_keys;
    let free = || per_key.tier_stats()[0].1;
    assert_eq!(per_key.tier_stats()[0].0, "free");
    assert!(free().admitted >= 300);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !per_key.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} keys still held",
            per_key.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(free().evicted >= 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_issued_api_keys_are_served_when_the_app_knows_them() {
    let settings = server::Settings {
        known_api_keys: Some(["k_issued".to_string()].into()),
        ..server::Settings::default()
    };
    let (addr, handled) = start_with(settings).await;
    let forged = get(addr, "/api", "x-api-key: k_forged\r\n").await;
    assert_eq!(forged.status, 401);
    assert_eq!(
        forged.headers["www-authenticate"],
        "ApiKey header=\"x-api-key\""
    );
    assert_eq!(
        get(addr, "/api", "x-api-key: k_issued\r\n").await.status,
        200
    );
    assert_eq!(handled.api.load(Ordering::Relaxed), 1);
}

/// A method the route does not serve is a 405 that spends no allowance: the
/// limiters are route layers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_not_allowed_spends_no_allowance() {
    let (addr, handled) = start().await;
    for (path, extra) in [("/api", "x-api-key: k_1\r\n"), ("/public", "")] {
        for method in ["POST", "DELETE", "PUT", "PATCH"] {
            let reply = request(addr, method, path, extra).await;
            assert_eq!(reply.status, 405, "{method} {path}");
        }
    }
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get(addr, "/api", "x-api-key: k_1\r\n").await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(get(addr, "/public", "").await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert_eq!(handled.api.load(Ordering::Relaxed), 3);
    assert_eq!(handled.public.load(Ordering::Relaxed), 5);
}

/// A client that sends its header section a byte at a time is disconnected
/// once the header read timeout has passed, while it is still sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_section_is_cut_off_at_the_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (app, _) = server::app_with(
        Arc::new(server::Handled::default()),
        server::Settings::default(),
    );
    let timeout = Duration::from_secs(1);
    tokio::spawn(async move { server::serve_with(listener, app, timeout).await });

    // A prompt request on the same server is served.
    assert_eq!(get(addr, "/public", "").await.status, 200);

    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /public HTTP/1.1\r\nHost: test\r\n")
        .await
        .expect("write");
    let (mut reader, mut writer) = stream.into_split();
    // Keep dribbling header bytes for far longer than the timeout.
    let dribble = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if writer.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), reader.read_to_end(&mut rest)).await;
    let elapsed = started.elapsed();
    assert!(
        read.is_ok(),
        "the connection was still open after {elapsed:?}"
    );
    assert!(
        elapsed >= timeout,
        "closed after {elapsed:?}, before the timeout"
    );
    assert!(
        elapsed < timeout + Duration::from_secs(2),
        "closed only after {elapsed:?}"
    );
    // No request was ever handled on it: at most an error status came back.
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text:?}"
    );
    dribble.abort();
}

/// One limit shared by every request, whatever key or client it carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_limit_over_real_http() {
    let served = Arc::new(AtomicU64::new(0));
    let counted = served.clone();
    let gate = Gate::new(KeyedLimiter::<()>::new(
        Quota::new(2, 1, Duration::from_secs(60)).unwrap(),
    ))
    .with_derived_policy("everyone")
    .unwrap();
    let app = Router::new().route(
        "/report",
        routing::get(move || async move {
            counted.fetch_add(1, Ordering::Relaxed);
            "report\n"
        })
        .route_layer(RateLimitLayer::new(gate, Global)),
    );
    let addr = serve(app).await;
    let mut statuses = Vec::new();
    for extra in [
        "x-api-key: a\r\n",
        "x-api-key: b\r\n",
        "forwarded: for=192.0.2.1\r\n",
        "",
    ] {
        let reply = get(addr, "/report", extra).await;
        if reply.status == 200 {
            assert_eq!(reply.headers["ratelimit-policy"], "\"everyone\";q=2;w=120");
        }
        statuses.push(reply.status);
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(served.load(Ordering::Relaxed), 2);
}

/// Behind a trusted proxy (here the loopback peer), RFC 7239 `Forwarded`
/// names the client: each has its own allowance, and an obfuscated node falls
/// back to the proxy's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc7239_forwarded_clients_over_real_http() {
    let proxies: Vec<IpNet> = vec!["127.0.0.1".parse().unwrap()];
    let limiter = KeyedLimiter::new(Quota::new(1, 1, Duration::from_secs(60)).unwrap());
    let layer = RateLimitLayer::new(
        Gate::new(limiter),
        ForwardedFor::rfc7239(PeerIp::connect_info(), proxies),
    );
    let gate = layer.gate().clone();
    let app = Router::new().route("/", routing::get(|| async { "ok\n" }).route_layer(layer));
    let addr = serve(app).await;
    let mut statuses = Vec::new();
    for forwarded in [
        "for=192.0.2.60;proto=http;by=203.0.113.43",
        "for=192.0.2.60",
        "for=\"[2001:db8:cafe::17]:4711\"",
        "for=198.51.100.1, for=_hidden",
        "for=unknown",
    ] {
        let reply = get(addr, "/", &format!("forwarded: {forwarded}\r\n")).await;
        statuses.push(reply.status);
    }
    assert_eq!(statuses, [200, 429, 200, 200, 429]);
    let limiter = gate.limiter();
    assert_eq!(
        limiter.len(),
        3,
        "192.0.2.60, 2001:db8:cafe::/48 and the proxy"
    );
    assert_eq!(limiter.remaining(&"127.0.0.1".parse().unwrap()), 0);
}

/// A per-IP route served without connect info: every request is a 500 that
/// names the misconfiguration, never a silent 401, and no handler runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_peer_addresses_is_reported_as_misconfigured() {
    let served = Arc::new(AtomicU64::new(0));
    let counted = served.clone();
    let limiter = KeyedLimiter::new(Quota::new(5, 1, Duration::from_secs(60)).unwrap());
    let app = Router::new().route(
        "/",
        routing::get(move || async move {
            counted.fetch_add(1, Ordering::Relaxed);
            "ok\n"
        })
        .route_layer(RateLimitLayer::new(
            Gate::new(limiter),
            PeerIp::connect_info(),
        )),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    // `axum::serve` without `into_make_service_with_connect_info`.
    tokio::spawn(async move { axum::serve(listener, app).await });
    for _ in 0..2 {
        let reply = get(addr, "/", "").await;
        assert_eq!(reply.status, 500);
        assert!(
            reply.body.contains("no peer-address extension"),
            "{}",
            reply.body
        );
        assert!(
            reply.body.contains("into_make_service_with_connect_info"),
            "{}",
            reply.body
        );
    }
    assert_eq!(served.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_scraped_with_the_exact_counts_of_known_traffic() {
    let settings = server::Settings {
        api_max_keys: 2,
        ..server::Settings::default()
    };
    let (addr, handled) = start_with(settings).await;
    // /api: k_1 five times (3 admitted, 2 denied), k_2 once, k_3 refused at
    // the bound of 2 keys, twice without a key, once with a malformed key.
    for _ in 0..5 {
        get(addr, "/api", "x-api-key: k_1\r\n").await;
    }
    get(addr, "/api", "x-api-key: k_2\r\n").await;
    assert_eq!(get(addr, "/api", "x-api-key: k_3\r\n").await.status, 503);
    get(addr, "/api", "").await;
    get(addr, "/api", "").await;
    assert_eq!(
        get(addr, "/api", "x-api-key: no/slashes\r\n").await.status,
        401
    );
    // A 405 is not a decision and is not counted.
    assert_eq!(
        request(addr, "POST", "/api", "x-api-key: k_1\r\n")
            .await
            .status,
        405
    );
    // /public: this peer, 7 times (5 admitted, 2 denied).
    for _ in 0..7 {
        get(addr, "/public", "").await;
    }
    let scrape = get(addr, "/metrics", "").await;
    assert_eq!(scrape.status, 200);
    assert!(scrape.headers["content-type"].starts_with("text/plain"));
    for line in [
        r#"turnstile_responses_total{limiter="api",status="200"} 4"#,
        r#"turnstile_responses_total{limiter="api",status="429"} 2"#,
        r#"turnstile_responses_total{limiter="api",status="503"} 1"#,
        r#"turnstile_responses_total{limiter="api",status="401"} 3"#,
        r#"turnstile_responses_total{limiter="api",status="500"} 0"#,
        r#"turnstile_keys{limiter="api.keys"} 2"#,
        r#"turnstile_keys{limiter="api.ip"} 1"#,
        r#"turnstile_responses_total{limiter="public",status="200"} 5"#,
        r#"turnstile_responses_total{limiter="public",status="429"} 2"#,
        r#"turnstile_keys{limiter="public"} 1"#,
    ] {
        assert!(
            scrape.body.lines().any(|l| l == line),
            "missing {line:?} in:\n{}",
            scrape.body
        );
    }
    assert_eq!(handled.api.load(Ordering::Relaxed), 4);
    assert_eq!(handled.public.load(Ordering::Relaxed), 5);
}

/// IPv6 clients behind a trusted proxy, over real TCP: by default every
/// address of one /48 is one key, so one holder rotating through its /64s
/// cannot fill the key bound; grouped by /64 the same rotation fills it and the
/// next client, from another network, is refused with 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slash_48_rotating_its_addresses_cannot_fill_the_key_bound() {
    async fn run(peer: PeerIp<axum::extract::ConnectInfo<SocketAddr>>) -> (Vec<u16>, u16) {
        let proxies: Vec<IpNet> = vec!["127.0.0.1".parse().unwrap()];
        let limiter = KeyedLimiter::builder(Quota::per_minute(1_000).unwrap())
            .max_keys(8)
            .build()
            .unwrap();
        let layer = RateLimitLayer::new(Gate::new(limiter), ForwardedFor::new(peer, proxies));
        let app = Router::new().route("/", routing::get(|| async { "ok\n" }).route_layer(layer));
        let addr = serve(app).await;
        let mut statuses = Vec::new();
        // Twenty /64s of 2001:db8:1::/48.
        for subnet in 0..20 {
            let header = format!("x-forwarded-for: 2001:db8:1:{subnet:x}::1\r\n");
            statuses.push(get(addr, "/", &header).await.status);
        }
        let newcomer = get(addr, "/", "x-forwarded-for: 2001:db8:2::1\r\n")
            .await
            .status;
        (statuses, newcomer)
    }
    let (statuses, newcomer) = run(PeerIp::connect_info()).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(newcomer, 200, "by /48: one key for the whole rotation");
    let (statuses, newcomer) = run(PeerIp::connect_info().ipv6_prefix(64).unwrap()).await;
    assert_eq!(
        statuses.iter().filter(|&&s| s == 503).count(),
        12,
        "{statuses:?}"
    );
    assert_eq!(newcomer, 503, "by /64: the rotation filled the bound of 8");
}
