//! What each exact-mode script costs Redis, beside the simplest script of the
//! same algorithm and a bare `return 1`.
//!
//! `cargo run --release -p turnstile-dev --example script_cost -- [--calls N] [--rounds R]`
//! starts a `redis-server` of its own on a free port and, for each case in
//! turn (one script kind at a time, since `INFO commandstats` counts per
//! command name), resets the statistics (`CONFIG RESETSTAT`), makes N calls
//! (20,000 by default) on one blocking connection and reads
//! `cmdstat_evalsha`'s `usec_per_call`: Redis' own time in the script. It
//! also times the N calls end to end. The cases run R rounds (3 by default),
//! interleaved, and each figure is reported as the median of the rounds and
//! their spread (lowest–highest).
//!
//! The cases: each algorithm through the crate (`RedisLimiter`, time from
//! Redis' `TIME`), with every call admitted (and its state written) and with
//! every call denied; each algorithm's refundable admission followed by its
//! refund (the two scripts alternating, so per call is their mean); a
//! minimal script per algorithm (TIME, GET, SET with PX on a ':'-joined
//! value, no validation), admitted and denied, plus the token bucket in a
//! hash (HMGET, HSET, PEXPIRE); and `return 1`, the floor of any EVALSHA.
//! End to end, each case's wall time per call is set against that of the
//! bare `return 1` on the same connection. The server's main thread's CPU
//! time per call (its schedstat) is reported too: on a loaded machine it is
//! less lengthened than `usec_per_call` by waiting for a CPU.
//!
//! `--body K` times the scripts' bodies instead, each run K times in a loop
//! inside one EVAL (R EVALs per case): the script's own work, without the
//! round trip or the EVALSHA's dispatch, which every script pays alike.
//!
//! `--dump DIR` writes the scripts of `--body` (each as sent, with its
//! arguments) to DIR and starts nothing: `benches/script_instructions.sh`
//! counts Redis' instructions per call for each under callgrind, a figure
//! that repeats on a shared machine where times do not.
//!
//! `--tsv` prints one line per case and round instead (case, Redis µs, CPU
//! µs, wall µs, wall over `return 1`'s), for comparing builds: BENCHMARKS.md
//! ("Exact mode on Redis: script time") ran the builds before and after a
//! change alternately, under `chrt -f 1` on a shared machine.

#[allow(dead_code)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use redis::{Connection, ConnectionLike, Script};
use turnstile::redis::RedisLimiter;
use turnstile::{FixedWindow, Gcra, Quota, SlidingWindow, TokenBucket};

const SECOND: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3_600);

/// The token bucket in a hash, the way it is often written: refill whole
/// periods, take n or deny. ARGV: capacity, amount, period (us), n.
const MIN_TOKEN_BUCKET_HASH: &str = r"
local capacity, amount, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local s = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(s[1]), tonumber(s[2])
if not tokens then
    tokens, ts = capacity, now
end
local periods = math.floor((now - ts) / period)
tokens = tokens + periods * amount
ts = ts + periods * period
if tokens >= capacity then
    tokens, ts = capacity, now
end
if tokens < n then
    return {0, 0, ts + math.ceil((n - tokens) / amount) * period - now, 0}
end
tokens = tokens - n
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', string.format('%d', ts))
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - tokens) / amount * period / 1000) + 1)
return {1, tokens, 0, 0}
";

/// The same bucket as 'tokens:time' in a string: TIME, GET, SET with PX.
const MIN_TOKEN_BUCKET: &str = r"
local capacity, amount, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local v = redis.call('GET', KEYS[1])
local tokens, ts = capacity, now
if v then
    local a, b = string.match(v, '(%d+):(%d+)')
    tokens, ts = tonumber(a), tonumber(b)
    local periods = math.floor((now - ts) / period)
    tokens = tokens + periods * amount
    ts = ts + periods * period
    if tokens >= capacity then
        tokens, ts = capacity, now
    end
end
if tokens < n then
    return {0, 0, ts + math.ceil((n - tokens) / amount) * period - now, 0}
end
tokens = tokens - n
local ms = math.ceil((capacity - tokens) / amount * period / 1000) + 1
redis.call('SET', KEYS[1], string.format('%d:%d', tokens, ts), 'PX', ms)
return {1, tokens, 0, 0}
";

