//! envoyproxy/ratelimit's environment variables as the binary's defaults.

#![allow(missing_docs)]

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use turnstile_server::service::{EnvoyHeaderNames, ResponseHeaders};
use turnstile_server::settings::{Defaults, from_env};

fn env(vars: &[(&str, &str)]) -> Result<Defaults, String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    from_env(|name| vars.get(name).cloned())
}

#[test]
fn envoyproxy_ratelimits_defaults() {
    let defaults = env(&[]).unwrap();
    assert_eq!(defaults.grpc, "0.0.0.0:8081".parse::<SocketAddr>().unwrap());
    assert_eq!(defaults.http, "0.0.0.0:8080".parse::<SocketAddr>().unwrap());
    let runtime = std::path::Path::new("/srv/runtime_data/current/config");
    assert_eq!(
        defaults.config,
        runtime.is_dir().then(|| runtime.to_path_buf())
    );
    assert_eq!(defaults.response_headers, ResponseHeaders::Off);
    assert!(defaults.warnings.is_empty());
    // Empty is unset.
    assert_eq!(env(&[("PORT", ""), ("HOST", "")]).unwrap(), defaults);
    // A Redis setting with no `REDIS_URL`: envoyproxy/ratelimit would count
    // in Redis at its nutcracker socket; here each replica counts alone,
    // and says so.
    let alone = env(&[("BACKEND_TYPE", "redis"), ("REDIS_SOCKET_TYPE", "tcp")]).unwrap();
    assert_eq!(alone.redis, None);
    assert_eq!(alone.warnings.len(), 1, "{:?}", alone.warnings);
    assert!(alone.warnings[0].starts_with("REDIS_URL is not set"));
}

#[test]
fn the_variables_give_the_defaults() {
    let d = env(&[
        ("HOST", "127.0.0.1"),
        ("PORT", "9080"),
        ("GRPC_HOST", "::1"),
        ("GRPC_PORT", "9081"),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_RESET_HEADER", "X-Reset"),
    ])
    .unwrap();
    assert_eq!(d.http, "127.0.0.1:9080".parse::<SocketAddr>().unwrap());
    assert_eq!(d.grpc, "[::1]:9081".parse::<SocketAddr>().unwrap());
    assert_eq!(d.config, Some(PathBuf::from("/data/ratelimit/config")));
    assert_eq!(
        d.response_headers,
        ResponseHeaders::Envoy(EnvoyHeaderNames {
            reset: "X-Reset".to_string(),
            ..EnvoyHeaderNames::default()
        })
    );
    let d = env(&[
        ("RUNTIME_ROOT", "/srv"),
        ("RUNTIME_APPDIRECTORY", "limits"),
        ("HOST", "localhost"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "0"),
    ])
    .unwrap();
    assert_eq!(d.config, Some(PathBuf::from("/srv/limits")));
    assert!(d.http.ip().is_loopback(), "{}", d.http);
    assert_eq!(d.response_headers, ResponseHeaders::Off);
}

#[test]
fn what_cannot_be_read_or_served_is_refused_by_name() {
    for (vars, says) in [
        (&[("PORT", "http")][..], "PORT=http"),
        (&[("GRPC_PORT", "70000")][..], "GRPC_PORT=70000"),
        (
            &[("LIMIT_RESPONSE_HEADERS_ENABLED", "yes")][..],
            "LIMIT_RESPONSE_HEADERS_ENABLED=yes",
        ),
        (
            &[("LIMIT_LIMIT_HEADER", "Rate Limit")][..],
            "LIMIT_LIMIT_HEADER",
        ),
        (
            &[("LIMIT_REMAINING_HEADER", "a:b")][..],
            "LIMIT_REMAINING_HEADER",
        ),
        (&[("GRPC_UDS", "/tmp/rl.sock")][..], "GRPC_UDS"),
        (
            &[("GRPC_SERVER_USE_TLS", "true")][..],
            "GRPC_SERVER_USE_TLS",
        ),
    ] {
        let error = env(vars).expect_err(says);
        assert!(error.contains(says), "{error}");
    }
    let d = env(&[
        ("REDIS_PERSECOND", "true"),
        ("REDIS_URL", "redis:6379"),
        ("MERGE_DOMAIN_CONFIG", "1"),
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
    ])
    .unwrap();
    assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
    assert!(
        d.warnings[0].starts_with("REDIS_PERSECOND=true is not read"),
        "{:?}",
        d.warnings
    );
    // Read: files naming one domain are merged, and descriptors spend
    // together or not at all.
    assert!(d.merge_domains);
    assert!(d.stop_increments);
    assert!(!env(&[]).unwrap().merge_domains);
    assert!(!env(&[]).unwrap().stop_increments);
}

