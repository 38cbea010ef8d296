//! envoyproxy/ratelimit's environment variables, read by `turnstile-server`
//! as the defaults under its command line's flags, so that a deployment
//! written for envoyproxy/ratelimit (its container's environment, its
//! Kubernetes manifests) starts this service unchanged:
//!
//! - `HOST`, `PORT` (default `0.0.0.0`, `8080`): the HTTP listener
//!   (`--http-addr`); `GRPC_HOST`, `GRPC_PORT` (`0.0.0.0`, `8081`): the
//!   gRPC listener (`--grpc-addr`). A host may be a name, resolved once at
//!   start.
//! - `RUNTIME_ROOT` (default `/srv/runtime_data/current`, taken where that
//!   directory is), `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY`
//!   (default `config`): the configuration directory
//!   `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY` (`--config`),
//!   where envoyproxy/ratelimit reads its files with either
//!   `RUNTIME_WATCH_ROOT`.
//! - `LIMIT_RESPONSE_HEADERS_ENABLED` and `LIMIT_LIMIT_HEADER`,
//!   `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`: envoyproxy/ratelimit's
//!   response header fields ([`ResponseHeaders::Envoy`]).
//! - `REDIS_URL`, with `REDIS_TYPE` (`SINGLE`, `CLUSTER` or `SENTINEL`),
//!   `REDIS_SOCKET_TYPE` (`unix`, envoyproxy/ratelimit's default, or
//!   `tcp`) and `REDIS_AUTH` (`password` or `user:password`): the Redis the
//!   replicas share ([`Defaults::redis`], `--redis`), so a deployment that
//!   counted in Redis still counts there, not once per replica.
//!   `BACKEND_TYPE=memcache` and `REDIS_TLS=true` are refused (neither is
//!   served: give `--redis URL`, or `--redis off` to count in this process).
//! - `MERGE_DOMAIN_CONFIG`: files that name one domain add their
//!   descriptors to it ([`Defaults::merge_domains`],
//!   `--merge-domain-config`).
//! - `SHADOW_MODE`: every answer over a limit is turned into `OK` and
//!   counted ([`Defaults::shadow_mode`], `--shadow-mode`), the descriptors'
//!   statuses left as they are, as envoyproxy/ratelimit's global shadow
//!   mode does.
//! - `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: a request's descriptors
//!   spend only if none is over its limit ([`Defaults::stop_increments`],
//!   `--stop-increments-over-limit`).
//!
//! An empty variable is as an unset one, and the binary does not read the
//! variables a flag given replaces (`--grpc-addr`: `GRPC_HOST`,
//! `GRPC_PORT`, `GRPC_UDS`; `--http-addr`: `HOST`, `PORT`; `--config`: the
//! `RUNTIME_*` three; `--response-headers`:
//! `LIMIT_RESPONSE_HEADERS_ENABLED`; `--redis`: `BACKEND_TYPE` and the
//! `REDIS_*` variables; `--shadow-mode`: `SHADOW_MODE`;
//! `--merge-domain-config`: `MERGE_DOMAIN_CONFIG`;
//! `--stop-increments-over-limit`: `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`), nor any for
//! `--help`. What would make the service unreachable as the deployment
//! expects (`GRPC_UDS`, `GRPC_SERVER_USE_TLS=true`), or count where it does
//! not (`BACKEND_TYPE=memcache`, `REDIS_TLS=true`), is refused; variables
//! that change the decisions and are not read here
//! (`REDIS_PERSECOND`, ...) are reported in [`Defaults::warnings`]. The rest
//! (statsd, logging, tracing, `DEBUG_PORT`) are not read: metrics are served
//! at `GET /metrics`.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use crate::service::{EnvoyHeaderNames, ResponseHeaders};

/// envoyproxy/ratelimit's `RUNTIME_ROOT` when none is given.
pub const DEFAULT_RUNTIME_ROOT: &str = "/srv/runtime_data/current";

