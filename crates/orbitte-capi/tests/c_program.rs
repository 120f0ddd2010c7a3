//! The C test programs in `tests/c/`, compiled with the platform's C
//! compiler (the `cc` crate finds it) against `include/orbitte.h` alone,
//! linked to the `liborbitte_capi.so` cargo built for this test, and run.
//! A missing C compiler fails the test: the C API is only shown working
//! from C.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding the `liborbitte_capi.so` built with this test:
/// beside it (`target/<profile>/deps`). The copy cargo puts in the
/// profile's directory is not refreshed by a test build, so it is never
/// used, and the programs run with this directory alone as their library
/// path (cargo's `LD_LIBRARY_PATH` names the profile's directory first).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let deps = exe.parent().expect("the test sits in a directory");
    assert!(
        deps.join("liborbitte_capi.so").is_file(),
        "liborbitte_capi.so is not beside {}: build the crate's cdylib (cargo test -p orbitte-capi)",
        exe.display()
    );
    deps.to_path_buf()
}

/// A command running the compiled program `exe` against the library built
/// with this test.
fn program(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.env("LD_LIBRARY_PATH", library_dir());
    cmd
}

/// Compiles `source` into an executable in `out_dir` and returns its path.
fn compile(source: &Path, out_dir: &Path) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let compiler = cc::Build::new()
        .target(&target)
        .host(&target)
        .opt_level(0)
        .cargo_metadata(false)
        .warnings(true)
        .extra_warnings(true)
        .flag("-Werror")
        .flag("-std=c11")
        .get_compiler();
    let exe = out_dir.join(source.file_stem().expect("a file name"));
    let mut cmd = compiler.to_command();
    cmd.arg("-D_GNU_SOURCE")
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(source)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lorbitte_capi");
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run the C compiler {cmd:?}: {e}; install one (gcc or clang)")
    });
    assert!(
        out.status.success(),
        "compiling {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs `cmd` and returns its standard output; a failed run fails the
/// test with both outputs.
fn run_ok(mut cmd: Command) -> String {
    let out = cmd.output().expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the C program failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// A scratch directory of one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("orbitte-capi-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_c_program_moves_bytes_and_notifications_through_the_c_api() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = Scratch::new("roundtrip");
    let exe = compile(&manifest.join("tests/c/roundtrip.c"), &scratch.0);
    let mut cmd = program(&exe);
    cmd.env_remove("ORBITTE_SECRET_FILE");
    let stdout = run_ok(cmd);
    for line in [
        "write: ",
        "read: ",
        "notify: received from capi-initiator",
        "bad call: -4",
        "all checks passed",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
}

#[test]
fn an_engine_created_without_a_secret_file_takes_the_one_orbitte_secret_file_names() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = Scratch::new("secret");
    let exe = compile(&manifest.join("tests/c/secret.c"), &scratch.0);
    let (by_env, same, other) = (
        scratch.0.join("by-env"),
        scratch.0.join("same"),
        scratch.0.join("other"),
    );
    for (file, byte) in [(&by_env, 0x5a), (&same, 0x5a), (&other, 0xa5)] {
        std::fs::write(file, [byte; 32]).expect("write a secret file");
    }
    let mut cmd = program(&exe);
    cmd.env("ORBITTE_SECRET_FILE", &by_env)
        .arg(&same)
        .arg(&other);
    let stdout = run_ok(cmd);
    assert!(stdout.contains("stranger: "), "{stdout}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

#[test]
fn an_engine_with_a_listener_token_lets_in_only_peers_handed_its_connection_info() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = Scratch::new("token");
    let exe = compile(&manifest.join("tests/c/token.c"), &scratch.0);
    let mut cmd = program(&exe);
    cmd.env_remove("ORBITTE_SECRET_FILE");
    let stdout = run_ok(cmd);
    for line in ["guesser: ", "stranger: ", "all checks passed"] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
}

#[test]
fn device_memory_is_offered_only_where_the_cuda_driver_has_a_device() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = Scratch::new("device");
    let exe = compile(&manifest.join("tests/c/device.c"), &scratch.0);
    let mut cmd = program(&exe);
    cmd.env_remove("ORBITTE_SECRET_FILE");
    let stdout = run_ok(cmd);
    assert!(
        stdout.contains("host memory as device memory: "),
        "{stdout}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

/// Why the kernel refuses same-host copies here, with the fix, if it does.
fn cma_refused() -> Option<String> {
    orbitte_capi::same_host_copies_refused()
        .map(|why| format!("{why}: sysctl -w kernel.yama.ptrace_scope=0 (.ci/run sets it)"))
}

#[test]
fn same_host_engines_with_the_cma_flag_copy_caller_memory_through_the_kernel() {
    if let Some(why) = cma_refused() {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true and {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = Scratch::new("cma");
    let exe = compile(&manifest.join("tests/c/cma.c"), &scratch.0);
    let mut cmd = program(&exe);
    cmd.env_remove("ORBITTE_SECRET_FILE");
    let stdout = run_ok(cmd);
    for line in [
        "same host: \"cma-target\" is pid ",
        "without the flag: \"cma-target\" over the engine's paths: this engine was created without ORBITTE_ENGINE_CMA",
        "outside: -4",
        "unloaded: ",
        "all checks passed",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
}
