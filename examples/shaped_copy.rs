//! Copy bytes at a set rate through `turnstile::io::ShapedWrite`, and print
//! the rate achieved and the writer's wake-ups.
//!
//! ```text
//! cargo run --release --example shaped_copy                      # 1 MB/s for 10 s over loopback TCP
//! cargo run --release --example shaped_copy -- --rate 1000000000 --burst 16777215
//! cargo run --release --example shaped_copy -- --file SRC DST --rate 50000000
//! cargo run --release --example shaped_copy -- --sink --rate 1000000000 --burst 16777215
//! ```
//!
//! Socket mode (the default) writes `rate × seconds` bytes beyond the
//! burst into a loopback TCP connection whose other end only counts them,
//! and times the copy from the first write to the last byte received:
//! the achieved rate is the bytes beyond the burst over that time. It exits
//! with failure when the rate is off by more than 1%. `--sink` writes into
//! `tokio::io::sink()` instead, timing the writer alone: the shaper at rates
//! a machine's loopback cannot carry. File mode copies SRC to DST through a
//! shaped reader.
//!
//! The writer's task runs under a waker that counts its wake-ups: each wait
//! for the limiter is one wake-up, and a full socket buffer adds its own.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Wake, Waker};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use turnstile::io::{ShapedRead, ShapedWrite};
use turnstile::{Quota, RateLimiter};

struct Options {
    rate: u64,
    burst: u32,
    seconds: u64,
    chunk: u32,
    file: Option<(String, String)>,
    /// Write into `tokio::io::sink()` instead of a socket: the shaper alone,
    /// for rates a machine's loopback cannot carry.
    sink: bool,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        rate: 1_000_000,
        burst: 64 * 1024,
        seconds: 10,
        chunk: 64 * 1024,
        file: None,
        sink: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--rate" => options.rate = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--burst" => options.burst = value()?.parse().map_err(|e| format!("--burst: {e}"))?,
            "--seconds" => {
                options.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            "--chunk" => options.chunk = value()?.parse().map_err(|e| format!("--chunk: {e}"))?,
            "--sink" => options.sink = true,
            "--file" => {
                let from = value()?;
                let to = args.next().ok_or("--file needs SRC and DST")?;
                options.file = Some((from, to));
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(options)
}

/// A waker that counts wake-ups and passes them on.
struct Counting {
    wakes: AtomicUsize,
    inner: Waker,
}

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        // Relaxed: a count, read once the writer's task has finished.
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.inner.wake_by_ref();
    }
}

/// Run `f` under a counting waker: its output, polls and wake-ups.
async fn counted<T>(f: impl Future<Output = T>) -> (T, usize, usize) {
    let mut f = std::pin::pin!(f);
    let mut polls = 0;
    let mut counter: Option<Arc<Counting>> = None;
    let out = std::future::poll_fn(|cx| {
        let counter = counter.get_or_insert_with(|| {
            Arc::new(Counting {
                wakes: AtomicUsize::new(0),
                inner: cx.waker().clone(),
            })
        });
        let waker = Waker::from(Arc::clone(counter));
        polls += 1;
        f.as_mut().poll(&mut Context::from_waker(&waker))
    })
    .await;
    // Relaxed: as in `wake_by_ref`.
    let wakes = counter.map_or(0, |c| c.wakes.load(Ordering::Relaxed));
    (out, polls, wakes)
}

async fn socket(options: &Options, limiter: RateLimiter) -> std::io::Result<bool> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let total = options.rate * options.seconds + u64::from(options.burst);
    let receiver = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut received = 0u64;
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>((received, Instant::now()));
            }
            received += n as u64;
        }
    });
    let stream = TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    let mut out = ShapedWrite::new(stream, limiter).chunk(options.chunk);
    let block = vec![0u8; 1 << 20];
    let start = Instant::now();
    let (written, polls, wakes) = counted(async {
        let mut left = total;
        while left > 0 {
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(block.len());
            out.write_all(&block[..n]).await?;
            left -= n as u64;
        }
        out.shutdown().await
    })
    .await;
    written?;
    let (received, end) = receiver.await.map_err(std::io::Error::other)??;
    report("socket", options, received, end - start, polls, wakes)
}

async fn sink(options: &Options, limiter: RateLimiter) -> std::io::Result<bool> {
    let total = options.rate * options.seconds + u64::from(options.burst);
    let mut out = ShapedWrite::new(tokio::io::sink(), limiter).chunk(options.chunk);
    let block = vec![0u8; 1 << 20];
    let start = Instant::now();
    let (written, polls, wakes) = counted(async {
        let mut left = total;
        while left > 0 {
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(block.len());
            out.write_all(&block[..n]).await?;
            left -= n as u64;
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    written?;
    let elapsed = start.elapsed();
    report("sink", options, total, elapsed, polls, wakes)
}

/// Print the rate achieved beyond the burst and the writer's wake-ups;
/// `true` when the rate is within 1%.
fn report(
    what: &str,
    options: &Options,
    moved: u64,
    elapsed: std::time::Duration,
    polls: usize,
    wakes: usize,
) -> std::io::Result<bool> {
    let beyond = moved.saturating_sub(u64::from(options.burst));
    let achieved = beyond as f64 / elapsed.as_secs_f64();
    let off = (achieved / options.rate as f64 - 1.0) * 100.0;
    // The waits the limiter alone forces: one per chunk beyond the burst.
    let chunk = u64::from(options.chunk.min(options.burst / 4).max(1));
    let waits = beyond.div_ceil(chunk);
    println!(
        "{what}: {moved} bytes in {:.3} s; beyond the burst of {}: {:.0} B/s against {} B/s ({off:+.3}%)",
        elapsed.as_secs_f64(),
        options.burst,
        achieved,
        options.rate
    );
    println!(
        "writer: {polls} polls, {wakes} wake-ups; at most {waits} waits for the limiter \
         (one per {chunk}-byte chunk beyond the burst)"
    );
    Ok(off.abs() <= 1.0)
}

async fn file(
    options: &Options,
    limiter: RateLimiter,
    from: &str,
    to: &str,
) -> std::io::Result<()> {
    let mut input =
        ShapedRead::new(tokio::fs::File::open(from).await?, limiter).chunk(options.chunk);
    let mut output = tokio::fs::File::create(to).await?;
    let start = Instant::now();
    let copied = tokio::io::copy(&mut input, &mut output).await?;
    output.flush().await?;
    let elapsed = start.elapsed();
    let beyond = copied.saturating_sub(u64::from(options.burst));
    println!(
        "file: {copied} bytes in {:.3} s; beyond the burst of {}: {:.0} B/s against {} B/s",
        elapsed.as_secs_f64(),
        options.burst,
        beyond as f64 / elapsed.as_secs_f64(),
        options.rate
    );
    Ok(())
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let quota = match Quota::per_second_with_burst(options.rate, options.burst) {
        Ok(quota) => quota,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "quota: {} bytes every {:?}, burst {} (time unit {:?})",
        quota.amount(),
        quota.period(),
        quota.capacity(),
        quota.time_unit()
    );
    let limiter = RateLimiter::new(quota);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match &options.file {
            Some((from, to)) => file(&options, limiter, from, to).await.map(|()| true),
            None if options.sink => sink(&options, limiter).await,
            None => socket(&options, limiter).await,
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("the achieved rate is off by more than 1%");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
