//! One hot thread deciding on a few hot keys while a second thread floods the
//! limiter with new keys past its key bound: the hot thread's decisions per
//! second with and without the flood, for each contender.
//!
//! ```text
//! cargo run --profile bench -p turnstile-dev --example churn -- [--secs S] [--reps R] [--max-keys N]
//! ```
//!
//! A measurement builds a fresh limiter and decides once on each of the 4 hot
//! keys. Under churn it then starts the flood thread, which decides once on
//! each of a stream of keys never seen before, and waits until the flood has
//! offered `N` new keys (the key bound, default 100,000; at most 2 s); then the
//! hot thread (the main thread, cycling through the hot keys) is timed for `S`
//! seconds (default 1, and at most one decision a nanosecond), and the flood is
//! stopped. Without churn there is no flood thread. Each contender is measured
//! `R` times (default 3) with and without churn, the contenders in a rotated
//! order each time and the two measurements in alternating order. Nothing is
//! pinned to a core.
//!
//! Every key of every contender has the same quota: a burst of 50,000, refilled
//! at 50 a microsecond (50 M/s a key, 1 ms from empty to full). The hot keys
//! are admitted as long as the hot thread stays under 50 M decisions a second
//! a key; a flood key, one token taken, is fresh-equivalent (sweepable without
//! loss) again 1 µs later, so at the bound nearly every key held can go.
//!
//! Contenders:
//! - `turnstile-membarrier` and `turnstile-fence`: `KeyedLimiter<u64>` (token
//!   bucket, `ahash`, default shards, `RealClock`) bounded at `N` keys. Each
//!   runs in a child process of this binary started with
//!   `TURNSTILE_BARRIER=membarrier` or `TURNSTILE_BARRIER=fence`, since the
//!   keyed map's barrier mode (`src/reclaim/`) is chosen once per process;
//!   the child reports the mode it asked for (a build that does not read the
//!   variable runs its default mode in both). The limiter sweeps and reclaims
//!   by itself; the flood only decides, and counts the new keys refused at the
//!   bound (`KeyLimit`).
//! - `governor-ahash`: governor's keyed limiter on its DashMap store with
//!   `ahash` (as in `benches/keyed.rs`). It has no key bound, so the flood
//!   thread bounds it as its users do: after every `N` new keys,
//!   `retain_recent()` then `shrink_to_fit()`.
//! - `papaya-gcra`: an epoch-reclaimed keyed limiter: a `papaya::HashMap<u64,
//!   AtomicU64>` with `ahash`, each value a GCRA word (the theoretical arrival
//!   time in nanoseconds on turnstile's `RealClock`) updated by
//!   compare-and-swap, the same rate and burst as the others. After every `N`
//!   new keys the flood thread removes the keys whose arrival time has passed
//!   (fresh-equivalent) with `retain`; papaya frees them through its epoch
//!   collector (seize, whose default `fast-barrier` feature on Linux also pairs
//!   a plain store on the read side with a `membarrier` on the reclaiming
//!   side).
//!
//! Output: one row per measurement as it ends (the hot thread's decisions per
//! second, the share admitted and the share of the window it spent on a CPU;
//! the new keys offered per second during the timed window and per second the
//! flood thread was on a CPU over its whole run, the new keys offered in all,
//! those refused, the most keys seen at an upkeep point (every `N` new keys),
//! the keys held at the end, and the contender's own counters),
//! then a table of medians and spreads (min–max): without churn, under churn,
//! the ratio of the two, and the ratio to `governor-ahash` under churn; then
//! the same medians per second the hot thread was on a CPU (from Linux's
//! `/proc/thread-self/schedstat`), which takes out the time it waited for a
//! core; then whether turnstile meets its targets under churn (at least
//! `governor-ahash`'s rate, and at least 0.7 times its own without churn). The
//! load average is printed before and after: other work on the machine shows
//! there.

use std::num::NonZeroU32;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::clock::DefaultClock;
use governor::state::keyed::DashMapStateStore;
use turnstile::Clock;

