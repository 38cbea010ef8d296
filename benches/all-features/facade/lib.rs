//! The all-features twin (`turnstile_all_features`) re-exported whole, so that
//! the twin's doc tests, which say `turnstile::`, name it (see
//! `../Cargo.toml`).

pub use turnstile_all_features::*;
