//! `turnstile-server --config DIR`: Envoy's rate limit service on turnstile.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use std::time::Duration;

use turnstile_server::backend::{Backend, DEFAULT_MAX_KEYS_PER_LIMIT, InProcess};
use turnstile_server::clock::ServiceClock;
use turnstile_server::config::LoadOptions;
use turnstile_server::redis_backend::{
    FailurePolicy, RedisBackend, RedisHealth, RedisMode, RedisOptions,
};
use turnstile_server::reload::{DEFAULT_POLL, Reloader};
use turnstile_server::server::{DEFAULT_MAX_CONNECTIONS, ServeLimits, serve_with};
use turnstile_server::service::{
    Bounds, DEFAULT_MAX_OVERRIDE_LIMITS, RateLimitService, ResponseHeaders,
};
use turnstile_server::settings;

const USAGE: &str = "\
usage: turnstile-server --config DIR [options]

  --config DIR            the *.yaml files of envoyproxy/ratelimit's format, one domain each;
                          reloaded when a file changes (polled each second) and on SIGHUP
                          (default: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, the
                          root /srv/runtime_data/current where that is)
  --grpc-addr ADDR        gRPC listener (default GRPC_HOST:GRPC_PORT, 0.0.0.0:8081)
  --http-addr ADDR|off    HTTP listener for /json, /healthcheck, /healthz, /metrics
                          (default HOST:PORT, 0.0.0.0:8080)
  --max-keys N            distinct keys held per limit (default 100000)
  --max-override-limits N distinct quotas that descriptors' limit overrides may ask for (default 16);
                          a new one past them is answered OVER_LIMIT
  --max-descriptors N     descriptors per request (default 64)
  --max-entries N         entries per descriptor (default 16)
  --max-length N          bytes in the domain (default 1024; keys and values: the message size)
  --max-connections N     connections each listener holds at once; more wait for a slot (default 1024)
  --response-headers[=draft|envoy|off]
                          header fields for Envoy to add to its answers: draft (the flag alone):
                          RateLimit-Policy, RateLimit and Retry-After; envoy: envoyproxy/ratelimit's
                          RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (named by
                          LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER); off
                          (default: envoy with LIMIT_RESPONSE_HEADERS_ENABLED=true, else off)

  --shadow-mode           answer OK where a limit is over (counted; the descriptors' statuses say it)
                          (default: SHADOW_MODE)
  --merge-domain-config   files that name one domain add their descriptors to it
                          (default: MERGE_DOMAIN_CONFIG; else a domain in two files is an error)
  --stop-increments-over-limit
                          a request's descriptors spend only if none is over its limit (each limit
                          checked first) (default: STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)

  --redis URL|off         share the limits with other replicas in Redis: redis://HOST:PORT[/DB],
                          redis+unix:///PATH, redis+cluster://HOST:PORT,HOST:PORT... or
                          redis+sentinel://HOST:PORT,.../PRIMARY_NAME; off: in process
                          (default: the Redis REDIS_URL, REDIS_TYPE, REDIS_SOCKET_TYPE and REDIS_AUTH
                          name, else in process)
  --redis-mode MODE       leased (default: leases spent in process) or exact (a script per decision)
  --on-redis-failure P    open (default: this replica's share of each limit, starting empty in each
                          outage) or closed (deny)
  --redis-deadline MS     deadline of each Redis reply, in milliseconds (default 5; connecting: 50)
  --replicas N            replicas sharing the limits: sizes the share and the leases (default 1)
  --max-lease N           largest lease, in permits (default 64)

envoyproxy/ratelimit's environment variables give the defaults above (HOST, PORT, GRPC_HOST,
GRPC_PORT, RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY, LIMIT_RESPONSE_HEADERS_ENABLED,
LIMIT_*_HEADER, SHADOW_MODE, MERGE_DOMAIN_CONFIG, BACKEND_TYPE and REDIS_*); a flag wins over a
variable.
";