/// The defaults the environment gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// `GRPC_HOST:GRPC_PORT`.
    pub grpc: SocketAddr,
    /// `HOST:PORT`.
    pub http: SocketAddr,
    /// The configuration directory: under `RUNTIME_ROOT` when it is set,
    /// else under envoyproxy/ratelimit's default root,
    /// [`DEFAULT_RUNTIME_ROOT`], when that directory is there.
    pub config: Option<PathBuf>,
    /// envoyproxy/ratelimit's header fields when
    /// `LIMIT_RESPONSE_HEADERS_ENABLED` is true, else none.
    pub response_headers: ResponseHeaders,
    /// The names the `LIMIT_*_HEADER` variables give (their defaults
    /// otherwise), for `--response-headers=envoy`.
    pub envoy_header_names: EnvoyHeaderNames,
    /// The `--redis` URL that `REDIS_URL`, `REDIS_TYPE`, `REDIS_SOCKET_TYPE`
    /// and `REDIS_AUTH` describe, when `REDIS_URL` is set: a deployment of
    /// envoyproxy/ratelimit counts in Redis, and its replicas share the
    /// counts there.
    pub redis: Option<String>,
    /// `SHADOW_MODE`: answers over a limit are turned into `OK`.
    pub shadow_mode: bool,
    /// `MERGE_DOMAIN_CONFIG`: files that name one domain add their
    /// descriptors to it ([`LoadOptions`](crate::config::LoadOptions)).
    pub merge_domains: bool,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: a request's descriptors
    /// spend only if none is over its limit
    /// ([`with_stop_increments`](crate::service::RateLimitService::with_stop_increments)).
    pub stop_increments: bool,
    /// envoyproxy/ratelimit's variables that are set and change what it
    /// decides, but that this service does not read: one line each.
    pub warnings: Vec<String>,
}

