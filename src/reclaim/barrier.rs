//! The barrier mode, process-wide (membarrier registration is per process):
//! how readers and writers order a pin before its reads, chosen at first use,
//! the switch to fences when a barrier fails, and [`reclamation`], which
//! reports it.

/// How the keyed limiters' readers and writers order a reader's pin before
/// its reads ([`reclamation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BarrierMode {
    /// Readers pin with a compiler fence; writers issue
    /// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (Linux).
    Membarrier,
    /// Readers and writers each issue a `SeqCst` fence.
    Fence,
}

/// The state of the keyed limiters' memory reclamation in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reclamation {
    /// The barrier mode in force.
    pub mode: BarrierMode,
    /// Expedited barriers that failed after the process registered for them.
    /// The first failure switches the process to [`BarrierMode::Fence`].
    pub failed_barriers: u64,
    /// `true` after such a failure until a `MEMBARRIER_CMD_GLOBAL` barrier
    /// has succeeded: until then each limiter frees memory only once every
    /// thread that used it has called it again, or exited.
    pub unconfirmed: bool,
}

/// How the keyed limiters' memory reclamation stands: the barrier mode chosen
/// at first use (set `TURNSTILE_BARRIER=fence` to choose fence mode), and how
/// many barriers failed since.
///
/// ```
/// let state = turnstile::reclamation();
/// assert_eq!(state.failed_barriers, 0);
/// ```
pub fn reclamation() -> Reclamation {
    mode::init();
    Reclamation {
        mode: if mode::reader_fences() {
            BarrierMode::Fence
        } else {
            BarrierMode::Membarrier
        },
        failed_barriers: mode::failed(),
        unconfirmed: mode::unconfirmed(),
    }
}

