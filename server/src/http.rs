//! The HTTP endpoints: `POST /json` (envoyproxy/ratelimit's JSON form of the
//! request and response: proto3's JSON mapping as protojson reads and writes
//! it, 200 when every descriptor is within its limit, 429 when one is over,
//! 400 for a body it cannot read; any method, as envoyproxy/ratelimit's
//! router takes it), `GET /healthcheck`
//! (envoyproxy/ratelimit's: `OK` while serving, 500 with no body once the
//! shutdown has begun), `GET /healthz` (`OK` while the process answers at
//! all), and `GET /metrics` (Prometheus text: [`metrics`](crate::metrics)).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, rate_limit::Unit as PbUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::server::{HTTP_BODY_BUDGET, ServeLimits};
use crate::service::RateLimitService;

/// The router of the HTTP endpoints, with bodies of at most `max_body` bytes
/// and the other [`ServeLimits`] by default.
pub fn router(service: Arc<RateLimitService>, max_body: usize) -> Router {
    let limits = ServeLimits {
        max_message: max_body,
        ..ServeLimits::default()
    };
    router_with(service, &limits)
}

/// The router of the HTTP endpoints, with bodies of at most
/// `limits.max_message` bytes, at most [`HTTP_BODY_BUDGET`] bytes of them
/// held at once, each read within `limits.body_timeout`.
pub fn router_with(service: Arc<RateLimitService>, limits: &ServeLimits) -> Router {
    // At least one whole body's room, whatever the message size.
    let budget = HTTP_BODY_BUDGET.max(limits.max_message).div_ceil(1024);
    let bodies = Arc::new(Semaphore::new(budget.min(Semaphore::MAX_PERMITS)));
    let body_timeout = limits.body_timeout;
    let max_body = limits.max_message;
    Router::new()
        .route(
            "/json",
            any(
                move |service: State<Arc<RateLimitService>>, request: Request| {
                    let bodies = Arc::clone(&bodies);
                    async move { json(service, request, &bodies, body_timeout, max_body).await }
                },
            ),
        )
        .route("/healthcheck", any(healthcheck))
        .route("/healthz", get(|| async { "OK\n" }))
        .route("/metrics", get(metrics))
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .with_state(service)
}

/// A `uint32` or `uint64` in proto3's JSON mapping: a number or a decimal
/// string, in either an exponent or a fraction where the value is whole
/// (`1e3`, `5.0`), as protojson reads them.
#[derive(Deserialize)]
#[serde(untagged)]
enum Uint64 {
    Number(u64),
    Float(f64),
    Text(String),
}

/// `value` as a `u64` when it is whole and in range.
fn whole(value: f64) -> Option<u64> {
    // 2^64, exactly representable: every whole f64 below it fits.
    const END: f64 = 18_446_744_073_709_551_616.0;
    (value.is_finite() && value.fract() == 0.0 && (0.0..END).contains(&value))
        // Whole and below 2^64: the conversion is exact.
        .then_some(value as u64)
}

impl Uint64 {
    fn value(&self, field: &str) -> Result<u64, String> {
        let bad = || format!("{field} is not a whole number from 0");
        match self {
            Uint64::Number(n) => Ok(*n),
            Uint64::Float(f) => whole(*f).ok_or_else(bad),
            Uint64::Text(text) => text
                .parse()
                .ok()
                .or_else(|| text.parse::<f64>().ok().and_then(whole))
                .ok_or_else(|| format!("{field} is not a whole number from 0: {text:?}")),
        }
    }

    fn value_u32(&self, field: &str) -> Result<u32, String> {
        u32::try_from(self.value(field)?).map_err(|_| format!("{field} is a uint32"))
    }
}

// protojson's reading, as envoyproxy/ratelimit's `/json` does it: the JSON
// name or the proto file's name of each field, `null` for a field's default,
// and a field of neither name refused (400), as a duplicated one is.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: Option<String>,
    #[serde(default, deserialize_with = "bounded::descriptors")]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Uint64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default, deserialize_with = "bounded::entries")]
    entries: Vec<JsonEntry>,
    #[serde(default, deserialize_with = "bounded::object_or_null")]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Uint64>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: Option<bool>,
}

/// A descriptor's `limit` override.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: Option<Uint64>,
    #[serde(default)]
    unit: Option<JsonUnit>,
}

/// An enum in proto3's JSON mapping: its name or its number.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonUnit {
    Number(i32),
    Name(String),
}

