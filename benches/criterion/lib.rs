//! The `turnstile-bench` package: it owns the criterion benchmarks in
//! `benches/` (see `Cargo.toml`). It has no code of its own.
