//! How a dropped bulkhead permit wakes the head of a fair queue
//! ([`Fair`](crate::Fair), feature `tokio`) waiting for one.

use core::sync::atomic::{AtomicBool, Ordering, fence};
use core::task::Waker;
use std::sync::Mutex;

use crate::sync::lock;

/// How a dropped bulkhead permit wakes the heads of the bulkhead's fair
/// queues: one waker per listening head, and a flag that says whether any is
/// listening, so that a release takes the lock only while a fair waiter waits.
///
/// Each [`Fair`] wrapper has its own queue and so its own head, and several
/// wrappers may share one bulkhead (it comes in an `Arc`): each head files its
/// waker under its wrapper, a release wakes them all (each tries again), and a
/// head that leaves takes away only its own.
///
/// # Orderings
///
/// A release subtracts with `SeqCst` and then loads the flag with `SeqCst`;
/// a head stores its waker, sets the flag with `SeqCst`, issues a `SeqCst`
/// fence and then tries for permits again. Either the release's load comes
/// after the head's store in the single total order of `SeqCst` operations and
/// sees the flag (and wakes the head), or it comes before: then the release's
/// subtraction precedes the fence, and the head's retry, sequenced after the
/// fence, sees the freed permits. So no head sleeps through a release (the
/// store-buffering pattern that needs `SeqCst` on both sides). The flag is
/// stored only under the lock, true while a waker is filed and false only
/// when the last listening head leaves, so a head's `true` is never undone by
/// another head leaving.
#[derive(Debug, Default)]
pub(crate) struct ReleaseSignal {
    listening: AtomicBool,
    /// The listening heads' wakers, each under its wrapper's address.
    wakers: Mutex<Vec<(usize, Waker)>>,
}

impl ReleaseSignal {
    /// Called by every release, after its `SeqCst` subtraction.
    #[inline]
    pub(crate) fn notify(&self) {
        // SeqCst: see the type's documentation.
        if self.listening.load(Ordering::SeqCst) {
            let wakers = core::mem::take(&mut *lock(&self.wakers));
            // Woken outside the lock: a woken head's poll takes it.
            for (_, waker) in wakers {
                waker.wake();
            }
        }
    }

    /// Wake `waker`, the head of the queue of wrapper `owner`, at the next
    /// release; the caller must try again after.
    pub(crate) fn listen(&self, owner: usize, waker: &Waker) {
        {
            let mut wakers = lock(&self.wakers);
            match wakers.iter_mut().find(|(o, _)| *o == owner) {
                Some((_, filed)) => filed.clone_from(waker),
                None => wakers.push((owner, waker.clone())),
            }
            // SeqCst: see the type's documentation. Under the lock, so that it
            // is ordered with a leaving head's store of `false`.
            self.listening.store(true, Ordering::SeqCst);
        }
        // SeqCst: see the type's documentation.
        fence(Ordering::SeqCst);
    }
}

/// Stops a head listening for releases when it leaves (admitted, given up or
/// cancelled): its waker is taken away, and the flag cleared if no other
/// wrapper's head listens.
pub(crate) struct Listening<'a> {
    pub(crate) signal: &'a ReleaseSignal,
    pub(crate) owner: usize,
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        let mut wakers = lock(&self.signal.wakers);
        wakers.retain(|(o, _)| *o != self.owner);
        if wakers.is_empty() {
            // Relaxed: under the lock, after every store of `true` by a head
            // that listened before; a release that still sees the flag takes
            // the lock and finds no waker, or a later head's.
            self.signal.listening.store(false, Ordering::Relaxed);
        }
    }
}