/// `script` with each `tonumber(x)` written `(x + 0)`, the conversion the
/// crate's scripts make (Lua 5.1's `tonumber` converts twice behind a
/// function call): for a minimal script at its fastest. `x` holds no
/// parenthesis in the scripts here.
fn by_arithmetic(script: &str) -> String {
    let mut out = String::with_capacity(script.len());
    let mut rest = script;
    while let Some(at) = rest.find("tonumber(") {
        out.push_str(&rest[..at]);
        let inner = &rest[at + "tonumber(".len()..];
        let close = inner.find(')').expect("a closed tonumber call");
        out.push_str(&format!("({} + 0)", &inner[..close]));
        rest = &inner[close + 1..];
    }
    out.push_str(rest);
    out
}

/// GCRA on the theoretical arrival time in microseconds. ARGV: interval
/// (us), horizon (us), n.
const MIN_GCRA: &str = r"
local interval, horizon, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now then
    tat = now
end
local new = tat + interval * n
if new - now > horizon then
    return {0, 0, new - horizon - now, 0}
end
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1)
return {1, math.floor((horizon - (new - now)) / interval), 0, 0}
";

/// The fixed window as 'count:window'. ARGV: limit, window (us), n.
const MIN_FIXED_WINDOW: &str = r"
local limit, w, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local index = math.floor(now / w)
local count = 0
local v = redis.call('GET', KEYS[1])
if v then
    local c, x = string.match(v, '(%d+):(%d+)')
    if tonumber(x) == index then
        count = tonumber(c)
    end
end
if count + n > limit then
    return {0, 0, (index + 1) * w - now, 0}
end
redis.call('SET', KEYS[1], string.format('%d:%d', count + n, index), 'PX',
    math.ceil(((index + 1) * w - now) / 1000))
return {1, limit - count - n, 0, 0}
";

/// The sliding window counter as 'current:previous:window'. ARGV: limit,
/// window (us), n.
const MIN_SLIDING_WINDOW: &str = r"
local limit, w, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local index = math.floor(now / w)
local into = now - index * w
local current, previous = 0, 0
local v = redis.call('GET', KEYS[1])
if v then
    local c, p, x = string.match(v, '(%d+):(%d+):(%d+)')
    x = tonumber(x)
    if x == index then
        current, previous = tonumber(c), tonumber(p)
    elseif x == index - 1 then
        previous = tonumber(c)
    end
end
local estimate = current + math.floor(previous * (w - into) / w)
if estimate + n > limit then
    return {0, 0, w - into, 0}
end
redis.call('SET', KEYS[1], string.format('%d:%d:%d', current + n, previous, index), 'PX',
    math.ceil(((index + 2) * w - now) / 1000))
return {1, limit - estimate - n, 0, 0}
";

/// One call of a case: whether it admitted.
type Call = Box<dyn FnMut(&mut dyn ConnectionLike) -> bool>;

/// One measured case: N calls, made by `call`.
struct Case {
    name: &'static str,
    /// Whether every counted call must admit (else deny).
    admits: bool,
    call: Call,
}

/// A round's figures for one case, per call: Redis' time in the command
/// (commandstats), the server's main thread's time on a CPU (the script plus
/// reading the request and writing the reply), the wall time at the client.
#[derive(Clone, Copy)]
struct Figures {
    redis_us: f64,
    cpu_us: f64,
    wall_us: f64,
}

