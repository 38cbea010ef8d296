//! Threads that decide flat out while a test changes what they decide on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

/// Threads calling a decision until [`stop`](Deciders::stop), counting the
/// calls it answered `true` (admitted).
pub struct Deciders {
    admitted: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Deciders {
    /// Start `threads` threads, each calling `decide` over and over.
    pub fn start<F>(threads: usize, decide: F) -> Deciders
    where
        F: Fn() -> bool + Send + Sync + 'static,
    {
        let decide = Arc::new(decide);
        let admitted = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let (decide, admitted, done) = (decide.clone(), admitted.clone(), done.clone());
                std::thread::spawn(move || {
                    // Relaxed: a stop flag; nothing is read on the strength
                    // of it (the count is read after `join`).
                    while !done.load(Ordering::Relaxed) {
                        if decide() {
                            // Relaxed: a count, read after `join`, which
                            // orders it.
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        Deciders {
            admitted,
            done,
            threads,
        }
    }

    /// Stop the threads and wait for them: the admissions they counted.
    pub fn stop(self) -> u64 {
        // Relaxed: see `start`.
        self.done.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("a decider thread");
        }
        // Relaxed: every increment happened before its thread's `join`.
        self.admitted.load(Ordering::Relaxed)
    }
}