struct Args {
    config: PathBuf,
    grpc: SocketAddr,
    http: Option<SocketAddr>,
    max_keys: usize,
    max_overrides: usize,
    max_connections: usize,
    bounds: Bounds,
    headers: ResponseHeaders,
    shadow_mode: bool,
    merge_domains: bool,
    stop_increments: bool,
    redis: Option<String>,
    redis_options: RedisOptions,
    warnings: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let given: Vec<String> = std::env::args().skip(1).collect();
    // A flag wins over a variable: the variables a flag given replaces are
    // not read at all (a `GRPC_PORT=tcp://…` that Kubernetes sets for a
    // Service named `grpc`, or a `HOST` that does not resolve, must not stop
    // a service started with `--grpc-addr` or `--http-addr`).
    // `--flag value` or `--flag=value`.
    let has = |flag: &str| {
        given.iter().any(|a| {
            a == flag
                || a.strip_prefix(flag)
                    .is_some_and(|rest| rest.starts_with('='))
        })
    };
    let replaced = |name: &str| match name {
        "GRPC_HOST" | "GRPC_PORT" | "GRPC_UDS" => has("--grpc-addr"),
        "HOST" | "PORT" => has("--http-addr"),
        "RUNTIME_ROOT" | "RUNTIME_SUBDIRECTORY" | "RUNTIME_APPDIRECTORY" => has("--config"),
        "LIMIT_RESPONSE_HEADERS_ENABLED" => {
            given.iter().any(|a| a.starts_with("--response-headers"))
        }
        "SHADOW_MODE" => has("--shadow-mode"),
        "MERGE_DOMAIN_CONFIG" => has("--merge-domain-config"),
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT" => has("--stop-increments-over-limit"),
        "BACKEND_TYPE" => has("--redis"),
        name if name.starts_with("REDIS_") => has("--redis"),
        _ => false,
    };
    let env = settings::from_env(|name| {
        if replaced(name) {
            None
        } else {
            std::env::var(name).ok()
        }
    })?;
    let mut config = env.config;
    let mut grpc = env.grpc;
    let mut http = Some(env.http);
    let mut max_keys = DEFAULT_MAX_KEYS_PER_LIMIT;
    let mut max_overrides = DEFAULT_MAX_OVERRIDE_LIMITS;
    let mut max_connections = DEFAULT_MAX_CONNECTIONS;
    let mut bounds = Bounds::default();
    let mut headers = env.response_headers;
    let mut shadow_mode = env.shadow_mode;
    let mut merge_domains = env.merge_domains;
    let mut stop_increments = env.stop_increments;
    let mut redis = env.redis;
    let mut redis_options = RedisOptions::default();
    let mut args = given.iter().cloned();
    let mut previous: Option<String> = None;
    // Redis settings given, refused without a Redis to apply them to.
    let mut redis_flags: Vec<String> = Vec::new();
    // `--redis off` given: Redis flags beside it are set aside, not refused
    // (a deployment that turns Redis off for a while keeps its flags).
    let mut redis_off = false;
    let mut warnings = env.warnings;
    while let Some(flag) = args.next() {
        let before = previous.replace(flag.clone());
        if let Some(kind) = flag.strip_prefix("--response-headers") {
            headers = match kind {
                "" | "=draft" => ResponseHeaders::Draft,
                "=envoy" => ResponseHeaders::Envoy(env.envoy_header_names.clone()),
                "=off" => ResponseHeaders::Off,
                _ => {
                    return Err(format!(
                        "{flag}: give --response-headers=draft, =envoy or =off"
                    ));
                }
            };
            continue;
        }
        if flag == "--shadow-mode" {
            shadow_mode = true;
            continue;
        }
        if flag == "--merge-domain-config" {
            merge_domains = true;
            continue;
        }
        if flag == "--stop-increments-over-limit" {
            stop_increments = true;
            continue;
        }
        if !flag.starts_with("--") {
            return Err(format!(
                "{flag}: not a flag{}",
                if before.as_deref() == Some("--response-headers") {
                    format!(
                        " (--response-headers takes its value after `=`: --response-headers={flag})"
                    )
                } else {
                    String::new()
                }
            ));
        }
        // `--flag value` or `--flag=value`; a name not known is told as
        // such, not as a flag missing its value.
        let (flag, inline) = match flag.split_once('=') {
            Some((name, value)) => (name.to_string(), Some(value.to_string())),
            None => (flag, None),
        };
        if !VALUE_FLAGS.contains(&flag.as_str()) {
            let hint = if [
                "--shadow-mode",
                "--merge-domain-config",
                "--stop-increments-over-limit",
            ]
            .contains(&flag.as_str())
            {
                " (it takes no value)"
            } else {
                ""
            };
            return Err(format!("unknown option {flag}{hint}"));
        }
        let value = match inline {
            Some(value) => value,
            None => args.next().ok_or_else(|| format!("{flag} needs a value"))?,
        };
        if REDIS_FLAGS.contains(&flag.as_str()) {
            redis_flags.push(flag.clone());
        }
        let count = |value: &str| {
            value
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} {value}: give a whole number from 1"))
        };
        let addr = |value: &str| {
            value
                .parse::<SocketAddr>()
                .map_err(|e| format!("{flag} {value}: {e} (for example 0.0.0.0:8081)"))
        };
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(value)),
            "--grpc-addr" => grpc = addr(&value)?,
            "--http-addr" if value == "off" => http = None,
            "--http-addr" => http = Some(addr(&value)?),
            "--max-keys" => max_keys = count(&value)?,
            "--max-override-limits" => max_overrides = count(&value)?,
            "--max-connections" => {
                max_connections = count(&value)?;
                if max_connections > MAX_CONNECTIONS {
                    return Err(format!(
                        "{flag} {value}: give at most {MAX_CONNECTIONS} (each connection takes a \
                         file descriptor)"
                    ));
                }
            }
            "--max-descriptors" => bounds.max_descriptors = count(&value)?,
            "--max-entries" => bounds.max_entries = count(&value)?,
            "--max-length" => bounds.max_length = count(&value)?,
            "--redis" if value == "off" => {
                redis = None;
                redis_off = true;
            }
            "--redis" => redis = Some(value),
            "--redis-mode" => {
                redis_options.mode = RedisMode::parse(&value)
                    .ok_or_else(|| format!("{flag} {value}: give exact or leased"))?;
            }
            "--on-redis-failure" => {
                redis_options.on_failure = FailurePolicy::parse(&value)
                    .ok_or_else(|| format!("{flag} {value}: give open or closed"))?;
            }
            "--redis-deadline" => {
                let millis = u64::try_from(count(&value)?).unwrap_or(u64::MAX);
                redis_options.deadlines = redis_options
                    .deadlines
                    .response(Duration::from_millis(millis))
                    .map_err(|e| format!("{flag} {value}: {e}"))?;
            }
            "--replicas" => {
                redis_options.replicas = u32::try_from(count(&value)?)
                    .map_err(|_| format!("{flag} {value}: give at most {}", u32::MAX))?;
            }
            "--max-lease" => {
                redis_options.max_lease = u32::try_from(count(&value)?)
                    .map_err(|_| format!("{flag} {value}: give at most {}", u32::MAX))?;
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if redis.is_none()
        && let Some(flag) = redis_flags.first()
    {
        if redis_off {
            warnings.push(format!(
                "{} not read: --redis off counts in this process",
                redis_flags.join(", ")
            ));
        } else {
            return Err(format!(
                "{flag} applies to the Redis backend, and none is set: give --redis URL (or \
             REDIS_URL), or leave {flag} out to count in this process"
            ));
        }
    }
    let config = config.ok_or(
        "--config DIR (or RUNTIME_ROOT) is required: envoyproxy/ratelimit's default, \
         /srv/runtime_data/current/config, is not there",
    )?;
    Ok(Args {
        config,
        grpc,
        http,
        max_keys,
        max_overrides,
        max_connections,
        bounds,
        headers,
        shadow_mode,
        merge_domains,
        stop_increments,
        redis,
        warnings,
        redis_options: RedisOptions {
            max_keys,
            ..redis_options
        },
    })
}

