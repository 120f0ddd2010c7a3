//! `cargo xtask build-and-check [--no-cargo] [--venv DIR]`: the build
//! matrix on this machine.
//!
//! 1. Prints the OS release, GCC/G++ and every clang and libclang found,
//!    each libclang with the version it reports itself. `LIBCLANG_PATH`
//!    (with `BINDGEN_EXTRA_CLANG_ARGS`, which goes to that libclang only) or
//!    `--venv DIR` (a Python environment holding PyPI's `libclang` and
//!    `ziglang` wheels) adds one to those installed.
//! 2. Checks the prerequisites: GCC/G++, CMake, pkg-config, the libibverbs
//!    development files and runtime library, a libclang; each missing piece
//!    is named with the Debian/Ubuntu package that provides it.
//! 3. Runs `cargo xtask bindgen --check --expect-llvm N` under each
//!    libclang found (`LIBCLANG_PATH` set to it), so every release must give
//!    the committed bindings byte for byte.
//! 4. Unless `--no-cargo`: `cargo fmt --check`, clippy with warnings
//!    denied, the workspace tests, and the docs with warnings denied.
//! 5. Says which cells of the canonical matrix (Ubuntu 24.04, GCC/G++ 13,
//!    Clang/libclang 18; what ci/Dockerfile builds) this run covered for
//!    real, and why not the others.
//!
//! Every failing step is one line; the task exits non-zero if any failed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bindgen::{EXTRA_CLANG_ARGS, clang_version_major, llvm_major};

/// The canonical matrix: what ci/Dockerfile installs.
const CANONICAL_OS: (&str, &str) = ("ubuntu", "24.04");
const CANONICAL_GCC: u32 = 13;
const CANONICAL_LLVM: u32 = 18;

/// The PyPI wheels that give a libclang 18 with its resource headers
/// (docs/building.md).
const PIP_LIBCLANG_18: &str = "libclang==18.1.1 ziglang==0.13.0";

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    const USAGE: &str = "usage: cargo xtask build-and-check [--no-cargo] [--venv DIR]";
    let mut cargo_steps = true;
    let mut venv: Option<PathBuf> = None;
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--no-cargo" => cargo_steps = false,
            "--venv" => {
                let dir = args
                    .next()
                    .ok_or_else(|| format!("--venv takes a directory; {USAGE}"))?;
                venv = Some(PathBuf::from(dir));
            }
            other => return Err(format!("unexpected argument `{other}`; {USAGE}")),
        }
    }
    let root = crate::workspace::root();
    let given = match &venv {
        Some(dir) => Some(GivenLibclang::from_venv(dir)?),
        None => GivenLibclang::from_env(),
    };
    let mut report = Report::default();

    section("environment");
    let env = Environment::discover(given.as_ref())?;
    env.print();

    section("prerequisites");
    check_prerequisites(&mut report, &env);

    section("bindgen --check under each libclang");
    let checks = check_bindings(&mut report, &root, &env.libclangs)?;

    if cargo_steps {
        run_cargo_steps(&mut report, &root);
    }

    section("canonical matrix (Ubuntu 24.04 / GCC/G++ 13 / Clang/libclang 18)");
    for cell in matrix_cells(&env.os, env.gcc.as_deref(), env.gxx.as_deref(), &checks) {
        println!("{cell}");
    }

    section("summary");
    report.finish()
}

/// A libclang named by the user rather than found in the system's
/// directories, with the clang arguments it needs (`-isystem DIR` for a
/// libclang shipped without its resource headers).
#[derive(Debug, PartialEq, Eq)]
struct GivenLibclang {
    /// A libclang file or a directory holding one (`LIBCLANG_PATH`'s forms).
    path: PathBuf,
    /// `BINDGEN_EXTRA_CLANG_ARGS` for this libclang only.
    extra_args: Option<String>,
}

