//! The tiers example: free and paid quotas per key; an upgrade while traffic
//! runs, which gives the key the paid tier's fresh allowance (the documented
//! bound) and the paid rate from then on; and the free tier's quota raised
//! while traffic runs, which creates nothing at the change and refills at the
//! new rate after it.

#[path = "../examples/shared/tiers.rs"]
mod tiers;

#[test]
fn the_story_prints_exactly_this() {
    let expected = [
        "t=  0 ms: admitted k_free  5 (free), k_paid 50 (paid), k_alice  5 (free)",
        "t=100 ms: admitted k_free  0 (free), k_paid  5 (paid), k_alice  0 (free)",
        "t=200 ms: admitted k_free  1 (free), k_paid  5 (paid), k_alice  1 (free)",
        "t=300 ms: admitted k_free  0 (free), k_paid  5 (paid), k_alice  0 (free)",
        "t=400 ms: admitted k_free  1 (free), k_paid  5 (paid), k_alice  1 (free)",
        "t=500 ms: k_alice upgraded to paid",
        "t=500 ms: admitted k_free  0 (free), k_paid  5 (paid), k_alice 50 (paid)",
        "t=600 ms: admitted k_free  1 (free), k_paid  5 (paid), k_alice  5 (paid)",
        "t=700 ms: free tier raised to 10 per second",
        "t=700 ms: admitted k_free  0 (free), k_paid  5 (paid), k_alice  5 (paid)",
        // 10 per second: a token every 100 ms from the change, where 5 per
        // second would have given one at 800 ms and none at 900 ms.
        "t=800 ms: admitted k_free  1 (free), k_paid  5 (paid), k_alice  5 (paid)",
        "t=900 ms: admitted k_free  1 (free), k_paid  5 (paid), k_alice  5 (paid)",
        "in 1 s: k_free 10, k_paid 95, k_alice 77",
    ];
    assert_eq!(tiers::story(), expected);
}

#[test]
fn every_key_stays_within_its_tiers_bound() {
    // Over 1 s a token bucket admits at most capacity + refill: for the free
    // key 5 + 700 ms at 5 per second (3), then nothing created at the raise
    // (its bucket was not full) and 300 ms at 10 per second (3); 50 + 50 for
    // a paid key. The upgraded key: at most the free tier's 5 + 500 ms of
    // refill (2), then the paid tier's fresh 50 + 500 ms of refill (25).
    let lines = tiers::story();
    let totals: Vec<u32> = lines
        .last()
        .unwrap()
        .split(", ")
        .map(|part| part.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    let [free, paid, alice] = totals[..] else {
        panic!("three totals: {totals:?}")
    };
    assert!(free <= 5 + 3 + 3, "{free}");
    assert!(paid <= 50 + 50, "{paid}");
    assert!(alice <= (5 + 2) + (50 + 25), "{alice}");
    // And the paid key got its rate, the free key only the free one.
    assert!(paid > 5 * free, "{paid} against {free}");
}
