//! `cargo xtask`: the project's build-and-check tasks (rust-analyzer's
//! convention). One file per task; this file only dispatches.
//!
//! Every task reports a failure as one line on stderr and exits non-zero;
//! none of them panics on a missing tool or library.

mod attack;
mod bindgen;
mod build_and_check;
mod capi_header;
mod circles;
mod perf;
mod softroce;
mod tidy;
mod wheel;
mod workspace;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [args]

tasks:
  tidy                 check ARCHITECTURE.md's invariants (also runs as a test)
  circles [CRATE_DIR...]
                       import circles between a crate's files (every crate under
                       crates/ by default), then its files in layering order
  attack [--seconds N] [--keep]
                       start `orbitte serve` and attack it (pre-auth floods, huge
                       announced frames, log injection, slow readers, frame
                       mutation for N s); check it lives, stays bounded and serves
  perf [--seconds S] [--rounds N] [--docs] [--no-build] [--from FILE]
                       the release orbitte's throughput matrix (tcp, local, rdma-sim)
                       next to its baselines; writes target/perf/ (--docs: docs/performance.md)
  softroce build|run|test  native verbs tests on Soft-RoCE in a qemu guest (docs/testing.md)
  bindgen [--check] [--expect-llvm N] [--libclang-version]
                       regenerate orbitte-verbs-sys's bindings (--check: fail on drift;
                       --expect-llvm: fail unless the libclang loaded is LLVM N)
  wheel [--out DIR] [--debug] [--venv DIR]
                       the release wheel users pip install (abi3, manylinux_2_28,
                       built by maturin with zig; writes target/wheels/); with
                       NIXL_INCLUDE_DIR set it carries the NIXL plugin too
  capi-header [--check]
                       regenerate orbitte-capi's C header include/orbitte.h with
                       cbindgen (--check: fail on drift)
  build-and-check [--no-cargo] [--venv DIR]
                       the build matrix: toolchain report, prerequisites, bindgen --check
                       under each libclang (--venv: also PyPI's libclang and ziglang
                       wheels in DIR), fmt, clippy, tests, docs
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let result = match task.as_str() {
        "tidy" => tidy::run(rest),
        "circles" => circles::run(rest),
        "attack" => attack::run(rest),
        "perf" => perf::run(rest),
        "softroce" => softroce::run(rest),
        "bindgen" => bindgen::run(rest),
        "capi-header" => capi_header::run(rest),
        "wheel" => wheel::run(rest),
        "build-and-check" => build_and_check::run(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!(
            "unknown task `{other}`; run `cargo xtask help` for the list"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("xtask {task}: {msg}");
            ExitCode::FAILURE
        }
    }
}
