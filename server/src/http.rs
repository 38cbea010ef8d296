//! The HTTP endpoints: `POST /json` (envoyproxy/ratelimit's JSON form of the
//! request and response: proto3's JSON mapping, 200 when every descriptor is
//! within its limit, 429 when one is over), `GET /healthcheck`
//! (envoyproxy/ratelimit's: `OK` while serving, 500 with no body once the
//! shutdown has begun), `GET /healthz` (`OK` while the process answers at
//! all), and `GET /metrics` (Prometheus text: [`metrics`](crate::metrics)).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
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
use serde::{Deserialize, Serialize};

use crate::service::RateLimitService;

/// The router of the HTTP endpoints, with bodies of at most `max_body` bytes.
pub fn router(service: Arc<RateLimitService>, max_body: usize) -> Router {
    Router::new()
        .route("/json", post(json))
        .route("/healthcheck", any(healthcheck))
        .route("/healthz", get(|| async { "OK\n" }))
        .route("/metrics", get(metrics))
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .with_state(service)
}

/// A `uint64` in proto3's JSON mapping: a number or a decimal string.
#[derive(Deserialize)]
#[serde(untagged)]
enum Uint64 {
    Number(u64),
    Text(String),
}

impl Uint64 {
    fn value(&self) -> Result<u64, String> {
        match self {
            Uint64::Number(n) => Ok(*n),
            Uint64::Text(text) => text
                .parse()
                .map_err(|_| format!("not a whole number: {text:?}")),
        }
    }
}

#[derive(Deserialize)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default, deserialize_with = "bounded::descriptors")]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Uint64>,
}

#[derive(Deserialize)]
struct JsonDescriptor {
    #[serde(default, deserialize_with = "bounded::entries")]
    entries: Vec<JsonEntry>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Uint64>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: bool,
    #[serde(default)]
    limit: Option<JsonOverride>,
}

/// A descriptor's `limit` override.
#[derive(Deserialize)]
struct JsonOverride {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: u32,
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
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonResponse {
    overall_code: &'static str,
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus {
    code: &'static str,
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
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Serialize)]
struct JsonHeader {
    key: String,
    value: String,
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).unwrap_or(Code::Unknown).as_str_name()
}

fn to_request(json: JsonRequest) -> Result<RateLimitRequest, String> {
    let hits_addend = match &json.hits_addend {
        Some(n) => u32::try_from(n.value()?).map_err(|_| "hitsAddend is a uint32".to_string())?,
        None => 0,
    };
    let mut descriptors = Vec::with_capacity(json.descriptors.len());
    for d in json.descriptors {
        let hits_addend = match &d.hits_addend {
            Some(n) => Some(UInt64Value { value: n.value()? }),
            None => None,
        };
        descriptors.push(RateLimitDescriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| Entry {
                    key: e.key,
                    value: e.value,
                })
                .collect(),
            hits_addend,
            is_negative_hits: d.is_negative_hits,
            limit: match d.limit {
                Some(limit) => Some(RateLimitOverride {
                    requests_per_unit: limit.requests_per_unit,
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
        domain: json.domain,
        descriptors,
        hits_addend,
    })
}

fn to_json(response: &RateLimitResponse) -> JsonResponse {
    JsonResponse {
        overall_code: code_name(response.overall_code),
        statuses: response
            .statuses
            .iter()
            .map(|s| JsonStatus {
                code: code_name(s.code),
                current_limit: s.current_limit.as_ref().map(|l| JsonLimit {
                    name: l.name.clone(),
                    requests_per_unit: l.requests_per_unit,
                    unit: PbUnit::try_from(l.unit)
                        .unwrap_or(PbUnit::Unknown)
                        .as_str_name(),
                }),
                limit_remaining: s.limit_remaining,
                // proto3's JSON form of a Duration: seconds with up to nine
                // fractional digits and an `s`.
                duration_until_reset: s.duration_until_reset.as_ref().map(|d| {
                    if d.nanos == 0 {
                        format!("{}s", d.seconds)
                    } else {
                        format!("{}.{:09}s", d.seconds, d.nanos)
                    }
                }),
            })
            .collect(),
        response_headers_to_add: response
            .response_headers_to_add
            .iter()
            .map(|h| JsonHeader {
                key: h.key.clone(),
                value: h.value.clone(),
            })
            .collect(),
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

async fn json(State(service): State<Arc<RateLimitService>>, body: Bytes) -> Response {
    let request = match bounded::parse(&body, service.bounds()) {
        Ok(json) => to_request(json),
        Err(error) => Err(error.to_string()),
    };
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

    use serde::Deserializer;
    use serde::de::{Error as _, IgnoredAny, SeqAccess, Visitor};

    use super::{JsonDescriptor, JsonEntry, JsonRequest};
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
        serde_json::from_slice(body)
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
        deserializer.deserialize_seq(Bounded {
            max: bounds.max_descriptors,
            each: |index| PARSING.with(|p| p.set((p.get().0, index))),
            over: |count, max| RequestError::TooManyDescriptors { count, max },
            item: std::marker::PhantomData,
        })
    }

    pub(super) fn entries<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<JsonEntry>, D::Error> {
        let (bounds, _) = PARSING.with(Cell::get);
        deserializer.deserialize_seq(Bounded {
            max: bounds.max_entries,
            each: |_| {},
            over: |count, max| RequestError::TooManyEntries {
                descriptor: PARSING.with(Cell::get).1,
                count,
                max,
            },
            item: std::marker::PhantomData,
        })
    }
}
