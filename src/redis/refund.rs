//! Refunds in exact mode: an admission that keeps what giving it back needs
//! ([`RedisReceipt`]), and one script per algorithm that gives it back
//! exactly or declines.

use ::redis::{ConnectionLike, Script, ScriptInvocation, Value};

use super::{
    FIXED_WINDOW_REFUND, FIXED_WINDOW_REFUNDABLE, GCRA_REFUND, GCRA_REFUNDABLE,
    MAX_EXPLICIT_MICROS, RedisAlgorithm, RedisLimitError, RedisLimiter, SLIDING_WINDOW_REFUND,
    SLIDING_WINDOW_REFUNDABLE, TOKEN_BUCKET_REFUND, TOKEN_BUCKET_REFUNDABLE, bad_reply,
    parse_items,
};
use crate::decision::Decision;

/// Proof of one admission by a [`RedisLimiter`]: what giving its permits back
/// needs, the Redis key, the permits, and the state the admission wrote.
///
/// From [`RedisLimiter::try_acquire_refundable`] and its `_n`, `_at` and
/// `_async` forms; given back by [`RedisLimiter::refund`] (or
/// [`refund_async`](RedisLimiter::refund_async)), which consumes it. Neither
/// `Clone` nor `Copy`: an admission is refunded at most once. It owns its
/// bytes (`Send + Sync + 'static`), so it can be kept with a request and
/// given back from another task once the request's cost is known. Dropping it
/// keeps the permits spent.
///
/// A receipt records the algorithm it was admitted under: a limiter with
/// another algorithm or other parameters declines it, sending nothing. The key
/// is the whole Redis key, so any limiter with the same algorithm and
/// parameters gives it back to the key that admitted it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a receipt is what gives the permits back; dropping it keeps them spent"]
pub struct RedisReceipt {
    key: Vec<u8>,
    n: u32,
    /// The state the admission wrote, as stored: whole numbers joined by `:`.
    written: String,
    algorithm: RedisAlgorithm,
}

impl RedisReceipt {
    /// The Redis key the admission was decided on (the limiter's prefix and
    /// the client's key).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The permits the admission took.
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// The same receipt for `n` of the permits the admission took (at most
    /// those): a call that also paid a debt gives back only its request's.
    pub(crate) fn for_permits(mut self, n: u32) -> Self {
        self.n = self.n.min(n);
        self
    }

    /// The state the admission wrote to the key, as Redis holds it (a token
    /// bucket's `tokens:time`, for one).
    pub fn written(&self) -> &str {
        &self.written
    }
}

impl RedisAlgorithm {
    /// The refundable decision's script, the refund's, and how many fields
    /// the algorithm's state has.
    fn refund_program(&self) -> (&'static Script, &'static Script, usize) {
        match self {
            RedisAlgorithm::TokenBucket(_) => (&TOKEN_BUCKET_REFUNDABLE, &TOKEN_BUCKET_REFUND, 2),
            RedisAlgorithm::FixedWindow(_) => (&FIXED_WINDOW_REFUNDABLE, &FIXED_WINDOW_REFUND, 2),
            RedisAlgorithm::SlidingWindow(_) => {
                (&SLIDING_WINDOW_REFUNDABLE, &SLIDING_WINDOW_REFUND, 3)
            }
            RedisAlgorithm::Gcra(_) => (&GCRA_REFUNDABLE, &GCRA_REFUND, 2),
        }
    }
}

impl RedisLimiter {
    /// [`try_acquire`](Self::try_acquire), keeping what is needed to give the
    /// permit back: the same decision, made the same way, and on an
    /// admission (only then) a [`RedisReceipt`] for
    /// [`refund`](Self::refund).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::redis::{Deadlines, RedisLimiter};
    /// use turnstile::FixedWindow;
    ///
    /// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
    /// // 5 failed logins per user per 15 minutes: admit every attempt, refund the good ones.
    /// let failures = RedisLimiter::new("logins", FixedWindow::new(5, Duration::from_secs(900))?)?;
    /// let (decision, receipt) = failures.try_acquire_refundable(&mut con, "alice")?;
    /// if let Some(receipt) = receipt {
    ///     let password_was_right = true;
    ///     if password_was_right {
    ///         // The attempt does not count; `false` would mean it stays counted.
    ///         let _given_back = failures.refund(&mut con, receipt)?;
    ///     }
    /// } else {
    ///     println!("locked for {:?}", decision.retry_after().map(|wait| wait.duration()));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire). After an error no receipt
    /// exists, even if Redis admitted: the permits stay spent.
    pub fn try_acquire_refundable(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
    ) -> Result<(Decision, Option<RedisReceipt>), RedisLimitError> {
        self.try_acquire_n_refundable(con, key, 1)
    }

