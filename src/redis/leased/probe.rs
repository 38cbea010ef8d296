//! Sharing a dry key in proportion to demand: while a key's bucket is dry,
//! each process keeps Redis' denial and answers its requests from it with no
//! call; besides the call at the end of each wait, one denial in every `L`
//! answered this way calls Redis instead (a probe). A process's calls to a
//! dry key then come at a rate in proportion to its requests, and the tokens
//! the bucket refills go to the first call that finds enough of them: to
//! each process in about the proportion of its calls, so of its demand, as
//! in exact mode, where every request is a call.

use core::cell::Cell;

std::thread_local! {
    /// Kept-denial answers left on this thread before the next probe: the
    /// `L`-th answer probes, the first thread's included.
    static UNTIL_PROBE: Cell<u32> = const { Cell::new(u32::MAX) };
}

/// Count one kept-denial answer on this thread; `true` when it is the one in
/// every `every` that probes Redis instead. A count kept for a larger
/// `every` (another limiter's) is cut to this one's.
pub(super) fn probes(every: u32) -> bool {
    UNTIL_PROBE.with(|left| {
        let n = left.get().min(every.saturating_sub(1));
        if n == 0 {
            left.set(every.saturating_sub(1));
            true
        } else {
            left.set(n - 1);
            false
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_answer_in_every_l_probes() {
        for every in [1u32, 2, 7, 1_000] {
            // Whatever another limiter left on this thread.
            let _ = super::probes(5_000);
            let _ = super::probes(every);
            let probes = (0..every * 10).filter(|_| super::probes(every)).count();
            assert_eq!(probes, 10, "every {every}");
        }
        assert!(super::probes(0), "a zero is one");
        // A fresh thread probes on its `every`-th answer, not its first.
        let first = std::thread::spawn(|| (1..=4).find(|_| super::probes(4)))
            .join()
            .unwrap();
        assert_eq!(first, Some(4));
    }
}
