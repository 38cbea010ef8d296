//! What an admitted request keeps for its response to settle, and the
//! settling: refunds, costs charged, lent or forgiven, drains.

use super::items::{Items, State};
use super::remote::{RemoteTaken, push_remote};
use super::*;
use crate::http::tower::one_key_for_all;

/// The permits `key` has left in `limiter` now.
pub(super) fn now_remaining<L, Q>(limiter: &L, key: &Q) -> u32
where
    L: GateLimiter<Q> + ?Sized,
    Q: ?Sized,
{
    match limiter.stage_peek(key, 1) {
        KeyedDecision::Allowed { remaining } => remaining.saturating_add(1),
        _ => 0,
    }
}

/// `key`'s state in `limiter` now: the permits left, or the wait for `n`.
pub(super) fn now_state<L, Q>(limiter: &L, key: &Q, n: u32) -> State
where
    L: GateLimiter<Q> + ?Sized,
    Q: ?Sized,
{
    match limiter.stage_peek(key, n) {
        // What is left after `n` more, plus those `n`: what is left now.
        KeyedDecision::Allowed { remaining } => State::Remaining(remaining.saturating_add(n)),
        denied => match denied.retry_after() {
            Some(wait) => State::Wait(wait),
            None => State::Remaining(0),
        },
    }
}

/// How an admitted request is settled by its response.
#[derive(Clone, Copy)]
pub(super) enum Settle {
    /// Give the permits back.
    Refund,
    /// Empty the key's allowance.
    Drain,
    /// The request's real cost.
    Cost(u32),
    /// Keep what was charged.
    Keep,
}

/// What settling one limit did.
#[derive(Default)]
pub(super) struct Settled {
    pub(super) refunded: u64,
    pub(super) refund_declined: u64,
    pub(super) charged: u64,
    pub(super) lent: u64,
    pub(super) forgiven: u64,
    pub(super) drained: u64,
}

/// One limit's admission of a request, kept until its response.
pub(super) trait Ticket: Send + Sync {
    /// Settle as `how`, then add the limit's item as it stands.
    fn settle(self: Box<Self>, how: Settle, items: &mut Items) -> Settled;
    /// Give the permits back, exactly or not at all (a later limit refused).
    fn give_back(self: Box<Self>) -> bool;
    /// Count the admission in the limit's stats: the remote limits admitted
    /// the request too.
    fn count_admission(&self);
}

/// An admission by one limit, with what gives it back: `X`'s key, owned.
pub(super) struct Held<X: KeyExtractor, L> {
    pub(super) name: String,
    pub(super) limiter: Arc<L>,
    pub(super) key: X::Key,
    /// `None` when the admission wrote nothing, so took nothing.
    pub(super) receipt: Option<Receipt>,
    pub(super) n: u32,
}

impl<X, L> Ticket for Held<X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    fn give_back(self: Box<Self>) -> bool {
        let key: &X::Lookup = self.key.borrow();
        // Nothing taken, nothing owed.
        self.receipt
            .is_none_or(|receipt| self.limiter.stage_give_back(key, receipt))
    }

    fn count_admission(&self) {
        self.limiter.stage_count_admission(self.key.borrow());
    }

    fn settle(self: Box<Self>, how: Settle, items: &mut Items) -> Settled {
        let Held {
            name,
            limiter,
            key,
            receipt,
            n,
        } = *self;
        let key: &X::Lookup = key.borrow();
        let mut settled = Settled::default();
        match how {
            Settle::Keep => {}
            Settle::Refund => {
                if receipt.is_none_or(|receipt| limiter.stage_give_back(key, receipt)) {
                    settled.refunded = 1;
                } else {
                    settled.refund_declined = 1;
                }
            }
            // One allowance for every client is not emptied by a response
            // to one of them.
            Settle::Drain if one_key_for_all::<X>() || limiter.one_allowance() => {}
            Settle::Drain => settled.drained = take_up_to(&*limiter, key, u32::MAX).0.into(),
            Settle::Cost(cost) if cost > n => charge(&*limiter, key, cost - n, &mut settled),
            Settle::Cost(cost) if cost < n => {
                // Give back only what was over-charged, in one step: nothing
                // is given back that another request could take before the
                // real cost is charged.
                let back = match receipt {
                    None => {
                        charge(&*limiter, key, cost, &mut settled);
                        true
                    }
                    Some(receipt) => limiter.stage_give_back(
                        key,
                        Receipt {
                            n: n - cost,
                            ..receipt
                        },
                    ),
                };
                if back {
                    settled.refunded = 1;
                } else {
                    // The charge stays: more than used, never less.
                    settled.refund_declined = 1;
                }
            }
            Settle::Cost(_) => {}
        }
        let state = State::Remaining(now_remaining(&*limiter, key));
        items.push(&name, None, limiter.advertise_for(key), &state);
        settled
    }
}

