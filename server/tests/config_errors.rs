//! Configuration errors name the file and line and what is wrong; the
//! binary exits non-zero with that message.

#![allow(missing_docs)]

use turnstile_server::backend::InProcess;
use turnstile_server::backend::Unit;
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
            "duplicate descriptor composite key 'd.a' (first at line 3)",
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
        // An alias of an anchored descriptor: a duplicate.
        (
            "domain: d\ndescriptors:\n  - &a {key: x}\n  - *a\n",
            "limits.yaml:3:",
            "duplicate descriptor composite key 'd.x'",
        ),
        // envoyproxy/ratelimit keys a descriptor by `key_value`: `a_b` and
        // `a` with `b` are one, whether or not either has a limit.
        (
            "domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: b\n    descriptors:\n      - key: c\n",
            "limits.yaml:5:",
            "duplicate descriptor composite key 'd.a_b' (first at line 3)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "limits.yaml:4:",
            "`share_threshold` applies to a wildcard",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n",
            "limits.yaml:4:",
            "`shadow_mode` must be true or false",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1e3\n",
            "limits.yaml:6:",
            "whole number",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 0x1_0000_0000\n",
            "limits.yaml:6:",
            "whole number from 0 to 4294967295, found '0x1_0000_0000'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 09\n",
            "limits.yaml:6:",
            "whole number",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      <<: [1, 2]\n",
            "limits.yaml:5:",
            "a merge key (`<<`) takes a mapping",
        ),
        (
            "domain: d\ndescriptors:\n  - &a\n    key: a\n    descriptors:\n      - *a\n",
            "limits.yaml:6:",
            "recursive alias",
        ),
        // Two descriptors that spell one composite key, `a_b_c`.
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a_b\n    value: c\n    rate_limit: {unit: second, requests_per_unit: 9}\n",
            "limits.yaml:6:",
            "duplicate descriptor composite key 'd.a_b_c' (first at line 3)",
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
    assert!(message.contains("MERGE_DOMAIN_CONFIG"), "{message}");
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

