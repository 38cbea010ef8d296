//! `POST /json`: envoyproxy/ratelimit's JSON request and response, 200 or
//! 429; `/healthcheck` and `/healthz`.

#![allow(missing_docs)]

mod common;

use common::{Options, http, start};

#[tokio::test]
async fn json_endpoint_as_envoyproxy_ratelimit() {
    let yaml = "\
domain: dummy
descriptors:
  - key: one_per_minute
    rate_limit: { unit: minute, requests_per_unit: 1, name: one }
  - key: two_per_minute
    rate_limit: { unit: minute, requests_per_unit: 2 }
";
    let rls = start(&[("d.yaml", yaml)], Options::default()).await;
    let body = r#"{"domain":"dummy","descriptors":[
        {"entries":[{"key":"one_per_minute","value":"something"}]},
        {"entries":[{"key":"two_per_minute","value":"something"}]}]}"#;
    let (status, first) = http(rls.http, "POST", "/json", body).await;
    assert_eq!(status, 200, "{first}");
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["overallCode"], "OK");
    assert_eq!(first["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(first["statuses"][0]["currentLimit"]["name"], "one");
    assert_eq!(first["statuses"][1]["limitRemaining"], 1);
    // The clock is at 0: the minute's window ends in 60 s.
    assert_eq!(first["statuses"][1]["durationUntilReset"], "60s");
    let (status, second) = http(rls.http, "POST", "/json", body).await;
    assert_eq!(status, 429, "{second}");
    let second: serde_json::Value = serde_json::from_str(&second).unwrap();
    assert_eq!(second["overallCode"], "OVER_LIMIT");
    assert_eq!(second["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(second["statuses"][1]["code"], "OK");
    // proto3 JSON leaves a zero out.
    assert!(second["statuses"][1].get("limitRemaining").is_none());
    // The field names of the proto file are accepted too, and a uint64 as a string.
    let check = r#"{"domain":"dummy","descriptors":[{"entries":[{"key":"two_per_minute","value":"x"}],"hits_addend":"0"}]}"#;
    let (status, third) = http(rls.http, "POST", "/json", check).await;
    assert_eq!(status, 200, "{third}");
    let third: serde_json::Value = serde_json::from_str(&third).unwrap();
    assert_eq!(third["statuses"][0]["limitRemaining"], 2);
    // Malformed and out-of-bounds requests: 400 with the reason.
    let (status, text) = http(rls.http, "POST", "/json", "{not json").await;
    assert_eq!(status, 400, "{text}");
    let (status, text) = http(
        rls.http,
        "POST",
        "/json",
        r#"{"domain":"","descriptors":[]}"#,
    )
    .await;
    assert_eq!(status, 400);
    assert!(text.contains("domain must not be empty"), "{text}");
    // Both counted, the one refused before the service saw it too.
    assert_eq!(rls.service.metrics().invalid_requests(), 2);
    let (status, text) = http(rls.http, "GET", "/healthz", "").await;
    assert_eq!((status, text.as_str()), (200, "OK\n"));
    rls.stop().await;
}

/// A body of a million empty descriptors (three bytes each) is refused with
/// the count, as the gRPC face refuses it (what it costs: `tests/memory.rs`).
/// Entries too, with their descriptor's index.
#[tokio::test]
async fn lists_past_the_bounds_are_refused_while_parsed() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    let rls = start(&[("d.yaml", yaml)], Options::default()).await;
    let empty = vec!["{}"; 1_000_000].join(",");
    let body = format!(r#"{{"domain":"d","descriptors":[{empty}]}}"#);
    let (status, message) = http(rls.http, "POST", "/json", &body).await;
    assert_eq!(status, 400, "{message}");
    assert!(
        message.contains("1000000 descriptors in one request: send at most 64"),
        "{message}"
    );
    let entries = vec![r#"{"key":"k","value":"v"}"#; 17].join(",");
    let body = format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"v"}}]}},{{"entries":[{entries}]}}]}}"#
    );
    let (status, message) = http(rls.http, "POST", "/json", &body).await;
    assert_eq!(status, 400, "{message}");
    assert!(
        message.contains("descriptor 1 has 17 entries: send at most 16"),
        "{message}"
    );
    // At the bounds exactly: decided.
    let descriptors = vec![r#"{"entries":[{"key":"k","value":"v"}]}"#; 64].join(",");
    let body = format!(r#"{{"domain":"d","descriptors":[{descriptors}]}}"#);
    let (status, message) = http(rls.http, "POST", "/json", &body).await;
    assert_eq!(status, 429, "{message}");
}

/// envoyproxy/ratelimit's `/healthcheck`: `OK` while serving, on any method,
/// and 500 with no body once the shutdown has begun; `/healthz` answers as
/// long as the process does.
#[tokio::test]
async fn healthcheck_as_envoyproxy_ratelimit() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    let rls = start(&[("d.yaml", yaml)], Options::default()).await;
    for method in ["GET", "HEAD", "POST"] {
        let (status, text) = http(rls.http, method, "/healthcheck", "").await;
        assert_eq!(status, 200, "{method}");
        if method != "HEAD" {
            assert_eq!(text, "OK", "{method}");
        }
    }
    rls.service.set_serving(false);
    let (status, text) = http(rls.http, "GET", "/healthcheck", "").await;
    assert_eq!((status, text.as_str()), (500, ""));
    let (status, text) = http(rls.http, "GET", "/healthz", "").await;
    assert_eq!((status, text.as_str()), (200, "OK\n"));
    // Decisions are still answered while draining.
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, text) = http(rls.http, "POST", "/json", body).await;
    assert_eq!(status, 200, "{text}");
    rls.service.set_serving(true);
    let (status, text) = http(rls.http, "GET", "/healthcheck", "").await;
    assert_eq!((status, text.as_str()), (200, "OK"));
    rls.stop().await;
}

