//! Replay recorded traffic through a per-key limiter, to tune a policy before
//! deploying it.
//!
//! ```text
//! cargo run --release --example replay -- --algorithm sliding-window --limit 100 --window-ms 60000 < trace.csv
//! ```
//!
//! Input lines are `time_ms,key,n` (`n` defaults to 1; an empty key is a request
//! without one; `#` starts a comment line). `--help` lists every option.

use std::io::{self, Write};
use std::process::ExitCode;

#[path = "shared/replay.rs"]
mod replay;

fn main() -> ExitCode {
    let options = match replay::parse_args(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(replay::ArgsError::Help) => {
            print!("{}", replay::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let stdin = io::stdin().lock();
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut err = io::stderr().lock();
    let result = replay::run(&options, stdin, &mut out, &mut err).and_then(|()| out.flush());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): nothing left to say.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
            eprintln!("replay: {e} (--help lists the options)");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("replay: {e}");
            ExitCode::FAILURE
        }
    }
}
