//! The C test programs in `tests/c/`, compiled with the platform's C
//! compiler (the `cc` crate finds it) against `include/orbitte.h` alone,
//! linked to the `liborbitte_capi.so` cargo built for this test, and run.
//! A missing C compiler fails the test: the C API is only shown working
//! from C.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding the `liborbitte_capi.so` built with this test.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let deps = exe.parent().expect("the test sits in a directory");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        if dir.join("liborbitte_capi.so").is_file() {
            return dir.to_path_buf();
        }
    }
    panic!(
        "liborbitte_capi.so is not beside {} nor in its parent: build the crate's cdylib (cargo test -p orbitte-capi)",
        deps.display()
    );
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

#[test]
fn a_c_program_moves_bytes_and_notifications_through_the_c_api() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = std::env::temp_dir().join(format!("orbitte-capi-test-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).expect("a scratch directory");
    let exe = compile(&manifest.join("tests/c/roundtrip.c"), &out_dir);
    let out = Command::new(&exe)
        .env_remove("ORBITTE_SECRET_FILE")
        .output()
        .expect("run the C program");
    let _ = std::fs::remove_dir_all(&out_dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the C program failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
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
