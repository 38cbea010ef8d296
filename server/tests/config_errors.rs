//! Configuration errors name the file and line and what is wrong; the
//! binary exits non-zero with that message.

#![allow(missing_docs)]

use turnstile_server::backend::InProcess;
use turnstile_server::config::{Config, ConfigError};

fn load(files: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    Config::from_files(&files, &InProcess::default())
}

fn error_of(yaml: &str) -> String {
    load(&[("limits.yaml", yaml)]).expect_err(yaml).to_string()
}

#[test]
fn each_error_names_its_file_and_line() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
            "limits.yaml:5:",
            "invalid unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    colour: blue\n",
            "limits.yaml:4:",
            "unknown key 'colour'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: b\n  - key: a\n",
            "limits.yaml:5:",
            "duplicate descriptor 'd.a'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: leaky\n",
            "limits.yaml:7:",
            "unknown algorithm 'leaky'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: fixed_window\n      burst: 9\n",
            "limits.yaml:8:",
            "`burst` applies to `token_bucket` and `gcra`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n",
            "limits.yaml:6:",
            "an unlimited limit takes no `unit`",
        ),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "limits.yaml:3:",
            "empty `key`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -3\n",
            "limits.yaml:6:",
            "whole number",
        ),
        ("descriptors: []\n", "limits.yaml:1:", "needs a `domain`"),
        ("domain: d\ndescriptors: [\n", "limits.yaml:", "limits.yaml"),
        (
            "domain: d\ndescriptors:\n  - &a {key: x}\n  - *a\n",
            "limits.yaml:3:",
            "anchors and aliases",
        ),
        // Two descriptors that spell one limit name, `d.a_b_c`.
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a_b\n    value: c\n    rate_limit: {unit: second, requests_per_unit: 9}\n",
            "limits.yaml:6:",
            "the limit 'd.a_b_c' has the name of the limit at line 3",
        ),
        // `a.b`, and `b` below `a`: both `d.a.b`.
        (
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a.b\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
            "limits.yaml:7:",
            "the limit 'd.a.b' has the name of the limit at line 5",
        ),
    ];
    for (yaml, at, what) in cases {
        let message = error_of(yaml);
        assert!(
            message.starts_with(at),
            "{message:?} should start with {at:?}"
        );
        assert!(message.contains(what), "{message:?} should say {what:?}");
    }
}

#[test]
fn a_domain_in_two_files_is_an_error() {
    let a = "domain: same\ndescriptors: []\n";
    let b = "\n\ndomain: same\n";
    let message = load(&[("a.yaml", a), ("b.yaml", b)])
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("b.yaml:3:"), "{message}");
    assert!(message.contains("first in a.yaml:1"), "{message}");
}

/// Domain `api` with `v1` above `user` and domain `api.v1` with `user` both
/// name `api.v1.user`: refused, naming both files. (Loaded, the two limits
/// shared their state across a reload: the one loaded first took the
/// other's limiter, and re-quotaed it, admitting 5 a minute where its quota
/// said 2.)
#[test]
fn two_domains_spelling_one_limit_name_are_an_error() {
    let a = "domain: api.v1\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let b = "domain: api\ndescriptors:\n  - key: v1\n    descriptors:\n      - key: user\n        rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let message = load(&[("1.yaml", a), ("2.yaml", b)])
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("2.yaml:5:"), "{message}");
    assert!(
        message.contains("the limit 'api.v1.user' has the name of the limit at 1.yaml:3"),
        "{message}"
    );
    // Different names in different domains load.
    let c = "domain: api\ndescriptors:\n  - key: v2\n    descriptors:\n      - key: user\n        rate_limit: {unit: minute, requests_per_unit: 2}\n";
    assert!(load(&[("1.yaml", a), ("2.yaml", c)]).is_ok());
}

#[test]
fn the_binary_exits_non_zero_with_the_message() {
    let dir = std::env::temp_dir().join(format!("turnstile-rls-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("bad.yaml"),
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile-server"))
        .arg("--config")
        .arg(&dir)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "off"])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "{}:5: invalid unit 'fortnight'",
        dir.join("bad.yaml").display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

/// A file nested far deeper than the 64 levels allowed is refused with its
/// line, not parsed by recursion until the stack overflows (which would abort
/// the process, a running server reloading it included).
#[test]
fn a_file_nested_a_hundred_thousand_levels_deep_is_an_error_not_a_crash() {
    // Run on a thread with a small stack, as a reload's blocking task has:
    // nesting that recursed would overflow it long before 100,000 levels.
    let deep = format!("domain: d\ndescriptors:\n{}x\n", "- ".repeat(100_000));
    let message = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || error_of(&deep))
        .expect("a thread")
        .join()
        .expect("no stack overflow, no panic");
    assert!(message.starts_with("limits.yaml:3:"), "{message}");
    assert!(message.contains("nested too deeply"), "{message}");
}
