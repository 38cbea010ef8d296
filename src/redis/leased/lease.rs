//! Taking a lease: claiming a key's fetch (and sizing the lease to the
//! key's demand), the lease script's call and reply, and putting its
//! answer into the key's word.

use ::redis::{RedisResult, ScriptInvocation, Value};

use super::local::{LeaseWord, Link};
use super::stats::Counters;
use super::{Fetch, LeasedLimiter, Purpose, RETRY_AT_ONCE, word};
use crate::clock::Clock;
use crate::decision::{Decision, RetryAfter};
use crate::redis::MAX_LEASE;
use crate::redis::RedisLimitError;
use crate::sync::Ordering;

impl<C: Clock> LeasedLimiter<C> {
    /// The lease size for a size code.
    pub(super) fn size(&self, code: u32) -> u32 {
        1u32.checked_shl(code)
            .unwrap_or(u32::MAX)
            .min(self.max_lease)
    }

    /// The largest useful size code.
    fn max_code(&self) -> u32 {
        32 - (self.max_lease - 1).leading_zeros()
    }

    /// Whether a request that left `remaining` tokens in lease word `w` at
    /// `now` is below the key's prefetch mark, the tokens the key spends
    /// while a fetch is under way: at least a quarter of the lease size
    /// (none below a size of 4), and up to half of it for a key whose lease,
    /// spent at the rate it has been since it was granted, would run out
    /// within twice the fetch latency measured. The mark is met only when
    /// the quarter is not, so the fast path reads nothing more.
    #[inline]
    pub(super) fn below_mark(&self, w: u64, remaining: u32, now: u64) -> bool {
        // The lease size is at most `2^e` (`e` the word's size code): at
        // or above half of that, the count is at or above half the size,
        // where no mark is (the common case, decided by one shift of the
        // word read already).
        if u64::from(remaining) >= (1u64 << word::size_code(w)) >> 1 {
            return false;
        }
        self.below_sized_mark(w, remaining, now)
    }

    /// [`below_mark`](Self::below_mark), from the lease size.
    fn below_sized_mark(&self, w: u64, remaining: u32, now: u64) -> bool {
        let size = self.size(word::size_code(w));
        let quarter = size / 4;
        if remaining < quarter {
            return true;
        }
        if quarter == 0 || remaining >= size / 2 {
            return false;
        }
        self.runs_dry_first(w, size, remaining, now)
    }

    /// Whether `remaining` tokens of a lease of `size` last less than twice
    /// the fetch latency, spent at the rate the lease has been.
    #[cold]
    fn runs_dry_first(&self, w: u64, size: u32, remaining: u32, now: u64) -> bool {
        // Relaxed: a measurement, which publishes no other data.
        let latency = self.fetch_latency.load(Ordering::Relaxed);
        if latency == 0 {
            return false;
        }
        // The lease was granted a lifetime before its expiry, rounded down
        // to a unit: its age is at least this.
        let granted = word::nanos(word::time(w).saturating_sub(self.lifetime_units));
        let age = now.saturating_sub(granted).saturating_sub(word::nanos(1));
        let spent = size.saturating_sub(remaining);
        // remaining / (spent / age) < 2 · latency, without dividing; an age
        // of 0 (less than a unit) reads as a key spending faster than any.
        u128::from(remaining) * u128::from(age) < 2 * u128::from(latency) * u128::from(spent)
    }

    /// Fold one fetch's latency (`nanos`) into the moving average.
    fn record_latency(&self, nanos: u64) {
        // Relaxed: a measurement, which publishes no other data; a sample
        // lost to a race with another fetch's only weighs less.
        let old = self.fetch_latency.load(Ordering::Relaxed);
        let next = if old == 0 {
            nanos
        } else {
            old - old / 8 + nanos / 8
        };
        // Relaxed: as above.
        self.fetch_latency.store(next.max(1), Ordering::Relaxed);
    }