/// A deployment of envoyproxy/ratelimit counts in Redis (its default
/// backend) and its replicas share the counts there: the variables that
/// name that Redis give `--redis`, so a replica started from them does not
/// count on its own (they were reported as not read, and each replica
/// admitted the whole limit).
#[test]
fn the_redis_variables_name_the_redis_the_replicas_share() {
    let redis = |vars: &[(&str, &str)]| env(vars).map(|d| d.redis);
    assert_eq!(redis(&[]).unwrap(), None);
    assert_eq!(redis(&[("REDIS_SOCKET_TYPE", "tcp")]).unwrap(), None);
    // envoyproxy/ratelimit's socket type is `unix` unless told.
    assert_eq!(
        redis(&[("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")]).unwrap(),
        Some("redis+unix:///var/run/nutcracker/ratelimit.sock".to_string())
    );
    assert_eq!(
        redis(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")]).unwrap(),
        Some("redis://redis:6379".to_string())
    );
    assert_eq!(
        redis(&[
            ("REDIS_SOCKET_TYPE", "TCP"),
            ("REDIS_URL", "redis:6379"),
            ("REDIS_AUTH", "p@ss:w/rd"),
            ("REDIS_TYPE", "single"),
        ])
        .unwrap(),
        Some("redis://p%40ss:w%2Frd@redis:6379".to_string())
    );
    assert_eq!(
        redis(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "a:7000, b:7001"),
            ("REDIS_AUTH", "secret"),
            ("REDIS_TYPE", "CLUSTER"),
        ])
        .unwrap(),
        Some("redis+cluster://:secret@a:7000,:secret@b:7001".to_string())
    );
    assert_eq!(
        redis(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ("REDIS_TYPE", "SENTINEL"),
        ])
        .unwrap(),
        Some("redis+sentinel://s1:26379,s2:26379/mymaster".to_string())
    );
    assert_eq!(
        redis(&[("REDIS_URL", "/run/redis.sock"), ("REDIS_AUTH", "u:p w")]).unwrap(),
        Some("redis+unix:///run/redis.sock?user=u&pass=p%20w".to_string())
    );
    // `BACKEND_TYPE=redis` is the default, spelt out.
    assert_eq!(
        redis(&[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "r:1")
        ])
        .unwrap(),
        Some("redis://r:1".to_string())
    );
    // What is not served, or cannot be read, is refused by name, with what to give.
    for (vars, says) in [
        (&[("BACKEND_TYPE", "memcache")][..], "BACKEND_TYPE=memcache"),
        (&[("BACKEND_TYPE", "dynamo")][..], "BACKEND_TYPE=dynamo"),
        (
            &[("REDIS_URL", "r:1"), ("REDIS_TLS", "true")][..],
            "REDIS_TLS=true",
        ),
        (
            &[("REDIS_URL", "r:1"), ("REDIS_SOCKET_TYPE", "udp")][..],
            "REDIS_SOCKET_TYPE=udp",
        ),
        (
            &[("REDIS_URL", "r:1"), ("REDIS_TYPE", "CLUSTER")][..],
            "REDIS_SOCKET_TYPE=tcp",
        ),
        (
            &[
                ("REDIS_URL", "mymaster"),
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_SOCKET_TYPE", "tcp"),
            ][..],
            "REDIS_URL=mymaster",
        ),
        (
            &[("REDIS_URL", "r:1"), ("REDIS_TYPE", "ring")][..],
            "REDIS_TYPE=ring",
        ),
    ] {
        let error = env(vars).expect_err(says);
        assert!(error.contains(says), "{error}");
    }
    let error = env(&[("BACKEND_TYPE", "memcache")]).unwrap_err();
    assert!(
        error.contains("--redis URL") && error.contains("--redis off"),
        "{error}"
    );
    // Per-second limits in a Redis of their own are not served: counted in
    // `REDIS_URL`'s, and said so.
    let d = env(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "r:1"),
        ("REDIS_PERSECOND", "true"),
    ])
    .unwrap();
    assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
    assert!(
        d.warnings[0].starts_with("REDIS_PERSECOND=true"),
        "{:?}",
        d.warnings
    );
}