    /// [`try_acquire_n`](Self::try_acquire_n), keeping what is needed to give
    /// the `n` permits back ([`try_acquire_refundable`](Self::try_acquire_refundable)).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    pub fn try_acquire_n_refundable(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<(Decision, Option<RedisReceipt>), RedisLimitError> {
        let (invocation, full_key) = self.refundable_invocation(key.as_ref(), n, None)?;
        self.admit(invocation.invoke(con), full_key, n)
    }

    /// [`try_acquire_n_at`](Self::try_acquire_n_at), keeping what is needed to
    /// give the `n` permits back: for tests and replays.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n_at`](Self::try_acquire_n_at).
    pub fn try_acquire_n_refundable_at(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
        n: u32,
        now_micros: u64,
    ) -> Result<(Decision, Option<RedisReceipt>), RedisLimitError> {
        let (invocation, full_key) =
            self.refundable_invocation(key.as_ref(), n, Some(now_micros))?;
        self.admit(invocation.invoke(con), full_key, n)
    }

    /// [`try_acquire_refundable`](Self::try_acquire_refundable) on an
    /// asynchronous connection (feature `tokio` too).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_refundable`](Self::try_acquire_refundable).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_refundable_async<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        key: impl AsRef<[u8]>,
    ) -> Result<(Decision, Option<RedisReceipt>), RedisLimitError> {
        self.try_acquire_n_refundable_async(con, key, 1).await
    }

    /// [`try_acquire_n_refundable`](Self::try_acquire_n_refundable) on an
    /// asynchronous connection (feature `tokio` too).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n_refundable`](Self::try_acquire_n_refundable).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_n_refundable_async<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<(Decision, Option<RedisReceipt>), RedisLimitError> {
        let (invocation, full_key) = self.refundable_invocation(key.as_ref(), n, None)?;
        self.admit(invocation.invoke_async(con).await, full_key, n)
    }

    /// [`try_acquire_n_refundable_at`](Self::try_acquire_n_refundable_at) on
    /// an asynchronous connection (feature `tokio` too).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n_refundable_at`](Self::try_acquire_n_refundable_at).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_n_refundable_at_async<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        key: impl AsRef<[u8]>,
        n: u32,
        now_micros: u64,
    ) -> Result<(Decision, Option<RedisReceipt>), RedisLimitError> {
        let (invocation, full_key) =
            self.refundable_invocation(key.as_ref(), n, Some(now_micros))?;
        self.admit(invocation.invoke_async(con).await, full_key, n)
    }

    /// Give back what an admission took, on Redis' clock: `Ok(true)` when the
    /// permits went back exactly, so that the key's state is the one it would
    /// hold had the admission never happened (the other admissions still
    /// counted); `Ok(false)` when the refund declined and changed nothing,
    /// the permits staying spent. Never more than the admission took goes
    /// back. One script, run atomically: it compares the key's state with
    /// the receipt's, and writes the state back, with its expiry, in the same
    /// step. The time is needed only for the expiry.
    ///
    /// Per algorithm (the reasons are in each script's header, in
    /// `src/redis/*_refund.lua`):
    ///
    /// - **token bucket**: exact only while the key holds the very state the
    ///   admission wrote (no decision, lease or give-back since). The
    ///   admission found `level` tokens on the refill grid `base` (its
    ///   refill of the stored state already applied), and the refund writes
    ///   `level:base`: from the admission's reading on, that bucket refills on
    ///   the same grid to the same levels as the state before the admission,
    ///   and is full at the same time, which is the key's expiry again. A
    ///   bucket the admission found full (it restarted the grid at its own
    ///   reading) is full again: the key is deleted, as a fresh bucket.
    /// - **GCRA**: exact only while the key holds the very TAT the admission
    ///   wrote, `max(TAT, now) + n·T`; the refund writes `max(TAT, now)`,
    ///   which decides as the TAT before it at the admission's reading and
    ///   every later one, and expires once it is no longer ahead. Once
    ///   another decision moved the TAT, time may have drained the meter
    ///   through this admission's cost, and one number cannot tell: declined.
    /// - **fixed window**: exact while the key still counts the window the
    ///   permits were counted in, whatever was admitted in it since: its count
    ///   less `n` is the count without this admission, and its expiry (the
    ///   window's end) stays. Once the key counts a later window, or has
    ///   expired with its window, the permits no longer count and nothing is
    ///   owed: declined.
    /// - **sliding window**: exact while the key's window is the one the
    ///   permits were counted in (they are in its current count) or the next
    ///   (a decision there moved that count, whole, to the previous one): that
    ///   count less `n`, the window and so the expiry unchanged. From two
    ///   windows on they weigh nothing: declined, as for a key that expired.
    ///
    /// Counts brought to 0, and a full bucket, delete the key: it reads as
    /// fresh. Either way a key never expires before its state is as good as
    /// fresh. Exactness is for readings at or after the admission's, the only
    /// order Redis' clock gives (with explicit times, a refunded token bucket
    /// read earlier than the grid point its admission refilled to is read as
    /// refilled, as in process). With Redis' clock a key that expired and was
    /// written again never holds a state an earlier admission wrote, so the
    /// comparisons cannot be fooled by one.
    ///
    /// **Never sent again.** A refund that fails (a timeout above all) may or
    /// may not have been applied; like every call it is not retried, and the
    /// receipt is consumed either way, so the permits count as spent. For the
    /// token bucket and GCRA a refund sent twice would be harmless anyway: the
    /// first changes the state, and the second's comparison then declines. A
    /// window's refund decrements the count of its window whatever else was
    /// counted there, so sending it twice would give back twice: it must not
    /// be, and is not. `NOSCRIPT`, the one error retried (the script is loaded
    /// and sent again), means that it did not run.
    ///
    /// A receipt of a limiter with another algorithm or other parameters
    /// declines without a call.
    ///
    /// ```no_run
    /// use turnstile::redis::{Deadlines, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
    /// let limiter = RedisLimiter::new("api", TokenBucket::new(Quota::per_minute(1)?))?;
    /// let (decision, receipt) = limiter.try_acquire_refundable(&mut con, "k_live_123")?;
    /// assert!(decision.is_allowed());
    /// assert!(limiter.try_acquire(&mut con, "k_live_123")?.is_denied());
    /// if let Some(receipt) = receipt {
    ///     // Nothing else touched the key since: the token goes back.
    ///     assert!(limiter.refund(&mut con, receipt)?);
    /// }
    /// assert!(limiter.try_acquire(&mut con, "k_live_123")?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Redis`] when the call fails (the refund may or may
    /// not have been applied), [`RedisLimitError::Reply`] for a reply that is
    /// not the script's.
    pub fn refund(
        &self,
        con: &mut dyn ConnectionLike,
        receipt: RedisReceipt,
    ) -> Result<bool, RedisLimitError> {
        match self.refund_invocation(&receipt, None)? {
            Some(invocation) => parse_refund(&invocation.invoke(con)?),
            None => Ok(false),
        }
    }

    /// [`refund`](Self::refund) at `now_micros` microseconds since the epoch
    /// the caller's times share (the reading only sets the expiry): for tests
    /// and replays.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Time`] when `now_micros` is at or above
    /// [`MAX_EXPLICIT_MICROS`] (nothing is sent, and the receipt is spent
    /// with it); otherwise as [`refund`](Self::refund).
    pub fn refund_at(
        &self,
        con: &mut dyn ConnectionLike,
        receipt: RedisReceipt,
        now_micros: u64,
    ) -> Result<bool, RedisLimitError> {
        match self.refund_invocation(&receipt, Some(now_micros))? {
            Some(invocation) => parse_refund(&invocation.invoke(con)?),
            None => Ok(false),
        }
    }

    /// [`refund`](Self::refund) on an asynchronous connection (feature
    /// `tokio` too): callable from any task, the receipt owning its bytes.
    ///
    /// # Errors
    ///
    /// As [`refund`](Self::refund).
    #[cfg(feature = "tokio")]
    pub async fn refund_async<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        receipt: RedisReceipt,
    ) -> Result<bool, RedisLimitError> {
        match self.refund_invocation(&receipt, None)? {
            Some(invocation) => parse_refund(&invocation.invoke_async(con).await?),
            None => Ok(false),
        }
    }

    /// [`refund_at`](Self::refund_at) on an asynchronous connection (feature
    /// `tokio` too).
    ///
    /// # Errors
    ///
    /// As [`refund_at`](Self::refund_at).
    #[cfg(feature = "tokio")]
    pub async fn refund_at_async<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        receipt: RedisReceipt,
        now_micros: u64,
    ) -> Result<bool, RedisLimitError> {
        match self.refund_invocation(&receipt, Some(now_micros))? {
            Some(invocation) => parse_refund(&invocation.invoke_async(con).await?),
            None => Ok(false),
        }
    }

    /// The refundable decision's call for `n` permits for `key`, and the
    /// Redis key it decides on.
    fn refundable_invocation(
        &self,
        key: &[u8],
        n: u32,
        now_micros: Option<u64>,
    ) -> Result<(ScriptInvocation<'static>, Vec<u8>), RedisLimitError> {
        let (script, _, _) = self.algorithm.refund_program();
        let full_key = self.redis_key(key);
        let invocation = self.invocation_of(script, full_key.clone(), n, now_micros)?;
        Ok((invocation, full_key))
    }

    /// The decision, and the receipt of an admission.
    fn admit(
        &self,
        reply: ::redis::RedisResult<Value>,
        key: Vec<u8>,
        n: u32,
    ) -> Result<(Decision, Option<RedisReceipt>), RedisLimitError> {
        let reply = reply?;
        let (_, _, fields) = self.algorithm.refund_program();
        let (decision, written) = parse_refundable(&reply, self.capacity, fields)?;
        let receipt = written.map(|written| RedisReceipt {
            key,
            n,
            written,
            algorithm: self.algorithm,
        });
        Ok((decision, receipt))
    }

    /// The refund's call, or `None` for a receipt of another algorithm (or
    /// other parameters), which declines. The arguments are a decision's,
    /// `n` being the receipt's, then the state the admission wrote, last.
    fn refund_invocation(
        &self,
        receipt: &RedisReceipt,
        now_micros: Option<u64>,
    ) -> Result<Option<ScriptInvocation<'static>>, RedisLimitError> {
        if let Some(now) = now_micros
            && now >= MAX_EXPLICIT_MICROS
        {
            return Err(RedisLimitError::Time { now_micros: now });
        }
        if receipt.algorithm != self.algorithm || receipt.n == 0 || receipt.n > self.capacity {
            return Ok(None);
        }
        let (_, script, _) = self.algorithm.refund_program();
        let mut invocation = script.prepare_invoke();
        invocation.key(receipt.key.as_slice());
        match now_micros {
            Some(now) => invocation.arg(now),
            None => invocation.arg(""),
        };
        invocation.arg(receipt.n).arg(self.slack_millis);
        for param in &self.params {
            invocation.arg(*param);
        }
        invocation.arg(receipt.written.as_str());
        Ok(Some(invocation))
    }
}

