//! The trace replay tool (`examples/replay.rs`): exact output, malformed lines
//! reported by number, bad options refused, and no input that makes it panic.

#[path = "../examples/shared/replay.rs"]
mod replay;

use proptest::prelude::*;
use replay::{ArgsError, Kind, Options};

fn options(args: &[&str]) -> Options {
    replay::parse_args(args.iter().map(|a| a.to_string())).expect("valid options")
}

/// (stdout, stderr) of a replay, or the configuration error.
fn run(args: &[&str], input: &[u8]) -> Result<(String, String), std::io::Error> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    replay::run(&options(args), input, &mut out, &mut err)?;
    Ok((
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    ))
}

/// The rate-limiter pattern's per-client flow, with a batch request and the
/// gate's 401.
#[test]
fn token_bucket_replay_prints_every_decision_and_a_summary() {
    let input = b"# the rate-limiter pattern's per-client flow\n\
        0,alice\n100,alice\n200,alice\n250,bob\n300,alice\n350,\n400,bob,2\n1300,alice\n";
    let (out, err) = run(&["--capacity", "3", "--period-ms", "1000"], input).unwrap();
    assert_eq!(
        out,
        "0 alice allowed 2\n100 alice allowed 1\n200 alice allowed 0\n250 bob allowed 2\n\
         300 alice denied 700\n350 - unauthorized\n400 bob allowed 0\n1300 alice allowed 0\n\
         \n\
         alice allowed 4 denied 1\nbob allowed 2 denied 0\n- unauthorized 1\n"
    );
    assert_eq!(err, "");
}

/// The rate-limiter pattern's comparison flow, under each algorithm with two per
/// second.
#[test]
fn every_algorithm_replays() {
    let input = b"900,k\n950,k\n1000,k\n1050,k\n1400,k\n";
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--algorithm",
                "fixed-window",
                "--limit",
                "2",
                "--window-ms",
                "1000",
            ],
            "900 k allowed 1\n950 k allowed 0\n1000 k allowed 1\n1050 k allowed 0\n\
             1400 k denied 600\n\nk allowed 4 denied 1\n",
        ),
        (
            &[
                "--algorithm",
                "sliding-window",
                "--limit",
                "2",
                "--window-ms",
                "1000",
            ],
            // At 1000 ms the previous window weighs 2: wait until it weighs 1
            // (1500 ms); at 1400 ms it weighs 1.2.
            "900 k allowed 1\n950 k allowed 0\n1000 k denied 500\n1050 k denied 450\n\
             1400 k denied 100\n\nk allowed 2 denied 3\n",
        ),
        (
            &[
                "--algorithm",
                "token-bucket",
                "--capacity",
                "2",
                "--period-ms",
                "500",
            ],
            "900 k allowed 1\n950 k allowed 0\n1000 k denied 400\n1050 k denied 350\n\
             1400 k allowed 0\n\nk allowed 3 denied 2\n",
        ),
        (
            &[
                "--algorithm",
                "gcra",
                "--capacity",
                "2",
                "--period-ms",
                "500",
            ],
            // TAT 1900 after two; one permit back every 500 ms from 1400.
            "900 k allowed 1\n950 k allowed 0\n1000 k denied 400\n1050 k denied 350\n\
             1400 k allowed 0\n\nk allowed 3 denied 2\n",
        ),
    ];
    for (args, expected) in cases {
        let (out, err) = run(args, input).unwrap();
        assert_eq!(out, expected, "{args:?}");
        assert_eq!(err, "");
    }
}

#[test]
fn malformed_lines_are_reported_by_number_and_skipped() {
    let input =
        b"0,a\nx,a\n5\n10,a,0\n10,a,9\n10,a,1,1\n-5,a\n99999999999999999,a\n\xff\xfe,a\n\n20,a,\n";
    let (out, err) = run(&["--capacity", "3", "--period-ms", "1000"], input).unwrap();
    assert_eq!(
        out,
        "0 a allowed 2\n20 a allowed 1\n\na allowed 2 denied 0\n"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 8, "{err}");
    for (line, number) in lines.iter().zip([2, 3, 4, 5, 6, 7, 8, 9]) {
        assert!(line.starts_with(&format!("line {number}: ")), "{line}");
        assert!(line.ends_with("; skipped"), "{line}");
    }
    assert!(lines[2].contains("0 permits"), "{}", lines[2]);
    assert!(lines[3].contains("at most 3"), "{}", lines[3]);
    assert!(
        lines[6].contains("beyond the clock's range"),
        "{}",
        lines[6]
    );
    assert!(lines[7].contains("UTF-8"), "{}", lines[7]);
}

#[test]
fn a_key_flood_past_the_bound_gets_the_gates_503() {
    let input = b"0,a\n0,b\n0,c\n";
    let args = ["--capacity", "1", "--period-ms", "1000", "--max-keys", "2"];
    let (out, _) = run(&args, input).unwrap();
    assert_eq!(
        out,
        "0 a allowed 0\n0 b allowed 0\n0 c key-limit 1000\n\n\
         a allowed 1 denied 0\nb allowed 1 denied 0\nc allowed 0 denied 0 key-limit 1\n"
    );
}