/// Take up to `want` permits for `key`, as many as the limiter holds: the
/// permits taken and those it did not hold.
/// Charge `want` permits for `key` after a response: from what the limiter
/// holds, then from its next permits when it can lend (a token bucket or
/// GCRA, at most one fill ahead: the requests after it wait), and what is
/// left is forgiven.
pub(super) fn charge<L, Q>(limiter: &L, key: &Q, want: u32, settled: &mut Settled)
where
    L: GateLimiter<Q> + 'static,
    Q: ?Sized,
{
    let (taken, short) = take_up_to(limiter, key, want);
    let lent = if short > 0 {
        limiter.stage_owe(key, short)
    } else {
        0
    };
    settled.charged += u64::from(taken);
    settled.lent += u64::from(lent);
    settled.forgiven += u64::from(short - lent);
}

pub(super) fn take_up_to<L, Q>(limiter: &L, key: &Q, want: u32) -> (u32, u32)
where
    L: GateLimiter<Q> + ?Sized,
    Q: ?Sized,
{
    let mut left = want;
    // A few tries: another request may take what was seen between the look
    // and the take; what is still not taken then is reported short.
    for _ in 0..4 {
        if left == 0 {
            break;
        }
        let State::Remaining(holds) = now_state(limiter, key, 1) else {
            break;
        };
        // What the key holds is within its own capacity (a tier's, for
        // tiers): no cap at the smallest tier's, which left a paid key
        // holding 100 with 60 after a drain that took 4 × 10.
        let ask = left.min(holds);
        if ask == 0 {
            break;
        }
        if limiter.settle_take(key, ask) {
            left -= ask;
        }
    }
    (want - left, left)
}

/// The tickets of an admitted request, and where their counts go.
pub(super) struct Settlement {
    pub(super) shared: Arc<Shared>,
    pub(super) tickets: Vec<Box<dyn Ticket>>,
    /// The remote limits' admissions, in order.
    pub(super) remote: Vec<RemoteTaken>,
}

impl Drop for Settlement {
    fn drop(&mut self) {
        // Settled, the tickets were taken; still here, the response never
        // came (the service's error, or the future dropped first). A layer
        // that settles nothing (its remote admissions kept here only to be
        // reported) has nothing left unsettled.
        if self.shared.settles() && (!self.tickets.is_empty() || !self.remote.is_empty()) {
            self.shared.counts.add(UNSETTLED, thread_slot());
        }
    }
}

impl Settlement {
    /// Settle every limit by the response, and say what each holds now.
    pub(super) fn settle(mut self, parts: &Parts) -> Option<Fields> {
        let shared = &self.shared;
        let how = if shared.drain_when.as_ref().is_some_and(|when| when(parts)) {
            Settle::Drain
        } else if shared.refund_when.as_ref().is_some_and(|when| when(parts)) {
            Settle::Refund
        } else if let Some(cost) = shared
            .cost_from_response
            .as_ref()
            .and_then(|cost| cost(parts))
        {
            Settle::Cost(cost)
        } else {
            Settle::Keep
        };
        let mut items = Items::default();
        let mut total = Settled::default();
        let remote = core::mem::take(&mut self.remote);
        // In the order the limits were asked (the tickets were kept from the
        // last limit back).
        for ticket in core::mem::take(&mut self.tickets).into_iter().rev() {
            let settled = ticket.settle(how, &mut items);
            total.refunded += settled.refunded;
            total.refund_declined += settled.refund_declined;
            total.charged += settled.charged;
            total.lent += settled.lent;
            total.forgiven += settled.forgiven;
            total.drained += settled.drained;
        }
        total.count(shared);
        let cost = shared.cost;
        // What each remote limit is left with once settled, at most: its
        // item never promises more.
        let after = |taken: &RemoteTaken| match how {
            Settle::Drain if !shared.remote[taken.index].one_key_for_all() => 0,
            Settle::Cost(real) if real > cost => taken.remaining.saturating_sub(real - cost),
            _ => taken.remaining,
        };
        if shared.advertise {
            for taken in &remote {
                push_remote(
                    &mut items,
                    shared,
                    taken.index,
                    &State::Remaining(after(taken)),
                );
            }
        }
        settle_remote(shared, remote, how);
        if !shared.advertise {
            return None;
        }
        items.fields(None)
    }