impl GivenLibclang {
    /// `LIBCLANG_PATH`, with `BINDGEN_EXTRA_CLANG_ARGS`.
    fn from_env() -> Option<Self> {
        let path = PathBuf::from(std::env::var_os("LIBCLANG_PATH")?);
        // The checks run from the workspace root, not from this directory.
        let path = std::path::absolute(&path).unwrap_or(path);
        let extra_args = std::env::var(EXTRA_CLANG_ARGS).ok();
        Some(Self { path, extra_args })
    }

    /// PyPI's `libclang` wheel (`clang/native/libclang.so`) and clang's
    /// resource headers from the `ziglang` wheel (`ziglang/lib/include`),
    /// installed in a virtual environment or with `pip install --target`.
    fn from_venv(dir: &Path) -> Result<Self, String> {
        let create = format!(
            "create it with `python3 -m venv {0} && {0}/bin/pip install {PIP_LIBCLANG_18}`",
            dir.display()
        );
        if !dir.is_dir() {
            return Err(format!(
                "--venv {} is not a directory; {create}",
                dir.display()
            ));
        }
        // The checks run from the workspace root, not from this directory.
        let dir = &std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        let Some(site) = site_packages(dir)
            .into_iter()
            .find(|s| s.join("clang/native/libclang.so").is_file())
        else {
            return Err(format!(
                "--venv {} holds no PyPI libclang (clang/native/libclang.so in its \
                 site-packages); {create}",
                dir.display()
            ));
        };
        let include = site.join("ziglang/lib/include");
        if !include.join("stddef.h").is_file() {
            return Err(format!(
                "--venv {} has PyPI's libclang but not clang's resource headers ({} has no \
                 stddef.h); {create}",
                dir.display(),
                include.display()
            ));
        }
        Ok(Self {
            path: site.join("clang/native/libclang.so"),
            extra_args: Some(format!("-isystem {}", include.display())),
        })
    }
}

/// Where pip puts packages under `dir`: the directory itself (`pip install
/// --target`) and a virtual environment's `lib*/python3*/site-packages`.
fn site_packages(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(dir.join(lib)) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
            .map(|e| e.path().join("site-packages"))
            .collect();
        pythons.sort();
        out.extend(pythons);
    }
    out
}

/// What this machine has.
struct Environment {
    os: OsRelease,
    gcc: Option<String>,
    gxx: Option<String>,
    clangs: Vec<(PathBuf, Option<String>)>,
    libclangs: Vec<FoundLibclang>,
}

impl Environment {
    fn discover(given: Option<&GivenLibclang>) -> Result<Self, String> {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find the xtask binary: {e}"))?;
        Ok(Self {
            os: OsRelease::read(Path::new("/etc/os-release")),
            gcc: tool_version("gcc", &["--version"]),
            gxx: tool_version("g++", &["--version"]),
            clangs: clang_executables()
                .into_iter()
                .map(|c| {
                    let v = tool_version(&c.to_string_lossy(), &["--version"]);
                    (c, v)
                })
                .collect(),
            libclangs: libclangs(given, &libclang_search_dirs(), |path| {
                libclang_version(&exe, path)
            }),
        })
    }

    fn print(&self) {
        println!("os:        {}", self.os.pretty());
        println!("gcc:       {}", self.gcc.as_deref().unwrap_or("not found"));
        println!("g++:       {}", self.gxx.as_deref().unwrap_or("not found"));
        for (clang, version) in &self.clangs {
            let version = version.as_deref().unwrap_or("?");
            println!("clang:     {} ({version})", clang.display());
        }
        if self.clangs.is_empty() {
            println!("clang:     none found");
        }
        for l in &self.libclangs {
            println!("libclang:  {} ({})", l.path.display(), l.label());
            if let Some(extra) = &l.extra_args {
                println!("           with {EXTRA_CLANG_ARGS}={extra}");
            }
        }
        if self.libclangs.is_empty() {
            println!("libclang:  none found");
        }
        for var in ["LIBCLANG_PATH", EXTRA_CLANG_ARGS, "CLANG_PATH"] {
            if let Some(v) = std::env::var_os(var) {
                println!("{var}: {}", Path::new(&v).display());
            }
        }
    }
}

