//! `cfg(turnstile_docs)`: set for this package only (see `Cargo.toml`), so
//! that the README's recipes are compiled as doc tests here, with the
//! dev-dependencies they use, and never in the root package.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(turnstile_docs)");
    println!("cargo::rustc-cfg=turnstile_docs");
}
