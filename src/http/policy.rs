//! The `RateLimit-Policy` and `RateLimit` header fields: [`RateLimitPolicy`],
//! and what an algorithm may advertise in them ([`AdvertisedQuota`]).

use core::fmt;
use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::live::LiveTokenBucket;
use crate::algorithm::sliding_window::SlidingWindow;
use crate::algorithm::token_bucket::TokenBucket;
use crate::quota::Quota;

use crate::http::outcome::Outcome;

/// A policy name, quota and window for the `RateLimit-Policy` and `RateLimit`
/// header fields of the IETF httpapi draft ("RateLimit header fields for
/// HTTP"): `RateLimit-Policy: "name";q=100;w=60` and
/// `RateLimit: "name";r=42` (with `;t=` the seconds to wait, on a denial).
///
/// In the draft, `q` is the quota (units, here permits) the policy allocates
/// and `w` the window in seconds over which it applies: a client that sends at
/// most `q` units in any `w` seconds is not refused.
/// [`from_algorithm`](RateLimitPolicy::from_algorithm) derives both from the
/// limiter's algorithm ([`AdvertisedQuota`]), so that they cannot drift from
/// what is enforced; [`new`](RateLimitPolicy::new) states them by hand.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Quota, RateLimitPolicy, TokenBucket};
///
/// // A bucket of 3 that gains one token every 10 s: a burst of 3 is always
/// // back 30 s later, and nothing larger is ever promised.
/// let bucket = TokenBucket::new(Quota::new(3, 1, Duration::from_secs(10))?);
/// let policy = RateLimitPolicy::from_algorithm("api", &bucket)?;
/// assert_eq!(policy.policy_value(), "\"api\";q=3;w=30");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitPolicy {
    name: String,
    quota: u32,
    window_secs: u64,
}