fn check_prerequisites(report: &mut Report, env: &Environment) {
    report.check("gcc/g++", env.gcc.is_some() && env.gxx.is_some(), || {
        "gcc or g++ not found; install gcc and g++ (Debian/Ubuntu: build-essential)".into()
    });
    let cmake = tool_version("cmake", &["--version"]);
    report.check_found(
        "cmake",
        cmake.as_deref(),
        "install cmake (Debian/Ubuntu: cmake)",
    );
    let pkg_config = tool_version("pkg-config", &["--version"]);
    report.check_found(
        "pkg-config",
        pkg_config.as_deref(),
        "install pkg-config (Debian/Ubuntu: pkg-config; Ubuntu 24.04 provides it via pkgconf)",
    );
    let header = Path::new("/usr/include/infiniband/verbs.h").is_file();
    let pc = pkg_config
        .as_ref()
        .and_then(|_| tool_version("pkg-config", &["--modversion", "libibverbs"]));
    let pc_missing = pkg_config.is_some() && pc.is_none();
    report.check(
        "libibverbs development files",
        header && !pc_missing,
        || {
            let mut what = Vec::new();
            if !header {
                what.push("no /usr/include/infiniband/verbs.h");
            }
            if pc_missing {
                what.push("pkg-config knows no libibverbs");
            }
            format!("{}; install libibverbs-dev", what.join(", "))
        },
    );
    if let Some(v) = &pc {
        println!(
            "           libibverbs {v} (the committed bindings come from the vendored rdma-core {} \
             headers)",
            crate::bindgen::RDMA_CORE_RELEASE
        );
    }
    report.check(
        "libibverbs runtime (libibverbs.so.1)",
        libibverbs_runtime_present(),
        || {
            "libibverbs.so.1 not found by the dynamic loader; install libibverbs1 and \
         ibverbs-providers"
                .into()
        },
    );
    report.check("libclang", !env.libclangs.is_empty(), || {
        "no libclang found; install libclang-dev (or libclang1-NN with libclang-common-NN-dev), \
         or set LIBCLANG_PATH"
            .into()
    });
}

/// `cargo xtask bindgen --check` in a child process per libclang, so each
/// loads exactly that one (`LIBCLANG_PATH` set to the file) and fails if it
/// reports another release than the one it was found as. A given
/// libclang's `BINDGEN_EXTRA_CLANG_ARGS` go to it alone: the others use
/// their own resource headers.
fn check_bindings(
    report: &mut Report,
    root: &Path,
    libclangs: &[FoundLibclang],
) -> Result<Vec<BindingsCheck>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the xtask binary: {e}"))?;
    let mut checks = Vec::new();
    for l in libclangs {
        println!("--- libclang {}: {}", l.label(), l.path.display());
        let name = format!("bindgen --check ({})", l.label());
        let mut cmd = Command::new(&exe);
        cmd.args(["bindgen", "--check"])
            .env("LIBCLANG_PATH", &l.path)
            .current_dir(root);
        if let Some(major) = l.major {
            cmd.args(["--expect-llvm", &major.to_string()]);
        }
        match &l.extra_args {
            Some(extra) => cmd.env(EXTRA_CLANG_ARGS, extra),
            None => cmd.env_remove(EXTRA_CLANG_ARGS),
        };
        let passed = match cmd.output() {
            Ok(out) => {
                print!("{}", String::from_utf8_lossy(&out.stdout));
                let stderr = String::from_utf8_lossy(&out.stderr);
                eprint!("{stderr}");
                // The task's own one-line reason is its last stderr line.
                let reason = stderr.lines().next_back().unwrap_or("").trim();
                report.check(&name, out.status.success(), || {
                    let reason = reason.trim_start_matches("xtask bindgen: ");
                    format!("{reason} ({})", out.status)
                });
                out.status.success()
            }
            Err(e) => {
                report.check_status(&name, Err(e));
                false
            }
        };
        checks.push(BindingsCheck {
            major: l.major,
            libclang: format!("{}, {}", l.label(), l.path.display()),
            passed,
        });
    }
    Ok(checks)
}