    /// Claim `key`'s fetch, adapting the lease size; or, for a miss, find
    /// the tokens another fetch brought meanwhile.
    pub(super) fn claim(&self, key: &[u8], n: u32, purpose: Purpose) -> Claim {
        if purpose == Purpose::Miss {
            // A miss on a new key wrote nothing: link it, so that its word
            // can carry the claim.
            let _ = self.local.take_with(&Link, key, 1, true);
        }
        let now = self.local.clock().now();
        let now_units = word::units_down(now);
        let lifetime = self.lifetime_units;
        let max_code = self.max_code();
        let mut outcome = Claim::Unlinked;
        let mut fetch = None;
        let linked = self.local.transform_linked(key, |w| {
            outcome = Claim::Busy;
            fetch = None;
            if w & word::FETCHING != 0 {
                return None;
            }
            let usable = LeaseWord::usable(w, now);
            let code = word::size_code(w);
            let code = match purpose {
                Purpose::Miss if usable >= n => {
                    outcome = Claim::Spent(Decision::Allowed {
                        remaining: usable - n,
                    });
                    return Some(word::with_tokens(w, usable - n));
                }
                Purpose::Miss if w & word::DENIED == 0 && word::tokens(w) > 0 && usable == 0 => {
                    // The lease expired with tokens left: smaller next time.
                    code.saturating_sub(1)
                }
                Purpose::Miss if w & word::DENIED == 0 && w != 0 => {
                    // Spent before the next lease came: larger.
                    (code + 1).min(max_code)
                }
                Purpose::Miss => code,
                Purpose::Prefetch(decision) => {
                    let seen = match decision {
                        Decision::Allowed { remaining } => remaining,
                        Decision::Denied { .. } => 0,
                    };
                    if usable > seen {
                        // Another fetch topped it up meanwhile.
                        return None;
                    }
                    // Spent to its low-water mark within a quarter of its
                    // lifetime: larger.
                    let granted = word::time(w).saturating_sub(lifetime);
                    if now_units.saturating_sub(granted).saturating_mul(4) < lifetime {
                        (code + 1).min(max_code)
                    } else {
                        code
                    }
                }
            };
            outcome = Claim::Claimed;
            fetch = Some((code, usable));
            Some(w | word::FETCHING)
        });
        if !linked {
            return match outcome {
                Claim::Spent(d) => Claim::Spent(d),
                Claim::Unlinked => Claim::Unlinked,
                _ => Claim::Busy,
            };
        }
        match (outcome, fetch) {
            (Claim::Claimed, Some((code, usable))) => {
                let target = self.size(code);
                // A whole lease per call, and none smaller than a quarter of
                // one: a bucket that has fewer tokens keeps them until it has
                // that many, so that a dry bucket is not drained by calls for
                // a token or two.
                let short = match purpose {
                    Purpose::Miss => n - usable.min(n),
                    Purpose::Prefetch(_) => 1,
                };
                let need = short.max(target / 4).max(1);
                let want = target.max(short);
                Claim::Fetch(Fetch {
                    purpose,
                    size_code: code,
                    need,
                    started: now,
                    invocation: self.lease_invocation(key, need, want),
                })
            }
            (outcome, _) => outcome,
        }
    }