/// Why a [`RateLimitPolicy`] was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// The name must be 1 to 64 characters from `A-Z a-z 0-9 _ - .`, so that
    /// it is safe inside a quoted header string.
    Name(String),
    /// The window must be at least one second (the fields count whole
    /// seconds) and at most [`RateLimitPolicy::MAX_WINDOW_SECS`] (the largest integer of a
    /// structured field has 15 digits).
    Window(Duration),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Name(name) => write!(
                f,
                "policy name {name:?}: use 1 to 64 characters from A-Z, a-z, 0-9, '_', '-', '.'"
            ),
            PolicyError::Window(window) => write!(
                f,
                "policy window {window:?}: it must be from 1 second to {} seconds",
                RateLimitPolicy::MAX_WINDOW_SECS
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

impl RateLimitPolicy {
    /// The longest policy window, in seconds: the largest integer a
    /// structured field can carry (15 digits, RFC 9651), some 31.7 million
    /// years.
    pub const MAX_WINDOW_SECS: u64 = 999_999_999_999_999;

    /// A policy called `name` of `quota` units per `window` (whole seconds,
    /// rounded up).
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] for a name that could break the header's syntax,
    /// [`PolicyError::Window`] for a window under one second or over
    /// [`MAX_WINDOW_SECS`](Self::MAX_WINDOW_SECS) (written, it would not be a structured-field
    /// integer, and a strict parser would refuse the whole field, other
    /// layers' items with it).
    pub fn new(name: &str, quota: u32, window: Duration) -> Result<RateLimitPolicy, PolicyError> {
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
            return Err(PolicyError::Name(name.chars().take(80).collect()));
        }
        if window < Duration::from_secs(1) || window_secs(window) > Self::MAX_WINDOW_SECS {
            return Err(PolicyError::Window(window));
        }
        Ok(RateLimitPolicy {
            name: name.to_string(),
            quota,
            window_secs: window_secs(window),
        })
    }

    /// A policy called `name` that advertises what `algorithm` enforces
    /// ([`AdvertisedQuota`]): `q` the largest burst it always admits and `w`
    /// the time after which that burst is always admitted again, rounded up to
    /// whole seconds (a longer window for the same quota only promises less).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Quota, RateLimitPolicy};
    ///
    /// let per_second = RateLimitPolicy::from_algorithm("burst", &Quota::per_second(100)?.burst(20)?)?;
    /// // 20 at once, refilled in 200 ms: advertised over a whole second.
    /// assert_eq!(per_second.policy_value(), "\"burst\";q=20;w=1");
    /// let window = FixedWindow::new(50, Duration::from_secs(60))?;
    /// assert_eq!(RateLimitPolicy::from_algorithm("w", &window)?.policy_value(), "\"w\";q=50;w=60");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] as for [`new`](RateLimitPolicy::new).
    pub fn from_algorithm(
        name: &str,
        algorithm: &impl AdvertisedQuota,
    ) -> Result<RateLimitPolicy, PolicyError> {
        let (quota, window) = algorithm.advertised_quota();
        // Every algorithm's window is positive; a sub-second one is advertised
        // as one second (the fields count whole seconds).
        RateLimitPolicy::new(name, quota, window.max(Duration::from_secs(1)))
    }

    /// Whether this policy is the one [`new`](Self::new) would make of its
    /// own name with `quota` and `window` (a window under a second counted
    /// as one, as a derived policy's is).
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn advertises(&self, quota: u32, window: Duration) -> bool {
        (quota, window_secs(window)) == (self.quota, self.window_secs)
    }

    /// The `RateLimit-Policy` item, written to `out` by hand.
    #[cfg(feature = "tower")]
    pub(crate) fn push_policy_item(&self, out: &mut Vec<u8>) {
        push_name(out, &self.name, None);
        out.extend_from_slice(b";q=");
        push_decimal(out, self.quota.into());
        out.extend_from_slice(b";w=");
        push_decimal(out, self.window_secs);
    }

    /// The `RateLimit` item for `outcome`, written to `out` by hand; `false`
    /// (nothing written) for a 401.
    #[cfg(feature = "tower")]
    pub(crate) fn push_value_item(&self, out: &mut Vec<u8>, outcome: &Outcome) -> bool {
        match outcome {
            Outcome::Unauthorized => return false,
            Outcome::Admitted { remaining } => {
                push_name(out, &self.name, None);
                out.extend_from_slice(b";r=");
                push_decimal(out, (*remaining).into());
            }
            Outcome::TooManyRequests { retry_after } | Outcome::Unavailable { retry_after } => {
                push_name(out, &self.name, None);
                out.extend_from_slice(b";r=0;t=");
                push_decimal(out, retry_after.header_secs());
            }
        }
        true
    }

    /// The `RateLimit-Policy` field value.
    pub fn policy_value(&self) -> String {
        format!("\"{}\";q={};w={}", self.name, self.quota, self.window_secs)
    }

    /// The `RateLimit` field value for `outcome`: the units left, and on a
    /// denial the seconds until the request could succeed. `None` for 401.
    pub fn value(&self, outcome: &Outcome) -> Option<String> {
        match outcome {
            Outcome::Admitted { remaining } => Some(format!("\"{}\";r={remaining}", self.name)),
            Outcome::Unauthorized => None,
            Outcome::TooManyRequests { retry_after } | Outcome::Unavailable { retry_after } => {
                Some(format!(
                    "\"{}\";r=0;t={}",
                    self.name,
                    retry_after.header_secs()
                ))
            }
        }
    }
}

/// An algorithm whose limit can be advertised in a `RateLimit-Policy` field:
/// the quota `q` and window `w` of [`RateLimitPolicy::from_algorithm`].
///
/// The pair must never promise more than the algorithm allows: a client that
/// sends `q` permits at once, and again each time `w` has passed, must never
/// be refused. `q` can be no larger than the largest burst (the capacity), so
/// each implementation advertises its capacity over the shortest window after
/// which that burst is certain to be available again:
///
/// - a token bucket ([`Quota`], [`TokenBucket`]): `q = capacity`,
///   `w = fill_time = ceil(capacity / amount) * period`, since a bucket
///   emptied at `t` has gained at least `capacity` tokens by `t + w`;
/// - [`Gcra`]: `q = capacity`, `w` the larger of the fill time and
///   `capacity` emission intervals (the interval is rounded up to whole
///   nanoseconds);
/// - [`FixedWindow`]: `q = limit`, `w = window`: two instants one window
///   apart lie in different windows;
/// - [`SlidingWindow`]: `q = limit`, `w = 2 * window`: one window later the
///   previous window's count still weighs fully, two windows later it is gone.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{AdvertisedQuota, Quota, SlidingWindow};
///
/// let bucket = Quota::new(5, 2, Duration::from_secs(10))?; // full again 30 s after a burst
/// assert_eq!(bucket.advertised_quota(), (5, Duration::from_secs(30)));
/// let sliding = SlidingWindow::new(10, Duration::from_secs(60))?;
/// assert_eq!(sliding.advertised_quota(), (10, Duration::from_secs(120)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AdvertisedQuota {
    /// `(q, w)`: the permits a client may send at once, and the time after
    /// which it may do so again.
    fn advertised_quota(&self) -> (u32, Duration);
}

