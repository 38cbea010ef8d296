//! Prefetches off the request path: the [`Refresher`] thread, its tokio
//! task twin, and the queue that hands them each key's claimed fetch.

use core::fmt;
use core::time::Duration;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use ::redis::ConnectionLike;

use super::give_back::Step;
use super::{Fetch, LeasedLimiter};
use crate::clock::Clock;
use crate::redis::RedisConnection;
use crate::sync::Ordering;

/// A thread that takes the prefetches of a [`LeasedLimiter`] off the request
/// path, on a connection of its own, and gives back idle leases every idle
/// time. Stopped (and joined) when dropped; from then on (and whenever its
/// queue is full) the requests make their prefetches themselves.
pub struct Refresher {
    stop: Arc<AtomicBool>,
    /// Wakes the thread from its wait for work, so that dropping the handle
    /// does not wait out the idle time.
    wake: SyncSender<Option<Queued>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Refresher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refresher")
            .field("running", &self.thread.is_some())
            .finish()
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        // Relaxed: the flag publishes no other data; the thread sees it at
        // its next wake-up at the latest.
        self.stop.store(true, Ordering::Relaxed);
        // A full queue means the thread is busy and checks the flag after
        // the fetch in hand; a disconnected one, that it has stopped.
        let _ = self.wake.try_send(None);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<C: Clock + 'static> LeasedLimiter<C> {
    /// This limiter, weakly, as what a queued prefetch releases its claim on.
    fn owner(self: &Arc<Self>) -> Weak<dyn ReleaseClaim> {
        let owner: Arc<dyn ReleaseClaim> = Arc::clone(self) as Arc<dyn ReleaseClaim>;
        Arc::downgrade(&owner)
    }

    /// Start a thread that makes this limiter's prefetches on `con` (the
    /// request that crosses the low-water mark then only queues the key, and
    /// makes no call), and gives back idle leases every idle time (at least
    /// every 10 ms). A miss (no tokens here) is still fetched by its request.
    /// `None` when a refresher was started already. `con` is any of the
    /// crate's blocking connections ([`RedisConnection`]): to one server, to
    /// a Redis Cluster, or to the primary Sentinels name.
    ///
    /// # Errors
    ///
    /// When the thread cannot be spawned.
    pub fn start_refresher(
        self: &Arc<Self>,
        mut con: impl RedisConnection,
    ) -> std::io::Result<Option<Refresher>> {
        let (queue, requests) = mpsc::sync_channel::<Option<Queued>>(QUEUE);
        let wake = queue.clone();
        if self
            .refresher
            .set(Queue {
                to: To::Thread(queue),
                owner: self.owner(),
            })
            .is_err()
        {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let limiter = Arc::clone(self);
        let stopped = Arc::clone(&stop);
        let tick = self.idle.max(Duration::from_millis(10));
        let thread = std::thread::Builder::new()
            .name("turnstile-lease-refresher".into())
            .spawn(move || {
                let mut last_give_back = Instant::now();
                // Relaxed: see `Refresher::drop`.
                while !stopped.load(Ordering::Relaxed) {
                    match requests.recv_timeout(tick) {
                        // The handle dropped: the loop's test ends it.
                        Ok(None) => {}
                        Ok(Some(mut queued)) => queued.make(&limiter, &mut con),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                    if last_give_back.elapsed() >= tick {
                        let idle = Some(limiter.idle);
                        for key in limiter.idle_keys(idle) {
                            // Relaxed: see `Refresher::drop`. A handle
                            // dropped mid-pass waits for one call, not the
                            // pass.
                            if stopped.load(Ordering::Relaxed) {
                                break;
                            }
                            // The prefetches queued meanwhile first: a key in
                            // use, about to run dry, does not wait for a pass
                            // over every idle key (one call each).
                            while let Ok(Some(mut queued)) = requests.try_recv() {
                                queued.make(&limiter, &mut con);
                            }
                            if let Step::Stop = limiter.give_back_key(&key, idle, &mut con) {
                                break;
                            }
                        }
                        last_give_back = Instant::now();
                    }
                }
            })?;
        Ok(Some(Refresher {
            stop,
            wake,
            thread: Some(thread),
        }))
    }
}

/// Prefetches waiting for a refresher, at most.
const QUEUE: usize = 1_024;

/// A refresher's queue, and the limiter whose claims its prefetches hold.
pub(super) struct Queue {
    to: To,
    owner: Weak<dyn ReleaseClaim>,
}

/// Where a refresher takes its prefetches from.
enum To {
    Thread(SyncSender<Option<Queued>>),
    #[cfg(feature = "tokio")]
    Task(tokio::sync::mpsc::Sender<Queued>),
}

/// Releases a key's fetch claim: a [`LeasedLimiter`] of any clock, for the
/// queue, which is not generic.
trait ReleaseClaim: Send + Sync {
    fn release(&self, key: &[u8]);
}

impl<C: Clock> ReleaseClaim for LeasedLimiter<C> {
    fn release(&self, key: &[u8]) {
        self.release_fetch(key);
    }
}

/// A prefetch handed to a refresher. Dropped before it was made (its
/// refresher stopped or its task was aborted with it queued or in flight, or
/// the queue was discarded), it releases its key's claim, so that the key's
/// next request can take a lease again.
struct Queued {
    key: Vec<u8>,
    /// `None` once taken back by [`into_fetch`](Self::into_fetch).
    fetch: Option<Fetch>,
    /// Set once the fetch's answer is in the key's word.
    made: bool,
    owner: Weak<dyn ReleaseClaim>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        if !self.made
            && self.fetch.is_some()
            && let Some(owner) = self.owner.upgrade()
        {
            owner.release(&self.key);
        }
    }
}

impl Queued {
    /// The fetch, taken back unmade (the queue refused it): the claim goes
    /// with it, to the request that makes it.
    fn into_fetch(mut self) -> Option<Fetch> {
        self.fetch.take()
    }

