//! A budget of model tokens per API key, priced by the response: a `Limits`
//! layer charges each call 500 tokens up front, then settles the call's real
//! cost from the `x-tokens-used` header the model sets.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use tower::ServiceExt;
use turnstile::tower::{ApiKeyHeader, Limits, LimitsStats};
use turnstile::{KeyedLimiter, ManualClock, Quota, TokenBucket};

/// Tokens each API key may use a minute.
pub const BUDGET: u32 = 10_000;
/// Tokens charged when a call is admitted, before its real cost is known.
pub const UP_FRONT: u32 = 500;

/// A model gateway: the model behind a token budget per API key.
pub struct Gateway {
    app: Router,
    layer: Limits,
    tokens: Arc<KeyedLimiter<String, TokenBucket, ManualClock>>,
}

/// What one call got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: StatusCode,
    /// `Retry-After`, in seconds, on a 429.
    pub retry_after: Option<u64>,
    pub ratelimit_policy: String,
    /// The `RateLimit` field: the tokens left after the call was settled.
    pub ratelimit: String,
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.status)?;
        if let Some(secs) = self.retry_after {
            write!(f, ", Retry-After: {secs}")?;
        }
        write!(f, ", RateLimit: {}", self.ratelimit)
    }
}

impl Gateway {
    /// A gateway on `clock`.
    pub fn new(clock: ManualClock) -> Gateway {
        let quota = Quota::per_minute(BUDGET).expect("a valid quota");
        let tokens = Arc::new(
            KeyedLimiter::<String>::builder(quota)
                .clock(clock)
                .build()
                .expect("a valid configuration"),
        );
        let api_key = ApiKeyHeader::new(HeaderName::from_static("x-api-key"));
        let layer = Limits::builder()
            .limit_shared("tokens", api_key, Arc::clone(&tokens))
            .expect("a valid limit name")
            .cost(UP_FRONT)
            // The real cost: what the model says it used. Above the charge,
            // the difference is taken from what the key holds, then lent
            // from its next refills (the key's next calls wait; at most a
            // minute's budget ahead, the rest forgiven and counted); below
            // it, the rest goes back.
            .cost_from_response(|parts| {
                parts
                    .headers
                    .get("x-tokens-used")?
                    .to_str()
                    .ok()?
                    .parse()
                    .ok()
            })
            .build()
            .expect("a cost the budget can admit");
        let app = Router::new().route("/v1/complete", post(model).route_layer(layer.clone()));
        Gateway { app, layer, tokens }
    }

    /// A call by `key` that the model answers with `tokens` tokens.
    pub async fn complete(&self, key: &str, tokens: u32) -> Reply {
        let request = Request::post("/v1/complete")
            .header("x-api-key", key)
            .body(Body::from(tokens.to_string()))
            .expect("a valid request");
        let response = match self.app.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        Reply {
            status: response.status(),
            retry_after: header("retry-after").and_then(|s| s.parse().ok()),
            ratelimit_policy: header("ratelimit-policy").unwrap_or_default(),
            ratelimit: header("ratelimit").unwrap_or_default(),
        }
    }

    /// What the layer has settled so far.
    pub fn stats(&self) -> LimitsStats {
        self.layer.stats()
    }

    /// Tokens `key` holds now.
    pub fn remaining(&self, key: &str) -> u32 {
        self.tokens.remaining(key)
    }
}

/// The fake model: its prompt says how many tokens the answer uses (so the
/// story is exact), and it reports them in `x-tokens-used`, as a model API
/// reports its usage.
async fn model(prompt: String) -> impl IntoResponse {
    let used = prompt.trim().to_owned();
    ([("x-tokens-used", used)], "a completion\n")
}

/// How a call that used `tokens` was settled: `lent` of them from the next
/// refills, `forgiven` neither held nor lent.
fn settled(tokens: u32, lent: u64, forgiven: u64) -> String {
    if tokens <= UP_FRONT {
        return format!("{} given back", UP_FRONT - tokens);
    }
    let more = u64::from(tokens - UP_FRONT);
    let mut said = format!("{more} more charged");
    if lent > 0 {
        said.push_str(&format!(", {lent} of them lent from the next refills"));
    }
    if forgiven > 0 {
        said.push_str(&format!(", {forgiven} forgiven"));
    }
    said
}

/// The calls of the story, by the tokens each uses: two cheap ones, two
/// expensive ones, and one that uses more than is left.
pub const CALLS: [u32; 5] = [120, 300, 4_000, 5_000, 2_000];

/// The example's story, one line per event.
pub async fn story() -> Vec<String> {
    let clock = ManualClock::new();
    let gateway = Gateway::new(clock.clone());
    let mut lines = Vec::new();
    let call = async |tokens: u32, lines: &mut Vec<String>| {
        let before = gateway.stats();
        let reply = gateway.complete("k_1", tokens).await;
        let after = gateway.stats();
        let lent = after.lent - before.lent;
        let forgiven = after.forgiven - before.forgiven;
        if reply.status.is_success() {
            let settled = settled(tokens, lent, forgiven);
            lines.push(format!("uses {tokens}: {reply} ({settled})"));
        } else {
            lines.push(format!("a call: {reply} (refused before the model ran)"));
        }
        reply
    };

    for tokens in CALLS {
        let reply = call(tokens, &mut lines).await;
        if lines.len() == 1 {
            // What the first answer advertises, told first.
            let policy = reply.ratelimit_policy;
            lines.insert(0, format!("policy: {policy}, {UP_FRONT} charged up front"));
        }
    }
    let used: u32 = CALLS.iter().sum();
    let held = BUDGET.saturating_sub(gateway.remaining("k_1"));
    let stats = gateway.stats();
    lines.push(format!(
        "used {used} = {held} the bucket held + {} lent + {} forgiven",
        stats.lent, stats.forgiven
    ));

    // Nothing is left, and some is owed: refused before the model runs,
    // for as long as the debt and the up-front charge take to come back.
    let refused = call(100, &mut lines).await;
    if let Some(secs) = refused.retry_after {
        clock.advance(std::time::Duration::from_secs(secs));
        lines.push(format!("after {secs} s:"));
    }
    call(200, &mut lines).await;
    lines
}