/// Durations as protojson writes them: 0, 3, 6 or 9 fractional digits.
#[test]
fn durations_as_protojson_writes_them() {
    use turnstile_server::http::proto_duration;
    for (seconds, nanos, text) in [
        (0, 0, "0s"),
        (1, 0, "1s"),
        (60, 0, "60s"),
        (0, 500_000_000, "0.500s"),
        (1, 1_000_000, "1.001s"),
        (0, 1_000, "0.000001s"),
        (59, 999_999_000, "59.999999s"),
        (0, 1, "0.000000001s"),
        (3, 120_000_001, "3.120000001s"),
        (-1, -500_000_000, "-1.500s"),
        (0, -1_000, "-0.000001s"),
        // Mixed signs are summed; past ±10,000 years, the bound.
        (1, -500_000_000, "0.500s"),
        (i64::MAX, 999_999_999, "315576000000s"),
        (i64::MIN, -999_999_999, "-315576000000s"),
    ] {
        assert_eq!(proto_duration(seconds, nanos), text, "{seconds} {nanos}");
    }
}

/// The response as envoyproxy/ratelimit writes it (protojson, without
/// EmitUnpopulated): every field at its default left out, a Duration with
/// as few fractional digits as hold it.
#[tokio::test]
async fn the_response_is_protojson() {
    let yaml = "\
domain: d
descriptors:
  - key: second
    rate_limit: { unit: second, requests_per_unit: 2, name: per_second }
  - key: never
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: free
    rate_limit: { unlimited: true }
";
    let rls = start(&[("d.yaml", yaml)], Options::default()).await;
    let ask = |key: &str| {
        format!(r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"v"}}]}}]}}"#)
    };
    rls.clock.advance(std::time::Duration::from_millis(500));
    let (status, text) = http(rls.http, "POST", "/json", &ask("second")).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        text,
        r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"name":"per_second","requestsPerUnit":2,"unit":"SECOND"},"limitRemaining":1,"durationUntilReset":"0.500s"}]}"#
    );
    // A limit of 0: no requestsPerUnit, no name, no remaining, no reset.
    let (status, text) = http(rls.http, "POST", "/json", &ask("never")).await;
    assert_eq!(status, 429, "{text}");
    assert_eq!(
        text,
        r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"unit":"MINUTE"}}]}"#
    );
    let (_, text) = http(rls.http, "POST", "/json", &ask("free")).await;
    assert_eq!(
        text,
        r#"{"overallCode":"OK","statuses":[{"code":"OK","limitRemaining":4294967295}]}"#
    );
    let (_, text) = http(rls.http, "POST", "/json", &ask("unknown")).await;
    assert_eq!(text, r#"{"overallCode":"OK","statuses":[{"code":"OK"}]}"#);
    rls.stop().await;
}