/// A `*.yaml` symbolic link whose target is missing is an error naming the
/// link and its target, as a file that cannot be read is, not a file passed
/// over (the configuration loaded without its limits). A hidden one (an
/// editor's lock, `.#name.yaml`) and a directory so named are passed over.
#[cfg(unix)]
#[test]
fn a_dangling_symbolic_link_is_an_error() {
    let dir = std::env::temp_dir().join(format!("turnstile-rls-link-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("nested.yaml")).unwrap();
    let good = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    std::fs::write(dir.join("good.yaml"), good).unwrap();
    std::os::unix::fs::symlink("nowhere", dir.join(".#good.yaml")).unwrap();
    assert!(Config::load_dir(&dir, &InProcess::default()).is_ok());

    std::os::unix::fs::symlink("missing.yaml", dir.join("limits.yaml")).unwrap();
    let error = Config::load_dir(&dir, &InProcess::default()).expect_err("a dangling link");
    std::fs::remove_dir_all(&dir).unwrap();
    let message = error.to_string();
    let expected = format!(
        "{}: a symbolic link to missing.yaml whose target cannot be read",
        dir.join("limits.yaml").display()
    );
    assert!(message.starts_with(&expected), "{message}");
    assert!(
        message.ends_with("restore the target or remove the link"),
        "{message}"
    );
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

fn one(yaml: &str) -> Config {
    match load(&[("limits.yaml", yaml)]) {
        Ok(config) => config,
        Err(error) => panic!("{yaml}\n{error}"),
    }
}

/// The limit `entries` match in domain `d`: its requests per unit, unit and
/// whether it is unlimited or in shadow mode.
fn limit_of(config: &Config, entries: &[(&str, &str)]) -> Option<(u32, Option<Unit>, bool, bool)> {
    config
        .lookup("d", entries.iter().copied())
        .map(|r| (r.requests_per_unit, r.unit, r.unlimited, r.shadow_mode))
}

/// envoyproxy/ratelimit's units: week, month and year too, in any case.
#[test]
fn weeks_months_and_years_are_units() {
    let config = one(
        "domain: d\ndescriptors:\n  - key: w\n    rate_limit: {unit: WEEK, requests_per_unit: 7}\n  - key: m\n    rate_limit: {unit: Month, requests_per_unit: 30}\n  - key: y\n    rate_limit: {unit: year, requests_per_unit: 365}\n",
    );
    assert_eq!(
        limit_of(&config, &[("w", "1")]),
        Some((7, Some(Unit::Week), false, false))
    );
    assert_eq!(
        limit_of(&config, &[("m", "1")]),
        Some((30, Some(Unit::Month), false, false))
    );
    assert_eq!(
        limit_of(&config, &[("y", "1")]),
        Some((365, Some(Unit::Year), false, false))
    );
    assert_eq!(Unit::Month.duration().as_secs(), 30 * 86_400);
    assert_eq!(Unit::Year.duration().as_secs(), 365 * 86_400);
}

/// YAML 1.1 as gopkg.in/yaml.v2 reads it: booleans in every spelling it
/// takes, nothing as false.
#[test]
fn yaml_1_1_booleans_load() {
    for (word, expected) in [
        ("true", true),
        ("True", true),
        ("TRUE", true),
        ("yes", true),
        ("Yes", true),
        ("YES", true),
        ("on", true),
        ("On", true),
        ("ON", true),
        ("y", true),
        ("Y", true),
        ("false", false),
        ("False", false),
        ("FALSE", false),
        ("no", false),
        ("No", false),
        ("NO", false),
        ("off", false),
        ("Off", false),
        ("OFF", false),
        ("n", false),
        ("N", false),
        ("", false),
    ] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: {word}\n    detailed_metric: {word}\n    value_to_metric: {word}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n  - key: b\n    rate_limit:\n      unlimited: {word}\n      unit: minute\n"
        );
        if expected {
            // `unlimited` with a valid unit: refused, as envoyproxy/ratelimit
            // refuses it, so `unlimited` was read as true.
            let message = error_of(&yaml);
            assert!(
                message.contains("limits.yaml:11: an unlimited limit takes no `unit`"),
                "{word}: {message}"
            );
            let yaml = yaml.replace("      unit: minute\n", "");
            let config = one(&yaml);
            assert_eq!(
                limit_of(&config, &[("a", "x")]),
                Some((1, Some(Unit::Second), false, true)),
                "{word}"
            );
            assert_eq!(
                limit_of(&config, &[("b", "x")]),
                Some((0, None, true, false)),
                "{word}"
            );
        } else {
            let config = one(&yaml);
            assert_eq!(
                limit_of(&config, &[("a", "x")]),
                Some((1, Some(Unit::Second), false, false)),
                "{word}"
            );
            assert_eq!(
                limit_of(&config, &[("b", "x")]),
                Some((0, Some(Unit::Minute), false, false)),
                "{word}"
            );
        }
    }
}

/// Integers as yaml.v2 reads them into `requests_per_unit`: `_`
/// separators, a sign, hex, octal (`0o17` and `017`) and binary.
#[test]
fn yaml_1_1_integers_load() {
    for (text, expected) in [
        ("1_000", 1_000),
        ("+12", 12),
        ("0x10", 16),
        ("0X1f", 31),
        ("0o17", 15),
        ("017", 15),
        ("0b101", 5),
        ("0", 0),
        ("-0", 0),
        ("4_294_967_295", u32::MAX),
    ] {
        let config = one(&format!(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: {text}\n"
        ));
        assert_eq!(
            limit_of(&config, &[("a", "x")]).unwrap().0,
            expected,
            "{text}"
        );
    }
}

/// `rate_limit:` with nothing is no limit, as yaml.v2 leaves the pointer
/// nil; the descriptor still leads to its children.
#[test]
fn an_empty_rate_limit_is_no_limit() {
    let config = one(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 3}\n",
    );
    assert_eq!(limit_of(&config, &[("a", "x")]), None);
    assert_eq!(limit_of(&config, &[("a", "x"), ("b", "y")]).unwrap().0, 3);
}

/// yaml.v2 reads a file's first document: what follows a `---` (even
/// text that is no YAML at all) is not read.
#[test]
fn only_the_first_document_is_read() {
    let config = one(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2}\n---\ndomain: other\ndescriptors: [\n",
    );
    assert_eq!(limit_of(&config, &[("a", "x")]).unwrap().0, 2);
    assert_eq!(config.domains().collect::<Vec<_>>(), ["d"]);
    let config = one("---\ndomain: d\n...\n---\ndomain: e\n");
    assert_eq!(config.domains().collect::<Vec<_>>(), ["d"]);
}

/// Anchors, aliases and merge keys, as real configurations share a
/// `rate_limit` block.
#[test]
fn anchors_aliases_and_merge_keys_load() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: &standard
      unit: minute
      requests_per_unit: 10
  - key: b
    rate_limit: *standard
  - key: c
    rate_limit:
      <<: *standard
      requests_per_unit: 20
  - key: e
    rate_limit:
      requests_per_unit: 30
      <<: [{unit: hour}, {unit: day, requests_per_unit: 40}]
  - key: f
    descriptors: &children
      - key: g
        rate_limit: {<<: *standard, unit: second}
  - key: h
    descriptors: *children