/// Hot keys, `0..HOT` (a power of two).
const HOT: u64 = 4;
/// The first flood key; the flood counts up from it.
const FLOOD_BASE: u64 = 1 << 40;
/// Each key's burst.
const BURST: u32 = 50_000;
/// Tokens back each microsecond.
const PER_MICRO: u32 = 50;
/// Nanoseconds between tokens (GCRA's emission interval).
const INTERVAL_NANOS: u64 = 1_000 / PER_MICRO as u64;
/// How far ahead of now a GCRA word may be and still admit: `BURST - 1`
/// intervals.
const TOLERANCE_NANOS: u64 = (BURST as u64 - 1) * INTERVAL_NANOS;
/// The longest wait for the flood to pass the bound before timing.
const WARM_MAX: Duration = Duration::from_secs(2);
/// The flood stops by itself this long after the timed window would have ended.
const FLOOD_GRACE: Duration = Duration::from_secs(10);
/// The most new keys one flood offers.
const FLOOD_CAP: u64 = 10_000_000_000;

const CONTENDERS: [&str; 4] = [
    "turnstile-membarrier",
    "turnstile-fence",
    "governor-ahash",
    "papaya-gcra",
];

/// A keyed limiter as the two threads use it.
trait Subject: Sync {
    /// One hot decision on `key`; whether it was admitted.
    fn hot(&self, key: u64) -> bool;
    /// One decision on a new `key`; `false` when the key was refused room.
    fn flood(&self, key: u64) -> bool;
    /// What the flood thread does after every `N` new keys; returns the keys
    /// held before it.
    fn upkeep(&self) -> usize;
    /// Keys held now.
    fn keys(&self) -> usize;
    /// The contender's own counters, after a measurement.
    fn note(&self) -> String;
}

type Ours = turnstile::KeyedLimiter<u64>;

fn ours(max_keys: u64) -> Ours {
    let quota =
        turnstile::Quota::new(BURST, PER_MICRO, Duration::from_micros(1)).expect("a valid quota");
    turnstile::KeyedLimiter::<u64>::builder(quota)
        .max_keys(max_keys as usize)
        .build()
        .expect("a valid configuration")
}

impl Subject for Ours {
    fn hot(&self, key: u64) -> bool {
        self.try_acquire(&key).is_allowed()
    }

    fn flood(&self, key: u64) -> bool {
        !self.try_acquire(&key).is_key_limit()
    }

    /// Nothing: the limiter sweeps and reclaims by itself.
    fn upkeep(&self) -> usize {
        self.len()
    }

    fn keys(&self) -> usize {
        self.len()
    }

    fn note(&self) -> String {
        let s = self.stats();
        format!(
            "stats: keys {}, admitted {}, denied {}, denied_key_limit {}, evicted {}",
            s.keys, s.admitted, s.denied, s.denied_key_limit, s.evicted
        )
    }
}

type Theirs = governor::RateLimiter<
    u64,
    DashMapStateStore<u64, ahash::RandomState>,
    DefaultClock,
    governor::middleware::NoOpMiddleware<<DefaultClock as governor::clock::Clock>::Instant>,
>;

fn theirs() -> Theirs {
    let quota = governor::Quota::with_period(Duration::from_nanos(INTERVAL_NANOS))
        .expect("a nonzero period")
        .allow_burst(NonZeroU32::new(BURST).expect("nonzero"));
    governor::RateLimiter::dashmap_with_clock_and_hasher(
        quota,
        DefaultClock::default(),
        ahash::RandomState::new(),
    )
}

impl Subject for Theirs {
    fn hot(&self, key: u64) -> bool {
        self.check_key(&key).is_ok()
    }

    /// Always stored: there is no bound.
    fn flood(&self, key: u64) -> bool {
        let _ = self.check_key(&key);
        true
    }

    fn upkeep(&self) -> usize {
        let held = self.len();
        self.retain_recent();
        self.shrink_to_fit();
        held
    }

    fn keys(&self) -> usize {
        self.len()
    }

    fn note(&self) -> String {
        String::new()
    }
}

/// A GCRA word per key in papaya's map, freed by epoch reclamation.
struct Epoch {
    map: papaya::HashMap<u64, AtomicU64, ahash::RandomState>,
    clock: turnstile::RealClock,
    /// Keys removed by `retain`, in all.
    removed: AtomicU64,
}

