//! The `orbitte` command: doctor, topology, bench, serve. The binary
//! (`src/main.rs`) and the Python wheel's `orbitte` script both call
//! [`run_command`].
//!
//! Exit status: 0 success; 1 the command ran and found a problem (a path
//! that does not work, a failed transfer); 2 bad usage or a bad config file.
//! Every error is one line naming the problem and the fix, never a panic
//! backtrace.
#![forbid(unsafe_code)]

mod bench;
mod chart;
mod cli;
mod config;
mod descriptors;
mod doctor;
mod exporter;
mod failure;
mod memory;
mod metadata;
mod pattern;
mod schema;
mod serve;
mod stats;
mod topology;

use std::ffi::OsString;

use clap::Parser;

use failure::{EXIT_USAGE, Failure};

/// Runs the command line `args` (the first is the program's name) and
/// returns the exit status.
pub fn run_command<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return 0;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return EXIT_USAGE;
            }
            // clap's message is several lines; keep the ones before the
            // usage (they name the problem) on one line, and point at
            // --help for the fix.
            let text = e.to_string();
            let problem: Vec<&str> = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
                .collect();
            let problem = problem.join(" ");
            let problem = problem.strip_prefix("error: ").unwrap_or(&problem);
            let problem = if problem.is_empty() {
                "invalid arguments"
            } else {
                problem
            };
            eprintln!("orbitte: {problem}; see `orbitte --help`");
            return EXIT_USAGE;
        }
    };
    match run(cli) {
        Ok(()) => 0,
        Err(f) => {
            // One line, whatever the wrapped error's text looks like.
            let line: Vec<&str> = f
                .message
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            eprintln!("orbitte: {}", line.join(" "));
            f.code
        }
    }
}

fn run(cli: cli::Cli) -> Result<(), Failure> {
    let log = cli.log.clone().unwrap_or_else(|| {
        match cli.command {
            cli::Command::Serve(_) => "info",
            _ => "warn",
        }
        .to_owned()
    });
    let filter = tracing_subscriber::EnvFilter::try_new(&log).map_err(|e| {
        Failure::usage(format!(
            "bad --log filter `{log}`: {e}; use e.g. `warn`, `info` or `orbitte_engine=debug`"
        ))
    })?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .map_err(|e| Failure::failed(format!("cannot install the log subscriber: {e}")))?;
    match cli.command {
        cli::Command::Topology(args) => topology::run(&args),
        cli::Command::Bench(args) => bench::run(&args),
        cli::Command::Doctor(args) => doctor::run(&args),
        cli::Command::Serve(args) => serve::run(&args),
    }
}