    /// Add each remote limit's item, with what it had left after the
    /// admission less `less(taken)`.
    pub(super) fn report_remote(&self, items: &mut Items, less: impl Fn(&RemoteTaken) -> u32) {
        if !self.shared.advertise {
            return;
        }
        for taken in &self.remote {
            let r = taken.remaining.saturating_sub(less(taken));
            push_remote(items, &self.shared, taken.index, &State::Remaining(r));
        }
    }
}

/// Settle the remote admissions as `how`, beside the response: each is a
/// call, made by a task of its own on the current tokio runtime, counted
/// when it ends. Outside a runtime nothing can run beside the response: the
/// permits stay spent, and a refund counts as declined.
pub(super) fn settle_remote(shared: &Arc<Shared>, remote: Vec<RemoteTaken>, how: Settle) {
    if remote.is_empty() || matches!(how, Settle::Keep) {
        return;
    }
    #[cfg(all(feature = "redis", feature = "tokio"))]
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let shared = Arc::clone(shared);
        drop(runtime.spawn(async move {
            let mut total = Settled::default();
            for taken in remote {
                let limit = match shared.remote.get(taken.index) {
                    Some(limit) => Arc::clone(limit),
                    None => continue,
                };
                settle_one(&*limit, taken, how, shared.cost, &mut total).await;
            }
            total.count(&shared);
        }));
        return;
    }
    let declined = remote.iter().filter(|t| t.refund.is_some()).count();
    if matches!(how, Settle::Refund) && declined > 0 {
        shared
            .counts
            .add_n(REFUND_DECLINED, thread_slot(), declined as u64);
    }
}

/// Settle one remote admission as `how` (charged `n` up front).
#[cfg(all(feature = "redis", feature = "tokio"))]
pub(super) async fn settle_one(
    limit: &dyn Remote,
    taken: RemoteTaken,
    how: Settle,
    n: u32,
    total: &mut Settled,
) {
    // Give back `back` of the `n` permits taken.
    let refund = |refund: Option<Refund>, back: u32| async move {
        match refund {
            Some(refund) => refund(back).await,
            None => false,
        }
    };
    match how {
        Settle::Keep => {}
        Settle::Refund => {
            if refund(taken.refund, n).await {
                total.refunded += 1;
            } else {
                total.refund_declined += 1;
            }
        }
        Settle::Drain if limit.one_key_for_all() => {}
        Settle::Drain => {
            total.drained += u64::from(remote_take_up_to(limit, &taken.key, u32::MAX).await.0)
        }
        Settle::Cost(real) if real > n => {
            let (charged, short) = remote_take_up_to(limit, &taken.key, real - n).await;
            total.charged += u64::from(charged);
            total.forgiven += u64::from(short);
        }
        Settle::Cost(real) if real < n => {
            // Give back only what was over-charged, in one call: nothing is
            // given back that another replica could take before the real
            // cost is charged. Declined, the charge stays: more than used,
            // never less.
            if refund(taken.refund, n - real).await {
                total.refunded += 1;
            } else {
                total.refund_declined += 1;
            }
        }
        Settle::Cost(_) => {}
    }
}

/// Take up to `want` permits for `key` from a remote limit, which answers
/// all or nothing: batches from what is asked (at most the capacity), the
/// batch halved after each refusal and kept after each admission, in at most
/// [`remote_calls`] calls. The permits taken, and those not.
///
/// The bound on calls is what keeps this to what the limit holds now: a
/// batch no larger than what the limit refills during one call is admitted
/// call after call, and without a bound a drain (`want` = `u32::MAX`) would
/// go on taking the refill for days.
#[cfg(all(feature = "redis", feature = "tokio"))]
pub(super) async fn remote_take_up_to(limit: &dyn Remote, key: &[u8], want: u32) -> (u32, u32) {
    let mut left = want;
    let mut ask = want.min(limit.capacity());
    for _ in 0..remote_calls(limit.capacity()) {
        if left == 0 || ask == 0 {
            break;
        }
        let (decision, _) = limit.take(key.to_vec(), ask).await;
        if decision.is_allowed() {
            left -= ask;
            ask = ask.min(left);
        } else {
            ask /= 2;
        }
    }
    (want - left, left)
}

/// The most calls [`remote_take_up_to`] makes on a limit of `capacity`: two
/// per halving of the capacity down to one (one admitted, one refused), so
/// that a limit holding any amount can be emptied by whole batches when
/// nothing refills it meanwhile.
#[cfg(all(feature = "redis", feature = "tokio"))]
pub(super) fn remote_calls(capacity: u32) -> u32 {
    2 * (u32::BITS - capacity.leading_zeros()) + 1
}