/// The flags that take a value.
const VALUE_FLAGS: &[&str] = &[
    "--config",
    "--grpc-addr",
    "--http-addr",
    "--max-keys",
    "--max-override-limits",
    "--max-connections",
    "--max-descriptors",
    "--max-entries",
    "--max-length",
    "--redis",
    "--redis-mode",
    "--on-redis-failure",
    "--redis-deadline",
    "--replicas",
    "--max-lease",
];

/// The flags that set the Redis backend's options.
const REDIS_FLAGS: &[&str] = &[
    "--redis-mode",
    "--on-redis-failure",
    "--redis-deadline",
    "--replicas",
    "--max-lease",
];

/// The largest `--max-connections`.
const MAX_CONNECTIONS: usize = 1 << 20;

/// The soft limit on open files, where the system tells it
/// (`/proc/self/limits`): `None` where it is unlimited or unknown.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Resolves on ctrl-c or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn policy_name(policy: FailurePolicy) -> &'static str {
    match policy {
        FailurePolicy::Open => "open (this replica's share of each limit, starting empty)",
        FailurePolicy::Closed => "closed (denied beyond the leases held here)",
    }
}

/// Ping Redis at start-up (a Redis that is down then is a failure like any
/// other, the policy decides, but the operator hears of it now), then log
/// when the Redis limits start failing and when Redis answers them again,
/// looking once a second, and pinging for the failing limits
/// ([`RedisBackend::recover`]).
async fn watch_redis(redis: RedisBackend) {
    let policy = redis.options().on_failure;
    match redis.ping().await {
        Ok(rtt) => eprintln!("turnstile-server: Redis answers (PING in {rtt:?})"),
        Err(error) => eprintln!(
            "turnstile-server: warning: Redis does not answer ({error}); decisions follow \
             --on-redis-failure {} until it does",
            policy_name(policy)
        ),
    }
    let health: Arc<RedisHealth> = redis.health();
    let mut before = health.counts();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if health.counts().failing_limits > 0 {
            // A limit with no request since its call failed would stay
            // failing (and this log silent) after Redis came back.
            redis.recover().await;
        }
        let now = health.counts();
        let new_failures = now.failures - before.failures;
        if before.failing_limits == 0 && now.failing_limits > 0 {
            eprintln!(
                "turnstile-server: warning: Redis is failing ({} limits; {new_failures} calls \
                 failed in the last second): decisions follow --on-redis-failure {}",
                now.failing_limits,
                policy_name(policy)
            );
        } else if before.failing_limits > 0 && now.failing_limits == 0 {
            eprintln!(
                "turnstile-server: Redis answers again ({} decisions were the policy's so far)",
                now.fallbacks
            );
        } else if now.failing_limits == 0 && new_failures > 0 {
            // Failures that opened no degraded period: a key holding
            // something else than a limit's state (WRONGTYPE), or a
            // period that opened and closed within the second.
            eprintln!(
                "turnstile-server: warning: {new_failures} Redis calls failed in the last second"
            );
        }
        before = now;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // Asked for: to standard output, a success.
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("turnstile-server: {message}");
            }
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    for warning in &args.warnings {
        eprintln!("turnstile-server: warning: {warning}");
    }
    let redis = match &args.redis {
        None => None,
        Some(url) => match RedisBackend::connect(url, args.redis_options.clone()).await {
            Ok(backend) => Some(backend),
            Err(error) => {
                eprintln!("turnstile-server: {error}");
                return ExitCode::FAILURE;
            }
        },
    };
    let backend: Arc<dyn Backend> = match &redis {
        None => Arc::new(InProcess::new(ServiceClock::real(), args.max_keys)),
        Some(redis) => Arc::new(redis.clone()),
    };
    let reloader = Arc::new(
        Reloader::new(&args.config, Arc::clone(&backend))
            .with_options(LoadOptions::default().merge_domains(args.merge_domains)),
    );
    let config = match reloader.load() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("turnstile-server: configuration error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut domains: Vec<&str> = config.domains().collect();
    domains.sort_unstable();
    let domains = domains.join(", ");
    let service = Arc::new(
        RateLimitService::new(config, args.bounds, false)
            .with_response_headers(args.headers)
            .with_shadow_mode(args.shadow_mode)
            .with_stop_increments(args.stop_increments)
            .with_overrides(Arc::clone(&backend), args.max_overrides),
    );
    if let Some(redis) = &redis {
        service.metrics().set_redis(redis.health());
    }
    let grpc = match tokio::net::TcpListener::bind(args.grpc).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("turnstile-server: gRPC listener on {}: {error}", args.grpc);
            return ExitCode::FAILURE;
        }
    };
    let http = match args.http {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => Some(listener),
            Err(error) => {
                eprintln!("turnstile-server: HTTP listener on {addr}: {error}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let bound = |listener: &tokio::net::TcpListener| {
        listener
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string())
    };
    eprintln!(
        "turnstile-server: domains [{domains}]; gRPC on {}{}",
        bound(&grpc),
        http.as_ref()
            .map_or(String::new(), |l| format!(", HTTP on {}", bound(l)))
    );
    if let Some(redis) = redis {
        // After the line above, which names the listeners first.
        tokio::spawn(watch_redis(redis));
    }
    let (stop_watch, watch_stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        reloader.watch(Arc::clone(&service), DEFAULT_POLL, async move {
            let _ = watch_stopped.await;
        }),
    );
    if let Some(open_files) = open_files_limit() {
        // Each listener's connections, and some room for the
        // configuration's files, Redis and the process itself.
        let listeners: u64 = if args.http.is_some() { 2 } else { 1 };
        let connections = u64::try_from(args.max_connections).unwrap_or(u64::MAX);
        let needed = listeners.saturating_mul(connections).saturating_add(64);
        if open_files < needed {
            eprintln!(
                "turnstile-server: warning: this process may open {open_files} files (ulimit -n), \
                 and the listeners may hold {} connections each: raise the limit to {needed}, or \
                 lower --max-connections to {}",
                args.max_connections,
                open_files.saturating_sub(64) / listeners
            );
        }
    }
    let mut limits = ServeLimits::default();
    limits.max_connections = args.max_connections;
    let served = serve_with(service, grpc, http, limits, shutdown_signal()).await;
    let _ = stop_watch.send(());
    match served {
        Ok(()) => {
            eprintln!("turnstile-server: stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("turnstile-server: {error}");
            ExitCode::FAILURE
        }
    }
}
