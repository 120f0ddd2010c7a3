//! The `orbitte` command: doctor, topology, bench, serve (see the
//! library's [`orbitte_cli::run_command`]).
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(orbitte_cli::run_command(std::env::args_os()))
}