/// The outcome of `bindgen --check` under one libclang.
#[derive(Debug)]
struct BindingsCheck {
    major: Option<u32>,
    /// The libclang, as the report names it.
    libclang: String,
    passed: bool,
}

fn run_cargo_steps(report: &mut Report, root: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let clippy = &[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ];
    let steps = [
        CargoStep::new("cargo fmt --check", &["fmt", "--all", "--", "--check"]),
        CargoStep::new("cargo clippy -D warnings", clippy),
        CargoStep::new("cargo test", &["test", "--workspace"]),
        CargoStep {
            env: Some(("RUSTDOCFLAGS", "-D warnings")),
            ..CargoStep::new(
                "cargo doc -D warnings",
                &["doc", "--workspace", "--no-deps"],
            )
        },
    ];
    for step in steps {
        section(step.name);
        let mut cmd = Command::new(&cargo);
        cmd.args(step.args).current_dir(root);
        if let Some((k, v)) = step.env {
            cmd.env(k, v);
        }
        report.check_status(step.name, cmd.status());
    }
}

/// One cargo command of the matrix.
struct CargoStep {
    name: &'static str,
    args: &'static [&'static str],
    env: Option<(&'static str, &'static str)>,
}

impl CargoStep {
    fn new(name: &'static str, args: &'static [&'static str]) -> Self {
        Self {
            name,
            args,
            env: None,
        }
    }
}

fn section(name: &str) {
    println!("\n== {name}");
}

/// The outcome of the checks so far.
#[derive(Default)]
struct Report {
    failed: Vec<String>,
}

impl Report {
    fn check(&mut self, name: &str, ok: bool, why: impl FnOnce() -> String) {
        if ok {
            println!("ok:        {name}");
        } else {
            let line = why();
            eprintln!("FAIL:      {name}: {line}");
            self.failed.push(format!("{name}: {line}"));
        }
    }

    fn check_found(&mut self, name: &str, version: Option<&str>, install: &str) {
        match version {
            Some(v) => println!("ok:        {name} ({v})"),
            None => {
                let line = format!("{name} not found; {install}");
                eprintln!("FAIL:      {line}");
                self.failed.push(line);
            }
        }
    }

    fn check_status(&mut self, name: &str, status: std::io::Result<std::process::ExitStatus>) {
        match status {
            Ok(s) if s.success() => println!("ok:        {name}"),
            Ok(s) => {
                let line = format!("{name} failed ({s}); see its output above");
                eprintln!("FAIL:      {line}");
                self.failed.push(line);
            }
            Err(e) => {
                let line = format!("{name} could not run: {e}");
                eprintln!("FAIL:      {line}");
                self.failed.push(line);
            }
        }
    }

    fn finish(self) -> Result<(), String> {
        if self.failed.is_empty() {
            println!("build-and-check: every step passed");
            return Ok(());
        }
        for f in &self.failed {
            eprintln!("failed: {f}");
        }
        Err(format!("{} step(s) failed", self.failed.len()))
    }
}

/// The first line of `tool args`' output, or `None` when it does not run.
fn tool_version(tool: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(tool).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Some(text.lines().next().unwrap_or("").trim().to_string())
}

/// Whether the dynamic loader can find libibverbs.so.1 (`ldconfig -p`, or
/// the usual library directories when ldconfig is unavailable).
fn libibverbs_runtime_present() -> bool {
    let ldconfig = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|t| Command::new(t).arg("-p").output().ok());
    if let Some(out) = ldconfig
        && String::from_utf8_lossy(&out.stdout).contains("libibverbs.so.1")
    {
        return true;
    }
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ]
    .iter()
    .any(|d| Path::new(d).join("libibverbs.so.1").exists())
}