    /// Make the fetch on `con` and put its answer into the key's word.
    fn make<C: Clock>(&mut self, limiter: &LeasedLimiter<C>, con: &mut dyn ConnectionLike) {
        if let Some(fetch) = &self.fetch {
            let result = fetch.invocation.invoke(con);
            let _ = limiter.finish_lease(&self.key, 1, fetch, result);
            self.made = true;
        }
    }

    /// [`make`](Self::make) on an asynchronous connection. Dropped while it
    /// awaits the call, `self` is still unmade, and releases the claim.
    #[cfg(feature = "tokio")]
    async fn make_async<C: Clock, Con: ::redis::aio::ConnectionLike>(
        &mut self,
        limiter: &LeasedLimiter<C>,
        con: &mut Con,
    ) {
        if let Some(fetch) = &self.fetch {
            let result = fetch.invocation.invoke_async(con).await;
            let _ = limiter.finish_lease(&self.key, 1, fetch, result);
            self.made = true;
        }
    }
}

impl Queue {
    /// Queue `key`'s fetch, or give it back when the queue is full or its
    /// refresher stopped.
    /// (`Err(None)` only in form: what comes back is what was sent, `Some`.)
    pub(super) fn send(&self, key: &[u8], fetch: Fetch) -> Result<(), Option<Fetch>> {
        let queued = Queued {
            key: key.to_vec(),
            fetch: Some(fetch),
            made: false,
            owner: Weak::clone(&self.owner),
        };
        match &self.to {
            To::Thread(queue) => queue.try_send(Some(queued)).map_err(|e| match e {
                TrySendError::Full(sent) | TrySendError::Disconnected(sent) => {
                    sent.and_then(Queued::into_fetch)
                }
            }),
            #[cfg(feature = "tokio")]
            To::Task(queue) => queue.try_send(queued).map_err(|e| match e {
                tokio::sync::mpsc::error::TrySendError::Full(queued)
                | tokio::sync::mpsc::error::TrySendError::Closed(queued) => queued.into_fetch(),
            }),
        }
    }
}

#[cfg(feature = "tokio")]
impl<C: Clock + 'static> LeasedLimiter<C> {
    /// [`start_refresher`](Self::start_refresher) as a tokio task on an
    /// asynchronous connection (feature `tokio` too): it makes this limiter's
    /// prefetches and gives back idle leases every idle time (at least every
    /// 10 ms), until the returned handle is aborted. `None` when a refresher
    /// was started already. Must be called within a tokio runtime.
    ///
    /// Give it one of the crate's reconnecting connections
    /// ([`AsyncRedisConnection`](crate::redis::AsyncRedisConnection): for
    /// one server [`Deadlines::reconnecting`](crate::redis::Deadlines::reconnecting)),
    /// none of which sends a call again. The refresher keeps its connection
    /// for as long as it runs, so it must connect again by itself: on
    /// [`Deadlines::multiplexed`](crate::redis::Deadlines::multiplexed),
    /// which never does, every prefetch and give-back after a Redis restart
    /// fails, and each failure starts the backoff again, so the limiter
    /// answers by its failure policy for good. Never redis-rs's own cluster
    /// connection either, which retries a timed-out command: a lease or a
    /// give-back script run twice takes or returns its tokens twice.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use turnstile::redis::{Deadlines, LeasedLimiter, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(1_000)?))?;
    /// let limiter = Arc::new(LeasedLimiter::builder(global, 50)?.build()?);
    /// // Connects again after a Redis restart, by itself.
    /// let con = Deadlines::default().reconnecting(redis::Client::open("redis://127.0.0.1/")?);
    /// let _refresher = limiter.start_refresher_async(con);
    /// # Ok(())
    /// # }
    /// ```
    pub fn start_refresher_async<Con>(
        self: &Arc<Self>,
        mut con: Con,
    ) -> Option<tokio::task::JoinHandle<()>>
    where
        Con: ::redis::aio::ConnectionLike + Send + 'static,
    {
        let (queue, mut requests) = tokio::sync::mpsc::channel::<Queued>(QUEUE);
        if self
            .refresher
            .set(Queue {
                to: To::Task(queue),
                owner: self.owner(),
            })
            .is_err()
        {
            return None;
        }
        let limiter = Arc::clone(self);
        let tick = self.idle.max(Duration::from_millis(10));
        Some(tokio::spawn(async move {
            let mut last_give_back = Instant::now();
            loop {
                match tokio::time::timeout(tick, requests.recv()).await {
                    // Aborted while this awaits, `queued` is dropped unmade
                    // and releases the key's claim.
                    Ok(Some(mut queued)) => queued.make_async(&limiter, &mut con).await,
                    Ok(None) => break,
                    Err(_) => {}
                }
                if last_give_back.elapsed() >= tick {
                    let idle = Some(limiter.idle);
                    for key in limiter.idle_keys(idle) {
                        // The prefetches queued meanwhile first (as the
                        // thread's pass does). Aborted while this awaits,
                        // `queued` is dropped unmade and releases its claim.
                        while let Ok(mut queued) = requests.try_recv() {
                            queued.make_async(&limiter, &mut con).await;
                        }
                        if let Step::Stop = limiter.give_back_key_async(&key, idle, &mut con).await
                        {
                            break;
                        }
                    }
                    last_give_back = Instant::now();
                }
            }
        }))
    }
}
