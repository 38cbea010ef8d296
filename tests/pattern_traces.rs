//! The rate-limiter pattern's printed traces, asserted byte for byte.

#[path = "../examples/shared/pattern.rs"]
mod pattern;

const PATTERN_TOKEN_BUCKET: &str = "\
t=   0 ms allowed  tokens left 2
t= 100 ms allowed  tokens left 1
t= 200 ms allowed  tokens left 0
t= 300 ms rejected Retry-After: 1 (next token in 700 ms)
t= 500 ms rejected Retry-After: 1 (next token in 500 ms)
t=1300 ms allowed  tokens left 0
t=1400 ms rejected Retry-After: 1 (next token in 600 ms)
t=3500 ms allowed  tokens left 1
";

#[test]
fn token_bucket_example_prints_the_pattern_trace() {
    assert_eq!(pattern::token_bucket_trace(), PATTERN_TOKEN_BUCKET);
}

/// An example binary's own stdout, when `cargo test` has built the examples (it
/// does, unless asked for a single test target); `None` when it is not built.
fn example_stdout(name: &str) -> Option<String> {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/pattern_traces-… → target/<profile>/examples/<name>
    let Some(profile_dir) = exe.parent().and_then(|deps| deps.parent()) else {
        panic!("unexpected test binary location {exe:?}");
    };
    let example = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !example.exists() {
        eprintln!("{example:?} not built (single-target test run); the function test covers it");
        return None;
    }
    let out = std::process::Command::new(&example)
        .output()
        .expect("run the example");
    assert!(out.status.success(), "{out:?}");
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn token_bucket_binary_prints_the_pattern_trace() {
    if let Some(stdout) = example_stdout("token_bucket") {
        assert_eq!(stdout, PATTERN_TOKEN_BUCKET);
    }
}

const PATTERN_PER_CLIENT: &str = "\
== per-client token buckets (capacity 3, 1 token per 1000 ms)
t=   0 alice  -> 200 OK (tokens left 2)
t= 100 alice  -> 200 OK (tokens left 1)
t= 200 alice  -> 200 OK (tokens left 0)
t= 250 bob    -> 200 OK (tokens left 2)
t= 300 alice  -> 429 Too Many Requests, Retry-After: 1
t= 350 (none) -> 401 Unauthorized
t= 400 bob    -> 200 OK (tokens left 1)
t=1300 alice  -> 200 OK (tokens left 0)
";

#[test]
fn keyed_limiter_reproduces_the_pattern_per_client_trace() {
    assert_eq!(pattern::per_client_trace(), PATTERN_PER_CLIENT);
}

const PATTERN_WINDOW_VS_BUCKET: &str = "\
== limit 2 per second: fixed window vs token bucket
t= 900  fixed window: allowed          token bucket: allowed
t= 950  fixed window: allowed          token bucket: allowed
t=1000  fixed window: allowed          token bucket: rejected 400 ms
t=1050  fixed window: allowed          token bucket: rejected 350 ms
t=1400  fixed window: rejected 600 ms  token bucket: allowed
admitted from 900 to 1050 ms: fixed window 4, token bucket 2
";

#[test]
fn fixed_window_and_token_bucket_reproduce_the_pattern_comparison() {
    assert_eq!(pattern::window_vs_bucket_trace(), PATTERN_WINDOW_VS_BUCKET);
}

#[test]
fn window_vs_bucket_binary_prints_the_pattern_comparison() {
    if let Some(stdout) = example_stdout("window_vs_bucket") {
        assert_eq!(stdout, PATTERN_WINDOW_VS_BUCKET);
    }
}

#[test]
fn gate_binary_prints_the_pattern_per_client_trace() {
    if let Some(stdout) = example_stdout("gate") {
        assert_eq!(stdout, PATTERN_PER_CLIENT);
    }
}

#[test]
fn extended_example_prints_the_pattern_extended_output() {
    let whole = format!("{PATTERN_PER_CLIENT}\n{PATTERN_WINDOW_VS_BUCKET}");
    assert_eq!(pattern::extended_trace(), whole);
    if let Some(stdout) = example_stdout("extended") {
        assert_eq!(stdout, whole);
    }
}
