//! `cargo xtask wheel`: the release wheel users install with pip.
//!
//! One abi3 wheel (CPython 3.10 and later) tagged manylinux_2_28, built by
//! maturin with zig as the linker so it runs on any x86-64 Linux with
//! glibc 2.28 or newer, whatever this machine's glibc is. maturin and
//! ziglang come from PyPI into a virtual environment under `target/`, so
//! the only prerequisites are the Rust toolchain and Python 3 with venv.
//!
//! With `NIXL_INCLUDE_DIR` set (NIXL's headers, docs/nixl-plugin.md) the
//! wheel also carries the NIXL plugin as `orbitte/nixl_plugin/
//! libplugin_OrbitTE.so`: its C++ shim is compiled by the system C++
//! compiler (NIXL's ABI is libstdc++'s) and the library is linked by zig
//! against glibc 2.28, with libstdc++ taken by its path.

use std::path::{Path, PathBuf};
use std::process::Command;

const USAGE: &str = "usage: cargo xtask wheel [--out DIR] [--debug] [--venv DIR]";

/// Where the package keeps the plugin (git-ignored; pyproject.toml's
/// `include` puts it in the wheel).
const PLUGIN_IN_PACKAGE: &str = "crates/orbitte-py/python/orbitte/nixl_plugin/libplugin_OrbitTE.so";

/// The wheel's build settings, from the task's arguments.
#[derive(Debug, PartialEq, Eq)]
struct Settings {
    out: PathBuf,
    release: bool,
    venv: PathBuf,
}

fn parse(args: &[String], root: &Path) -> Result<Settings, String> {
    let mut s = Settings {
        out: root.join("target/wheels"),
        release: true,
        venv: root.join("target/wheel-venv"),
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
            "--venv" => {
                let dir = it
                    .next()
                    .ok_or_else(|| format!("--venv takes a folder; {USAGE}"))?;
                s.venv = root.join(dir);
            }
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
    let venv = s.venv.clone();
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
    let plugin = nixl_plugin(&root, &bin, &joined, s.release)?;
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
    match plugin {
        Some(p) => println!(
            "NIXL plugin: {p} is in the wheel (python -m orbitte.nixl_plugin prints its NIXL_PLUGIN_DIR)"
        ),
        None => println!(
            "NIXL plugin: none; NIXL_INCLUDE_DIR is not set, so the wheel has no libplugin_OrbitTE.so \
             (set it to NIXL's include folder, docs/nixl-plugin.md)"
        ),
    }
    println!("install it with: pip install {}", wheel.display());
    Ok(())
}

/// Builds the NIXL plugin for the wheel and puts it in the package; None
/// (and no stale plugin left there) without `NIXL_INCLUDE_DIR`.
fn nixl_plugin(
    root: &Path,
    bin: &Path,
    path: &std::ffi::OsStr,
    release: bool,
) -> Result<Option<String>, String> {
    let dest = root.join(PLUGIN_IN_PACKAGE);
    if std::env::var_os("NIXL_INCLUDE_DIR").is_none_or(|d| d.is_empty()) {
        if dest.exists() {
            std::fs::remove_file(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        }
        return Ok(None);
    }
    // libstdc++ of the compiler the cc crate uses (CXX, else c++).
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let out = Command::new(&cxx)
        .arg("-print-file-name=libstdc++.so")
        .output()
        .map_err(|e| format!("cannot start {cxx} (the C++ compiler for the NIXL plugin): {e}"))?;
    let libstdcxx = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || !Path::new(&libstdcxx).is_absolute() {
        return Err(format!(
            "{cxx} -print-file-name=libstdc++.so gave `{libstdcxx}`: install g++ (libstdc++ development files)"
        ));
    }
    // zig as the linker, against glibc 2.28, through maturin (which drops
    // the arguments zig refuses).
    let target = root.join("target/nixl-wheel");
    std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    let linker = target.join("zigcc.sh");
    std::fs::write(
        &linker,
        format!(
            "#!/bin/sh\nexec \"{}\" zig cc -- -target x86_64-linux-gnu.2.28 \"$@\"\n",
            bin.join("maturin").display()
        ),
    )
    .map_err(|e| format!("{}: {e}", linker.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&linker, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", linker.display()))?;
    }
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    cargo
        .current_dir(root)
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER", &linker)
        .env("ORBITTE_NIXL_LIBSTDCXX", &libstdcxx)
        .args(["build", "-p", "orbitte-nixl", "--lib"]);
    if release {
        cargo.arg("--release");
    }
    run_step(
        "building the NIXL plugin (cargo build -p orbitte-nixl)",
        &mut cargo,
    )?;
    let built = target
        .join(if release { "release" } else { "debug" })
        .join("libplugin_OrbitTE.so");
    std::fs::copy(&built, &dest)
        .map_err(|e| format!("copying {} to {}: {e}", built.display(), dest.display()))?;
    Ok(Some("orbitte/nixl_plugin/libplugin_OrbitTE.so".to_owned()))
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
                release: true,
                venv: PathBuf::from("/r/target/wheel-venv"),
            }
        );
        let args = ["--out", "dist", "--debug", "--venv", "target/py-venv"].map(str::to_owned);
        assert_eq!(
            parse(&args, root).unwrap(),
            Settings {
                out: PathBuf::from("/r/dist"),
                release: false,
                venv: PathBuf::from("/r/target/py-venv"),
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