impl JsonUnit {
    fn value(&self) -> Result<i32, String> {
        match self {
            JsonUnit::Number(n) => Ok(*n),
            JsonUnit::Name(name) if name == "WEEK" => Ok(crate::service::WEEK_UNIT),
            JsonUnit::Name(name) => RateLimitUnit::from_str_name(name)
                .map(|unit| unit as i32)
                .ok_or_else(|| {
                    format!("unknown unit {name:?}: SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR")
                }),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    value: Option<String>,
}

// protojson's writing, as envoyproxy/ratelimit's `/json` does it
// (`protojson.Marshal`, without `EmitUnpopulated`): the JSON names, fields in
// the proto file's order, a field at its default (0, "", an empty list, an
// enum's 0, an unset message) left out, an enum by its name (its number
// when it has none), a Duration as seconds with 0, 3, 6 or 9 fractional
// digits.

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonResponse {
    #[serde(skip_serializing_if = "Option::is_none")]
    overall_code: Option<JsonEnum>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    request_headers_to_add: Vec<JsonHeader>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<JsonEnum>,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimit>,
    #[serde(skip_serializing_if = "is_zero")]
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "is_zero")]
    requests_per_unit: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    unit: Option<JsonEnum>,
}

#[derive(Serialize)]
struct JsonHeader {
    #[serde(skip_serializing_if = "String::is_empty")]
    key: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    value: String,
}

/// An enum's value in proto3's JSON mapping.
#[derive(Serialize)]
#[serde(untagged)]
enum JsonEnum {
    Name(&'static str),
    Number(i32),
}

/// `None` for 0 (left out); the name of a known value, else the number.
fn json_enum(value: i32, name: Option<&'static str>) -> Option<JsonEnum> {
    match (value, name) {
        (0, _) => None,
        (_, Some(name)) => Some(JsonEnum::Name(name)),
        (_, None) => Some(JsonEnum::Number(value)),
    }
}

fn code(value: i32) -> Option<JsonEnum> {
    json_enum(value, Code::try_from(value).ok().map(|c| c.as_str_name()))
}

fn unit(value: i32) -> Option<JsonEnum> {
    json_enum(value, PbUnit::try_from(value).ok().map(|u| u.as_str_name()))
}

/// The largest Duration proto3's JSON mapping writes: 10,000 years.
const MAX_DURATION_SECONDS: i64 = 315_576_000_000;

/// A Duration as proto3's JSON mapping writes it (protojson): the seconds, a
/// point and 3, 6 or 9 digits when there is a fraction (as few as hold it),
/// and `s`: `60s`, `0.500s`, `1.000001s`, `0.000000001s`, `-1.500s`. A value
/// past the mapping's range (±10,000 years), which protojson refuses to
/// write, is written as that bound; seconds and nanoseconds of different
/// signs are summed.
///
/// # Examples
///
/// ```
/// use turnstile_server::http::proto_duration;
///
/// assert_eq!(proto_duration(60, 0), "60s");
/// assert_eq!(proto_duration(0, 500_000_000), "0.500s");
/// assert_eq!(proto_duration(1, 1_000), "1.000001s");
/// assert_eq!(proto_duration(0, 1), "0.000000001s");
/// assert_eq!(proto_duration(-1, -500_000_000), "-1.500s");
/// // Past 10,000 years: the bound.
/// assert_eq!(proto_duration(i64::MAX, 0), "315576000000s");
/// ```
pub fn proto_duration(seconds: i64, nanos: i32) -> String {
    const NANOS: i128 = 1_000_000_000;
    let bound = i128::from(MAX_DURATION_SECONDS) * NANOS;
    let total = (i128::from(seconds) * NANOS + i128::from(nanos)).clamp(-bound, bound);
    let sign = if total < 0 { "-" } else { "" };
    let total = total.unsigned_abs();
    let (whole, fraction) = (total / NANOS.unsigned_abs(), total % NANOS.unsigned_abs());
    let mut text = if fraction == 0 {
        format!("{sign}{whole}")
    } else if fraction % 1_000_000 == 0 {
        format!("{sign}{whole}.{:03}", fraction / 1_000_000)
    } else if fraction % 1_000 == 0 {
        format!("{sign}{whole}.{:06}", fraction / 1_000)
    } else {
        format!("{sign}{whole}.{fraction:09}")
    };
    text.push('s');
    text
}

fn json_headers(headers: &[HeaderValue]) -> Vec<JsonHeader> {
    headers
        .iter()
        .map(|h| JsonHeader {
            key: h.key.clone(),
            value: h.value.clone(),
        })
        .collect()
}

fn to_request(json: JsonRequest) -> Result<RateLimitRequest, String> {
    let hits_addend = match &json.hits_addend {
        Some(n) => n.value_u32("hitsAddend")?,
        None => 0,
    };
    let mut descriptors = Vec::with_capacity(json.descriptors.len());
    for d in json.descriptors {
        let hits_addend = match &d.hits_addend {
            Some(n) => Some(UInt64Value {
                value: n.value("hitsAddend")?,
            }),
            None => None,
        };
        descriptors.push(RateLimitDescriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| Entry {
                    key: e.key.unwrap_or_default(),
                    value: e.value.unwrap_or_default(),
                })
                .collect(),
            hits_addend,
            is_negative_hits: d.is_negative_hits.unwrap_or(false),
            limit: match d.limit {
                Some(limit) => Some(RateLimitOverride {
                    requests_per_unit: match &limit.requests_per_unit {
                        Some(n) => n.value_u32("requestsPerUnit")?,
                        None => 0,
                    },
                    unit: match &limit.unit {
                        Some(unit) => unit.value()?,
                        None => 0,
                    },
                }),
                None => None,
            },
        });
    }
    Ok(RateLimitRequest {
        domain: json.domain.unwrap_or_default(),
        descriptors,
        hits_addend,
    })
}