/// `/etc/os-release`'s fields.
struct OsRelease {
    fields: BTreeMap<String, String>,
}

impl OsRelease {
    fn read(path: &Path) -> Self {
        Self::parse(&std::fs::read_to_string(path).unwrap_or_default())
    }

    fn parse(text: &str) -> Self {
        let fields = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
            .collect();
        Self { fields }
    }

    fn field(&self, key: &str) -> &str {
        self.fields.get(key).map_or("", String::as_str)
    }

    fn pretty(&self) -> String {
        match self.field("PRETTY_NAME") {
            "" => "unknown (no /etc/os-release)".into(),
            p => p.to_string(),
        }
    }
}

/// The canonical matrix's cells, each saying whether this run covered it
/// for real and, when not, why.
fn matrix_cells(
    os: &OsRelease,
    gcc: Option<&str>,
    gxx: Option<&str>,
    checks: &[BindingsCheck],
) -> Vec<String> {
    let covered = |yes: bool| if yes { "covered: yes" } else { "covered: no " };
    let os_ok = os.field("ID") == CANONICAL_OS.0 && os.field("VERSION_ID") == CANONICAL_OS.1;
    let os_why = if os_ok {
        format!("this machine runs {}", os.pretty())
    } else {
        format!(
            "this machine runs {}; ci/build-and-check.sh runs the canonical image where Docker \
             is available",
            os.pretty()
        )
    };
    let gcc_majors = [gcc, gxx].map(|v| v.and_then(gcc_major));
    let gcc_ok = gcc_majors.iter().all(|m| *m == Some(CANONICAL_GCC));
    let release = |line: &str| {
        line.split_whitespace()
            .next_back()
            .unwrap_or("")
            .to_string()
    };
    let gcc_why = match (gcc, gxx) {
        (Some(c), Some(cxx)) => {
            let has = format!("gcc {}, g++ {}", release(c), release(cxx));
            if gcc_ok {
                has
            } else {
                format!("this machine has {has}; GCC {CANONICAL_GCC} is Ubuntu 24.04's")
            }
        }
        _ => "gcc or g++ not found".to_string(),
    };
    let canonical: Vec<&BindingsCheck> = checks
        .iter()
        .filter(|c| c.major == Some(CANONICAL_LLVM))
        .collect();
    let llvm_ok = canonical.iter().any(|c| c.passed);
    let llvm_why = if let Some(c) = canonical.iter().find(|c| c.passed) {
        format!("bindgen --check passed under {}", c.libclang)
    } else if let Some(c) = canonical.first() {
        format!("bindgen --check failed under {}", c.libclang)
    } else {
        let found: Vec<String> = checks
            .iter()
            .map(|c| c.major.map_or_else(|| "?".to_string(), |m| m.to_string()))
            .collect();
        let found = if found.is_empty() {
            "none".to_string()
        } else {
            found.join(", ")
        };
        format!(
            "no libclang {CANONICAL_LLVM} found (found: {found}); PyPI's {PIP_LIBCLANG_18} give \
             one: --venv DIR"
        )
    };
    vec![
        format!("Ubuntu 24.04:       {} ({os_why})", covered(os_ok)),
        format!(
            "GCC/G++ {CANONICAL_GCC}:         {} ({gcc_why})",
            covered(gcc_ok)
        ),
        format!("Clang/libclang 18:  {} ({llvm_why})", covered(llvm_ok)),
    ]
}

