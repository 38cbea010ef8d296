//! Limits decided by a call (the crate's limits in Redis): asked after every
//! in-process limit admitted, all or nothing among themselves.

use super::items::{Items, State};
use super::*;

/// A boxed future that can move between threads.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Gives back `n` of the permits a remote limit's admission took (at most
/// those), exactly or not at all: `true` when exact. Fewer than it took
/// leaves the key as if the admission had taken only the rest.
pub(crate) type Refund = Box<dyn FnOnce(u32) -> BoxFuture<bool> + Send + Sync>;

/// A limit decided by a call (one of the crate's limits in Redis), asked
/// only once every in-process limit admitted.
pub(crate) trait Remote: Send + Sync {
    fn name(&self) -> &str;
    /// The most permits one request can get.
    fn capacity(&self) -> u32;
    /// Why the request has no key for this limit, if it has none.
    fn missing(&self, head: &RequestHead<'_>) -> Option<Denial>;
    /// The challenge of a 401 for a key this limit did not find.
    fn challenge(&self) -> HeaderValue;
    /// The request's key, as the bytes the limit keeps it under.
    fn key(&self, head: &RequestHead<'_>) -> Option<Vec<u8>>;
    /// What the limit may advertise.
    fn advertise(&self) -> Option<(u32, Duration)>;
    /// Whether every request has the one key ([`Global`]): never drained.
    fn one_key_for_all(&self) -> bool;
    /// Take `n` permits for `key`, and what gives them back (`None` when
    /// they cannot be).
    fn take(&self, key: Vec<u8>, n: u32) -> BoxFuture<(crate::decision::Decision, Option<Refund>)>;
    /// What `n` permits for `key` would get now, taking nothing.
    fn peek(&self, key: Vec<u8>, n: u32) -> BoxFuture<crate::decision::Decision>;
    /// Whether an exact refund leaves the key as it was before the
    /// admission, so that what it holds is the admission's `remaining` and
    /// the permits given back (a token bucket's or GCRA's refund, exact only
    /// while no other decision changed the key). A window's refund takes its
    /// permits out of a count that later admissions are in too: what the key
    /// holds then is asked.
    fn refund_restores_state(&self) -> bool {
        false
    }
}

/// A remote admission kept for settling: its limit's index, its key, the
/// permits left after it, and its refund.
pub(crate) struct RemoteTaken {
    pub(super) index: usize,
    #[cfg_attr(not(all(feature = "redis", feature = "tokio")), allow(dead_code))]
    pub(super) key: Vec<u8>,
    pub(super) remaining: u32,
    pub(super) refund: Option<Refund>,
}

/// What the remote limits answered.
pub(crate) enum RemoteOutcome {
    Admitted(Vec<RemoteTaken>),
    /// Remote limit `by` refused; the ones before it admitted and were given
    /// back (each its index and what it holds now: after an exact refund,
    /// what it had left and the permits given back, for a refund that
    /// restores the state it found; otherwise what a peek
    /// answered, a wait when the same request would be refused now).
    Refused {
        by: usize,
        decision: crate::decision::Decision,
        taken: Vec<(usize, State)>,
    },
}

/// Ask the remote limits in order, all or nothing.
pub(super) fn remote_phase(
    shared: Arc<Shared>,
    keys: Vec<Vec<u8>>,
    n: u32,
) -> BoxFuture<RemoteOutcome> {
    Box::pin(async move {
        let mut held = Held {
            taken: Vec::with_capacity(keys.len()),
            n,
            shared,
        };
        for (index, (limit, key)) in held.shared.remote.iter().zip(keys).enumerate() {
            let (decision, refund) = limit.take(key.clone(), n).await;
            match decision {
                crate::decision::Decision::Allowed { remaining } => held.taken.push(RemoteTaken {
                    index,
                    key,
                    remaining,
                    refund,
                }),
                denied => {
                    let mut back = Vec::with_capacity(held.taken.len());
                    // The last first, each taken out of the guard only as
                    // its own refund is made: dropped meanwhile, the guard
                    // gives the rest back.
                    while let Some(earlier) = held.taken.pop() {
                        let exact = match earlier.refund {
                            Some(refund) => refund(n).await,
                            None => false,
                        };
                        let limit = &held.shared.remote[earlier.index];
                        let state = if exact && limit.refund_restores_state() {
                            State::Remaining(earlier.remaining.saturating_add(n))
                        } else {
                            // Kept spent (declined, or leased mode), or given
                            // back into a window's count that other requests
                            // may have added to meanwhile: what the key
                            // holds, or how long until the same request is
                            // admitted, is asked.
                            match limit.peek(earlier.key, n).await {
                                crate::decision::Decision::Allowed { remaining } => {
                                    State::Remaining(remaining.saturating_add(n))
                                }
                                crate::decision::Decision::Denied { retry_after } => {
                                    State::Wait(retry_after)
                                }
                            }
                        };
                        back.push((earlier.index, state));
                    }
                    back.reverse();
                    return RemoteOutcome::Refused {
                        by: index,
                        decision: denied,
                        taken: back,
                    };
                }
            }
        }
        RemoteOutcome::Admitted(core::mem::take(&mut held.taken))
    })
}

/// The remote admissions of a request still being decided: given back if
/// the request is dropped first (a timeout around the service, a client
/// gone while a later limit's call was in flight), as a refusal gives them
/// back, by a task of their own; counted as refunds are. A limit that
/// cannot give its permits back (leased mode) keeps them spent.
struct Held {
    taken: Vec<RemoteTaken>,
    #[cfg_attr(not(all(feature = "redis", feature = "tokio")), allow(dead_code))]
    n: u32,
    shared: Arc<Shared>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let taken = core::mem::take(&mut self.taken);
        if taken.iter().all(|t| t.refund.is_none()) {
            return;
        }
        #[cfg(all(feature = "redis", feature = "tokio"))]
        {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (n, shared) = (self.n, Arc::clone(&self.shared));
                drop(runtime.spawn(async move {
                    for earlier in taken.into_iter().rev() {
                        if let Some(refund) = earlier.refund {
                            let counter = if refund(n).await {
                                REFUNDED
                            } else {
                                REFUND_DECLINED
                            };
                            shared.counts.add(counter, thread_slot());
                        }
                    }
                }));
            } else {
                // Dropped outside a runtime: no call can be made, and the
                // permits stay spent, counted as refunds declined.
                let declined = taken.iter().filter(|t| t.refund.is_some()).count();
                self.shared
                    .counts
                    .add_n(REFUND_DECLINED, thread_slot(), declined as u64);
            }
        }
    }
}

/// Remote limit `index`'s item.
pub(super) fn push_remote(items: &mut Items, shared: &Shared, index: usize, state: &State) {
    if let Some(limit) = shared.remote.get(index) {
        let advertised = limit.advertise().map(|(quota, window)| Advertised {
            quota,
            window,
            tier: None,
        });
        items.push(limit.name(), None, advertised, state);
    }
}