fn to_json(response: &RateLimitResponse) -> JsonResponse {
    JsonResponse {
        overall_code: code(response.overall_code),
        statuses: response
            .statuses
            .iter()
            .map(|s| JsonStatus {
                code: code(s.code),
                current_limit: s.current_limit.as_ref().map(|l| JsonLimit {
                    name: l.name.clone(),
                    requests_per_unit: l.requests_per_unit,
                    unit: unit(l.unit),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s
                    .duration_until_reset
                    .as_ref()
                    .map(|d| proto_duration(d.seconds, d.nanos)),
            })
            .collect(),
        response_headers_to_add: json_headers(&response.response_headers_to_add),
        request_headers_to_add: json_headers(&response.request_headers_to_add),
    }
}

/// envoyproxy/ratelimit's health check, on any method as its router takes
/// it: `OK` (no newline) while serving, 500 with an empty body when not.
async fn healthcheck(State(service): State<Arc<RateLimitService>>) -> Response {
    if service.serving() {
        "OK".into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

async fn metrics(State(service): State<Arc<RateLimitService>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        service.metrics().render(),
    )
        .into_response()
}

/// Read `request`'s body, at most `max_body` bytes, taking from `budget` a
/// permit per KiB as each part arrives (so that a client that sends slowly
/// holds only what it sent): the body and its permits, or the answer that
/// refuses it (`413` past `max_body`, `400` for a body that broke off).
async fn read_body(
    request: Request,
    budget: &Semaphore,
    max_body: usize,
) -> Result<(Vec<SemaphorePermit<'_>>, Bytes), Response> {
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {max_body} bytes\n"),
        )
            .into_response()
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return Err(too_large());
    }
    let mut body = request.into_body();
    let mut held = Vec::new();
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("the body broke off: {e}\n"),
            )
                .into_response()
        })?;
        let Ok(data) = frame.into_data() else {
            // Trailers: nothing to hold.
            continue;
        };
        if bytes.len() + data.len() > max_body {
            return Err(too_large());
        }
        // The body's KiB so far, rounded up, less those held already: a
        // body sent a byte at a time holds no more than one sent whole.
        let held_kib = bytes.len().div_ceil(1024);
        let kib = (bytes.len() + data.len()).div_ceil(1024) - held_kib;
        if kib > 0 {
            // The budget holds at least `max_body` (rounded up to KiB), so
            // a body within it always finds room once others are done; it
            // is never closed.
            let kib = u32::try_from(kib).unwrap_or(u32::MAX);
            match budget.acquire_many(kib).await {
                Ok(permit) => held.push(permit),
                Err(_) => return Err(too_large()),
            }
        }
        bytes.extend_from_slice(&data);
    }
    Ok((held, Bytes::from(bytes)))
}

async fn json(
    State(service): State<Arc<RateLimitService>>,
    request: Request,
    bodies: &Semaphore,
    body_timeout: Duration,
    max_body: usize,
) -> Response {
    // The body is read within the deadline, each part as the budget of
    // bodies held at once has room for it; the budget is kept until the
    // body is parsed.
    let read = tokio::time::timeout(body_timeout, read_body(request, bodies, max_body)).await;
    let (turn, body) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(refused)) => return refused,
        Err(_) => {
            return (
                StatusCode::REQUEST_TIMEOUT,
                [(header::CONNECTION, "close")],
                format!(
                    "the body did not arrive within {} s\n",
                    body_timeout.as_secs_f64()
                ),
            )
                .into_response();
        }
    };
    let request = match bounded::parse(&body, service.bounds()) {
        Ok(json) => to_request(json),
        Err(error) => Err(error.to_string()),
    };
    drop(body);
    drop(turn);
    let request = match request {
        Ok(request) => request,
        Err(message) => {
            // Refused before the service sees it: counted as it would count it.
            service.metrics().invalid();
            return (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response();
        }
    };
    match service.should_rate_limit(&request).await {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(to_json(&response))).into_response()
        }
        Err(error) => (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response(),
    }
}

