//! `cargo xtask build-and-check [--no-cargo]`: the build matrix on this
//! machine.
//!
//! 1. Prints the OS release, GCC/G++ and every clang and libclang found.
//! 2. Checks the prerequisites: GCC/G++, CMake, pkg-config, the libibverbs
//!    development files and runtime library, a libclang; each missing piece
//!    is named with the Debian/Ubuntu package that provides it.
//! 3. Runs `cargo xtask bindgen --check` under each libclang found
//!    (`LIBCLANG_PATH` set to it), so every release must give the committed
//!    bindings byte for byte.
//! 4. Unless `--no-cargo`: `cargo fmt --check`, clippy with warnings
//!    denied, the workspace tests, and the docs with warnings denied.
//! 5. Says which cells of the canonical matrix (Ubuntu 24.04, GCC/G++,
//!    Clang/libclang 18; what ci/Dockerfile builds) this machine matches.
//!
//! Every failing step is one line; the task exits non-zero if any failed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bindgen::llvm_major;

/// The canonical matrix: what ci/Dockerfile installs.
const CANONICAL_OS: (&str, &str) = ("ubuntu", "24.04");
const CANONICAL_LLVM: u32 = 18;

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut cargo_steps = true;
    for a in args {
        match a.as_str() {
            "--no-cargo" => cargo_steps = false,
            other => {
                return Err(format!(
                    "unexpected argument `{other}`; usage: cargo xtask build-and-check [--no-cargo]"
                ));
            }
        }
    }
    let root = crate::workspace::root();
    let mut report = Report::default();

    section("environment");
    let env = Environment::discover();
    env.print();

    section("prerequisites");
    check_prerequisites(&mut report, &env);

    section("bindgen --check under each libclang");
    check_bindings(&mut report, &root, &env.libclangs)?;

    if cargo_steps {
        run_cargo_steps(&mut report, &root);
    }

    section("canonical matrix (Ubuntu 24.04 / GCC/G++ / Clang/libclang 18)");
    let majors: Vec<u32> = env.libclangs.iter().filter_map(|l| l.major).collect();
    for cell in matrix_cells(&env.os, env.gcc.is_some() && env.gxx.is_some(), &majors) {
        println!("{cell}");
    }

    section("summary");
    report.finish()
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
    fn discover() -> Self {
        Self {
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
            libclangs: libclangs(&libclang_search_dirs()),
        }
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
        }
        if self.libclangs.is_empty() {
            println!("libclang:  none found");
        }
        for var in ["LIBCLANG_PATH", "CLANG_PATH"] {
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
/// loads exactly that one (`LIBCLANG_PATH` set to the file).
fn check_bindings(
    report: &mut Report,
    root: &Path,
    libclangs: &[FoundLibclang],
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the xtask binary: {e}"))?;
    for l in libclangs {
        println!("--- libclang {}: {}", l.label(), l.path.display());
        let name = format!("bindgen --check ({})", l.label());
        let out = Command::new(&exe)
            .args(["bindgen", "--check"])
            .env("LIBCLANG_PATH", &l.path)
            .current_dir(root)
            .output();
        match out {
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
            }
            Err(e) => report.check_status(&name, Err(e)),
        }
    }
    Ok(())
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

/// The canonical matrix's cells, each saying whether this machine matches.
fn matrix_cells(os: &OsRelease, gcc_and_gxx: bool, llvm_majors: &[u32]) -> Vec<String> {
    let os_ok = os.field("ID") == CANONICAL_OS.0 && os.field("VERSION_ID") == CANONICAL_OS.1;
    let llvm_ok = llvm_majors.contains(&CANONICAL_LLVM);
    let found = if llvm_majors.is_empty() {
        "none".to_string()
    } else {
        llvm_majors
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mark = |ok: bool| if ok { "matches" } else { "differs" };
    vec![
        format!(
            "os Ubuntu 24.04:          {} (this machine: {})",
            mark(os_ok),
            os.pretty()
        ),
        format!(
            "compiler GCC/G++:         {} ({})",
            mark(gcc_and_gxx),
            if gcc_and_gxx {
                "gcc and g++ found"
            } else {
                "gcc or g++ missing"
            }
        ),
        format!(
            "clang/libclang 18:        {} (libclang found: {found})",
            mark(llvm_ok)
        ),
    ]
}

/// Directories that may hold a libclang: `LIBCLANG_PATH`, every
/// `/usr/lib/llvm-*/lib`, and the distributions' library directories.
fn libclang_search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(p) = std::env::var_os("LIBCLANG_PATH") {
        let p = PathBuf::from(p);
        dirs.push(if p.is_file() {
            p.parent().map(Path::to_path_buf).unwrap_or(p)
        } else {
            p
        });
    }
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
    /// Its LLVM major version, when its path names one.
    major: Option<u32>,
    /// The file, which `LIBCLANG_PATH` accepts and which, unlike a
    /// directory, cannot pick another release in a shared directory.
    path: PathBuf,
}

impl FoundLibclang {
    fn label(&self) -> String {
        self.major
            .map_or_else(|| "LLVM ?".to_string(), |m| format!("LLVM {m}"))
    }
}

/// One libclang per LLVM major version found in `dirs` (the first found
/// wins, so `LIBCLANG_PATH` and `/usr/lib/llvm-NN/lib` come before the
/// multiarch directory), plus each file whose version is unknown.
fn libclangs(dirs: &[PathBuf]) -> Vec<FoundLibclang> {
    let mut found: Vec<FoundLibclang> = Vec::new();
    let mut seen_files = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
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
        for path in files {
            let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
            if seen_files.contains(&canonical) {
                continue;
            }
            seen_files.push(canonical);
            let major = llvm_major(&path);
            if major.is_some() && found.iter().any(|f| f.major == major) {
                continue;
            }
            found.push(FoundLibclang { major, path });
        }
    }
    found.sort_by_key(|f| f.major.unwrap_or(u32::MAX));
    found
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

    #[test]
    fn ubuntu_24_04_with_clang_18_matches_every_cell() {
        let ubuntu = os("PRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\nID=ubuntu\nVERSION_ID=\"24.04\"\n");
        let cells = matrix_cells(&ubuntu, true, &[18]);
        assert!(cells.iter().all(|c| c.contains("matches")), "{cells:?}");
    }

    #[test]
    fn debian_12_with_clang_14_and_19_differs_on_os_and_llvm() {
        let debian = os(
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n\
                         VERSION_ID=\"12\"\n",
        );
        let cells = matrix_cells(&debian, true, &[14, 19]);
        assert!(
            cells[0].contains("differs") && cells[0].contains("Debian"),
            "{cells:?}"
        );
        assert!(cells[1].contains("matches"), "{cells:?}");
        assert!(
            cells[2].contains("differs") && cells[2].contains("14, 19"),
            "{cells:?}"
        );
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
        let found = libclangs(&[a.clone(), b.clone()]);
        let _ = std::fs::remove_dir_all(&base);
        let expected = [
            (Some(14), a.join("libclang-14.so.1")),
            (Some(19), b.join("libclang-19.so.1")),
            (None, b.join("libclang.so")),
        ]
        .map(|(major, path)| FoundLibclang { major, path });
        assert_eq!(found, expected, "{found:?}");
    }
}