/// The server's main thread's time on a CPU so far, in ns (the first field of
/// its schedstat): unlike `usec_per_call`, not lengthened by the other
/// processes of a loaded machine while the server waits for a CPU.
fn cpu_ns(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|f| f.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// The server's process id, from `INFO server`.
fn server_pid(plain: &mut Connection) -> u32 {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(plain)
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .and_then(|v| v.parse().ok())
        .expect("a process id")
}

fn arg(args: &[String], name: &str) -> Option<usize> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn limiter(name: &str, algorithm: impl Into<turnstile::redis::RedisAlgorithm>) -> RedisLimiter {
    RedisLimiter::new(name, algorithm).expect("a limiter Redis can keep exactly")
}

/// Every call admitted: far more permits than the calls can use.
fn roomy() -> [(&'static str, RedisLimiter); 4] {
    let bucket = Quota::new(10_000, 1, Duration::from_micros(1)).expect("a valid quota");
    let gcra = Quota::new(1_000_000, 1_000_000, SECOND).expect("a valid quota");
    [
        ("token bucket", limiter("tb", TokenBucket::new(bucket))),
        ("GCRA", limiter("gcra", Gcra::new(gcra))),
        (
            "fixed window",
            limiter("fw", FixedWindow::new(1_000_000, SECOND).expect("valid")),
        ),
        (
            "sliding window",
            limiter(
                "sw",
                SlidingWindow::new(100_000, 2 * SECOND).expect("valid"),
            ),
        ),
    ]
}

/// Every call after the first denied: one permit an hour.
fn tight() -> [(&'static str, RedisLimiter); 4] {
    let hourly = Quota::new(1, 1, HOUR).expect("a valid quota");
    [
        ("token bucket", limiter("tb-", TokenBucket::new(hourly))),
        ("GCRA", limiter("gcra-", Gcra::new(hourly))),
        (
            "fixed window",
            limiter("fw-", FixedWindow::new(1, HOUR).expect("valid")),
        ),
        (
            "sliding window",
            limiter("sw-", SlidingWindow::new(1, HOUR).expect("valid")),
        ),
    ]
}

/// Refundable admissions whose keys outlive the refund that follows: long
/// periods and windows, each admission given back at once.
fn refundable() -> [(&'static str, RedisLimiter); 4] {
    let slow = Quota::new(100, 1, SECOND).expect("a valid quota");
    [
        ("token bucket", limiter("tb+", TokenBucket::new(slow))),
        ("GCRA", limiter("gcra+", Gcra::new(slow))),
        (
            "fixed window",
            limiter("fw+", FixedWindow::new(100, HOUR).expect("valid")),
        ),
        (
            "sliding window",
            limiter("sw+", SlidingWindow::new(100, HOUR).expect("valid")),
        ),
    ]
}

fn crate_case(name: &'static str, limiter: RedisLimiter, admitted: bool) -> Case {
    Case {
        name,
        admits: admitted,
        call: Box::new(move |con| {
            let decision = limiter.try_acquire(con, "k").expect("a decision");
            decision.is_allowed()
        }),
    }
}

fn refund_case(name: &'static str, limiter: RedisLimiter) -> Case {
    Case {
        name,
        admits: true,
        call: Box::new(move |con| {
            let (decision, receipt) = limiter
                .try_acquire_refundable(con, "r")
                .expect("a decision");
            match receipt {
                Some(receipt) => {
                    decision.is_allowed() && limiter.refund(con, receipt).expect("a refund")
                }
                None => false,
            }
        }),
    }
}

/// A minimal script's case: `args` after the key; whether it must admit.
fn minimal_case(name: &'static str, lua: &'static str, args: Vec<u64>, admitted: bool) -> Case {
    let script = Script::new(lua);
    Case {
        name,
        admits: admitted,
        call: Box::new(move |con| {
            let mut invocation = script.prepare_invoke();
            invocation.key("k");
            for a in &args {
                invocation.arg(*a);
            }
            let reply: Vec<i64> = invocation.invoke(con).expect("the script's reply");
            reply.first() == Some(&1)
        }),
    }
}

fn cases() -> Vec<Case> {
    let return_1 = Script::new("return 1");
    let mut cases = vec![Case {
        name: "return 1",
        admits: true,
        call: Box::new(move |con| {
            let one: i64 = return_1.prepare_invoke().invoke(con).expect("1");
            one == 1
        }),
    }];
    for (name, limiter) in roomy() {
        cases.push(crate_case(leak(format!("{name}, admitted")), limiter, true));
    }
    for (name, limiter) in tight() {
        cases.push(crate_case(leak(format!("{name}, denied")), limiter, false));
    }
    for (name, limiter) in refundable() {
        cases.push(refund_case(
            leak(format!("{name}, refundable + refund")),
            limiter,
        ));
    }
    let hour = HOUR.as_micros() as u64;
    let minimal: [(&str, &'static str, Vec<u64>, Vec<u64>); 5] = [
        (
            "token bucket",
            MIN_TOKEN_BUCKET,
            vec![10_000, 1, 1, 1],
            vec![1, 1, hour, 1],
        ),
        (
            "token bucket, hash",
            MIN_TOKEN_BUCKET_HASH,
            vec![10_000, 1, 1, 1],
            vec![1, 1, hour, 1],
        ),
        ("GCRA", MIN_GCRA, vec![1, 1_000_000, 1], vec![hour, hour, 1]),
        (
            "fixed window",
            MIN_FIXED_WINDOW,
            vec![1_000_000, 1_000_000, 1],
            vec![1, hour, 1],
        ),
        (
            "sliding window",
            MIN_SLIDING_WINDOW,
            vec![100_000, 2_000_000, 1],
            vec![1, hour, 1],
        ),
    ];
    for (name, lua, roomy, tight) in minimal {
        cases.push(minimal_case(
            leak(format!("minimal {name}, admitted")),
            lua,
            roomy,
            true,
        ));
        cases.push(minimal_case(
            leak(format!("minimal {name}, denied")),
            lua,
            tight,
            false,
        ));
    }
    cases
}

/// A case name for the whole run (a handful of them, made once).
fn leak(name: String) -> &'static str {
    Box::leak(name.into_boxed_str())
}

/// `usec_per_call` of `cmdstat_evalsha`, and its calls.
fn evalsha_stats(plain: &mut Connection) -> (u64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(plain)
        .expect("INFO commandstats");
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .expect("EVALSHA counted");
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .expect("a number")
    };
    (field("calls=") as u64, field("usec_per_call="))
}

fn measure(
    case: &mut Case,
    con: &mut dyn ConnectionLike,
    plain: &mut Connection,
    pid: u32,
    calls: usize,
) -> Figures {
    // Warm, uncounted: the script loaded, the key in its steady state (the
    // first call of a denied case admits and spends the key).
    let _: () = redis::cmd("FLUSHALL").query(plain).expect("FLUSHALL");
    (case.call)(con);
    (case.call)(con);
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(plain)
        .expect("CONFIG RESETSTAT");
    let cpu_start = cpu_ns(pid);
    let start = Instant::now();
    let mut expected = 0;
    for _ in 0..calls {
        expected += usize::from((case.call)(con) == case.admits);
    }
    let wall = start.elapsed();
    let cpu = cpu_ns(pid) - cpu_start;
    assert_eq!(expected, calls, "{}: every call as intended", case.name);
    let (counted, redis_us) = evalsha_stats(plain);
    let per_case = if case.name.contains("refund") { 2 } else { 1 };
    assert_eq!(counted, (calls * per_case) as u64, "{}", case.name);
    let per_call = (calls * per_case) as f64;
    Figures {
        redis_us,
        cpu_us: cpu / 1e3 / per_call,
        wall_us: wall.as_secs_f64() * 1e6 / per_call,
    }
}

fn median_spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    (median, values[0], values[values.len() - 1])
}

/// The crate's scripts as `RedisLimiter` assembles them (the prelude, then
/// the algorithm's part), from the sources this example was built with.
const PRELUDE: &str = include_str!("../src/redis/prelude.lua");
const TOKEN_BUCKET: [&str; 2] = [
    include_str!("../src/redis/token_bucket_level.lua"),
    include_str!("../src/redis/token_bucket.lua"),
];
const GCRA: &str = include_str!("../src/redis/gcra.lua");
const FIXED_WINDOW: &str = include_str!("../src/redis/fixed_window.lua");
const SLIDING_WINDOW: &str = include_str!("../src/redis/sliding_window.lua");

/// `--body K`: each script's body run K times in a loop inside one EVAL, so
/// that neither the round trip nor the EVAL's own dispatch is counted, and
/// a loaded machine's pauses show as outliers of single EVALs: `reps` EVALs
/// per case, each timed alone (`CONFIG RESETSTAT` before it), reported as
/// the lowest and the median µs per iteration.
fn body_mode(plain: &mut Connection, k: usize, reps: usize) {
    println!(
        "each script's body {k} times in one EVAL, {reps} EVALs: µs per iteration, lowest and median"
    );
    println!("| case | lowest | median |\n|---|---|---|");
    for (name, script, argv, admits) in script_cases() {
        let looped = format!(
            "local function body()\n{script}\nend\nlocal r\nfor i = 1, {k} do\n    r = body()\nend\nreturn r[1]\n"
        );
        let _: () = redis::cmd("FLUSHALL").query(plain).expect("FLUSHALL");
        let mut per_iteration = Vec::new();
        // The first EVAL warms (and spends a denied case's key), uncounted.
        for rep in 0..=reps {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(plain)
                .expect("CONFIG RESETSTAT");
            let last: i64 = redis::cmd("EVAL")
                .arg(&looped)
                .arg(1)
                .arg("bk")
                .arg(&argv)
                .query(plain)
                .expect("the looped script runs");
            assert_eq!(last == 1, admits, "{name}");
            if rep > 0 {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(plain)
                    .expect("INFO commandstats");
                let usec: f64 = info
                    .lines()
                    .find(|l| l.starts_with("cmdstat_eval:"))
                    .and_then(|l| l.split([':', ',']).find_map(|f| f.strip_prefix("usec=")))
                    .and_then(|v| v.parse().ok())
                    .expect("EVAL counted");
                per_iteration.push(usec / k as f64);
            }
        }
        let (median, low, _) = median_spread(per_iteration);
        println!("| {name} | {low:.2} | {median:.2} |");
    }
}

/// `--dump DIR`: each case of `script_cases` as three files in DIR, for
/// `benches/script_instructions.sh`, which counts Redis' instructions per
/// call under callgrind: `NN.name` (the case's name), `NN.lua` (the script
/// as sent) and `NN.args` (its ARGV, one per line; the crate's first
/// argument is empty: the time from Redis' `TIME`).
fn dump(dir: &str) {
    std::fs::create_dir_all(dir).expect("the dump directory");
    for (i, (name, script, argv, _)) in script_cases().into_iter().enumerate() {
        let file = |ext: &str| format!("{dir}/{i:02}.{ext}");
        std::fs::write(file("name"), format!("{name}\n")).expect("write the name");
        std::fs::write(file("lua"), script).expect("write the script");
        let args: String = argv.iter().map(|a| format!("{a}\n")).collect();
        std::fs::write(file("args"), args).expect("write the arguments");
    }
}

/// The scripts of `--body` and `--dump`: each algorithm's decision through
/// the crate's script and its minimal script, admitted and denied: (name,
/// script, ARGV, whether it admits).
fn script_cases() -> Vec<(&'static str, String, Vec<String>, bool)> {
    let micros = |d: Duration| d.as_micros() as u64;
    let roomy = Quota::new(10_000, 1, Duration::from_micros(1)).expect("a valid quota");
    let tight = Quota::new(1, 1, HOUR).expect("a valid quota");
    let bucket = |q: Quota| {
        let unit = micros(q.time_unit());
        vec![
            u64::from(q.capacity()),
            u64::from(q.amount()),
            micros(q.period()) / unit,
            micros(q.fill_time()) / unit,
            unit,
        ]
    };
    let hour = micros(HOUR);
    let window = 20_000_000;
    let tb = format!("{PRELUDE}{}{}", TOKEN_BUCKET[0], TOKEN_BUCKET[1]);
    let gcra = format!("{PRELUDE}{GCRA}");
    let fw = format!("{PRELUDE}{FIXED_WINDOW}");
    let sw = format!("{PRELUDE}{SLIDING_WINDOW}");
    let min_tb_arith = by_arithmetic(MIN_TOKEN_BUCKET);
    // (name, script, ARGV after the time, n and slack for the crate's; whole
    // ARGV for a minimal one, admits)
    let crate_args = |params: Vec<u64>| {
        let mut v = vec![String::new(), "1".to_owned(), "0".to_owned()];
        v.extend(params.iter().map(u64::to_string));
        v
    };
    let plain_args = |params: Vec<u64>| params.iter().map(u64::to_string).collect::<Vec<_>>();
    let cases: Vec<(&str, &str, Vec<String>, bool)> = vec![
        (
            "token bucket, admitted",
            &tb,
            crate_args(bucket(roomy)),
            true,
        ),
        (
            "minimal token bucket, admitted",
            MIN_TOKEN_BUCKET,
            plain_args(vec![10_000, 1, 1, 1]),
            true,
        ),
        (
            "minimal token bucket, arithmetic, admitted",
            &min_tb_arith,
            plain_args(vec![10_000, 1, 1, 1]),
            true,
        ),
        (
            "GCRA, admitted",
            &gcra,
            crate_args(vec![1_000, 1_000_000_000]),
            true,
        ),
        (
            "minimal GCRA, admitted",
            MIN_GCRA,
            plain_args(vec![1, 1_000_000, 1]),
            true,
        ),
        (
            "fixed window, admitted",
            &fw,
            crate_args(vec![10_000_000, window]),
            true,
        ),
        (
            "minimal fixed window, admitted",
            MIN_FIXED_WINDOW,
            plain_args(vec![10_000_000, window, 1]),
            true,
        ),
        (
            "sliding window, admitted",
            &sw,
            crate_args(vec![10_000_000, window]),
            true,
        ),
        (
            "minimal sliding window, admitted",
            MIN_SLIDING_WINDOW,
            plain_args(vec![10_000_000, window, 1]),
            true,
        ),
        (
            "token bucket, denied",
            &tb,
            crate_args(bucket(tight)),
            false,
        ),
        (
            "minimal token bucket, denied",
            MIN_TOKEN_BUCKET,
            plain_args(vec![1, 1, hour, 1]),
            false,
        ),
        (
            "minimal token bucket, arithmetic, denied",
            &min_tb_arith,
            plain_args(vec![1, 1, hour, 1]),
            false,
        ),
        (
            "GCRA, denied",
            &gcra,
            crate_args(vec![hour * 1_000, hour * 1_000]),
            false,
        ),
        (
            "minimal GCRA, denied",
            MIN_GCRA,
            plain_args(vec![hour, hour, 1]),
            false,
        ),
        (
            "fixed window, denied",
            &fw,
            crate_args(vec![1, hour]),
            false,
        ),
        (
            "minimal fixed window, denied",
            MIN_FIXED_WINDOW,
            plain_args(vec![1, hour, 1]),
            false,
        ),
        (
            "sliding window, denied",
            &sw,
            crate_args(vec![1, hour]),
            false,
        ),
        (
            "minimal sliding window, denied",
            MIN_SLIDING_WINDOW,
            plain_args(vec![1, hour, 1]),
            false,
        ),
    ];
    cases
        .into_iter()
        .map(|(name, script, argv, admits)| (name, script.to_owned(), argv, admits))
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let calls = arg(&args, "--calls").unwrap_or(20_000);
    let rounds = arg(&args, "--rounds").unwrap_or(3).max(1);
    if let Some(i) = args.iter().position(|a| a == "--dump") {
        dump(args.get(i + 1).map_or("script_cases", String::as_str));
        return;
    }
    let Some(server) = redis_server::server("script_cost") else {
        return;
    };
    let mut con = server.connection();
    let mut plain = server.plain();
    if let Some(k) = arg(&args, "--body") {
        body_mode(&mut plain, k.max(1), rounds);
        return;
    }
    let pid = server_pid(&mut plain);
    let mut cases = cases();
    let mut figures: Vec<Vec<Figures>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        eprintln!("round {} of {rounds}", round + 1);
        for (case, figures) in cases.iter_mut().zip(&mut figures) {
            figures.push(measure(case, &mut con, &mut plain, pid, calls));
        }
    }
    let bare: Vec<f64> = figures[0].iter().map(|f| f.wall_us).collect();
    let tsv = args.iter().any(|a| a == "--tsv");
    if !tsv {
        println!(
            "{calls} calls per case, {rounds} rounds: median [lowest–highest]; CPU is the \
             server's main thread's time on a CPU per call (request and reply included); \
             'vs return 1' is the wall time over the same round's bare EVALSHA's"
        );
        println!(
            "| case | Redis µs per call | server CPU µs per call | wall µs per call | vs return 1 |\n\
             |---|---|---|---|---|"
        );
    }
    for (case, figures) in cases.iter().zip(&figures) {
        if tsv {
            // One line a round: case, Redis µs, CPU µs, wall µs, wall ratio.
            for (f, b) in figures.iter().zip(&bare) {
                println!(
                    "{}\t{:.3}\t{:.3}\t{:.2}\t{:.4}",
                    case.name,
                    f.redis_us,
                    f.cpu_us,
                    f.wall_us,
                    f.wall_us / b
                );
            }
            continue;
        }
        let column = |value: &dyn Fn(&Figures) -> f64| {
            let (median, low, high) = median_spread(figures.iter().map(value).collect());
            format!("{median:.2} [{low:.2}–{high:.2}]")
        };
        let ratio = median_spread(
            figures
                .iter()
                .zip(&bare)
                .map(|(f, b)| f.wall_us / b)
                .collect(),
        );
        println!(
            "| {} | {} | {} | {} | {:.2} [{:.2}–{:.2}] |",
            case.name,
            column(&|f| f.redis_us),
            column(&|f| f.cpu_us),
            column(&|f| f.wall_us),
            ratio.0,
            ratio.1,
            ratio.2
        );
    }
}