impl AdvertisedQuota for Quota {
    fn advertised_quota(&self) -> (u32, Duration) {
        (self.capacity(), self.fill_time())
    }
}

/// The algorithm's own rule ([`Algorithm::advertise`]); every algorithm of
/// the crate advertises one.
macro_rules! advertised_by_algorithm {
    ($($algorithm:ty),*) => {$(
        impl AdvertisedQuota for $algorithm {
            fn advertised_quota(&self) -> (u32, Duration) {
                Algorithm::advertise(self)
                    .unwrap_or((Algorithm::capacity(self), Algorithm::fresh_after_idle(self)))
            }
        }
    )*};
}

advertised_by_algorithm!(
    TokenBucket,
    Gcra,
    FixedWindow,
    SlidingWindow,
    LiveTokenBucket,
    crate::LiveGcra,
    crate::LiveFixedWindow,
    crate::LiveSlidingWindow
);

/// `window` in the fields' whole seconds: rounded up, at least 1.
pub(crate) fn window_secs(window: Duration) -> u64 {
    let window = window.max(Duration::from_secs(1));
    window
        .as_secs()
        .saturating_add(u64::from(window.subsec_nanos() > 0))
}

/// One policy's `RateLimit-Policy` and `RateLimit` list items.
#[cfg(feature = "tower")]
pub(crate) type Fields = [Option<http::HeaderValue>; 2];

/// The `RateLimit-Policy` and `RateLimit` field values for `outcome`.
#[cfg(feature = "tower")]
pub(crate) fn policy_fields(policy: &RateLimitPolicy, outcome: &Outcome) -> Fields {
    let mut buffer = Vec::with_capacity(48);
    policy.push_policy_item(&mut buffer);
    let policy_value = http::HeaderValue::from_bytes(&buffer).ok();
    buffer.clear();
    [policy_value, value_field(policy, outcome, buffer)]
}

/// [`policy_fields`] with `policy`'s item already written (`item`).
#[cfg(feature = "tower")]
pub(crate) fn policy_fields_with(
    policy: &RateLimitPolicy,
    item: &[u8],
    outcome: &Outcome,
) -> Fields {
    [
        http::HeaderValue::from_bytes(item).ok(),
        value_field(policy, outcome, Vec::with_capacity(48)),
    ]
}

/// The `RateLimit` value for `outcome`, written in `buffer` (empty); none
/// for a 401. Validated names and numbers make valid values.
#[cfg(feature = "tower")]
fn value_field(
    policy: &RateLimitPolicy,
    outcome: &Outcome,
    mut buffer: Vec<u8>,
) -> Option<http::HeaderValue> {
    policy
        .push_value_item(&mut buffer, outcome)
        .then(|| http::HeaderValue::from_bytes(&buffer).ok())
        .flatten()
}

/// `n` in decimal, two digits a division.
#[cfg(feature = "tower")]
pub(crate) fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(Digits::of(n).as_bytes());
}

/// A number's decimal digits, written on the stack.
#[cfg(feature = "tower")]
pub(crate) struct Digits {
    digits: [u8; 20],
    /// Where the digits start: they end at the end of `digits`.
    at: usize,
}

#[cfg(feature = "tower")]
impl Digits {
    /// `n` in decimal, two digits a division (`u64::MAX` has 20).
    #[inline]
    pub(crate) fn of(mut n: u64) -> Digits {
        /// `00` to `99`.
        const PAIRS: &[u8; 200] = b"\
            0001020304050607080910111213141516171819\
            2021222324252627282930313233343536373839\
            4041424344454647484950515253545556575859\
            6061626364656667686970717273747576777879\
            8081828384858687888990919293949596979899";
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        while n >= 100 {
            // `n % 100 < 100`: the pair is within the table.
            let pair = (n % 100) as usize * 2;
            n /= 100;
            at -= 2;
            digits[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            let pair = n as usize * 2;
            at -= 2;
            digits[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        } else {
            at -= 1;
            // `n < 10`: the cast keeps every bit.
            digits[at] = b'0' + n as u8;
        }
        Digits { digits, at }
    }

    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.digits[self.at..]
    }
}

/// `"name"` or `"name.tier"`: a quoted policy name.
#[cfg(feature = "tower")]
pub(crate) fn push_name(out: &mut Vec<u8>, name: &str, tier: Option<&str>) {
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    if let Some(tier) = tier {
        out.push(b'.');
        out.extend_from_slice(tier.as_bytes());
    }
    out.push(b'"');
}
