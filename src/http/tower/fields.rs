//! The `RateLimit-Policy` and `RateLimit` fields as the layers write them:
//! structured-field List items, appended to what a layer closer to the
//! service set, written by hand (`core::fmt` costs more than a decision).

use core::time::Duration;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

#[cfg(test)]
use crate::http::outcome::Outcome;
#[cfg(test)]
use crate::http::policy::RateLimitPolicy;
#[cfg(any(test, all(feature = "redis", feature = "tokio")))]
pub(crate) use crate::http::policy::policy_fields;
use crate::http::policy::window_secs;
pub(crate) use crate::http::policy::{Digits, Fields, push_decimal, push_name};

/// `"name";q=Q;w=W`, the window in whole seconds rounded up (at least 1).
pub(crate) fn push_policy(
    out: &mut Vec<u8>,
    name: &str,
    tier: Option<&str>,
    quota: u32,
    window: Duration,
) {
    push_name(out, name, tier);
    out.extend_from_slice(b";q=");
    push_decimal(out, quota.into());
    out.extend_from_slice(b";w=");
    push_decimal(out, window_secs(window));
}

/// The values as `RateLimitPolicy`'s strings, for comparison in tests.
#[cfg(test)]
fn formatted(policy: &RateLimitPolicy, outcome: &Outcome) -> Fields {
    // Validated policy names and numbers make valid values; anything else
    // would be left out, never a panic.
    let value = |s: Option<String>| s.and_then(|s| HeaderValue::from_str(&s).ok());
    [
        value(Some(policy.policy_value())),
        value(policy.value(outcome)),
    ]
}

/// Add one policy's items to the `RateLimit-Policy` and `RateLimit` fields.
///
/// Both fields are structured-field Lists (draft-ietf-httpapi-ratelimit-headers,
/// -08 onwards), one item per policy: an item is appended to what a layer
/// closer to the service already set, never written over it, so that every
/// limit a request met is told. The items go on one field line each (a List
/// split across lines means the same, but not every client joins them).
pub(crate) fn add_policy_fields(headers: &mut HeaderMap, fields: Fields) {
    let [policy, value] = fields;
    if let (Some(policy), Some(value)) = (policy, value) {
        append_items(headers, policy, value);
    }
}

/// Append one policy's `RateLimit-Policy` item and its `RateLimit` item,
/// both or neither: when either field already holds a line in another form
/// (not a List of Strings: an earlier draft's Dictionary or Integer items,
/// `limit=100, remaining=50`), neither is added, so the two never disagree
/// and a client of the other draft reads what it was sent.
pub(crate) fn append_items(headers: &mut HeaderMap, policy: HeaderValue, value: HeaderValue) {
    // Neither field set closer to the service, as behind a single layer:
    // each item is the whole field.
    if !headers.contains_key(&RATELIMIT_POLICY) && !headers.contains_key(&RATELIMIT) {
        headers.insert(RATELIMIT_POLICY, policy);
        headers.insert(RATELIMIT, value);
        return;
    }
    append_to_lines(headers, policy, value);
}

/// [`append_items`] where either field holds a line already.
#[inline(never)]
fn append_to_lines(headers: &mut HeaderMap, policy: HeaderValue, value: HeaderValue) {
    let (Some(policy_lines), Some(value_lines)) = (
        joined_lines(headers, &RATELIMIT_POLICY),
        joined_lines(headers, &RATELIMIT),
    ) else {
        return;
    };
    append_item(headers, RATELIMIT_POLICY, policy_lines, policy);
    append_item(headers, RATELIMIT, value_lines, value);
}

/// The lines field `name` holds, joined by ", " with a trailing separator
/// (empty lines dropped: joined, they would make the List invalid): an
/// empty vector, with no allocation, when there is none; `None` when a line
/// is not a List of this draft's items (each a String first).
fn joined_lines(headers: &HeaderMap, name: &HeaderName) -> Option<Vec<u8>> {
    let mut joined = Vec::new();
    for line in headers.get_all(name) {
        let line = line.as_bytes().trim_ascii();
        match line.first() {
            None => {}
            Some(b'"') => {
                // Once, room for what a few items take: growing from
                // nothing would reallocate as each layer's items are added.
                if joined.capacity() == 0 {
                    joined.reserve(64 + line.len());
                }
                joined.extend_from_slice(line);
                joined.extend_from_slice(b", ");
            }
            Some(_) => return None,
        }
    }
    Some(joined)
}