/// A refundable decision's reply: a decision's four numbers, and on an
/// admission (only then) the state it wrote, of `fields` whole numbers below
/// `2^53` joined by `:`.
fn parse_refundable(
    reply: &Value,
    capacity: u32,
    fields: usize,
) -> Result<(Decision, Option<String>), RedisLimitError> {
    let Value::Array(items) = reply else {
        return Err(bad_reply(reply));
    };
    match items.as_slice() {
        [decision @ .., Value::BulkString(state)] if decision.len() == 4 => {
            let decision = parse_items(reply, decision, capacity)?;
            match state_text(state, fields) {
                Some(written) if decision.is_allowed() => Ok((decision, Some(written))),
                _ => Err(bad_reply(reply)),
            }
        }
        _ => match parse_items(reply, items, capacity)? {
            // An admission must say what it wrote.
            Decision::Allowed { .. } => Err(bad_reply(reply)),
            denied => Ok((denied, None)),
        },
    }
}

/// `state` as text when it is `fields` whole numbers below `2^53` (decimal
/// digits only) joined by single `:`, as the scripts write a state.
fn state_text(state: &[u8], fields: usize) -> Option<String> {
    let text = core::str::from_utf8(state).ok()?;
    let mut count = 0;
    for field in text.split(':') {
        if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let value: u64 = field.parse().ok()?;
        if value >= 1 << 53 {
            return None;
        }
        count += 1;
    }
    (count == fields).then(|| text.to_owned())
}

