//! What the gate answers a request: [`Outcome`], its status and trace line.

use core::fmt;
use core::hash::Hash;

use crate::decision::{KeyedDecision, RetryAfter};

/// What the gate answers a request.
///
/// Its [`Display`](fmt::Display) is the rate-limiter pattern's trace format:
/// `200 OK (tokens left 2)`, `429 Too Many Requests, Retry-After: 1`,
/// `401 Unauthorized`, `503 Service Unavailable, Retry-After: 3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a denied request must not reach the work it would start"]
pub enum Outcome {
    /// 200: admitted, with `remaining` permits left for the key.
    Admitted {
        /// Permits left for the key.
        remaining: u32,
    },
    /// 401: the request carried no key, so there is no allowance to charge it
    /// to. (Authenticating the key is the caller's job.)
    Unauthorized,
    /// 429: the key is over its limit; retry after the wait, which the
    /// `Retry-After` header gives in whole seconds, rounded up.
    TooManyRequests {
        /// The exact wait.
        retry_after: RetryAfter,
    },
    /// 503: the limiter holds as many keys as it may
    /// ([`KeyedDecision::KeyLimit`]); a new key can be tracked once idle ones
    /// have been swept. Not the client's fault, so not a 429.
    Unavailable {
        /// When idle keys will have been swept.
        retry_after: RetryAfter,
    },
}

impl Outcome {
    /// The outcome for a request with `decision`, or with no key (`None`).
    pub const fn from_decision(decision: Option<KeyedDecision>) -> Outcome {
        match decision {
            None => Outcome::Unauthorized,
            Some(KeyedDecision::Allowed { remaining }) => Outcome::Admitted { remaining },
            Some(KeyedDecision::Denied { retry_after }) => Outcome::TooManyRequests { retry_after },
            Some(KeyedDecision::KeyLimit { retry_after }) => Outcome::Unavailable { retry_after },
        }
    }

    /// The HTTP status code: 200, 401, 429 or 503.
    pub const fn status(&self) -> u16 {
        match self {
            Outcome::Admitted { .. } => 200,
            Outcome::Unauthorized => 401,
            Outcome::TooManyRequests { .. } => 429,
            Outcome::Unavailable { .. } => 503,
        }
    }

    /// The status's reason phrase.
    pub const fn reason(&self) -> &'static str {
        match self {
            Outcome::Admitted { .. } => "OK",
            Outcome::Unauthorized => "Unauthorized",
            Outcome::TooManyRequests { .. } => "Too Many Requests",
            Outcome::Unavailable { .. } => "Service Unavailable",
        }
    }

    /// `true` for 200: let the request through.
    pub const fn is_admitted(&self) -> bool {
        matches!(self, Outcome::Admitted { .. })
    }

    /// The wait, for 429 and 503.
    pub const fn retry_after(&self) -> Option<RetryAfter> {
        match self {
            Outcome::TooManyRequests { retry_after } | Outcome::Unavailable { retry_after } => {
                Some(*retry_after)
            }
            Outcome::Admitted { .. } | Outcome::Unauthorized => None,
        }
    }

    /// The `Retry-After` value in whole seconds, rounded up (a client told to
    /// come back early only gets another 429), for 429 and 503.
    pub const fn retry_after_secs(&self) -> Option<u64> {
        match self.retry_after() {
            Some(wait) => Some(wait.header_secs()),
            None => None,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status(), self.reason())?;
        match (self, self.retry_after_secs()) {
            (Outcome::Admitted { remaining }, _) => write!(f, " (tokens left {remaining})"),
            (_, Some(secs)) => write!(f, ", Retry-After: {secs}"),
            (_, None) => Ok(()),
        }
    }
}