/// The major version in `gcc --version`'s first line: "gcc (Debian
/// 12.2.0-14) 12.2.0", "g++ (Ubuntu 13.2.0-23ubuntu4) 13.2.0".
fn gcc_major(first_line: &str) -> Option<u32> {
    let last = first_line.split_whitespace().next_back()?;
    let digits: String = last.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Directories that may hold an installed libclang: every
/// `/usr/lib/llvm-*/lib`, and the distributions' library directories.
fn libclang_search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        let mut llvm: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
            .map(|e| e.path().join("lib"))
            .collect();
        llvm.sort();
        dirs.extend(llvm);
    }
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

/// A libclang on this machine.
#[derive(Debug, PartialEq, Eq)]
struct FoundLibclang {
    /// Its LLVM major version: from the version the library reports, else
    /// from its path.
    major: Option<u32>,
    /// The file, which `LIBCLANG_PATH` accepts and which, unlike a
    /// directory, cannot pick another release in a shared directory.
    path: PathBuf,
    /// What the library says it is (`clang version 18.1.1`).
    version: Option<String>,
    /// `BINDGEN_EXTRA_CLANG_ARGS` for this libclang (a given one's).
    extra_args: Option<String>,
}

impl FoundLibclang {
    fn label(&self) -> String {
        match (self.major, &self.version) {
            (Some(m), Some(v)) => format!("LLVM {m}, \"{v}\""),
            (Some(m), None) => format!("LLVM {m} by its path"),
            (None, _) => "LLVM ?".to_string(),
        }
    }
}

/// The version string a libclang reports (`cargo xtask bindgen
/// --libclang-version` in a child process, so each library is loaded
/// alone), or `None` when it cannot be loaded.
fn libclang_version(exe: &Path, path: &Path) -> Option<String> {
    let out = Command::new(exe)
        .args(["bindgen", "--libclang-version"])
        .env("LIBCLANG_PATH", path)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// One libclang per LLVM major version: the given one first, then those in
/// `dirs` in order (so `/usr/lib/llvm-NN/lib` comes before the multiarch
/// directory), plus each file whose version is unknown. `read_version`
/// asks a library its version; a file whose path names an already found
/// release is not asked.
fn libclangs(
    given: Option<&GivenLibclang>,
    dirs: &[PathBuf],
    read_version: impl Fn(&Path) -> Option<String>,
) -> Vec<FoundLibclang> {
    let mut candidates: Vec<(PathBuf, Option<String>)> = Vec::new();
    if let Some(g) = given {
        let files = if g.path.is_file() {
            vec![g.path.clone()]
        } else {
            libclang_files(&g.path)
        };
        candidates.extend(files.into_iter().map(|f| (f, g.extra_args.clone())));
    }
    for dir in dirs {
        candidates.extend(libclang_files(dir).into_iter().map(|f| (f, None)));
    }
    let mut found: Vec<FoundLibclang> = Vec::new();
    let mut seen_files = Vec::new();
    for (path, extra_args) in candidates {
        let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
        if seen_files.contains(&canonical) {
            continue;
        }
        seen_files.push(canonical);
        let by_path = llvm_major(&path);
        if by_path.is_some() && found.iter().any(|f| f.major == by_path) {
            continue;
        }
        let version = read_version(&path);
        let major = version.as_deref().and_then(clang_version_major).or(by_path);
        if major.is_some() && found.iter().any(|f| f.major == major) {
            continue;
        }
        found.push(FoundLibclang {
            major,
            path,
            version,
            extra_args,
        });
    }
    found.sort_by_key(|f| f.major.unwrap_or(u32::MAX));
    found
}

/// The libclang files in `dir`, sorted.
fn libclang_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| is_libclang_name(&n.to_string_lossy()))
        })
        .collect();
    files.sort();
    files
}

