//! `cargo xtask wheel`: the release wheel users install with pip.
//!
//! One abi3 wheel (CPython 3.10 and later) tagged manylinux_2_28, built by
//! maturin with zig as the linker so it runs on any x86-64 Linux with
//! glibc 2.28 or newer, whatever this machine's glibc is. maturin and
//! ziglang come from PyPI into a virtual environment under `target/`, so
//! the only prerequisites are the Rust toolchain and Python 3 with venv.

use std::path::{Path, PathBuf};
use std::process::Command;

const USAGE: &str = "usage: cargo xtask wheel [--out DIR] [--debug]";

/// The wheel's build settings, from the task's arguments.
#[derive(Debug, PartialEq, Eq)]
struct Settings {
    out: PathBuf,
    release: bool,
}

fn parse(args: &[String], root: &Path) -> Result<Settings, String> {
    let mut s = Settings {
        out: root.join("target/wheels"),
        release: true,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => {
                let dir = it
                    .next()
                    .ok_or_else(|| format!("--out takes a folder; {USAGE}"))?;
                s.out = root.join(dir);
            }
            "--debug" => s.release = false,
            other => return Err(format!("unexpected argument `{other}`; {USAGE}")),
        }
    }
    Ok(s)
}

fn run_step(what: &str, cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("{what}: cannot start {:?}: {e}", cmd.get_program()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let root = crate::workspace::root();
    let s = parse(args, &root)?;
    let venv = root.join("target/wheel-venv");
    let bin = venv.join("bin");
    if !bin.join("maturin").exists() {
        run_step(
            "creating target/wheel-venv (Debian and Ubuntu need the python3-venv package)",
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
        )?;
        run_step(
            "installing maturin and ziglang from PyPI",
            Command::new(bin.join("pip")).args(["install", "-q", "maturin>=1.5,<2", "ziglang"]),
        )?;
    }
    // maturin finds zig as `python -m ziglang` of the first python on PATH.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin.clone()];
    paths.extend(std::env::split_paths(&path));
    let joined = std::env::join_paths(paths).map_err(|e| format!("PATH: {e}"))?;
    let mut maturin = Command::new(bin.join("maturin"));
    maturin
        .env("PATH", joined)
        .args(["build", "--zig", "--compatibility", "manylinux_2_28", "-i"])
        .arg(bin.join("python"))
        .arg("-m")
        .arg(root.join("crates/orbitte-py/Cargo.toml"))
        .arg("-o")
        .arg(&s.out);
    if s.release {
        maturin.arg("--release");
    }
    run_step("maturin build", &mut maturin)?;
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(&s.out)
        .map_err(|e| format!("{}: {e}", s.out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("orbitte-") && n.ends_with(".whl"))
        })
        .collect();
    wheels.sort();
    let wheel = wheels
        .last()
        .ok_or_else(|| format!("maturin wrote no orbitte wheel into {}", s.out.display()))?;
    println!("wheel: {}", wheel.display());
    println!("install it with: pip install {}", wheel.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_choose_the_folder_and_the_profile() {
        let root = Path::new("/r");
        assert_eq!(
            parse(&[], root).unwrap(),
            Settings {
                out: PathBuf::from("/r/target/wheels"),
                release: true
            }
        );
        let args = ["--out".to_owned(), "dist".to_owned(), "--debug".to_owned()];
        assert_eq!(
            parse(&args, root).unwrap(),
            Settings {
                out: PathBuf::from("/r/dist"),
                release: false
            }
        );
        assert!(
            parse(&["--out".to_owned()], root)
                .unwrap_err()
                .contains("folder")
        );
        assert!(
            parse(&["--fast".to_owned()], root)
                .unwrap_err()
                .contains("--fast")
        );
    }
}
