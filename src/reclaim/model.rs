//! The protocol's interface, public under loom only, for the models in
//! `loom-tests/`.

/// A collector of its own.
#[derive(Debug, Default)]
pub struct Collector(super::Collector);

/// A pin.
pub struct Guard<'a>(#[allow(dead_code)] super::Guard<'a>);

impl core::fmt::Debug for Guard<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Guard")
    }
}

/// The readers pinned at an unpublish.
#[derive(Debug)]
pub struct Snapshot(super::Snapshot);

impl Collector {
    /// Pin this thread.
    pub fn pin(&self) -> Guard<'_> {
        Guard(self.0.pin())
    }

    /// Pin as a thread whose thread-locals are gone does.
    pub fn pin_unrecorded(&self) -> Guard<'_> {
        Guard(self.0.pin_unrecorded())
    }

    /// Note the readers pinned now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.0.snapshot())
    }
}

impl Snapshot {
    /// Whether every reader noted has unpinned.
    pub fn passed(&mut self, collector: &Collector) -> bool {
        self.0.passed(&collector.0)
    }
}