/// The request read as protojson reads it: either name of a field, `null`
/// for its default, a 32-bit number as a string; a field of neither name
/// is refused (400), at every level. Any method, as envoyproxy/ratelimit's
/// router takes `/json`.
#[tokio::test]
async fn the_request_is_read_as_protojson_reads_it() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    let rls = start(&[("d.yaml", yaml)], Options::default()).await;
    for body in [
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"colour":"blue"}"#,
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"colour":"blue"}]}"#,
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v","colour":"blue"}]}]}"#,
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k"}],"limit":{"requestsPerUnit":1,"unit":"SECOND","colour":"blue"}}]}"#,
        // One field under both its names.
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k"}],"hitsAddend":1,"hits_addend":1}]}"#,
    ] {
        let (status, text) = http(rls.http, "POST", "/json", body).await;
        assert_eq!(status, 400, "{body}: {text}");
    }
    let (status, text) = http(
        rls.http,
        "POST",
        "/json",
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"colour":1}]}"#,
    )
    .await;
    assert!(text.contains("unknown field `colour`"), "{status} {text}");
    let nulls = r#"{"domain":"d","hitsAddend":null,"descriptors":[{"entries":[{"key":"k","value":null}],"limit":null,"hitsAddend":null,"isNegativeHits":null},{"entries":null}]}"#;
    let (status, text) = http(rls.http, "POST", "/json", nulls).await;
    assert_eq!(status, 200, "{text}");
    let override_text = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"o"}],"limit":{"requests_per_unit":"3","unit":"MINUTE"}}]}"#;
    let (status, text) = http(rls.http, "POST", "/json", override_text).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(r#""requestsPerUnit":3"#), "{text}");
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    for method in ["GET", "PUT"] {
        let (status, text) = http(rls.http, method, "/json", body).await;
        assert_eq!(status, 200, "{method}: {text}");
    }
    let (status, _) = http(rls.http, "GET", "/json", "").await;
    assert_eq!(status, 400);
    rls.stop().await;
}

/// A message is read only from a JSON object, as protojson reads it: an
/// array of the fields in order (which serde's derived structs take) is a
/// body it cannot read, 400, at every level. `["d", [[[["user", "a"]]]], 3]`
/// was read as a request and decided.
#[tokio::test]
async fn a_message_written_as_an_array_is_refused() {
    let yaml = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";
    let rls = start(&[("d.yaml", yaml)], Options::default()).await;
    for body in [
        r#"["d",[[[["user","a"]]]],3]"#,
        r#"{"domain":"d","descriptors":[[[["user","a"]]]]}"#,
        r#"{"domain":"d","descriptors":[{"entries":[["user","a"]]}]}"#,
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}],"limit":[5,"MINUTE"]}]}"#,
    ] {
        let (status, message) = http(rls.http, "POST", "/json", body).await;
        assert_eq!(status, 400, "{body}: {message}");
    }
    // The same as objects, and `null` for the override: decided.
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}],"limit":null}],"hitsAddend":1}"#;
    let (status, message) = http(rls.http, "POST", "/json", body).await;
    assert_eq!(status, 200, "{message}");
    rls.stop().await;
}

/// protojson reads an integer written with an exponent or a fraction when
/// its value is whole (`1e0`, `2.0`, `"3e0"`), as envoyproxy/ratelimit's
/// `/json` does: they were refused with "data did not match any variant".
/// A value that is not whole, or below 0, is refused naming its field.
#[tokio::test]
async fn integers_in_an_exponent_or_a_fraction_are_read_when_whole() {
    let yaml = "\
domain: d
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 10 }
";
    let rls = start(&[("d.yaml", yaml)], Options::default()).await;
    let body = |hits: &str| {
        format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"v"}}],"hitsAddend":{hits}}}]}}"#
        )
    };
    for (hits, left) in [("1e0", 9), ("2.0", 7), (r#""3e0""#, 4), ("0.1e1", 3)] {
        let (status, text) = http(rls.http, "POST", "/json", &body(hits)).await;
        assert_eq!(status, 200, "{hits}: {text}");
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            answer["statuses"][0]["limitRemaining"], left,
            "{hits}: {text}"
        );
    }
    let request_level =
        r#"{"domain":"d","hitsAddend":1e0,"descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, text) = http(rls.http, "POST", "/json", request_level).await;
    assert_eq!(status, 200, "{text}");
    for hits in ["1.5", "-1", "1e20", r#""1.5""#] {
        let (status, text) = http(rls.http, "POST", "/json", &body(hits)).await;
        assert_eq!(status, 400, "{hits}: {text}");
        assert!(text.contains("hitsAddend"), "{hits}: {text}");
    }
    rls.stop().await;
}
