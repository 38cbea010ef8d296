//! One in-process limit of a combined layer ([`Limit`], [`Entry`]) and the
//! all-or-nothing walk over them.

use super::items::{Cached, Items, State};
use super::settle::{Held, Ticket, now_remaining, now_state};
use super::*;

/// How a request was decided.
pub(super) enum Verdict {
    Admitted,
    /// Limit `by` refused first; `decision` carries the longest wait.
    Refused {
        by: usize,
        decision: KeyedDecision,
    },
    /// A key vanished between the check and the decision.
    NoKey,
}

/// What deciding a request collects.
pub(super) struct Decide {
    /// Write the `RateLimit` items.
    pub(super) advertise: bool,
    /// Keep tickets for settling.
    pub(super) keep: bool,
    pub(super) items: Items,
    pub(super) tickets: Vec<Box<dyn Ticket>>,
    /// The index of the limit deciding now.
    pub(super) depth: usize,
}

/// One limit of a [`Limits`] layer, its types erased.
pub(super) trait Limit: Send + Sync {
    fn name(&self) -> &str;
    /// The policy item it advertises for every key, when it has no tiers.
    fn cached_item(&self) -> Option<&[u8]>;
    /// The most permits one request can get, whatever its key.
    fn capacity(&self) -> u32;
    /// Why the request has no key for this limit, if it has none.
    fn missing(&self, head: &RequestHead<'_>) -> Option<Denial>;
    /// The challenge of a 401 for a key this limit did not find.
    fn challenge(&self) -> HeaderValue;
    /// Decide this limit and then `rest`, all or nothing.
    fn decide(
        &self,
        head: &RequestHead<'_>,
        n: u32,
        rest: &[Box<dyn Limit>],
        cx: &mut Decide,
    ) -> Verdict;
    /// The wait `n` permits would have now, if this limit would refuse them.
    fn wait(&self, head: &RequestHead<'_>, n: u32) -> Option<RetryAfter>;
    /// This limit's item as it stands now: on a denial (`refused`), with
    /// the wait for `n` permits if it would refuse them too.
    fn report(&self, head: &RequestHead<'_>, n: u32, refused: bool, items: &mut Items);
}

/// A limit's name, extractor and limiter.
pub(super) struct Entry<X, L> {
    pub(super) name: String,
    pub(super) extractor: X,
    pub(super) limiter: Arc<L>,
    /// The policy item, for a limit without tiers.
    pub(super) cached: Option<Cached>,
}

impl<X, L> Limit for Entry<X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn cached_item(&self) -> Option<&[u8]> {
        self.cached.as_ref().map(|c| &*c.item)
    }

    fn capacity(&self) -> u32 {
        self.limiter.min_capacity()
    }

    fn missing(&self, head: &RequestHead<'_>) -> Option<Denial> {
        if self.extractor.extract(head).is_some() {
            return None;
        }
        Some(match self.extractor.misconfiguration(head) {
            Some(problem) => Denial::Misconfigured(problem),
            None => Denial::Refused(Outcome::Unauthorized),
        })
    }

    fn challenge(&self) -> HeaderValue {
        self.extractor.challenge()
    }

    #[inline]
    fn decide(
        &self,
        head: &RequestHead<'_>,
        n: u32,
        rest: &[Box<dyn Limit>],
        cx: &mut Decide,
    ) -> Verdict {
        let Some(key) = self.extractor.extract(head) else {
            return Verdict::NoKey;
        };
        let by = cx.depth;
        let (decision, receipt) = self.limiter.stage_take(&key, n);
        let KeyedDecision::Allowed { remaining } = decision else {
            // The longest wait of this limit and every later one that would
            // refuse too; those are asked without taking anything.
            let longest = rest
                .iter()
                .filter_map(|later| later.wait(head, n))
                .chain(decision.retry_after())
                .max();
            let decision = match (decision, longest) {
                (KeyedDecision::KeyLimit { .. }, Some(retry_after)) => {
                    KeyedDecision::KeyLimit { retry_after }
                }
                (_, Some(retry_after)) => KeyedDecision::Denied { retry_after },
                (other, None) => other,
            };
            return Verdict::Refused { by, decision };
        };
        if cx.advertise && !cx.keep {
            cx.items.push(
                &self.name,
                self.cached.as_ref(),
                self.limiter.advertise_for(&key),
                &State::Remaining(remaining),
            );
        }
        cx.depth += 1;
        let verdict = match rest.split_first() {
            None => Verdict::Admitted,
            Some((next, rest)) => next.decide(head, n, rest, cx),
        };
        match (&verdict, receipt) {
            // Kept even when the admission wrote nothing (so took nothing):
            // its limit is still told after the response.
            (Verdict::Admitted, receipt) if cx.keep => {
                cx.tickets.push(Box::new(Held::<X, L> {
                    name: self.name.clone(),
                    limiter: Arc::clone(&self.limiter),
                    key: key.into_owned(),
                    receipt,
                    n,
                }));
            }
            (Verdict::Admitted, _) => {}
            (_, Some(receipt)) => {
                // Declined or not, the answer is the same denial.
                let _ = self.limiter.stage_give_back(&key, receipt);
            }
            (_, None) => {}
        }
        verdict
    }

    fn wait(&self, head: &RequestHead<'_>, n: u32) -> Option<RetryAfter> {
        let key = self.extractor.extract(head)?;
        self.limiter.stage_peek(&key, n).retry_after()
    }

    fn report(&self, head: &RequestHead<'_>, n: u32, refused: bool, items: &mut Items) {
        let Some(key) = self.extractor.extract(head) else {
            return;
        };
        let state = if refused {
            now_state(&*self.limiter, &key, n)
        } else {
            State::Remaining(now_remaining(&*self.limiter, &key))
        };
        items.push(
            &self.name,
            self.cached.as_ref(),
            self.limiter.advertise_for(&key),
            &state,
        );
    }
}
