//! The trace replay tool's logic, shared by `examples/replay.rs` and its tests:
//! recorded requests (`time_ms,key,n`) through a per-key limiter on a manual
//! clock, one output line per request and a per-key summary.

#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, Write};
use std::time::Duration;

use turnstile::{
    Algorithm, DEFAULT_MAX_KEYS, FixedWindow, Gcra, KeyedBuilder, KeyedDecision, ManualClock,
    Quota, SlidingWindow, TokenBucket,
};

pub const USAGE: &str = "\
usage: replay [OPTIONS] < trace.csv

Replays recorded requests through a per-key rate limiter on a simulated clock.
Input lines are `time_ms,key,n`: an empty key is a request without one (401), n
defaults to 1, and lines starting with # are ignored. Lines come in time order
(sort a merged log first): one earlier than the line before is reported and
skipped, since deciding it would turn the clock back.

options:
  --algorithm A    token-bucket (default), fixed-window, sliding-window or gcra
  --capacity N     token-bucket, gcra: the burst
  --period-ms N    token-bucket, gcra: one refill every N ms
  --amount N       token-bucket, gcra: tokens per refill (default 1)
  --limit N        fixed-window, sliding-window: permits per window
  --window-ms N    fixed-window, sliding-window: the window
  --max-keys N     keys held at once (default 1000000); a new key past it gets
                   `key-limit`, the gate's 503
  --help           this text

output: `TIME_MS KEY allowed REMAINING`, `TIME_MS KEY denied RETRY_AFTER_MS`
(the wait in whole milliseconds, rounded up), `TIME_MS KEY key-limit
RETRY_AFTER_MS`, or `TIME_MS - unauthorized`; then, after a blank line, one
summary line per key in order of first appearance. The summary remembers every
key the trace names (a few hundred bytes each), whatever --max-keys bounds the
limiter to. Malformed lines are reported on stderr with their line number and
skipped.
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    Gcra,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub kind: Kind,
    pub capacity: Option<u32>,
    pub period_ms: Option<u64>,
    pub amount: u32,
    pub limit: Option<u32>,
    pub window_ms: Option<u64>,
    pub max_keys: usize,
}

/// Why the command line was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum ArgsError {
    Help,
    Bad(String),
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgsError::Help => f.write_str(USAGE),
            ArgsError::Bad(why) => write!(f, "replay: {why} (--help lists the options)"),
        }
    }
}

fn number<T: std::str::FromStr>(flag: &str, value: Option<String>) -> Result<T, ArgsError> {
    let value = value.ok_or_else(|| ArgsError::Bad(format!("{flag} needs a value")))?;
    value
        .parse()
        .map_err(|_| ArgsError::Bad(format!("{flag} {value:?} is not a whole number in range")))
}

pub fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, ArgsError> {
    let mut options = Options {
        kind: Kind::TokenBucket,
        capacity: None,
        period_ms: None,
        amount: 1,
        limit: None,
        window_ms: None,
        max_keys: DEFAULT_MAX_KEYS,
    };
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--help" | "-h" => return Err(ArgsError::Help),
            "--algorithm" => {
                options.kind = match args.next().as_deref() {
                    Some("token-bucket") => Kind::TokenBucket,
                    Some("fixed-window") => Kind::FixedWindow,
                    Some("sliding-window") => Kind::SlidingWindow,
                    Some("gcra") => Kind::Gcra,
                    Some(other) => {
                        return Err(ArgsError::Bad(format!(
                            "--algorithm {other:?}: expected token-bucket, fixed-window, \
                             sliding-window or gcra"
                        )));
                    }
                    None => return Err(ArgsError::Bad("--algorithm needs a value".into())),
                }
            }
            "--capacity" => options.capacity = Some(number(&flag, args.next())?),
            "--period-ms" => options.period_ms = Some(number(&flag, args.next())?),
            "--amount" => options.amount = number(&flag, args.next())?,
            "--limit" => options.limit = Some(number(&flag, args.next())?),
            "--window-ms" => options.window_ms = Some(number(&flag, args.next())?),
            "--max-keys" => options.max_keys = number(&flag, args.next())?,
            other => return Err(ArgsError::Bad(format!("unknown argument {other:?}"))),
        }
    }
    Ok(options)
}

/// What one request came to, for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub allowed: u64,
    pub denied: u64,
    pub key_limit: u64,
}

/// Replay `input` and write the report to `out`, malformed lines to `err`.
/// Returns an error only when the configuration is invalid or writing fails.
pub fn run(
    options: &Options,
    input: impl BufRead,
    out: &mut impl Write,
    err: &mut impl Write,
) -> io::Result<()> {
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let required = |value: Option<u64>, flag: &str| {
        value.ok_or_else(|| invalid(format!("this algorithm needs {flag}")))
    };
    let quota = || -> io::Result<Quota> {
        let capacity = required(options.capacity.map(u64::from), "--capacity")? as u32;
        let period = Duration::from_millis(required(options.period_ms, "--period-ms")?);
        Quota::new(capacity, options.amount, period).map_err(|e| invalid(e.to_string()))
    };
    let window = || -> io::Result<(u32, Duration)> {
        let limit = required(options.limit.map(u64::from), "--limit")? as u32;
        let window = Duration::from_millis(required(options.window_ms, "--window-ms")?);
        Ok((limit, window))
    };
    match options.kind {
        Kind::TokenBucket => replay(TokenBucket::new(quota()?), options, input, out, err),
        Kind::Gcra => replay(Gcra::new(quota()?), options, input, out, err),
        Kind::FixedWindow => {
            let (limit, window) = window()?;
            let algorithm = FixedWindow::new(limit, window).map_err(|e| invalid(e.to_string()))?;
            replay(algorithm, options, input, out, err)
        }
        Kind::SlidingWindow => {
            let (limit, window) = window()?;
            let algorithm =
                SlidingWindow::new(limit, window).map_err(|e| invalid(e.to_string()))?;
            replay(algorithm, options, input, out, err)
        }
    }
}