#[test]
fn bad_options_are_refused_with_a_reason() {
    let parse = |args: &[&str]| replay::parse_args(args.iter().map(|a| a.to_string()));
    assert_eq!(parse(&["--help"]), Err(ArgsError::Help));
    for (args, needle) in [
        (&["--algorithm", "leaky"][..], "\"leaky\""),
        (&["--algorithm"][..], "needs a value"),
        (&["--capacity", "-1"][..], "\"-1\""),
        (&["--capacity", "5000000000"][..], "\"5000000000\""),
        (&["--period-ms"][..], "needs a value"),
        (&["--frobnicate"][..], "unknown argument"),
    ] {
        match parse(args) {
            Err(ArgsError::Bad(why)) => assert!(why.contains(needle), "{args:?}: {why}"),
            other => panic!("{args:?}: {other:?}"),
        }
    }
    assert_eq!(options(&["--algorithm", "gcra"]).kind, Kind::Gcra);
    // Options the algorithm needs, or values a quota refuses: the run refuses.
    for args in [
        &["--algorithm", "token-bucket"][..],
        &["--algorithm", "fixed-window", "--limit", "3"][..],
        &["--capacity", "0", "--period-ms", "10"][..],
        &[
            "--algorithm",
            "sliding-window",
            "--limit",
            "2",
            "--window-ms",
            "0",
        ][..],
        &["--capacity", "1", "--period-ms", "1", "--max-keys", "0"][..],
    ] {
        let e = run(args, b"0,a\n").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{args:?}: {e}");
    }
}

proptest! {
    /// Any bytes at all: no panic, and every line that is not blank or a
    /// comment gets exactly one line of output or one of error.
    #[test]
    fn any_input_gets_one_answer_per_line_and_never_panics(
        lines in prop::collection::vec(
            prop_oneof![
                3 => "[0-9]{1,6},[a-c]{0,2}(,[0-9]{0,2})?",
                1 => "[0-9a-z,# -]{0,12}",
                1 => prop::collection::vec(any::<u8>(), 0..12).prop_map(|b| String::from_utf8_lossy(&b).replace('\n', "")),
            ],
            0..40,
        ),
        kind in 0..4usize,
    ) {
        let args: &[&str] = match kind {
            0 => &["--capacity", "3", "--period-ms", "100"],
            1 => &["--algorithm", "fixed-window", "--limit", "3", "--window-ms", "100"],
            2 => &["--algorithm", "sliding-window", "--limit", "3", "--window-ms", "100"],
            _ => &["--algorithm", "gcra", "--capacity", "3", "--period-ms", "100"],
        };
        let input = lines.join("\n");
        let (out, err) = run(args, input.as_bytes()).unwrap();
        let answered = out.lines().take_while(|l| !l.is_empty()).count() + err.lines().count();
        let expected = lines.iter().filter(|l| {
            let l = l.trim_end_matches('\r');
            !l.trim().is_empty() && !l.starts_with('#')
        }).count();
        prop_assert_eq!(answered, expected, "{:?}\n{}\n{}", input, out, err);
    }
}

/// With a bound of one key, a new key finds room once the key held has gone
/// idle, whichever shards the two land in (the hasher is random: run it
/// several times).
#[test]
fn a_new_key_at_the_bound_takes_the_room_of_an_idle_key() {
    let input = b"0,a,1\n5000,b,1\n100000,b,1\n1000000,b,1\n";
    let args = [
        "--algorithm",
        "token-bucket",
        "--capacity",
        "2",
        "--period-ms",
        "100",
        "--max-keys",
        "1",
    ];
    for _ in 0..20 {
        let (out, _) = run(&args, input).unwrap();
        assert_eq!(
            out,
            "0 a allowed 1\n5000 b allowed 1\n100000 b allowed 1\n1000000 b allowed 1\n\n\
             a allowed 1 denied 0\nb allowed 3 denied 0\n"
        );
    }
}

/// A line earlier than the one before was decided on a clock gone back
/// (`1000 a denied 2000`, where the sorted trace admits all three), with no
/// word of it: it is now reported and skipped.
#[test]
fn a_line_before_the_previous_one_is_reported_and_skipped() {
    let (out, err) = run(
        &["--capacity", "1", "--period-ms", "1000"],
        b"0,a\n2000,a\n1000,a\n3000,a\n",
    )
    .unwrap();
    assert_eq!(
        err,
        "line 3: time 1000 ms is before the previous request's 2000 ms (sort the trace by \
         time); skipped\n"
    );
    assert!(!out.contains("1000 a"), "{out}");
    assert!(
        out.starts_with("0 a allowed 0\n2000 a allowed 0\n3000 a allowed 0\n"),
        "{out}"
    );
}