impl Settled {
    /// Add these counts to the layer's.
    pub(super) fn count(&self, shared: &Shared) {
        let slot = thread_slot();
        for (which, n) in [
            (REFUNDED, self.refunded),
            (REFUND_DECLINED, self.refund_declined),
            (CHARGED, self.charged),
            (LENT, self.lent),
            (FORGIVEN, self.forgiven),
            (DRAINED, self.drained),
        ] {
            if n > 0 {
                shared.counts.add_n(which, slot, n);
            }
        }
    }
}

#[cfg(all(test, feature = "redis", feature = "tokio"))]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::super::remote::{BoxFuture, Refund, Remote};
    use super::*;
    use crate::decision::{Decision, RetryAfter};

    /// A remote limit of `capacity` holding `holds` permits, which refills
    /// `refill` permits before answering each call (a limit that refills
    /// during every round trip), counting the calls.
    struct Refilling {
        capacity: u32,
        holds: AtomicU32,
        refill: u32,
        calls: AtomicU32,
    }

    impl Remote for Refilling {
        fn name(&self) -> &str {
            "fleet"
        }
        fn capacity(&self) -> u32 {
            self.capacity
        }
        fn missing(&self, _: &RequestHead<'_>) -> Option<Denial> {
            None
        }
        fn challenge(&self) -> HeaderValue {
            HeaderValue::from_static("x")
        }
        fn key(&self, _: &RequestHead<'_>) -> Option<Vec<u8>> {
            Some(b"k".to_vec())
        }
        fn advertise(&self) -> Option<(u32, Duration)> {
            None
        }
        fn one_key_for_all(&self) -> bool {
            false
        }
        fn take(&self, _: Vec<u8>, n: u32) -> BoxFuture<(Decision, Option<Refund>)> {
            // Relaxed: one task calls, in order.
            self.calls.fetch_add(1, Ordering::Relaxed);
            let holds = (self.holds.load(Ordering::Relaxed) + self.refill).min(self.capacity);
            let decision = if n <= holds {
                self.holds.store(holds - n, Ordering::Relaxed);
                Decision::Allowed {
                    remaining: holds - n,
                }
            } else {
                self.holds.store(holds, Ordering::Relaxed);
                Decision::Denied {
                    retry_after: RetryAfter::from_nanos(1),
                }
            };
            Box::pin(async move { (decision, None) })
        }
        fn peek(&self, _: Vec<u8>, n: u32) -> BoxFuture<Decision> {
            // Relaxed: as `take`.
            let holds = self.holds.load(Ordering::Relaxed);
            let decision = if n <= holds {
                Decision::Allowed {
                    remaining: holds - n,
                }
            } else {
                Decision::Denied {
                    retry_after: RetryAfter::from_nanos(1),
                }
            };
            Box::pin(async move { decision })
        }
    }

    fn run<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(future)
    }

    /// A drain on a limit that refills 9 permits during each call (a bucket
    /// of 10,000 a second, a round trip of a millisecond) ends after a
    /// bounded number of calls, where it went on taking the refill until it
    /// had four billion permits.
    #[test]
    fn a_drain_of_a_limit_that_refills_every_call_ends() {
        let limit = Refilling {
            capacity: 10_000,
            holds: AtomicU32::new(10_000),
            refill: 9,
            calls: AtomicU32::new(0),
        };
        let (taken, short) = run(remote_take_up_to(&limit, b"k", u32::MAX));
        let calls = limit.calls.load(Ordering::Relaxed);
        assert!(calls <= remote_calls(10_000), "{calls} calls");
        assert_eq!(remote_calls(10_000), 29);
        assert!(taken >= 10_000, "the bucket's whole content: {taken}");
        assert_eq!(taken + short, u32::MAX);
    }

    /// With nothing refilled, a drain empties any content in whole batches
    /// within the bound, and a cost takes what is held and no more.
    #[test]
    fn without_refills_a_drain_empties_the_limit() {
        for (capacity, holds) in [
            (1, 1),
            (10, 9),
            (10_000, 10_000),
            (10_000, 6_789),
            (u32::MAX, 12_345),
        ] {
            let limit = Refilling {
                capacity,
                holds: AtomicU32::new(holds),
                refill: 0,
                calls: AtomicU32::new(0),
            };
            let (taken, _) = run(remote_take_up_to(&limit, b"k", u32::MAX));
            assert_eq!(taken, holds, "capacity {capacity}");
            assert_eq!(limit.holds.load(Ordering::Relaxed), 0);
            assert!(limit.calls.load(Ordering::Relaxed) <= remote_calls(capacity));
        }
        let limit = Refilling {
            capacity: 100,
            holds: AtomicU32::new(30),
            refill: 0,
            calls: AtomicU32::new(0),
        };
        assert_eq!(run(remote_take_up_to(&limit, b"k", 50)), (30, 20));
    }
}