/// `libclang.so`, `libclang.so.1`, `libclang-14.so.1`, `libclang-19.1.7.so`;
/// not `libclang-cpp`, nor the static `libclangAST.a` family.
fn is_libclang_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("libclang") else {
        return false;
    };
    let rest = rest.strip_prefix('-').unwrap_or(rest);
    rest.find(".so")
        .is_some_and(|i| rest[..i].chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// Every clang executable on `PATH` (`clang`, `clang-NN`) and in
/// `/usr/lib/llvm-*/bin`, without duplicates of the same file.
fn clang_executables() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        let mut llvm: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
            .map(|e| e.path().join("bin"))
            .collect();
        llvm.sort();
        dirs.extend(llvm);
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n == "clang"
                        || n.strip_prefix("clang-")
                            .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
                })
            })
            .collect();
        names.sort();
        for p in names {
            let canonical = p.canonicalize().unwrap_or_else(|_| p.clone());
            if !seen.contains(&canonical) {
                seen.push(canonical);
                out.push(p);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(text: &str) -> OsRelease {
        OsRelease::parse(text)
    }

    fn check(major: u32, passed: bool) -> BindingsCheck {
        BindingsCheck {
            major: Some(major),
            libclang: format!("LLVM {major}, /nonexistent/libclang.so"),
            passed,
        }
    }

    #[test]
    fn ubuntu_24_04_with_gcc_13_and_a_passing_libclang_18_covers_every_cell() {
        let ubuntu = os("PRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\nID=ubuntu\nVERSION_ID=\"24.04\"\n");
        let gcc = "gcc (Ubuntu 13.2.0-23ubuntu4) 13.2.0";
        let gxx = "g++ (Ubuntu 13.2.0-23ubuntu4) 13.2.0";
        let cells = matrix_cells(&ubuntu, Some(gcc), Some(gxx), &[check(18, true)]);
        assert!(
            cells.iter().all(|c| c.contains("covered: yes")),
            "{cells:?}"
        );
    }

    #[test]
    fn debian_12_with_a_pip_libclang_18_covers_only_the_libclang_cell() {
        let debian = os(
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n\
                         VERSION_ID=\"12\"\n",
        );
        let gcc = "gcc (Debian 12.2.0-14) 12.2.0";
        let gxx = "g++ (Debian 12.2.0-14) 12.2.0";
        let checks = [check(14, true), check(18, true)];
        let cells = matrix_cells(&debian, Some(gcc), Some(gxx), &checks);
        assert!(
            cells[0].contains("covered: no") && cells[0].contains("Debian"),
            "{cells:?}"
        );
        assert!(
            cells[1].contains("covered: no") && cells[1].contains("gcc 12.2.0, g++ 12.2.0"),
            "{cells:?}"
        );
        assert!(
            cells[2].contains("covered: yes") && cells[2].contains("passed under LLVM 18"),
            "{cells:?}"
        );
    }

    #[test]
    fn a_libclang_18_found_but_failing_or_absent_is_not_covered() {
        let debian = os("ID=debian\nVERSION_ID=\"12\"\n");
        let failed = matrix_cells(&debian, None, None, &[check(18, false)]);
        assert!(
            failed[2].contains("covered: no") && failed[2].contains("failed under LLVM 18"),
            "{failed:?}"
        );
        assert!(failed[1].contains("gcc or g++ not found"), "{failed:?}");
        let absent = matrix_cells(&debian, None, None, &[check(14, true), check(19, true)]);
        assert!(
            absent[2].contains("covered: no") && absent[2].contains("found: 14, 19"),
            "{absent:?}"
        );
    }

    #[test]
    fn gcc_major_reads_the_version_line() {
        assert_eq!(gcc_major("gcc (Debian 12.2.0-14) 12.2.0"), Some(12));
        assert_eq!(gcc_major("g++ (Ubuntu 13.2.0-23ubuntu4) 13.2.0"), Some(13));
        assert_eq!(gcc_major(""), None);
    }

    #[test]
    fn a_venv_gives_the_wheels_libclang_and_zig_headers() {
        let base = std::env::temp_dir().join(format!("xtask-venv-{}", std::process::id()));
        let site = base.join("lib/python3.11/site-packages");
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(site.join("clang/native")).unwrap();
        std::fs::write(site.join("clang/native/libclang.so"), b"").unwrap();
        let no_headers = GivenLibclang::from_venv(&base);
        std::fs::create_dir_all(site.join("ziglang/lib/include")).unwrap();
        std::fs::write(site.join("ziglang/lib/include/stddef.h"), b"").unwrap();
        let given = GivenLibclang::from_venv(&base);
        let not_a_venv = GivenLibclang::from_venv(&base.join("lib"));
        let _ = std::fs::remove_dir_all(&base);
        let err = no_headers.unwrap_err();
        assert!(err.contains("not clang's resource headers"), "{err}");
        assert_eq!(
            given,
            Ok(GivenLibclang {
                path: site.join("clang/native/libclang.so"),
                extra_args: Some(format!(
                    "-isystem {}",
                    site.join("ziglang/lib/include").display()
                )),
            })
        );
        let err = not_a_venv.unwrap_err();
        assert!(err.contains("holds no PyPI libclang"), "{err}");
    }

    #[test]
    fn libclang_names_are_told_from_other_clang_libraries() {
        for yes in [
            "libclang.so",
            "libclang.so.1",
            "libclang-14.so.1",
            "libclang-19.1.7.so",
        ] {
            assert!(is_libclang_name(yes), "{yes}");
        }
        for no in [
            "libclang-cpp.so.14",
            "libclangAST.a",
            "libclang_rt.a",
            "libclangBasic.a",
        ] {
            assert!(!is_libclang_name(no), "{no}");
        }
    }

    #[test]
    fn one_libclang_per_major_version_first_directory_wins() {
        let base = std::env::temp_dir().join(format!("xtask-libclangs-{}", std::process::id()));
        let a = base.join("llvm-14/lib");
        let b = base.join("multiarch");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        for f in [
            a.join("libclang-14.so.1"),
            b.join("libclang-14.so.1"),
            b.join("libclang-19.so.1"),
        ] {
            std::fs::write(f, b"").unwrap();
        }
        std::fs::write(b.join("libclang-cpp.so.19"), b"").unwrap();
        std::fs::write(b.join("libclang.so"), b"").unwrap();
        let found = libclangs(None, &[a.clone(), b.clone()], |_| None);
        let expected = [
            (Some(14), a.join("libclang-14.so.1")),
            (Some(19), b.join("libclang-19.so.1")),
            (None, b.join("libclang.so")),
        ]
        .map(|(major, path)| FoundLibclang {
            major,
            path,
            version: None,
            extra_args: None,
        });
        assert_eq!(found, expected, "{found:?}");

        // A given libclang whose path names no release is known by the
        // version it reports, comes first, and keeps its clang arguments.
        let pip = base.join("clang/native");
        std::fs::create_dir_all(&pip).unwrap();
        std::fs::write(pip.join("libclang.so"), b"").unwrap();
        let given = GivenLibclang {
            path: pip.clone(),
            extra_args: Some("-isystem /nonexistent/include".into()),
        };
        let found = libclangs(Some(&given), std::slice::from_ref(&a), |p| {
            p.starts_with(&pip)
                .then(|| "clang version 18.1.1".to_string())
        });
        let _ = std::fs::remove_dir_all(&base);
        let majors: Vec<Option<u32>> = found.iter().map(|f| f.major).collect();
        assert_eq!(majors, [Some(14), Some(18)], "{found:?}");
        assert_eq!(found[1].path, pip.join("libclang.so"));
        assert_eq!(found[1].version.as_deref(), Some("clang version 18.1.1"));
        assert_eq!(
            found[1].extra_args.as_deref(),
            Some("-isystem /nonexistent/include")
        );
        assert_eq!(found[0].extra_args, None);
    }
}