/// One parsed input line.
struct Request {
    time_ms: u64,
    key: Option<String>,
    n: u32,
}

fn parse_line(line: &str) -> Result<Request, String> {
    let mut fields = line.split(',');
    let time = fields.next().unwrap_or("").trim();
    let time_ms: u64 = time
        .parse()
        .map_err(|_| format!("time {time:?} is not a whole number of milliseconds"))?;
    // Milliseconds as the clock's nanoseconds must fit in a u64 (584 years).
    if time_ms.checked_mul(1_000_000).is_none() {
        return Err(format!("time {time_ms} ms is beyond the clock's range"));
    }
    let Some(key) = fields.next() else {
        return Err("expected `time_ms,key` or `time_ms,key,n`".to_string());
    };
    let key = key.trim();
    let n = match fields.next().map(str::trim) {
        None | Some("") => 1,
        Some(n) => n
            .parse()
            .map_err(|_| format!("n {n:?} is not a whole number of permits"))?,
    };
    if fields.next().is_some() {
        return Err("too many fields: expected `time_ms,key,n`".to_string());
    }
    Ok(Request {
        time_ms,
        key: (!key.is_empty()).then(|| key.to_string()),
        n,
    })
}

fn replay<A: Algorithm>(
    algorithm: A,
    options: &Options,
    mut input: impl BufRead,
    out: &mut impl Write,
    err: &mut impl Write,
) -> io::Result<()> {
    let clock = ManualClock::new();
    let limiter = KeyedBuilder::<String, A>::new(algorithm)
        .clock(clock.clone())
        .max_keys(options.max_keys)
        .build()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    // Per key, in order of first appearance.
    let mut order: Vec<String> = Vec::new();
    let mut counts: HashMap<String, Counts> = HashMap::new();
    let mut unauthorized = 0u64;
    let mut bytes = Vec::new();
    let mut number = 0u64;
    // The latest time decided on: the simulated clock's reading.
    let mut latest_ms = 0u64;
    loop {
        bytes.clear();
        if input.read_until(b'\n', &mut bytes)? == 0 {
            break;
        }
        number += 1;
        let Ok(line) = std::str::from_utf8(&bytes) else {
            writeln!(err, "line {number}: not UTF-8; skipped")?;
            continue;
        };
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let request = match parse_line(line) {
            Ok(request) => request,
            Err(why) => {
                writeln!(err, "line {number}: {why}; skipped")?;
                continue;
            }
        };
        // A real clock never goes back; a trace out of order would decide on
        // one that does (readings behind a word admit less), silently.
        if request.time_ms < latest_ms {
            writeln!(
                err,
                "line {number}: time {} ms is before the previous request's {latest_ms} ms \
                 (sort the trace by time); skipped",
                request.time_ms
            )?;
            continue;
        }
        latest_ms = request.time_ms;
        let Some(key) = request.key else {
            writeln!(out, "{} - unauthorized", request.time_ms)?;
            unauthorized += 1;
            continue;
        };
        clock.set(Duration::from_millis(request.time_ms));
        // `n = 0` and `n` above the capacity are typed errors, reported.
        let decision = match limiter.try_acquire_n(key.as_str(), request.n) {
            Ok(decision) => decision,
            Err(e) => {
                writeln!(err, "line {number}: {e}; skipped")?;
                continue;
            }
        };
        let time = request.time_ms;
        let entry = counts.entry(key.clone()).or_insert_with(|| {
            order.push(key.clone());
            Counts::default()
        });
        match decision {
            KeyedDecision::Allowed { remaining } => {
                entry.allowed += 1;
                writeln!(out, "{time} {key} allowed {remaining}")?;
            }
            KeyedDecision::Denied { retry_after } => {
                entry.denied += 1;
                writeln!(out, "{time} {key} denied {}", retry_after.millis_ceil())?;
            }
            KeyedDecision::KeyLimit { retry_after } => {
                entry.key_limit += 1;
                writeln!(out, "{time} {key} key-limit {}", retry_after.millis_ceil())?;
            }
        }
    }
    writeln!(out)?;
    for key in &order {
        let c = counts[key];
        write!(out, "{key} allowed {} denied {}", c.allowed, c.denied)?;
        if c.key_limit > 0 {
            write!(out, " key-limit {}", c.key_limit)?;
        }
        writeln!(out)?;
    }
    if unauthorized > 0 {
        writeln!(out, "- unauthorized {unauthorized}")?;
    }
    Ok(())
}
