//! The `turnstile-dev` package: it owns the benchmarks in this folder and the
//! tests and examples that need heavy dev-dependencies (see `Cargo.toml`). It
//! has no code of its own.
