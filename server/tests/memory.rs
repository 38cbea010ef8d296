//! What hostile requests make the service hold, counted by the allocator:
//! lists past the bounds are refused from their bytes, not decoded first, and
//! long keys are held as their hash. Alone in their binary, one at a time, so
//! that no other test's allocations are counted.

#![allow(missing_docs)]

mod common;

use std::sync::atomic::Ordering;

use common::*;
use tonic::Code as GrpcCode;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One measurement at a time.
static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const YAML: &str = "\
domain: d
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 2 }
";

/// Start counting: the bytes held now.
fn held() -> usize {
    // Relaxed: statistics, read by this thread after the requests complete
    // (see `Counting`).
    let held = HELD.load(Ordering::Relaxed);
    PEAK.store(held, Ordering::Relaxed);
    held
}

fn peak_since(before: usize) -> usize {
    // Relaxed: as in `held`.
    PEAK.load(Ordering::Relaxed).saturating_sub(before)
}

/// A request of a million empty descriptors (two bytes each on the wire) is
/// refused from its bytes: decoded first, as it was before its bounds were
/// checked, it peaked at 34 MB; counted in its bytes, 6.8 MB.
#[tokio::test]
async fn a_million_empty_descriptors_over_grpc_are_refused_undecoded() {
    let _one = ONE.lock().await;
    let mut rls = start(&[("d.yaml", YAML)], Options::default()).await;
    let flood = request("d", vec![descriptor(&[]); 1_000_000]);
    let before = held();
    let status = rls.ask(flood).await.expect_err("refused");
    let peak = peak_since(before);
    assert_eq!(status.code(), GrpcCode::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("1000000 descriptors in one request: send at most 64"),
        "{status:?}"
    );
    assert!(peak < 16 << 20, "the request held {peak} bytes at its peak");
    rls.stop().await;
}

/// The same flood as JSON (three bytes a descriptor): parsed whole before
/// the bounds were checked it peaked at 152 MB; held to them while parsed,
/// 6.6 MB.
#[tokio::test]
async fn a_million_empty_descriptors_as_json_are_refused_while_parsed() {
    let _one = ONE.lock().await;
    let rls = start(&[("d.yaml", YAML)], Options::default()).await;
    let empty = vec!["{}"; 1_000_000].join(",");
    let body = format!(r#"{{"domain":"d","descriptors":[{empty}]}}"#);
    let before = held();
    let (status, message) = http(rls.http, "POST", "/json", &body).await;
    let peak = peak_since(before);
    assert_eq!(status, 400, "{message}");
    assert!(
        message.contains("1000000 descriptors in one request: send at most 64"),
        "{message}"
    );
    assert!(peak < 24 << 20, "the request held {peak} bytes at its peak");
    rls.stop().await;
}

/// Values of 1 KiB, nine thousand of them (the test's key bound is ten
/// thousand), each a key of its own: held as their hash, the limit keeps
/// 0.93 MB (BENCHMARKS.md; their text alone is 9.2 MB); and each still has
/// its own allowance (two values differing in their last byte are two keys,
/// one value is one key).
#[tokio::test]
async fn long_keys_are_held_as_their_hash_and_still_counted_apart() {
    let _one = ONE.lock().await;
    let mut rls = start(&[("d.yaml", YAML)], Options::default()).await;
    let value = |i: usize| format!("{}{i:08}", "v".repeat(1_016));
    let one = |i: usize| request("d", vec![descriptor(&[("user", &value(i))])]);
    assert!(overall_ok(&rls.decide(one(0)).await));
    assert!(overall_ok(&rls.decide(one(0)).await));
    assert!(!overall_ok(&rls.decide(one(0)).await), "the third of two");
    assert!(overall_ok(&rls.decide(one(1)).await), "another value");
    let before = held();
    for i in 2..9_002 {
        assert!(overall_ok(&rls.decide(one(i)).await));
    }
    // Relaxed: as in `held`.
    let kept = HELD.load(Ordering::Relaxed).saturating_sub(before);
    eprintln!("9,000 values of 1 KiB: {kept} bytes held after their requests");
    assert!(
        kept < 4 << 20,
        "9,000 keys of 1 KiB held {kept} bytes after their requests"
    );
    assert!(!overall_ok(&rls.decide(one(0)).await), "still spent");
    rls.stop().await;
}