";
    let config = one(yaml);
    let minute = Some(Unit::Minute);
    assert_eq!(
        limit_of(&config, &[("a", "x")]),
        Some((10, minute, false, false))
    );
    assert_eq!(
        limit_of(&config, &[("b", "x")]),
        Some((10, minute, false, false))
    );
    assert_eq!(
        limit_of(&config, &[("c", "x")]),
        Some((20, minute, false, false))
    );
    // yaml.v2 applies a merge in its place: the merged `requests_per_unit`
    // replaces the one above it; of the two merged, the first wins `unit`.
    assert_eq!(
        limit_of(&config, &[("e", "x")]),
        Some((40, Some(Unit::Hour), false, false))
    );
    for parent in ["f", "h"] {
        assert_eq!(
            limit_of(&config, &[(parent, "x"), ("g", "y")]),
            Some((10, Some(Unit::Second), false, false)),
            "{parent}"
        );
    }
}

/// A "billion laughs": ten levels of ten aliases each would copy 10^10
/// nodes. Refused with its line, promptly, without the memory.
#[test]
fn alias_expansion_is_bounded() {
    let mut yaml = String::from("domain: d\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..10 {
        let prev = level - 1;
        yaml.push_str(&format!(
            "l{level}: &l{level} [*l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}]\n"
        ));
    }
    let started = std::time::Instant::now();
    let message = error_of(&yaml);
    assert!(message.contains("aliases copy too much"), "{message}");
    assert!(message.starts_with("limits.yaml:"), "{message}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // Bytes too: a megabyte scalar aliased sixteen times.
    let big = "x".repeat(1 << 20);
    let yaml = format!(
        "domain: d\nbig: &b {big}\nmany: [{}]\n",
        vec!["*b"; 16].join(", ")
    );
    assert!(error_of(&yaml).contains("aliases copy too much"));
    // An alias nesting past the depth bound.
    let deep = format!(
        "domain: d\ndeep: &d {}x{}\nmore: {}*d{}\n",
        "[".repeat(40),
        "]".repeat(40),
        "[".repeat(30),
        "]".repeat(30)
    );
    assert!(error_of(&deep).contains("nested too deeply"));
    // Anchors nested in anchors, with no alias at all: each anchor kept a
    // copy of everything within it, 63 levels of a 400,000-item list took
    // 1.86 GB. Counted as aliases are, refused.
    let items = vec!["x"; 150_000].join(",");
    let mut nested = String::from("domain: d\nx: ");
    for level in 0..20 {
        nested.push_str(&format!("&a{level} ["));
    }
    nested.push_str(&items);
    nested.push_str(&"]".repeat(20));
    nested.push('\n');
    let started = std::time::Instant::now();
    assert!(error_of(&nested).contains("aliases copy too much"));
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// Merge keys are applied in linear time: 80,000 keys after a merge, and
/// 80,000 merges in one mapping, are read in well under a second (scanning
/// the entries for each took 19 and 34 seconds).
#[test]
fn many_keys_and_merges_load_in_linear_time() {
    let mut keys = String::from("domain: d\nbig:\n  <<: {}\n");
    for i in 0..80_000 {
        keys.push_str(&format!("  k{i}: v\n"));
    }
    let merges = format!("domain: d\nbig:\n{}", "  <<: {}\n".repeat(80_000));
    for yaml in [keys, merges] {
        let started = std::time::Instant::now();
        // `big` is no key of a domain: an error, once the document is read.
        let message = error_of(&yaml);
        assert!(message.contains("big"), "{message}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }
}

/// `value_to_metric` and `share_threshold` (on a wildcard) are
/// envoyproxy/ratelimit keys.
#[test]
fn value_to_metric_and_share_threshold_load() {
    let config = one(
        "domain: d\ndescriptors:\n  - key: path\n    value: /files/*\n    share_threshold: true\n    value_to_metric: true\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: user\n    value_to_metric: yes\n    rate_limit: {unit: second, requests_per_unit: 7}\n",
    );
    assert_eq!(limit_of(&config, &[("path", "/files/a")]).unwrap().0, 5);
    assert_eq!(limit_of(&config, &[("user", "u")]).unwrap().0, 7);
}

/// `unlimited` with `requests_per_unit` loads (envoyproxy/ratelimit refuses
/// only a valid unit beside it), and so does an invalid unit beside it.
#[test]
fn unlimited_takes_requests_per_unit() {
    let config = one(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, requests_per_unit: 100}\n  - key: b\n    rate_limit: {unlimited: true, unit: ''}\n",
    );
    assert_eq!(
        limit_of(&config, &[("a", "x")]),
        Some((0, None, true, false))
    );
    assert_eq!(
        limit_of(&config, &[("b", "x")]),
        Some((0, None, true, false))
    );
    let message = error_of(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, requests_per_unit: lots}\n",
    );
    assert!(message.contains("whole number"), "{message}");
}

/// envoyproxy/ratelimit's matching: the composite `key_value`, then a
/// composite key ending in `*` as a prefix (a wildcard `key` too), then the
/// key alone.
#[test]
fn composite_keys_and_wildcards_match_as_envoyproxy_ratelimit() {
    let config = one(
        "domain: d\ndescriptors:\n  - key: foo*\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: path\n    value: /api/*\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 3}\n  - key: path\n    value: /api/health\n    rate_limit: {unit: second, requests_per_unit: 4}\n",
    );
    let rpu = |entries: &[(&str, &str)]| limit_of(&config, entries).map(|l| l.0);
    // A wildcard key: any key it prefixes, whatever the value.
    assert_eq!(rpu(&[("foo", "x")]), Some(1));
    assert_eq!(rpu(&[("foobar", "")]), Some(1));
    assert_eq!(rpu(&[("fo", "ox")]), None);
    assert_eq!(rpu(&[("path", "/api/health")]), Some(4));
    assert_eq!(rpu(&[("path", "/api/users")]), Some(2));
    assert_eq!(rpu(&[("path", "/web")]), Some(3));
}

/// A key of the format out of place (envoyproxy/ratelimit checks names
/// against one list for every level and ignores one out of place) is
/// refused with where it belongs, so a file moved from there is fixed
/// rather than guessed at.
#[test]
fn a_known_key_out_of_place_is_told_where_it_belongs() {
    for (yaml, line, says) in [
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      shadow_mode: true\n",
            "limits.yaml:7:",
            "'shadow_mode' belongs in a descriptor, not here",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    unit: second\n",
            "limits.yaml:4:",
            "'unit' belongs in a descriptor's `rate_limit`, not here",
        ),
        (
            "domain: d\nkey: a\n",
            "limits.yaml:2:",
            "'key' belongs in a descriptor, not here",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    domain: e\n",
            "limits.yaml:4:",
            "'domain' belongs at the top of the file, not here",
        ),
    ] {
        let error = error_of(yaml);
        assert!(error.starts_with(line), "{error}");
        assert!(error.contains(says), "{error}");
    }
    // A key of no level is unknown, shown with what it holds escaped.
    let error = error_of("domain: d\ndescriptors:\n  - key: a\n    col\u{7}our: blue\n");
    assert!(error.contains(r"unknown key 'col\u{7}our'"), "{error}");
}

/// A byte order mark, as editors on Windows save one, is skipped, as
/// gopkg.in/yaml.v2 skips it: the file was refused with an "unknown key"
/// whose name looked right.
#[test]
fn a_byte_order_mark_is_skipped() {
    let config = load(&[(
        "limits.yaml",
        "\u{feff}domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 5 }\n",
    )])
    .expect("loads");
    assert_eq!(config.domains().collect::<Vec<_>>(), ["d"]);
}

/// `MERGE_DOMAIN_CONFIG=true` (`LoadOptions::merge_domains`): files naming
/// one domain add their descriptors to it, as envoyproxy/ratelimit merges
/// them; one composite key in two of them is still an error, naming the
/// other file. Without it the second file is refused (above).
#[test]
fn files_naming_one_domain_merge_when_asked() {
    use turnstile_server::config::LoadOptions;
    let files = |b: &str| {
        vec![
            (
                "a.yaml".to_string(),
                "domain: api\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: path\n    value: /login*\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n".to_string(),
            ),
            ("b.yaml".to_string(), b.to_string()),
        ]
    };
    let merged = LoadOptions::default().merge_domains(true);
    let b = "domain: api\ndescriptors:\n  - key: ip\n    rate_limit: { unit: second, requests_per_unit: 9 }\n  - key: path\n    value: /log*\n    rate_limit: { unit: minute, requests_per_unit: 7 }\n";
    let config = Config::from_files_with(&files(b), &InProcess::default(), merged).unwrap();
    assert_eq!(config.domains().collect::<Vec<_>>(), ["api"]);
    let limit = |entries: &[(&str, &str)]| {
        config
            .lookup("api", entries.iter().copied())
            .map(|r| r.requests_per_unit)
    };
    assert_eq!(limit(&[("user", "u")]), Some(5));
    assert_eq!(limit(&[("ip", "1.2.3.4")]), Some(9));
    // Wildcards keep the files' order: a.yaml's first.
    assert_eq!(limit(&[("path", "/login/x")]), Some(3));
    assert_eq!(limit(&[("path", "/logout")]), Some(7));
    // One composite key in both files.
    let b = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
    let error = Config::from_files_with(&files(b), &InProcess::default(), merged)
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("b.yaml:3:"), "{error}");
    assert!(error.contains("first at a.yaml:3"), "{error}");
    // Not asked: the domain in two files is refused, with how to merge.
    let error = Config::from_files(&files(b), &InProcess::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("--merge-domain-config"), "{error}");
}
