//! The `orbitte` command: doctor, topology, bench, serve.
//!
//! Exit status: 0 success; 1 the command ran and found a problem (a path
//! that does not work, a failed transfer); 2 bad usage or a bad config file.
//! Every error is one line naming the problem and the fix, never a panic
//! backtrace.
#![forbid(unsafe_code)]

mod chart;
mod cli;
mod stats;
mod topology;

use std::process::ExitCode;

use clap::Parser;

/// An error that ends the command: its one-line message and exit status.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    /// Bad usage or configuration (exit status 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }
    /// The command ran and what it checked does not work (exit status 1).
    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Self {
            code: 1,
            message: message.into(),
        }
    }
}

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            // clap's message is several lines; keep the first, which names
            // the problem, and point at --help for the fix.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("orbitte: {first}; see `orbitte --help`");
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("orbitte: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run(cli: cli::Cli) -> Result<(), Failure> {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .map_err(|e| Failure::usage(format!("bad --log filter `{}`: {e}", cli.log)))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        cli::Command::Topology(args) => topology::run(&args),
        cli::Command::Doctor(_)
        | cli::Command::Bench(_)
        | cli::Command::Serve(_) => Err(Failure::failed(
            "this command is not implemented yet in this build",
        )),
    }
}