    fn lease_invocation(&self, key: &[u8], need: u32, want: u32) -> ScriptInvocation<'static> {
        let mut invocation = self.limiter.algorithm().lease_scripts().0.prepare_invoke();
        invocation
            .key(self.limiter.redis_key(key))
            .arg("")
            .arg(need)
            .arg(self.limiter.slack_millis);
        for param in &self.limiter.params {
            invocation.arg(*param);
        }
        invocation.arg(want);
        invocation
    }

    /// Put a lease's answer into the key's word, and answer the request.
    pub(super) fn finish_lease(
        &self,
        key: &[u8],
        n: u32,
        fetch: &Fetch,
        result: RedisResult<Value>,
    ) -> Decision {
        let Fetch {
            purpose,
            size_code: code,
            need,
            started,
            ..
        } = *fetch;
        let now = self.local.clock().now();
        let now_units = word::units_down(now);
        let reply = result
            .map_err(RedisLimitError::from)
            .and_then(|v| parse_lease(&v));
        let (granted, wait, window) = match reply {
            Ok(answer) => answer,
            Err(e) => {
                self.fail(&e);
                // Release the claim; the tokens held stay.
                self.release_fetch(key);
                return match purpose {
                    Purpose::Prefetch(decision) => decision,
                    Purpose::Miss => self.fallback(key, n, self.backoff),
                };
            }
        };
        self.succeed();
        self.record_latency(now.saturating_sub(started));
        Counters::add(&self.counters.lease_calls, 1);
        Counters::add(&self.counters.tokens_leased, u64::from(granted));
        if granted > 0 {
            let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
            // The window a give-back returns the tokens to (0 but for the
            // windows): noted before the word takes the lease, under the
            // lock a give-back takes the word's tokens under.
            let tag = window.map_or(0, |(_, index)| index);
            match holders.keys.get_mut(key) {
                Some(kept) => *kept = tag,
                None => {
                    if holders.keys.len() >= holders.prune_at {
                        self.prune(&mut holders, now);
                    }
                    holders.keys.insert(key.to_vec(), tag);
                }
            }
        }
        let mut expiry = now_units.saturating_add(self.lifetime_units);
        if let Some((valid_micros, _)) = window {
            // A window's permits are spent in it only: the lease ends with
            // the window, counted from before the call was sent (so no
            // later than the window's end on Redis' clock, with clocks that
            // run at one rate), rounded down to the word's unit.
            let end = started.saturating_add(valid_micros.saturating_mul(1_000));
            expiry = expiry.min(word::units_down(end));
        }
        // A miss whose word is gone (not linked any more) is denied, to be
        // tried again at once.
        let mut decision = match purpose {
            Purpose::Prefetch(decision) => decision,
            Purpose::Miss => Decision::Denied {
                retry_after: RETRY_AT_ONCE,
            },
        };
        let lifetime_nanos = word::nanos(self.lifetime_units);
        self.local.transform_linked(key, |w| {
            let usable = LeaseWord::usable(w, now);
            if granted == 0 {
                // A denial kept in the word lasts at most one lifetime.
                let kept = wait.min(lifetime_nanos);
                return Some(match purpose {
                    // The lease held here runs on; no more prefetching
                    // until it runs out.
                    Purpose::Prefetch(_) => word::pack(
                        word::tokens(w),
                        word::size_code(w),
                        word::time(w),
                        (w & word::DENIED) | word::DRY,
                    ),
                    // Tokens are still held here (fewer than this request
                    // needs): they stay, for the requests they cover and for
                    // this one's retry, which Redis's wait (for what it
                    // lacked beyond them) is for. No denial is kept, so a
                    // larger request asks Redis for its own wait, and no
                    // prefetch runs until the lease runs out.
                    Purpose::Miss if usable > 0 => {
                        decision = Decision::Denied {
                            retry_after: RetryAfter::from_nanos(wait),
                        };
                        (w & !word::FETCHING) | word::DRY
                    }
                    // A denial kept already that answers for fewer tokens
                    // (a smaller request's) stays: it is the sooner answer
                    // for the requests it covers, and this one has its own.
                    Purpose::Miss
                        if LeaseWord::denial(w, now).is_some_and(|running| {
                            word::tokens(w) < need && running.as_nanos() <= wait
                        }) =>
                    {
                        decision = Decision::Denied {
                            retry_after: RetryAfter::from_nanos(wait),
                        };
                        w & !word::FETCHING
                    }
                    // The denial is kept with the tokens its wait is for:
                    // it answers the key's requests for as many or fewer.
                    Purpose::Miss => {
                        let until = word::units_up(now.saturating_add(kept));
                        decision = Decision::Denied {
                            retry_after: RetryAfter::from_nanos(
                                word::nanos(until).saturating_sub(now),
                            ),
                        };
                        let kept_for = need.min(word::TOKENS_MASK as u32);
                        word::pack(kept_for, code, until, word::DENIED)
                    }
                });
            }
            let mut tokens = usable.saturating_add(granted);
            if purpose == Purpose::Miss {
                if tokens >= n {
                    tokens -= n;
                    decision = Decision::Allowed { remaining: tokens };
                } else {
                    // The tokens held here when the lease was asked for were
                    // spent meanwhile (or expired): the request may be tried
                    // again at once, and will take another lease.
                    decision = Decision::Denied {
                        retry_after: RETRY_AT_ONCE,
                    };
                }
            }
            Some(word::pack(tokens, code, expiry, 0))
        });
        self.signal.fetch_ended();
        decision
    }
}

/// How a claim went.
pub(super) enum Claim {
    /// This request fetches.
    Fetch(Fetch),
    /// Claimed; the fetch is being built.
    Claimed,
    /// A miss found tokens after all, and spent them.
    Spent(Decision),
    /// Another request is fetching.
    Busy,
    /// The key is not held here (the keyed map's key bound is reached).
    Unlinked,
}

/// What a lease script answered: the tokens granted, the wait in nanoseconds
/// when none, and for a window's lease the microseconds left of the window
/// and its number.
type LeaseReply = (u32, u64, Option<(u64, u64)>);

