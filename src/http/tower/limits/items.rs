//! The `RateLimit-Policy` and `RateLimit` items a combined layer writes.

use super::*;

/// The `RateLimit-Policy` and `RateLimit` items being written, as bytes
/// (written by hand: `core::fmt` costs several times the decision itself).
pub(super) struct Items {
    pub(super) policy: Vec<u8>,
    pub(super) value: Vec<u8>,
    /// Items written.
    pub(super) count: usize,
    /// Whether every policy item was the limit's cached one.
    pub(super) all_cached: bool,
}

impl Default for Items {
    fn default() -> Items {
        Items {
            policy: Vec::new(),
            value: Vec::new(),
            count: 0,
            all_cached: true,
        }
    }
}

/// A limit's `RateLimit-Policy` item, written once for the quota and window
/// it advertised when it was added (a limit without tiers).
pub(super) struct Cached {
    pub(super) quota: u32,
    pub(super) window: Duration,
    pub(super) item: Box<[u8]>,
    /// The start of its `RateLimit` item, `"name";r=`.
    pub(super) value: Box<[u8]>,
}

impl Cached {
    pub(super) fn new(name: &str, (quota, window): (u32, Duration)) -> Cached {
        let mut item = Vec::new();
        push_policy(&mut item, name, None, quota, window);
        let mut value = Vec::new();
        push_name(&mut value, name, None);
        value.extend_from_slice(b";r=");
        Cached {
            quota,
            window,
            item: item.into(),
            value: value.into(),
        }
    }
}

/// One limit's state, for its `RateLimit` item.
pub(super) enum State {
    Remaining(u32),
    Wait(RetryAfter),
}

impl Items {
    pub(super) fn push(
        &mut self,
        name: &str,
        cached: Option<&Cached>,
        advertised: Option<Advertised<'_>>,
        state: &State,
    ) {
        let Some(advertised) = advertised else {
            return;
        };
        self.count += 1;
        let (policy, value) = (&mut self.policy, &mut self.value);
        if policy.is_empty() {
            // Allocated at once, not grown from nothing.
            *policy = Vec::with_capacity(96);
            *value = Vec::with_capacity(96);
        } else {
            policy.extend_from_slice(b", ");
            value.extend_from_slice(b", ");
        }
        match cached {
            Some(cached)
                if advertised.tier.is_none()
                    && (cached.quota, cached.window) == (advertised.quota, advertised.window) =>
            {
                policy.extend_from_slice(&cached.item);
                value.extend_from_slice(&cached.value);
            }
            _ => {
                self.all_cached = false;
                push_policy(
                    policy,
                    name,
                    advertised.tier,
                    advertised.quota,
                    advertised.window,
                );
                push_name(value, name, advertised.tier);
                value.extend_from_slice(b";r=");
            }
        }
        match state {
            State::Remaining(r) => push_decimal(value, (*r).into()),
            State::Wait(wait) => {
                value.extend_from_slice(b"0;t=");
                push_decimal(value, wait.header_secs());
            }
        }
    }

    /// The two field values; `line` is the whole `RateLimit-Policy` value
    /// of `limits` limits each with its cached item, shared rather than
    /// copied when every item written was that.
    #[inline]
    pub(super) fn fields(self, line: Option<&(usize, HeaderValue)>) -> Option<Fields> {
        if self.policy.is_empty() {
            return None;
        }
        self.values(line)
    }

    /// [`fields`](Self::fields) for a list with items: out of line, so a
    /// request with nothing to advertise runs only the check above.
    #[inline(never)]
    fn values(self, line: Option<&(usize, HeaderValue)>) -> Option<Fields> {
        let policy = match line {
            Some((limits, line)) if self.all_cached && self.count == *limits => Some(line.clone()),
            // Validated names and numbers make valid values.
            _ => HeaderValue::from_bytes(&self.policy).ok(),
        };
        Some([policy, HeaderValue::from_bytes(&self.value).ok()])
    }
}