/// Set field `name` to the `joined` lines it held ([`joined_lines`]) and
/// `item` after them.
fn append_item(headers: &mut HeaderMap, name: HeaderName, mut joined: Vec<u8>, item: HeaderValue) {
    if joined.is_empty() {
        headers.insert(name, item);
        return;
    }
    joined.extend_from_slice(item.as_bytes());
    // Valid values joined by ", " make a valid value; were it not, the item
    // would be appended as a line of its own, never lost.
    match HeaderValue::from_bytes(&joined) {
        Ok(value) => {
            headers.insert(name, value);
        }
        Err(_) => {
            headers.append(name, item);
        }
    }
}

pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{KeyedDecision, RetryAfter};

    #[test]
    fn an_item_is_appended_to_a_list_never_to_an_empty_line_or_another_form() {
        let item = HeaderValue::from_static("\"api\";r=4");
        let policy = HeaderValue::from_static("\"api\";q=5;w=1");
        let lines_of = |headers: &HeaderMap, name| {
            headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        let joined = |lines: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for line in lines {
                headers.append(RATELIMIT, HeaderValue::from_static(line));
            }
            append_items(&mut headers, policy.clone(), item.clone());
            lines_of(&headers, RATELIMIT)
        };
        assert_eq!(joined(&[]), ["\"api\";r=4"]);
        assert_eq!(joined(&[""]), ["\"api\";r=4"], "no leading comma");
        assert_eq!(joined(&["  ", ""]), ["\"api\";r=4"]);
        assert_eq!(joined(&["\"edge\";r=9", ""]), ["\"edge\";r=9, \"api\";r=4"]);
        assert_eq!(
            joined(&["\"a\";r=1, \"b\";r=2", " \"c\";r=3 "]),
            ["\"a\";r=1, \"b\";r=2, \"c\";r=3, \"api\";r=4"]
        );
        // An earlier draft's Dictionary is left alone, and neither item is
        // added, nor the policy's: the two fields never disagree.
        assert_eq!(
            joined(&["limit=100, remaining=50, reset=5"]),
            ["limit=100, remaining=50, reset=5"]
        );
        let mut headers = HeaderMap::new();
        headers.append(RATELIMIT_POLICY, HeaderValue::from_static("100;w=60"));
        append_items(&mut headers, policy.clone(), item.clone());
        assert_eq!(lines_of(&headers, RATELIMIT_POLICY), ["100;w=60"]);
        assert!(lines_of(&headers, RATELIMIT).is_empty());
        let mut headers = HeaderMap::new();
        headers.append(RATELIMIT, HeaderValue::from_static("limit=100"));
        append_items(&mut headers, policy.clone(), item.clone());
        assert!(lines_of(&headers, RATELIMIT_POLICY).is_empty());
    }

    #[test]
    fn items_written_by_hand_are_the_policy_s_own_strings() {
        let policy =
            RateLimitPolicy::new("api.paid-1", 4_294_967_295, Duration::from_millis(1_500))
                .unwrap();
        for outcome in [
            Outcome::Admitted { remaining: 0 },
            Outcome::Admitted {
                remaining: 1_234_567,
            },
            Outcome::Unauthorized,
            Outcome::from_decision(Some(KeyedDecision::Denied {
                retry_after: RetryAfter::from_nanos(2_500_000_000),
            })),
            Outcome::from_decision(Some(KeyedDecision::KeyLimit {
                retry_after: RetryAfter::from_nanos(1),
            })),
        ] {
            assert_eq!(
                policy_fields(&policy, &outcome),
                formatted(&policy, &outcome),
                "{outcome:?}"
            );
        }
        let mut n = Vec::new();
        for x in [0, 9, 10, 99, 100, u64::MAX] {
            n.clear();
            push_decimal(&mut n, x);
            assert_eq!(n, x.to_string().as_bytes());
        }
    }

    /// Every number up to 100,000, each power of ten and its neighbours,
    /// and a million more spread over the whole range, as `to_string`
    /// writes them; appended after what is there.
    #[test]
    fn decimals_are_to_string_s() {
        let mut xs: Vec<u64> = (0..=100_000).collect();
        for k in 0..20 {
            let p = 10u64.pow(k);
            xs.extend([p - 1, p, p + 1]);
        }
        xs.push(u64::MAX);
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..1_000_000 {
            // xorshift64, shifted right by 0 to 63 bits: every length of number.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            xs.push(state >> (state % 64));
        }
        let mut out = b"r=".to_vec();
        for x in xs {
            out.truncate(2);
            push_decimal(&mut out, x);
            assert_eq!(&out[2..], x.to_string().as_bytes(), "{x}");
            assert_eq!(&out[..2], b"r=");
        }
    }
}