/// The defaults from the variables `var` gives (`std::env::var` in the
/// binary).
///
/// # Errors
///
/// A variable that cannot be read (a port that is not a number, a host that
/// does not resolve, a header name that is not a token, a boolean that is
/// not one), or one that asks for what this service cannot do: the message
/// names the variable and its value.
///
/// # Examples
///
/// ```
/// use std::collections::HashMap;
/// use std::net::SocketAddr;
/// use std::path::Path;
/// use turnstile_server::service::{EnvoyHeaderNames, ResponseHeaders};
/// use turnstile_server::settings::from_env;
///
/// // A deployment's variables, as envoyproxy/ratelimit reads them.
/// let env = HashMap::from([
///     ("HOST", ""), // empty: as if unset
///     ("PORT", "9090"),
///     ("GRPC_HOST", "127.0.0.1"),
///     ("RUNTIME_ROOT", "/data"),
///     ("RUNTIME_SUBDIRECTORY", "ratelimit"),
///     ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
///     ("LIMIT_RESET_HEADER", "X-RateLimit-Reset"),
///     ("REDIS_SOCKET_TYPE", "tcp"),
///     ("REDIS_URL", "redis:6379"),
///     ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
///     ("REDIS_PERSECOND", "true"),
/// ]);
/// let defaults = from_env(|name| env.get(name).map(|value| value.to_string()))?;
/// assert_eq!(defaults.http, "0.0.0.0:9090".parse::<SocketAddr>()?);
/// assert_eq!(defaults.grpc, "127.0.0.1:8081".parse::<SocketAddr>()?);
/// assert_eq!(defaults.config.as_deref(), Some(Path::new("/data/ratelimit/config")));
/// let names = EnvoyHeaderNames {
///     reset: "X-RateLimit-Reset".to_string(),
///     ..EnvoyHeaderNames::default()
/// };
/// assert_eq!(defaults.response_headers, ResponseHeaders::Envoy(names));
/// // The replicas keep counting in that Redis.
/// assert_eq!(defaults.redis.as_deref(), Some("redis://redis:6379"));
/// // Not read here, but it changes what envoyproxy/ratelimit decides.
/// assert_eq!(defaults.warnings.len(), 1);
/// assert!(defaults.warnings[0].starts_with("REDIS_PERSECOND=true is not read"));
/// // A request's descriptors spend together or not at all.
/// assert!(defaults.stop_increments);
///
/// // Nothing set: envoyproxy/ratelimit's defaults.
/// let none = from_env(|_| None)?;
/// assert_eq!(none.grpc, "0.0.0.0:8081".parse::<SocketAddr>()?);
/// assert_eq!(none.response_headers, ResponseHeaders::Off);
/// // The configuration under envoyproxy/ratelimit's root, where that is.
/// let default = Path::new("/srv/runtime_data/current/config");
/// assert_eq!(none.config, default.is_dir().then(|| default.to_path_buf()));
///
/// // A value that cannot be read, or asks for what is not served, is refused.
/// let port = from_env(|name| (name == "GRPC_PORT").then(|| "grpc".to_string()));
/// assert_eq!(port.unwrap_err(), "GRPC_PORT=grpc: give a port from 0 to 65535");
/// let tls = from_env(|name| (name == "GRPC_SERVER_USE_TLS").then(|| "true".to_string()));
/// assert!(tls.is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Defaults, String> {
    let get = |name: &str| var(name).filter(|v| !v.is_empty());
    let flag = |name: &str| -> Result<bool, String> {
        match get(name) {
            None => Ok(false),
            Some(value) => {
                parse_bool(&value).ok_or_else(|| format!("{name}={value}: give true or false"))
            }
        }
    };
    if let Some(path) = get("GRPC_UDS") {
        return Err(format!(
            "GRPC_UDS={path}: a Unix socket is not served; unset it and give GRPC_HOST and GRPC_PORT"
        ));
    }
    if flag("GRPC_SERVER_USE_TLS")? {
        return Err(
            "GRPC_SERVER_USE_TLS=true: TLS is not served; terminate it in front of the service"
                .to_string(),
        );
    }
    let address = |host_var: &str, port_var: &str, port: u16| -> Result<SocketAddr, String> {
        let host = get(host_var).unwrap_or_else(|| "0.0.0.0".to_string());
        let port = match get(port_var) {
            None => port,
            Some(value) => value
                .parse::<u16>()
                .map_err(|_| format!("{port_var}={value}: give a port from 0 to 65535"))?,
        };
        resolve(&host, port).map_err(|e| format!("{host_var}={host}: {e}"))
    };
    let grpc = address("GRPC_HOST", "GRPC_PORT", 8081)?;
    let http = address("HOST", "PORT", 8080)?;
    let runtime_dir = |root: String| {
        let mut dir = PathBuf::from(root);
        if let Some(sub) = get("RUNTIME_SUBDIRECTORY") {
            dir.push(sub);
        }
        dir.push(get("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".to_string()));
        dir
    };
    let config = match get("RUNTIME_ROOT") {
        Some(root) => Some(runtime_dir(root)),
        // envoyproxy/ratelimit's default root, where a deployment that
        // relied on it mounts its files; taken only where it is.
        None => Some(runtime_dir(DEFAULT_RUNTIME_ROOT.to_string())).filter(|dir| dir.is_dir()),
    };
    let name = |var_name: &str, default: String| -> Result<String, String> {
        match get(var_name) {
            None => Ok(default),
            Some(value) if is_token(&value) => Ok(value),
            Some(value) => Err(format!(
                "{var_name}={value:?}: not a header field name (letters, digits and !#$%&'*+-.^_`|~)"
            )),
        }
    };
    let defaults = EnvoyHeaderNames::default();
    let envoy_header_names = EnvoyHeaderNames {
        limit: name("LIMIT_LIMIT_HEADER", defaults.limit)?,
        remaining: name("LIMIT_REMAINING_HEADER", defaults.remaining)?,
        reset: name("LIMIT_RESET_HEADER", defaults.reset)?,
    };
    let response_headers = if flag("LIMIT_RESPONSE_HEADERS_ENABLED")? {
        ResponseHeaders::Envoy(envoy_header_names.clone())
    } else {
        ResponseHeaders::Off
    };
    let redis = redis_url(&get, &flag)?;
    let shadow_mode = flag("SHADOW_MODE")?;
    let merge_domains = flag("MERGE_DOMAIN_CONFIG")?;
    let stop_increments = flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")?;
    let mut warnings = Vec::new();
    if redis.is_some() && flag("REDIS_PERSECOND")? {
        warnings.push(
            "REDIS_PERSECOND=true is not read: per-second limits are counted in REDIS_URL's Redis too"
                .to_string(),
        );
    }
    if flag("LIMIT_REQUEST_HEADERS_ENABLED")? {
        warnings.push(
            "LIMIT_REQUEST_HEADERS_ENABLED=true is not read: no request header fields are added"
                .to_string(),
        );
    }
    // envoyproxy/ratelimit counts in Redis by default, at its nutcracker
    // socket: a deployment that names a Redis setting but no `REDIS_URL`
    // counted there, and here counts in each replica on its own.
    if redis.is_none()
        && [
            "BACKEND_TYPE",
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_AUTH",
        ]
        .iter()
        .any(|name| get(name).is_some())
    {
        warnings.push(
            "REDIS_URL is not set: limits are counted in this process, each replica on its own \
             (envoyproxy/ratelimit would count in Redis at /var/run/nutcracker/ratelimit.sock); \
             give --redis URL (or REDIS_URL) to share them, or --redis off"
                .to_string(),
        );
    }
    if let Some(kind) = get("CONFIG_TYPE").filter(|k| k != "FILE") {
        warnings.push(format!(
            "CONFIG_TYPE={kind} is not read: the configuration comes from files (--config, RUNTIME_ROOT)"
        ));
    }
    Ok(Defaults {
        grpc,
        http,
        config,
        response_headers,
        envoy_header_names,
        redis,
        shadow_mode,
        merge_domains,
        stop_increments,
        warnings,
    })
}