#[test]
fn shadow_mode_is_read() {
    assert!(!env(&[]).unwrap().shadow_mode);
    assert!(env(&[("SHADOW_MODE", "true")]).unwrap().shadow_mode);
    assert!(env(&[("SHADOW_MODE", "on")]).is_err());
}

/// A configuration directory at `dir`: domain `d`, five a minute per `k`.
fn write_config(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("d.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    )
    .unwrap();
}

/// The binary with envoyproxy/ratelimit's environment and no flag: its
/// listeners, its configuration directory, its health check and header
/// fields.
#[test]
fn the_binary_starts_from_envoyproxy_ratelimits_environment() {
    let root = std::env::temp_dir().join(format!("turnstile-env-{}", std::process::id()));
    let dir = root.join("ratelimit").join("config");
    write_config(&dir);
    // A second file for the same domain, merged by `MERGE_DOMAIN_CONFIG`.
    std::fs::write(
        dir.join("e.yaml"),
        "domain: d\ndescriptors:\n  - key: k2\n    rate_limit: { unit: hour, requests_per_unit: 7 }\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnstile-server"))
        .env_clear()
        .env("MERGE_DOMAIN_CONFIG", "true")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("RUNTIME_ROOT", &root)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
        .env("LIMIT_LIMIT_HEADER", "X-Limit")
        .env("SHADOW_MODE", "true")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let result = std::panic::catch_unwind(|| {
        assert!(line.contains("domains [d]; gRPC on 127.0.0.1:"), "{line}");
        let http: SocketAddr = line
            .trim_end()
            .rsplit_once("HTTP on ")
            .unwrap()
            .1
            .parse()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (status, text) = common::http(http, "GET", "/healthcheck", "").await;
            assert_eq!((status, text.as_str()), (200, "OK"));
            let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
            let (status, text) = common::http(http, "POST", "/json", body).await;
            assert_eq!(status, 200, "{text}");
            assert!(
                text.contains(r#""responseHeadersToAdd":[{"key":"X-Limit","value":"5"},{"key":"RateLimit-Remaining","value":"4"},{"key":"RateLimit-Reset","value":"#),
                "{text}"
            );
            let merged = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k2","value":"v"}]}]}"#;
            let (status, text) = common::http(http, "POST", "/json", merged).await;
            assert_eq!(status, 200, "{text}");
            assert!(text.contains(r#""requestsPerUnit":7"#), "{text}");
            // `SHADOW_MODE=true`: the sixth of five a minute is answered OK,
            // its descriptor's status over the limit.
            for _ in 0..4 {
                assert_eq!(common::http(http, "POST", "/json", body).await.0, 200);
            }
            let (status, text) = common::http(http, "POST", "/json", body).await;
            assert_eq!(status, 200, "{text}");
            assert!(text.contains(r#""overallCode":"OK""#), "{text}");
            assert!(text.contains(r#""code":"OVER_LIMIT""#), "{text}");
            let (_, metrics) = common::http(http, "GET", "/metrics", "").await;
            assert!(
                metrics.contains("turnstile_rls_global_shadow_mode_total 1\n"),
                "{metrics}"
            );
        });
    });
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&root);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// A flag wins over a variable: the variables it replaces are not read, so
/// a `GRPC_PORT` that Kubernetes sets for a Service named `grpc`
/// (`tcp://10.0.0.1:8081`), a `HOST` that does not resolve, or a
/// `GRPC_UDS`, do not stop a service started with `--grpc-addr` and
/// `--http-addr` (they did: the variables were read, and failed, first).
#[test]
fn flags_win_over_variables_they_replace() {
    let dir = std::env::temp_dir().join(format!("turnstile-flags-{}", std::process::id()));
    write_config(&dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnstile-server"))
        .env_clear()
        .env("HOST", "nonexistent.invalid")
        .env("GRPC_PORT", "tcp://10.0.0.1:8081")
        .env("GRPC_UDS", "/tmp/ratelimit.sock")
        .args(["--config"])
        .arg(&dir)
        // Either form of a flag replaces the variables (`--flag=value` did
        // not, and the bad variable stopped the service).
        .args(["--grpc-addr=127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(line.contains("domains [d]; gRPC on 127.0.0.1:"), "{line}");
    // And `--help` reads no variable.
    let out = Command::new(env!("CARGO_BIN_EXE_turnstile-server"))
        .env_clear()
        .env("GRPC_UDS", "/tmp/ratelimit.sock")
        .arg("--help")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stderr.contains("GRPC_UDS"), "{stderr}");
    // Asked for: on standard output, and a success (it was on standard
    // error with the exit code of a mistake).
    assert!(stdout.contains("usage"), "{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(0));
}

/// `--response-headers` takes `=draft`, `=envoy` or `=off`; anything else is
/// refused before the service starts, as an unreadable variable is.
#[test]
fn the_binary_refuses_what_it_cannot_read() {
    for (args, vars, says) in [
        (
            &["--response-headers=ietf"][..],
            &[][..],
            "--response-headers=ietf",
        ),
        (&["--config", "."][..], &[("PORT", "http")][..], "PORT=http"),
        // A value given apart from the flag that takes it after `=`.
        (
            &["--config", ".", "--response-headers", "envoy"][..],
            &[][..],
            "--response-headers=envoy",
        ),
        (
            &["--config", ".", "--max-connections", "0"][..],
            &[][..],
            "--max-connections 0: give a whole number from 1",
        ),
        (
            &["--config", ".", "--max-connections", "18446744073709551615"][..],
            &[][..],
            "give at most 1048576",
        ),
        // A mistyped flag is named as unknown (it was told it "needs a
        // value"), with or without a value after `=`.
        (
            &["--config", ".", "--shadow-mod"][..],
            &[][..],
            "unknown option --shadow-mod",
        ),
        (&["--bogus=1"][..], &[][..], "unknown option --bogus"),
        (
            &["--config", ".", "--shadow-mode=true"][..],
            &[][..],
            "unknown option --shadow-mode (it takes no value)",
        ),
        // Redis settings with no Redis to apply them to (they were
        // ignored, and the limits counted in process).
        (
            &["--config", ".", "--redis-mode", "exact"][..],
            &[][..],
            "--redis-mode applies to the Redis backend, and none is set",
        ),
        (
            &["--config", ".", "--replicas", "3"][..],
            &[][..],
            "--replicas applies to the Redis backend",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_turnstile-server"))
            .env_clear()
            .envs(vars.iter().copied())
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// Without `RUNTIME_ROOT`, envoyproxy/ratelimit reads
/// `/srv/runtime_data/current`: the directory is taken from there when it
/// is, and otherwise none is (the binary then asks for `--config`).
#[test]
fn the_default_runtime_root_is_taken_where_it_is() {
    let default = std::path::Path::new(turnstile_server::settings::DEFAULT_RUNTIME_ROOT);
    let expected = default.join("config");
    let d = env(&[]).unwrap();
    assert_eq!(d.config, expected.is_dir().then_some(expected));
    let d = env(&[("RUNTIME_SUBDIRECTORY", "ratelimit")]).unwrap();
    let expected = default.join("ratelimit").join("config");
    assert_eq!(d.config, expected.is_dir().then_some(expected));
}
