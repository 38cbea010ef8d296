//! The pacing example: a client waiting on a limiter below the target's rate
//! delivers every record without a single rejection.

#[path = "../examples/shared/pacing.rs"]
mod pacing;

#[test]
fn a_paced_client_is_never_rejected() {
    let paced = pacing::paced(10_000);
    assert_eq!(paced.sends, 10_000);
    assert_eq!(paced.rejected, 0);
    // 95 per second: about 105 s for 10,000 (the first one at once).
    let secs = paced.elapsed.as_secs_f64();
    assert!((105.0..105.3).contains(&secs), "{secs}");
}

#[test]
fn a_retrying_client_sends_many_times_over() {
    let retrying = pacing::retrying(10_000);
    assert_eq!(
        retrying.sends - retrying.rejected,
        10_000,
        "every record delivered once"
    );
    assert!(retrying.sends > 3 * 10_000, "{retrying:?}");
}