/// The `--redis` URL of envoyproxy/ratelimit's Redis variables, `None`
/// without `REDIS_URL`.
fn redis_url(
    get: &impl Fn(&str) -> Option<String>,
    flag: &impl Fn(&str) -> Result<bool, String>,
) -> Result<Option<String>, String> {
    let not_served = |what: String| {
        format!(
            "{what}: give --redis URL to count in Redis, or --redis off to count in this process"
        )
    };
    if let Some(backend) = get("BACKEND_TYPE") {
        if backend.eq_ignore_ascii_case("memcache") {
            return Err(not_served(format!(
                "BACKEND_TYPE={backend}: memcached is not served"
            )));
        }
        if !backend.eq_ignore_ascii_case("redis") {
            return Err(format!("BACKEND_TYPE={backend}: give redis or memcache"));
        }
    }
    let Some(url) = get("REDIS_URL") else {
        return Ok(None);
    };
    if flag("REDIS_TLS")? {
        return Err(not_served(
            "REDIS_TLS=true: TLS to Redis is not served".to_string(),
        ));
    }
    let socket = get("REDIS_SOCKET_TYPE").unwrap_or_else(|| "unix".to_string());
    let unix = match socket.to_ascii_lowercase().as_str() {
        "unix" => true,
        "tcp" => false,
        _ => return Err(format!("REDIS_SOCKET_TYPE={socket}: give unix or tcp")),
    };
    let auth = get("REDIS_AUTH");
    // `user:password`, or a password alone; each part percent-encoded.
    let userinfo = auth.as_deref().map(|auth| match auth.split_once(':') {
        Some((user, password)) => format!("{}:{}@", encode(user), encode(password)),
        None => format!(":{}@", encode(auth)),
    });
    let userinfo = userinfo.unwrap_or_default();
    let kind = get("REDIS_TYPE").unwrap_or_else(|| "SINGLE".to_string());
    let tcp_only = |kind: &str| {
        if unix {
            Err(format!(
                "REDIS_TYPE={kind} with REDIS_SOCKET_TYPE=unix: give REDIS_SOCKET_TYPE=tcp"
            ))
        } else {
            Ok(())
        }
    };
    let hosts = |list: &str| -> Result<Vec<String>, String> {
        let hosts: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_string)
            .collect();
        if hosts.is_empty() {
            return Err(format!("REDIS_URL={url}: no host named"));
        }
        Ok(hosts)
    };
    Ok(Some(match kind.to_ascii_lowercase().as_str() {
        "single" if unix => match auth.as_deref() {
            None => format!("redis+unix://{url}"),
            Some(auth) => match auth.split_once(':') {
                Some((user, password)) => format!(
                    "redis+unix://{url}?user={}&pass={}",
                    encode(user),
                    encode(password)
                ),
                None => format!("redis+unix://{url}?pass={}", encode(auth)),
            },
        },
        "single" => format!("redis://{userinfo}{url}"),
        "cluster" => {
            tcp_only(&kind)?;
            let nodes: Vec<String> = hosts(&url)?
                .into_iter()
                .map(|host| format!("{userinfo}{host}"))
                .collect();
            format!("redis+cluster://{}", nodes.join(","))
        }
        "sentinel" => {
            tcp_only(&kind)?;
            // `PRIMARY_NAME,HOST:PORT,HOST:PORT…`.
            let mut parts = hosts(&url)?.into_iter();
            let name = parts.next().unwrap_or_default();
            let sentinels: Vec<String> = parts.collect();
            if sentinels.is_empty() {
                return Err(format!(
                    "REDIS_URL={url}: give the primary's name, then its Sentinels (NAME,HOST:PORT,…)"
                ));
            }
            format!("redis+sentinel://{userinfo}{}/{name}", sentinels.join(","))
        }
        _ => {
            return Err(format!(
                "REDIS_TYPE={kind}: give SINGLE, CLUSTER or SENTINEL"
            ));
        }
    }))
}

/// `text` percent-encoded for a URL's user information or query: every byte
/// but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A boolean as Go's `strconv.ParseBool` reads it (envoyproxy/ratelimit's
/// variables are read so).
fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// An HTTP field name: one or more of RFC 9110's token characters.
///
/// # Examples
///
/// ```
/// use turnstile_server::settings::is_token;
///
/// assert!(is_token("X-RateLimit-Limit"));
/// assert!(!is_token("Rate Limit")); // a space
/// assert!(!is_token("RateLimit:")); // a colon
/// assert!(!is_token(""));
/// ```
pub fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `host` (an address, or a name resolved now) and `port`.
fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (bare, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| "resolves to no address".to_string())
}