/// The refund's reply: 1 given back, 0 declined.
fn parse_refund(reply: &Value) -> Result<bool, RedisLimitError> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        _ => Err(bad_reply(reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FixedWindow, Quota, TokenBucket};
    use core::time::Duration;

    fn ints(values: &[i64]) -> Vec<Value> {
        values.iter().map(|v| Value::Int(*v)).collect()
    }

    fn with_state(values: &[i64], state: &str) -> Value {
        let mut items = ints(values);
        items.push(Value::BulkString(state.as_bytes().to_vec()));
        Value::Array(items)
    }

    #[test]
    fn receipts_can_be_kept_by_any_task() {
        fn owned<T: Send + Sync + 'static>() {}
        owned::<RedisReceipt>();
    }

    #[test]
    fn refundable_replies_carry_the_written_state() {
        assert_eq!(
            parse_refundable(&with_state(&[1, 4, 0, 0], "4:100"), 5, 2).unwrap(),
            (Decision::Allowed { remaining: 4 }, Some("4:100".to_owned()))
        );
        let (denied, none) = parse_refundable(&Value::Array(ints(&[0, 0, 700, 0])), 5, 2).unwrap();
        assert!(denied.is_denied() && none.is_none());
    }

    #[test]
    fn any_other_refundable_reply_is_an_error_not_a_panic() {
        let replies = [
            Value::Nil,
            Value::Int(1),
            // An admission without its state, a denial with one.
            Value::Array(ints(&[1, 4, 0, 0])),
            with_state(&[0, 0, 700, 0], "4:100"),
            // States that are not this algorithm's.
            with_state(&[1, 4, 0, 0], "4:100:7"),
            with_state(&[1, 4, 0, 0], "4"),
            with_state(&[1, 4, 0, 0], ""),
            with_state(&[1, 4, 0, 0], "4::100"),
            with_state(&[1, 4, 0, 0], ":4:100"),
            with_state(&[1, 4, 0, 0], "-4:100"),
            with_state(&[1, 4, 0, 0], "4:1e3"),
            with_state(&[1, 4, 0, 0], "4:9007199254740992"),
            with_state(&[1, 4, 0, 0], "4:99999999999999999999999"),
            with_state(&[1, 9, 0, 0], "4:100"),
            with_state(&[1, 4, 0], "4:100"),
            Value::Array(vec![
                Value::Int(1),
                Value::Int(4),
                Value::Int(0),
                Value::Int(0),
                Value::Int(4),
            ]),
        ];
        for reply in replies {
            assert!(
                matches!(
                    parse_refundable(&reply, 5, 2),
                    Err(RedisLimitError::Reply { .. })
                ),
                "{reply:?}"
            );
        }
        for reply in [Value::Int(2), Value::Int(-1), Value::Nil, Value::Okay] {
            assert!(matches!(
                parse_refund(&reply),
                Err(RedisLimitError::Reply { .. })
            ));
        }
        assert!(parse_refund(&Value::Int(1)).unwrap());
        assert!(!parse_refund(&Value::Int(0)).unwrap());
    }

    #[test]
    fn a_receipt_of_another_limit_declines_without_a_call() {
        let quota = Quota::per_second(10).unwrap();
        let bucket = RedisLimiter::new("a", TokenBucket::new(quota)).unwrap();
        let receipt = |algorithm| RedisReceipt {
            key: b"turnstile:{a}:k".to_vec(),
            n: 1,
            written: "9:0".to_owned(),
            algorithm,
        };
        let window = FixedWindow::new(10, Duration::from_secs(1)).unwrap();
        let slower = TokenBucket::new(Quota::per_second(9).unwrap());
        for other in [RedisAlgorithm::from(window), RedisAlgorithm::from(slower)] {
            assert!(matches!(
                bucket.refund_invocation(&receipt(other), None),
                Ok(None)
            ));
        }
        // The same parameters under another name (prefix) refund the key the
        // receipt names.
        let twin = RedisLimiter::new("b", TokenBucket::new(quota)).unwrap();
        assert!(matches!(
            twin.refund_invocation(&receipt(bucket.algorithm), None),
            Ok(Some(_))
        ));
        assert!(matches!(
            twin.refund_invocation(&receipt(bucket.algorithm), Some(MAX_EXPLICIT_MICROS)),
            Err(RedisLimitError::Time { .. })
        ));
    }
}