/// The lease script's reply `{granted, left, wait_us, wait_ns}`, or with a
/// window's grant `{…, valid_us, window}`, as a [`LeaseReply`].
fn parse_lease(reply: &Value) -> Result<LeaseReply, RedisLimitError> {
    let bad = || RedisLimitError::Reply {
        reply: format!("{reply:?}"),
    };
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let (head, window) = match items.as_slice() {
        [head @ .., Value::Int(valid), Value::Int(index)] if head.len() == 4 => {
            let valid = u64::try_from(*valid).map_err(|_| bad())?;
            let index = u64::try_from(*index).map_err(|_| bad())?;
            (head, Some((valid, index)))
        }
        head => (head, None),
    };
    let [
        Value::Int(granted),
        Value::Int(_left),
        Value::Int(us),
        Value::Int(ns),
    ] = head
    else {
        return Err(bad());
    };
    let granted = u32::try_from(*granted).map_err(|_| bad())?;
    if granted > MAX_LEASE || !(-999..=999).contains(ns) {
        return Err(bad());
    }
    let nanos = i128::from(*us) * 1_000 + i128::from(*ns);
    Ok((
        granted,
        u64::try_from(nanos.max(0)).unwrap_or(u64::MAX),
        window,
    ))
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use super::*;
    use crate::algorithm::token_bucket::TokenBucket;
    use crate::redis::RedisLimiter;
    use crate::redis::leased::LeasedBuilder;
    use crate::redis::leased::give_back::MIN_PRUNE;

    #[test]
    fn lease_replies_parse_and_others_are_errors() {
        let array = |v: &[i64]| Value::Array(v.iter().map(|x| Value::Int(*x)).collect());
        assert_eq!(parse_lease(&array(&[7, 3, 0, 0])).unwrap(), (7, 0, None));
        assert_eq!(
            parse_lease(&array(&[0, 0, 5, -1])).unwrap(),
            (0, 4_999, None)
        );
        assert_eq!(
            parse_lease(&array(&[7, 3, 0, 0, 250_000, 42])).unwrap(),
            (7, 0, Some((250_000, 42)))
        );
        for bad in [
            array(&[7, 3, 0, 0, -1, 42]),
            array(&[7, 3, 0, 0, 1, -42]),
            array(&[7, 3, 0, 0, 1]),
            array(&[-1, 0, 0, 0]),
            array(&[1 << 40, 0, 0, 0]),
            array(&[0, 0, 0, 1_000]),
            array(&[1, 2, 3]),
            Value::Nil,
        ] {
            assert!(parse_lease(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_mark_read_from_the_size_code_alone_is_the_sized_one() {
        for max_lease in [1, 3, 4, 5, 1_000, 1 << 20, MAX_LEASE] {
            let global = RedisLimiter::new(
                "mark",
                TokenBucket::new(
                    crate::Quota::per_second_with_burst(1_000_000_000, MAX_LEASE).unwrap(),
                ),
            )
            .unwrap();
            let limiter = LeasedBuilder::new(global, max_lease)
                .unwrap()
                .lifetime(Duration::from_secs(1))
                .build()
                .unwrap();
            // A fetch latency, so that the adaptive part of the mark is read.
            limiter.record_latency(1_000_000_000);
            for code in 0..=limiter.max_code() + 1 {
                let size = limiter.size(code);
                let w = word::pack(0, code, word::units_down(500_000_000), 0);
                let counts = [0, 1, size / 4, size / 2, size.saturating_sub(1), size];
                for remaining in counts
                    .into_iter()
                    .chain(counts.map(|c| c.saturating_sub(1)))
                {
                    for now in [0, 400_000_000] {
                        let w = word::with_tokens(w, remaining);
                        assert_eq!(
                            limiter.below_mark(w, remaining, now),
                            limiter.below_sized_mark(w, remaining, now),
                            "L {max_lease}, code {code}, {remaining} left at {now}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_keys_kept_for_give_back_passes_stay_bounded_without_them() {
        use crate::clock::ManualClock;
        let clock = ManualClock::new();
        let global = RedisLimiter::new(
            "holders",
            TokenBucket::new(crate::Quota::per_second(1_000).unwrap()),
        )
        .unwrap();
        let limiter = LeasedBuilder::new(global, 8)
            .unwrap()
            .lifetime(Duration::from_secs(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        let granted = Value::Array([4, 0, 0, 0].into_iter().map(Value::Int).collect());
        let miss = Fetch {
            purpose: Purpose::Miss,
            size_code: 2,
            need: 1,
            started: 0,
            invocation: limiter.lease_invocation(b"k", 1, 4),
        };
        let mut most = 0;
        for i in 0..20_000u32 {
            // Every key takes one lease, which expires before the next key's:
            // no give-back pass ever runs.
            let key = i.to_be_bytes();
            let _ = limiter.finish_lease(&key, 1, &miss, Ok(granted.clone()));
            clock.advance(Duration::from_secs(2));
            let held = limiter.holders.lock().unwrap().keys.len();
            most = most.max(held);
        }
        assert!(most <= MIN_PRUNE, "{most}");
    }
}