fn epoch() -> Epoch {
    Epoch {
        map: papaya::HashMap::builder()
            .hasher(ahash::RandomState::new())
            .build(),
        clock: turnstile::RealClock::new(),
        removed: AtomicU64::new(0),
    }
}

/// One GCRA decision on `word` (a theoretical arrival time; 0 for a new key)
/// at `now`: admitted when the next arrival time is at most the tolerance
/// ahead of now.
fn gcra(word: &AtomicU64, now: u64) -> bool {
    // Relaxed: the word is all the state; nothing else is published with it.
    let mut tat = word.load(Ordering::Relaxed);
    loop {
        let start = tat.max(now);
        if start - now > TOLERANCE_NANOS {
            return false;
        }
        match word.compare_exchange_weak(
            tat,
            start + INTERVAL_NANOS,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return true,
            Err(seen) => tat = seen,
        }
    }
}

impl Subject for Epoch {
    fn hot(&self, key: u64) -> bool {
        let map = self.map.pin();
        // A hot key removed by the flood's `retain` (its word had caught up
        // with the clock) is inserted again.
        let word = match map.get(&key) {
            Some(word) => word,
            None => map.get_or_insert(key, AtomicU64::new(0)),
        };
        gcra(word, self.clock.now())
    }

    /// Always stored: the bound is kept by the upkeep.
    fn flood(&self, key: u64) -> bool {
        let map = self.map.pin();
        gcra(map.get_or_insert(key, AtomicU64::new(0)), self.clock.now());
        true
    }

    fn upkeep(&self) -> usize {
        let held = self.map.len();
        let now = self.clock.now();
        let mut removed = 0_u64;
        self.map.pin().retain(|_, word| {
            // Relaxed: as in `gcra`. A word at or behind the clock is
            // fresh-equivalent.
            let keep = word.load(Ordering::Relaxed) > now;
            removed += u64::from(!keep);
            keep
        });
        // Relaxed: read after the flood thread is joined.
        self.removed.fetch_add(removed, Ordering::Relaxed);
        held
    }

    fn keys(&self) -> usize {
        self.map.len()
    }

    fn note(&self) -> String {
        format!("removed by retain {}", self.removed.load(Ordering::Relaxed))
    }
}

/// One measurement.
#[derive(Clone, Debug, Default)]
struct Sample {
    /// The hot thread's decisions per second.
    hot_per_s: f64,
    /// The share of them admitted.
    admitted: f64,
    /// The share of the timed window the hot thread spent on a CPU (NaN where
    /// the kernel does not say): below 1 when it waited for a core.
    hot_cpu: f64,
    /// New keys offered per second during the timed window.
    flood_per_s: f64,
    /// New keys offered in all, from the flood's start.
    offered: u64,
    /// New keys offered per second the flood thread was on a CPU, over its
    /// whole run (0 without churn, NaN where the kernel does not say).
    flood_per_cpu_s: f64,
    /// New keys refused room.
    refused: u64,
    /// The most keys held at an upkeep point.
    peak: usize,
    /// Keys held at the end.
    keys_end: usize,
    /// The contender's own counters.
    note: String,
}

impl Sample {
    /// One line, as a child prints it: `sample CHURN FIELDS... | NOTE`.
    fn to_line(&self, churn: bool) -> String {
        format!(
            "sample {} {} {} {} {} {} {} {} {} {} | {}",
            u8::from(churn),
            self.hot_per_s,
            self.admitted,
            self.hot_cpu,
            self.flood_per_s,
            self.offered,
            self.flood_per_cpu_s,
            self.refused,
            self.peak,
            self.keys_end,
            self.note
        )
    }

    /// A line of [`to_line`](Self::to_line): whether under churn, and the sample.
    fn parse(line: &str) -> Option<(bool, Sample)> {
        let (fields, note) = line.strip_prefix("sample ")?.split_once(" | ")?;
        let f: Vec<&str> = fields.split(' ').collect();
        if f.len() != 10 {
            return None;
        }
        let sample = Sample {
            hot_per_s: f[1].parse().ok()?,
            admitted: f[2].parse().ok()?,
            hot_cpu: f[3].parse().ok()?,
            flood_per_s: f[4].parse().ok()?,
            offered: f[5].parse().ok()?,
            flood_per_cpu_s: f[6].parse().ok()?,
            refused: f[7].parse().ok()?,
            peak: f[8].parse().ok()?,
            keys_end: f[9].parse().ok()?,
            note: note.to_string(),
        };
        Some((f[0] == "1", sample))
    }
}

