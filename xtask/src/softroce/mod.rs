//! `cargo xtask softroce build|run|test`: real verbs without RDMA hardware.
//!
//! Our machines' kernel has no RDMA support, but a Debian guest kernel under
//! qemu has `rdma_rxe` (Soft-RoCE). `build` makes a guest image from Debian
//! packages (`ci/softroce/build-image.sh`), cached under `.softroce-cache/`
//! by a hash of its inputs; `run -- CMD` boots it, creates `rxe0` on the
//! guest's eth0 and runs CMD in the shared work folder with its output and
//! exit status passed through; `test` builds the native test suites on the
//! host and runs them in the guest against `rxe0`. docs/testing.md explains
//! what each proves; /work/shared/softroce.md the facts it rests on.
//!
//! Every failure is one line naming the cause and the fix; every wait is
//! bounded; qemu never outlives the task (see `guest.rs`).

mod guest;
mod host;
mod image;
mod suites;

use std::path::PathBuf;
use std::time::Duration;

const USAGE: &str = "\
usage: cargo xtask softroce <build|run|test> [options]

  build [--rebuild]          make the guest image (root, network to the Debian mirror)
  run [--timeout SECS] -- CMD
                             boot the guest, run CMD (a shell command line) in the
                             work folder with ORBITTE_TEST_DEVICE=rxe0, pass its
                             output and exit status through, power off
  test [--timeout SECS] [--wheel PATH] [-- TEST-ARGS]
                             build the native test suites on the host and run them
                             in the guest against rxe0, after a smoke check; the
                             Python suite installs the orbitte wheel PATH (else
                             ORBITTE_WHEEL, else one built with maturin) in the guest

environment: SOFTROCE_MIRROR (Debian mirror), SOFTROCE_CACHE (image cache folder),
SOFTROCE_ACCEL (tcg|kvm, default: kvm only where it really works), SOFTROCE_QEMU,
SOFTROCE_BOOT_TIMEOUT and SOFTROCE_BUILD_TIMEOUT (seconds), SOFTROCE_KERNEL
(vmlinux|bzimage), SOFTROCE_VERBOSE=1 (show the guest's boot messages)
";

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let Some((sub, rest)) = args.split_first() else {
        return Err(format!("missing subcommand\n{USAGE}"));
    };
    match sub.as_str() {
        "build" => {
            let rebuild = match rest {
                [] => false,
                [flag] if flag == "--rebuild" => true,
                _ => return Err(format!("unexpected arguments {rest:?}\n{USAGE}")),
            };
            image::ensure(rebuild).map(drop)
        }
        "run" => {
            let Options {
                timeout,
                wheel,
                rest: cmd,
            } = options(rest, Duration::from_secs(1800))?;
            if wheel.is_some() {
                return Err(format!("`--wheel` is an option of `test`\n{USAGE}"));
            }
            if cmd.is_empty() {
                return Err(format!("`run` needs a command after `--`\n{USAGE}"));
            }
            guest::qemu()?;
            let image = image::ensure(false)?;
            let rc = guest::run(&image, &cmd.join(" "), timeout)?;
            exit_with(rc)
        }
        "test" => {
            let Options {
                timeout,
                wheel,
                rest: test_args,
            } = options(rest, Duration::from_secs(2400))?;
            let rc = suites::run(&test_args, timeout, wheel)?;
            exit_with(rc)
        }
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown subcommand `{other}`\n{USAGE}")),
    }
}

/// What `run` and `test` take before `--`, and what follows it.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    timeout: Duration,
    wheel: Option<PathBuf>,
    rest: Vec<String>,
}

/// Parses `[--timeout SECS] [--wheel PATH] [-- REST...]`.
fn options(args: &[String], default: Duration) -> Result<Options, String> {
    let mut opts = Options {
        timeout: default,
        wheel: None,
        rest: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--" => {
                opts.rest = it.cloned().collect();
                return Ok(opts);
            }
            "--timeout" => {
                let secs = it
                    .next()
                    .and_then(|s| s.parse::<u64>().ok())
                    .filter(|&s| s > 0)
                    .ok_or("`--timeout` needs a positive number of seconds")?;
                opts.timeout = Duration::from_secs(secs);
            }
            "--wheel" => {
                let path = it
                    .next()
                    .filter(|p| !p.is_empty())
                    .ok_or("`--wheel` needs the path of an orbitte wheel (.whl)")?;
                opts.wheel = Some(PathBuf::from(path));
            }
            other => return Err(format!("unexpected argument `{other}`\n{USAGE}")),
        }
    }
    Ok(opts)
}

/// Passes the guest command's exit status through as the task's own.
fn exit_with(rc: i32) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        // Everything that owned a process or a file has been dropped by now.
        std::process::exit(rc.clamp(1, 255))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_take_a_timeout_and_everything_after_the_separator() {
        let d = Duration::from_secs(7);
        let o = options(&strings(&["--timeout", "90", "--", "ls", "-l"]), d).unwrap();
        assert_eq!(o.timeout, Duration::from_secs(90));
        assert_eq!(o.rest, strings(&["ls", "-l"]));
        let o = options(&strings(&["--", "--timeout", "3"]), d).unwrap();
        assert_eq!(o.timeout, d);
        assert_eq!(o.rest, strings(&["--timeout", "3"]));
        assert_eq!(
            options(&[], d).unwrap(),
            Options {
                timeout: d,
                wheel: None,
                rest: Vec::new()
            }
        );
        let o = options(&strings(&["--wheel", "/w/o.whl", "--", "x"]), d).unwrap();
        assert_eq!(o.wheel, Some(PathBuf::from("/w/o.whl")));
        assert_eq!(o.rest, strings(&["x"]));
    }

    #[test]
    fn bad_options_are_errors_naming_the_argument() {
        let d = Duration::from_secs(7);
        for bad in [&["--timeout"][..], &["--timeout", "0"], &["--timeout", "x"]] {
            let err = options(&strings(bad), d).unwrap_err();
            assert!(err.contains("positive number of seconds"), "{err}");
        }
        let err = options(&strings(&["ls"]), d).unwrap_err();
        assert!(err.starts_with("unexpected argument `ls`"), "{err}");
        let err = options(&strings(&["--wheel"]), d).unwrap_err();
        assert!(err.contains("path of an orbitte wheel"), "{err}");
    }

    #[test]
    fn run_without_a_command_is_an_error_before_anything_starts() {
        let err = run(&strings(&["run", "--"])).unwrap_err();
        assert!(err.starts_with("`run` needs a command"), "{err}");
        let err = run(&strings(&["run", "--wheel", "w.whl", "--", "true"])).unwrap_err();
        assert!(err.starts_with("`--wheel` is an option of `test`"), "{err}");
        let err = run(&strings(&["boot"])).unwrap_err();
        assert!(err.starts_with("unknown subcommand `boot`"), "{err}");
    }
}