#[cfg(not(turnstile_loom))]
pub(super) mod mode {
    use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering, fence};
    use std::sync::Once;

    const UNKNOWN: u8 = 0;
    const MEMBARRIER: u8 = 1;
    const FENCE: u8 = 2;

    /// The mode readers follow. Set once at start-up; may later go from
    /// `MEMBARRIER` to `FENCE`, never back.
    static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
    static INIT: Once = Once::new();
    /// Set before a switch to fence mode, cleared by a `CMD_GLOBAL` barrier
    /// that succeeded after it.
    static UNCONFIRMED: AtomicBool = AtomicBool::new(false);
    static FAILED: AtomicU64 = AtomicU64::new(0);

    /// Choose the mode, once. Every thread calls this before it takes a
    /// thread index, so a reader never sees `UNKNOWN`.
    pub(in crate::reclaim) fn init() {
        INIT.call_once(|| {
            let forced = std::env::var_os("TURNSTILE_BARRIER");
            let mode = if forced.as_deref() == Some("fence".as_ref()) {
                FENCE
            } else if membarrier::register() {
                MEMBARRIER
            } else {
                FENCE
            };
            // Relaxed: the `Once` orders this store before every thread that
            // passes `call_once`.
            MODE.store(mode, Ordering::Relaxed);
        });
    }

    /// Whether a reader must fence its pin: the mode as this thread sees it.
    #[inline(always)]
    pub(in crate::reclaim) fn reader_fences() -> bool {
        // Relaxed: a thread reading `MEMBARRIER` after the switch pins
        // without a fence, and says so in its record (no `FENCED` bit); the
        // writers then do not trust a snapshot until it has shown a fenced
        // store (`Collector::transition_done`).
        MODE.load(Ordering::Relaxed) != MEMBARRIER
    }

    pub(super) fn failed() -> u64 {
        // Relaxed: a count for display.
        FAILED.load(Ordering::Relaxed)
    }

    pub(in crate::reclaim) fn unconfirmed() -> bool {
        // SeqCst: see `writer_barrier`.
        UNCONFIRMED.load(Ordering::SeqCst)
    }

    /// The writer's barrier, after its unpublishing stores and before it
    /// reads the records: `true` when it is sound for every reader, `false`
    /// when readers pinned without a fence may be missed (see the module's
    /// docs).
    pub(in crate::reclaim) fn writer_barrier() -> bool {
        init();
        // SeqCst: ordered with `UNCONFIRMED` below, so that a writer that
        // sees fence mode also sees a switch's unconfirmed flag.
        if MODE.load(Ordering::SeqCst) == MEMBARRIER {
            match membarrier::expedited() {
                Ok(()) => return true,
                Err(errno) => switch_to_fence(errno),
            }
        }
        fence(Ordering::SeqCst);
        if !UNCONFIRMED.load(Ordering::SeqCst) {
            return true;
        }
        // The switch came before this call: a global barrier now makes every
        // thread pass a full barrier after it, so each later pin sees fence
        // mode and each earlier one is visible here.
        if membarrier::global().is_ok() {
            // SeqCst: as above.
            UNCONFIRMED.store(false, Ordering::SeqCst);
            return true;
        }
        false
    }

    #[cold]
    fn switch_to_fence(errno: i32) {
        // Relaxed: a count.
        let failures = FAILED.fetch_add(1, Ordering::Relaxed);
        // SeqCst, before the mode: a writer that reads `FENCE` reads this
        // flag (or a later confirmation) too.
        UNCONFIRMED.store(true, Ordering::SeqCst);
        let was = MODE.swap(FENCE, Ordering::SeqCst);
        if was == MEMBARRIER && failures == 0 {
            log_switch(errno);
        }
    }

    #[cfg(feature = "tracing")]
    fn log_switch(errno: i32) {
        tracing::error!(
            errno,
            "turnstile: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after start-up \
             (a seccomp filter, or the kernel out of memory); keyed limiters switch to fence \
             mode, and free memory only once a global barrier succeeds or every thread that \
             used them has called them again"
        );
    }

    #[cfg(not(feature = "tracing"))]
    fn log_switch(_errno: i32) {}

    // Miri runs no system call it does not model: there, as off Linux, the
    // readers pin with a fence of their own.
    #[cfg(all(target_os = "linux", not(miri)))]
    mod membarrier {
        const CMD_GLOBAL: libc::c_long = 1;
        const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
        const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

        fn call(cmd: libc::c_long) -> Result<(), i32> {
            // SAFETY: `membarrier(cmd, flags = 0, cpu_id = 0)` takes no pointers
            // and has no effect on memory this process owns; every failure
            // returns -1 with `errno`, which the caller handles.
            #[allow(unsafe_code)]
            let result = unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) };
            if result == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            }
        }

        /// Register for expedited barriers and issue one; `false` where the
        /// kernel refuses either.
        pub(super) fn register() -> bool {
            call(CMD_REGISTER_PRIVATE_EXPEDITED).is_ok() && call(CMD_PRIVATE_EXPEDITED).is_ok()
        }

        pub(super) fn expedited() -> Result<(), i32> {
            call(CMD_PRIVATE_EXPEDITED)
        }

        pub(super) fn global() -> Result<(), i32> {
            call(CMD_GLOBAL)
        }
    }

    #[cfg(any(not(target_os = "linux"), miri))]
    mod membarrier {
        pub(super) fn register() -> bool {
            false
        }

        pub(super) fn expedited() -> Result<(), i32> {
            Err(0)
        }

        pub(super) fn global() -> Result<(), i32> {
            Err(0)
        }
    }
}

/// Under loom: fence mode, the one loom can check.
#[cfg(turnstile_loom)]
pub(super) mod mode {
    pub(in crate::reclaim) fn init() {}

    pub(in crate::reclaim) fn reader_fences() -> bool {
        true
    }

    pub(super) fn failed() -> u64 {
        0
    }

    pub(in crate::reclaim) fn unconfirmed() -> bool {
        false
    }

    pub(in crate::reclaim) fn writer_barrier() -> bool {
        // SeqCst: the writer's half of the store-load pair.
        crate::sync::fence(crate::sync::Ordering::SeqCst);
        true
    }
}