/// What the flood thread did.
#[derive(Default)]
struct Flood {
    offered: u64,
    /// The flood thread's time on a CPU, if known.
    cpu: Option<Duration>,
    refused: u64,
    peak: usize,
}

/// Offers new keys until `stop`, `FLOOD_CAP` keys or `limit`, with the
/// contender's upkeep after every `every`; publishes its count in `progress`.
fn flood<S: Subject>(
    subject: &S,
    stop: &AtomicBool,
    progress: &AtomicU64,
    every: u64,
    limit: Duration,
) -> Flood {
    let began = Instant::now();
    let cpu_from = on_cpu();
    let mut f = Flood::default();
    // Relaxed: the flag only ends the loop; the counts come back through
    // `join`.
    while !stop.load(Ordering::Relaxed) && f.offered < FLOOD_CAP && began.elapsed() < limit {
        for _ in 0..256 {
            if !subject.flood(FLOOD_BASE + f.offered) {
                f.refused += 1;
            }
            f.offered += 1;
            if f.offered.is_multiple_of(every) {
                f.peak = f.peak.max(subject.upkeep());
            }
        }
        // Relaxed: a progress figure for the main thread, nothing more.
        progress.store(f.offered, Ordering::Relaxed);
    }
    f.cpu = cpu_from.zip(on_cpu()).map(|(a, b)| b.saturating_sub(a));
    f
}

/// The calling thread's time on a CPU so far, from Linux's
/// `/proc/thread-self/schedstat`; `None` elsewhere.
fn on_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(Duration::from_nanos(
        stat.split_whitespace().next()?.parse().ok()?,
    ))
}

/// Decides on the hot keys in turn for `window` (and at most one decision a
/// nanosecond); returns the decisions, those admitted and the time taken.
fn hot<S: Subject>(subject: &S, window: Duration) -> (u64, u64, Duration) {
    let cap = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
    let began = Instant::now();
    let (mut i, mut admitted) = (0_u64, 0_u64);
    loop {
        for _ in 0..256 {
            admitted += u64::from(subject.hot(i & (HOT - 1)));
            i += 1;
        }
        let elapsed = began.elapsed();
        if elapsed >= window || i >= cap {
            return (i, admitted, elapsed);
        }
    }
}

