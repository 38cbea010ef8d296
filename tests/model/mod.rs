//! A plain, obviously correct model of the rate-limiter pattern's
//! `TokenBucketLimiter`, written for clarity and not speed: unbounded integer
//! time, no packing, no atomics.
//!
//! Generalized as the crate documents it: `amount` tokens per period, `n` permits
//! all or nothing, time in whole units (`Quota::time_unit`) of a nanosecond
//! clock, and a reading behind the last refill time refills nothing and moves
//! nothing.
//!
//! Two flavours. [`Model::pattern`] refills on every request, denied or not, as
//! the pattern's C# does. [`Model::denial_writes_nothing`] keeps a denied request's
//! refill out of the state, as the crate does. While time only moves forward the
//! two cannot be told apart (a refill is idempotent); with readings that go
//! backwards they can, and the crate follows the second.

#![allow(dead_code)]

use turnstile::{Decision, Quota, RetryAfter};

#[derive(Clone, Debug)]
pub struct Model {
    /// Whether a denied request keeps the refill it computed.
    refill_on_denial: bool,
    /// Microseconds per time unit.
    unit: u64,
    capacity: u64,
    amount: u64,
    period: u64,
    tokens: u64,
    last: u64,
}

impl Model {
    /// The rate-limiter pattern's algorithm: a denied request keeps its refill.
    pub fn pattern(quota: Quota) -> Model {
        Model::new(quota, true)
    }

    /// The crate's rule: a denied request changes nothing.
    pub fn denial_writes_nothing(quota: Quota) -> Model {
        Model::new(quota, false)
    }

    /// A full bucket. (Its refill time does not matter while it is full.)
    fn new(quota: Quota, refill_on_denial: bool) -> Model {
        let unit = quota.time_unit().as_micros() as u64;
        Model {
            refill_on_denial,
            unit,
            capacity: u64::from(quota.capacity()),
            amount: u64::from(quota.amount()),
            period: quota.period().as_micros() as u64 / unit,
            tokens: u64::from(quota.capacity()),
            last: 0,
        }
    }

    /// The rate-limiter pattern's `Refill`.
    fn refill(&mut self, now: u64) {
        if self.tokens < self.capacity && now < self.last {
            // Behind the last refill: nothing.
            return;
        }
        let periods = now.saturating_sub(self.last) / self.period;
        let refilled = u128::from(self.tokens) + u128::from(periods) * u128::from(self.amount);
        self.tokens = refilled.min(u128::from(self.capacity)) as u64;
        // Discard the fraction of a period when full.
        self.last = if self.tokens == self.capacity {
            now
        } else {
            self.last + periods * self.period
        };
    }

    /// The rate-limiter pattern's `TryAcquire`, for `n` permits, at `now_ns`
    /// nanoseconds.
    pub fn acquire(&mut self, now_ns: u64, n: u32) -> Decision {
        let now = now_ns / 1_000 / self.unit;
        let before = self.clone();
        self.refill(now);
        let n = u64::from(n);
        if self.tokens >= n {
            self.tokens -= n;
            return Decision::Allowed {
                remaining: self.tokens as u32,
            };
        }
        let periods = (n - self.tokens).div_ceil(self.amount);
        let ready_units = u128::from(self.last) + u128::from(periods) * u128::from(self.period);
        let ready_ns = ready_units * u128::from(self.unit) * 1_000;
        if !self.refill_on_denial {
            *self = before;
        }
        Decision::Denied {
            retry_after: RetryAfter::from_nanos(
                u64::try_from(ready_ns - u128::from(now_ns)).unwrap_or(u64::MAX),
            ),
        }
    }

    /// The tokens a request would see at `now_ns`, without spending.
    pub fn remaining(&self, now_ns: u64) -> u32 {
        let mut peek = self.clone();
        peek.refill(now_ns / 1_000 / self.unit);
        peek.tokens as u32
    }

    /// A change of quota at `now_ns`, as `LiveTokenBucket` documents it: a
    /// bucket full at the change is full in the new quota; another holds what
    /// the old quota had refilled it to, up to the new capacity; the new
    /// refill grid starts at the change (or stays at the last refill time, if
    /// the change is behind it). Both quotas must share the time unit.
    pub fn set_quota(&mut self, quota: Quota, now_ns: u64) {
        let now = now_ns / 1_000 / self.unit;
        let level = u64::from(self.remaining(now_ns));
        let full = level == self.capacity;
        assert_eq!(quota.time_unit().as_micros() as u64, self.unit);
        self.capacity = u64::from(quota.capacity());
        self.amount = u64::from(quota.amount());
        self.period = quota.period().as_micros() as u64 / self.unit;
        self.tokens = if full {
            self.capacity
        } else {
            level.min(self.capacity)
        };
        self.last = self.last.max(now);
    }
}