/// The JSON request parsed with its lists held to the service's [`Bounds`]
/// while they are read: an empty descriptor is three bytes of JSON (`{},`)
/// and over a hundred in memory once parsed and converted, so a body of a
/// million of them, parsed whole before the bounds were checked, held 152 MB
/// at its peak (6.6 MB when held to them: `tests/json.rs`). Past a bound, the rest of the list is skipped (counted, not
/// kept), and the request refused with the error the service gives a decoded
/// request past it ([`RequestError`](crate::service::RequestError)).
mod bounded {
    use std::cell::Cell;
    use std::fmt;

    use serde::Deserialize as _;
    use serde::Deserializer;
    use serde::de::value::MapAccessDeserializer;
    use serde::de::{Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};

    use super::{JsonDescriptor, JsonEntry, JsonOverride, JsonRequest};
    use crate::service::{Bounds, RequestError};

    thread_local! {
        /// The bounds of the parse running on this thread (serde's
        /// `deserialize_with` takes no argument), and the index of the
        /// descriptor being read.
        static PARSING: Cell<(Bounds, usize)> = Cell::new((Bounds::default(), 0));
    }

    /// Parse `body` under `bounds`.
    pub(super) fn parse(body: &[u8], bounds: Bounds) -> Result<JsonRequest, serde_json::Error> {
        PARSING.with(|p| p.set((bounds, 0)));
        serde_json::from_slice::<Object<JsonRequest>>(body).map(|o| o.0)
    }

    /// A message read only from a JSON object, as protojson reads one:
    /// serde's derived structs also take an array of the fields in order
    /// (`["d", [...], 3]` was read as a request).
    pub(super) struct Object<T>(pub(super) T);

    impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Object<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Fields<T>(std::marker::PhantomData<T>);
            impl<'de, T: serde::Deserialize<'de>> Visitor<'de> for Fields<T> {
                type Value = T;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("an object")
                }

                fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                    T::deserialize(MapAccessDeserializer::new(map))
                }
            }
            deserializer
                .deserialize_map(Fields(std::marker::PhantomData))
                .map(Object)
        }
    }

    /// A message field: an object, or `null` for none.
    pub(super) fn object_or_null<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<JsonOverride>, D::Error> {
        Ok(Option::<Object<JsonOverride>>::deserialize(deserializer)?.map(|o| o.0))
    }

    /// Read a list, keeping at most `max` items and counting the rest.
    struct Bounded<T> {
        max: usize,
        each: fn(usize),
        over: fn(usize, usize) -> RequestError,
        item: std::marker::PhantomData<T>,
    }

    impl<'de, T: serde::Deserialize<'de>> Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list")
        }

        /// `null`: the empty list, as protojson reads it.
        fn visit_none<E: serde::de::Error>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<T>, D::Error> {
            deserializer.deserialize_seq(self)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut items = Vec::new();
            loop {
                (self.each)(items.len());
                if items.len() == self.max {
                    break;
                }
                match seq.next_element()? {
                    Some(item) => items.push(item),
                    None => return Ok(items),
                }
            }
            let mut count = self.max;
            while seq.next_element::<IgnoredAny>()?.is_some() {
                count += 1;
            }
            if count == self.max {
                return Ok(items);
            }
            Err(A::Error::custom((self.over)(count, self.max)))
        }
    }

    pub(super) fn descriptors<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<JsonDescriptor>, D::Error> {
        let (bounds, _) = PARSING.with(Cell::get);
        let list = deserializer.deserialize_option(Bounded::<Object<JsonDescriptor>> {
            max: bounds.max_descriptors,
            each: |index| PARSING.with(|p| p.set((p.get().0, index))),
            over: |count, max| RequestError::TooManyDescriptors { count, max },
            item: std::marker::PhantomData,
        })?;
        Ok(list.into_iter().map(|o| o.0).collect())
    }

    pub(super) fn entries<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<JsonEntry>, D::Error> {
        let (bounds, _) = PARSING.with(Cell::get);
        let list = deserializer.deserialize_option(Bounded::<Object<JsonEntry>> {
            max: bounds.max_entries,
            each: |_| {},
            over: |count, max| RequestError::TooManyEntries {
                descriptor: PARSING.with(Cell::get).1,
                count,
                max,
            },
            item: std::marker::PhantomData,
        })?;
        Ok(list.into_iter().map(|o| o.0).collect())
    }
}
