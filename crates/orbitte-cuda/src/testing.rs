//! Test support (feature `testing`, off by default): a fake `libcuda.so.1`
//! so the driver paths run without a GPU.
//!
//! The stub ([`STUB_SOURCE`], `testing/stub_libcuda.c`) exports exactly the
//! driver functions this crate may call (and one test control,
//! `orbitte_stub_fail_syncs`, for processes that load it themselves). Its
//! "device memory" is an address range reserved without access, as a GPU's
//! is to the host, whose bytes only the stub's copies reach; its copies
//! really move bytes, asynchronously: a worker thread
//! does each stream's copies in order, only once something waits for them
//! (`cuStreamSynchronize`, `cuStreamQuery`, `cuCtxSynchronize`, a free), so
//! a missing wait reads stale bytes. `ORBITTE_STUB_MODE` picks the
//! behaviour (`no-device`, `zero-devices`, `fake-gpu`),
//! `ORBITTE_STUB_COPY_DELAY_US=N` also starts copies N µs after they were
//! issued without a wait, and `ORBITTE_STUB_FAIL_SYNC_AFTER=N` makes every
//! `cuStreamSynchronize` after the first N fail.
//!
//! The loader reads `LD_LIBRARY_PATH` only at process start, so a test
//! suite uses the stub by re-running its own binary as a child:
//! [`StubHarness::run_child`] compiles the stub with `cc` into a temporary
//! directory, puts it first on the child's `LD_LIBRARY_PATH` and selects one
//! `#[ignore]`d `child_*` test; that test starts with
//! [`StubHarness::is_child`]. The parent requires that the child ran
//! exactly one test and passed, so a panic anywhere in the child fails it.
//! Without `cc` the parent prints `skipped: ...`, except under `CI=true`,
//! where `cc` is installed and its absence is a failure.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The C source of the stub driver.
pub const STUB_SOURCE: &str = include_str!("../testing/stub_libcuda.c");

/// Which stub driver to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StubKind {
    /// Every driver function this crate calls.
    #[default]
    Complete,
    /// Without `cuMemcpyHtoDAsync_v2`: a driver that lacks a symbol.
    WithoutHtoD,
}

/// Why the stub driver could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StubBuildError {
    /// The C source could not be written into the directory.
    #[error("cannot write the stub driver source to {path}: {source}")]
    Source {
        /// Where it was to go.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `cc` could not be started (not installed?).
    #[error("cannot run cc: {0}")]
    Spawn(#[source] std::io::Error),
    /// `cc` rejected the source.
    #[error("cc failed: {stderr}")]
    Compile {
        /// What `cc` printed on stderr.
        stderr: String,
    },
    /// `libcuda.so.1` could not be copied to `libcuda.so`.
    #[error("{0}")]
    Copy(#[source] std::io::Error),
}

/// Compiles the stub into `dir` as `libcuda.so.1` and `libcuda.so` (cudarc
/// tries the unversioned name first, and a system copy must not win);
/// returns the path of `libcuda.so.1`.
pub fn build_stub_driver(dir: &Path, kind: StubKind) -> Result<PathBuf, StubBuildError> {
    let src = dir.join("stub_libcuda.c");
    std::fs::write(&src, STUB_SOURCE).map_err(|source| StubBuildError::Source {
        path: src.clone(),
        source,
    })?;
    let out = dir.join("libcuda.so.1");
    let mut cmd = Command::new("cc");
    cmd.args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-lpthread");
    if kind == StubKind::WithoutHtoD {
        cmd.arg("-DOMIT_HTOD");
    }
    let result = cmd.output().map_err(StubBuildError::Spawn)?;
    if !result.status.success() {
        return Err(StubBuildError::Compile {
            stderr: String::from_utf8_lossy(&result.stderr).into_owned(),
        });
    }
    std::fs::copy(&out, dir.join("libcuda.so")).map_err(StubBuildError::Copy)?;
    Ok(out)
}

/// A test binary that re-runs its own `#[ignore]`d child entries against the
/// stub driver (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct StubHarness {
    child_var: &'static str,
    suite: &'static str,
}

impl StubHarness {
    /// A harness whose children are told apart by environment variable
    /// `child_var` (set to the child's name); `suite` names the parent tests
    /// in the message of an entry run outside a child.
    pub const fn new(child_var: &'static str, suite: &'static str) -> Self {
        Self { child_var, suite }
    }

    /// Builds `kind` of stub and runs child entry `child` of this test
    /// binary with `ORBITTE_STUB_MODE=mode` and `env`; returns the child's
    /// output, or `None` (after printing `skipped: ...`) when there is no C
    /// compiler outside CI.
    ///
    /// # Panics
    /// When the child fails or does not run exactly one test, when the stub
    /// cannot be built under `CI=true`, or when no temporary directory can
    /// be made: this is test support, and a panic fails the calling test.
    pub fn run_child(
        &self,
        child: &str,
        mode: &str,
        kind: StubKind,
        env: &[(&str, &str)],
    ) -> Option<String> {
        let dir = tempfile::tempdir().expect("temporary directory");
        if let Err(e) = build_stub_driver(dir.path(), kind) {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("CI has a C compiler, but building the stub driver failed: {e}");
            }
            println!("skipped: no C compiler for the stub driver ({e})");
            return None;
        }
        let mut path = OsString::from(dir.path());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = Command::new(exe);
        cmd.args([
            child,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", path)
        .env("ORBITTE_STUB_MODE", mode)
        .env(self.child_var, child)
        .env_remove("ORBITTE_STUB_FAIL_SYNC_AFTER")
        .env_remove("ORBITTE_STUB_COPY_DELAY_US");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run the child test");
        let text = format!(
            "{}\n--- stderr ---\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "child {child} failed ({}):\n{text}",
            out.status
        );
        assert!(
            text.contains("1 passed"),
            "child {child} did not run exactly one test:\n{text}"
        );
        println!("{text}");
        Some(text)
    }

    /// Whether this process is the child for entry `name` (else the entry
    /// should do nothing: it says so and returns false).
    pub fn is_child(&self, name: &str) -> bool {
        let me = std::env::var(self.child_var).as_deref() == Ok(name);
        if !me {
            println!(
                "skipped: {name} runs only as a child of the {} tests",
                self.suite
            );
        }
        me
    }
}