/// One measurement of `subject`, with the flood thread (`churn`) or without.
fn measure<S: Subject>(subject: &S, secs: f64, churn: bool, bound: u64) -> Sample {
    for k in 0..HOT {
        subject.hot(k);
    }
    let window = Duration::from_secs_f64(secs);
    let stop = AtomicBool::new(false);
    let progress = AtomicU64::new(0);
    std::thread::scope(|s| {
        let flooding = churn.then(|| {
            s.spawn(|| {
                flood(
                    subject,
                    &stop,
                    &progress,
                    bound,
                    WARM_MAX + window + FLOOD_GRACE,
                )
            })
        });
        if churn {
            let began = Instant::now();
            // Relaxed: as in `flood`.
            while progress.load(Ordering::Relaxed) < bound && began.elapsed() < WARM_MAX {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let cpu_from = on_cpu();
        let from = progress.load(Ordering::Relaxed);
        let (decisions, admitted, elapsed) = hot(subject, window);
        let to = progress.load(Ordering::Relaxed);
        let hot_cpu = cpu_from.zip(on_cpu()).map_or(f64::NAN, |(a, b)| {
            b.saturating_sub(a).as_secs_f64() / elapsed.as_secs_f64()
        });
        // Relaxed: as in `flood`.
        stop.store(true, Ordering::Relaxed);
        let f = flooding
            .map(|t| t.join().expect("the flood thread panicked"))
            .unwrap_or_default();
        Sample {
            hot_per_s: decisions as f64 / elapsed.as_secs_f64(),
            admitted: admitted as f64 / decisions.max(1) as f64,
            hot_cpu,
            flood_per_s: (to - from) as f64 / elapsed.as_secs_f64(),
            offered: f.offered,
            flood_per_cpu_s: match f.cpu {
                _ if !churn => 0.0,
                Some(cpu) => f.offered as f64 / cpu.as_secs_f64(),
                None => f64::NAN,
            },
            refused: f.refused,
            peak: f.peak,
            keys_end: subject.keys(),
            note: subject.note(),
        }
    })
}

/// Without churn then with it on even reps, the other way round on odd ones.
fn order(rep: usize) -> [bool; 2] {
    if rep.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    }
}

/// The child's side: turnstile in this process's barrier mode, one rep.
fn child(secs: f64, bound: u64, rep: usize) -> ExitCode {
    let asked = std::env::var("TURNSTILE_BARRIER").unwrap_or_else(|_| "(unset)".to_string());
    for churn in order(rep) {
        let l = ours(bound);
        let mut s = measure(&l, secs, churn, bound);
        s.note = format!("TURNSTILE_BARRIER={asked}; {}", s.note);
        println!("{}", s.to_line(churn));
    }
    ExitCode::SUCCESS
}

/// One rep of contender `name`: its samples without and with churn.
fn run(name: &str, secs: f64, bound: u64, rep: usize) -> Result<[Sample; 2], String> {
    let mut out: [Sample; 2] = Default::default();
    if let Some(mode) = name.strip_prefix("turnstile-") {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let output = Command::new(exe)
            .args(["--only", "turnstile", "--secs", &secs.to_string()])
            .args(["--max-keys", &bound.to_string(), "--rep", &rep.to_string()])
            .env("TURNSTILE_BARRIER", mode)
            .output()
            .map_err(|e| format!("starting the {name} child: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "the {name} child failed ({}):\n{stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let mut seen = [false; 2];
        for (churn, s) in stdout.lines().filter_map(Sample::parse) {
            seen[usize::from(churn)] = true;
            out[usize::from(churn)] = s;
        }
        if seen != [true, true] {
            return Err(format!("the {name} child printed no samples:\n{stdout}"));
        }
    } else {
        for churn in order(rep) {
            out[usize::from(churn)] = match name {
                "governor-ahash" => measure(&theirs(), secs, churn, bound),
                "papaya-gcra" => measure(&epoch(), secs, churn, bound),
                _ => return Err(format!("no contender {name}")),
            };
        }
    }
    Ok(out)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spread(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_string(),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

fn usage() -> ExitCode {
    eprintln!("usage: churn [--secs S] [--reps R] [--max-keys N]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let (mut secs, mut reps, mut bound) = (1.0_f64, 3_usize, 100_000_u64);
    let (mut only, mut rep) = (None, 0_usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--secs" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) if v > 0.0 && v <= 600.0 => secs = v,
                _ => return usage(),
            },
            "--reps" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) if v > 0 => reps = v,
                _ => return usage(),
            },
            "--max-keys" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) if v > 0 => bound = v,
                _ => return usage(),
            },
            // Internal: a child's contender and rep.
            "--only" => only = args.next(),
            "--rep" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) => rep = v,
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    match only.as_deref() {
        Some("turnstile") => return child(secs, bound, rep),
        Some(_) => return usage(),
        None => {}
    }

    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "{cores} cores available; {secs} s per measurement, {reps} reps, contenders rotated each rep; \
         {HOT} hot keys; key bound / upkeep every {bound} new keys; \
         quota: burst {BURST}, {PER_MICRO} per µs a key"
    );
    println!("load average before: {}", loadavg());
    println!();
    println!(
        "| rep | contender | churn | hot M/s | hot admitted % | hot on CPU % | flood M new keys/s | flood M new keys per CPU-s | new keys offered | refused | most keys at upkeep | keys at end | counters |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut samples: Vec<[Vec<Sample>; 2]> = vec![Default::default(); CONTENDERS.len()];
    for r in 0..reps {
        for k in 0..CONTENDERS.len() {
            let c = (k + r) % CONTENDERS.len();
            let name = CONTENDERS[c];
            let pair = match run(name, secs, bound, r) {
                Ok(pair) => pair,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            for churn in order(r) {
                let s = &pair[usize::from(churn)];
                println!(
                    "| {} | {name} | {} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
                    r + 1,
                    if churn { "yes" } else { "no" },
                    s.hot_per_s / 1e6,
                    100.0 * s.admitted,
                    100.0 * s.hot_cpu,
                    s.flood_per_s / 1e6,
                    s.flood_per_cpu_s / 1e6,
                    s.offered,
                    s.refused,
                    s.peak,
                    s.keys_end,
                    s.note,
                );
            }
            for (churn, s) in pair.into_iter().enumerate() {
                samples[c][churn].push(s);
            }
        }
    }
    println!();
    println!("load average after: {}", loadavg());

    let rates = |c: usize, churn: usize, f: fn(&Sample) -> f64| -> Vec<f64> {
        samples[c][churn].iter().map(f).collect()
    };
    let hot = |s: &Sample| s.hot_per_s / 1e6;
    let flooded = |s: &Sample| s.flood_per_s / 1e6;
    let refused = |s: &Sample| s.refused as f64;
    let offered = |s: &Sample| s.offered as f64;
    let governor = CONTENDERS
        .iter()
        .position(|&n| n == "governor-ahash")
        .expect("governor-ahash is a contender");
    let governor_churn = median(&rates(governor, 1, hot));

    println!();
    println!(
        "| contender | hot M/s, no churn | spread | hot M/s, churn | spread | churn / no churn | vs governor-ahash, churn | flood M new keys/s | spread | new keys offered, median | refused, median |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut own = vec![(0.0, 0.0); CONTENDERS.len()];
    for (c, name) in CONTENDERS.iter().enumerate() {
        let (calm, busy, fl) = (rates(c, 0, hot), rates(c, 1, hot), rates(c, 1, flooded));
        let (m0, m1, mf) = (median(&calm), median(&busy), median(&fl));
        let ((l0, h0), (l1, h1), (lf, hf)) = (spread(&calm), spread(&busy), spread(&fl));
        own[c] = (m1 / m0, m1 / governor_churn);
        println!(
            "| {name} | {m0:.2} | {l0:.2}–{h0:.2} | {m1:.2} | {l1:.2}–{h1:.2} | {:.2}× | {:.2}× | {mf:.2} | {lf:.2}–{hf:.2} | {:.0} | {:.0} |",
            own[c].0,
            own[c].1,
            median(&rates(c, 1, offered)),
            median(&rates(c, 1, refused)),
        );
    }
    // The same per second the hot thread was on a CPU: on a machine with
    // other work (or only as many cores as the two threads), time spent
    // waiting for a core is taken out.
    let per_cpu = |s: &Sample| s.hot_per_s / s.hot_cpu / 1e6;
    let on_cpu_share = |s: &Sample| 100.0 * s.hot_cpu;
    let flood_per_cpu = |s: &Sample| s.flood_per_cpu_s / 1e6;
    let governor_cpu = median(&rates(governor, 1, per_cpu));
    println!();
    println!(
        "| contender | hot M per CPU-s, no churn | hot on CPU %, no churn | hot M per CPU-s, churn | hot on CPU %, churn | churn / no churn | vs governor-ahash, churn | flood M new keys per CPU-s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (c, name) in CONTENDERS.iter().enumerate() {
        let (m0, m1) = (median(&rates(c, 0, per_cpu)), median(&rates(c, 1, per_cpu)));
        println!(
            "| {name} | {m0:.2} | {:.1} | {m1:.2} | {:.1} | {:.2}× | {:.2}× | {:.2} |",
            median(&rates(c, 0, on_cpu_share)),
            median(&rates(c, 1, on_cpu_share)),
            m1 / m0,
            m1 / governor_cpu,
            median(&rates(c, 1, flood_per_cpu)),
        );
    }
    println!();
    println!(
        "Targets, under churn: turnstile's hot thread at least governor-ahash's (1.00×) and at least 0.70× its own without churn."
    );
    for (c, name) in CONTENDERS.iter().enumerate() {
        if name.starts_with("turnstile-") {
            let (vs_own, vs_governor) = own[c];
            let holds = |ok: bool| if ok { "holds" } else { "missed" };
            println!(
                "- {name}: {vs_governor:.2}× governor-ahash ({}), {vs_own:.2}× own without churn ({})",
                holds(vs_governor >= 1.0),
                holds(vs_own >= 0.7),
            );
        }
    }
    ExitCode::SUCCESS
}
