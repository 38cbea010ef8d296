//! The HTTP edge: the framework-neutral [`Gate`](gate::Gate) (200, 401, 429,
//! 503 and their header fields) and, with feature `tower`, the tower layer and
//! its key extractors.

pub(crate) mod gate;
pub(crate) mod outcome;
pub(crate) mod policy;
#[cfg(feature = "tower")]
pub mod tower;
