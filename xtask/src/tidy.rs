//! `cargo xtask tidy`: enforce ARCHITECTURE.md's invariants.
//!
//! - dependencies between orbitte crates only point down the layer table;
//! - orbitte-wire and orbitte-topology depend on no other orbitte crate;
//! - only orbitte-memory, orbitte-verbs-sys, orbitte-verbs, orbitte-cuda,
//!   orbitte-py, orbitte-capi and orbitte-nixl contain `unsafe`,
//!   every other crate root (lib, bin, tests, examples, benches) declares
//!   `#![forbid(unsafe_code)]`;
//! - in the crates that may use `unsafe`, every `unsafe` block and
//!   `unsafe impl` carries a `// SAFETY:` comment (generated bindings aside);
//! - the sans-IO crate orbitte-proto uses no threads, sockets or clock:
//!   time is an argument there (test files and inline test modules, which
//!   start virtual time from one `Instant`, aside);
//! - the files of the crates in [`NO_IMPORT_CIRCLES`] import in one
//!   direction: no import circle between them (`cargo xtask circles`);
//! - the code is formatted (`cargo fmt --check`).
//!
//! It runs as an ordinary `#[test]` too, so `cargo test --workspace`
//! enforces it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::circles::Circle;

/// The crates allowed to contain `unsafe`.
const UNSAFE_ALLOWED: &[&str] = &[
    "orbitte-memory",
    "orbitte-verbs-sys",
    "orbitte-verbs",
    "orbitte-cuda",
    "orbitte-py",
    "orbitte-capi",
    "orbitte-nixl",
];

/// The sans-IO code: each crate's folders, relative to its directory.
const SANS_IO_DIRS: &[(&str, &str)] = &[("orbitte-proto", "src")];

/// Test-only files of those layers (`#[cfg(test)]` modules): they start
/// virtual time from one `Instant::now()`.
const SANS_IO_TEST_FILES: &[&str] = &["tests.rs", "fuzz.rs"];

/// What a sans-IO layer must not touch: threads, sockets, the clock.
const SANS_IO_FORBIDDEN: &[&str] = &[
    "Instant::now",
    "SystemTime::now",
    "std::thread",
    "thread::spawn",
    "thread::sleep",
    "std::net",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "rustix::net",
    "std::sync::Mutex",
    "Condvar",
];

/// The crates, by directory under the workspace root, whose files import
/// in one direction (ARCHITECTURE.md): an import circle between their
/// files is a problem. A crate that still has circles is not listed;
/// `cargo xtask circles` shows them.
const NO_IMPORT_CIRCLES: &[&str] = &[
    "crates/orbitte-cli",
    "crates/orbitte-engine",
    "crates/orbitte-proto",
    "xtask",
];

/// For each orbitte crate, the orbitte crates it may depend on (any kind of
/// dependency: normal, dev or build). Everything not listed is a violation.
const ALLOWED_DEPS: &[(&str, &[&str])] = &[
    ("orbitte-memory", &[]),
    ("orbitte-verbs-sys", &[]),
    ("orbitte-verbs", &["orbitte-verbs-sys", "orbitte-memory"]),
    ("orbitte-topology", &[]),
    ("orbitte-wire", &[]),
    ("orbitte-cuda", &["orbitte-memory"]),
    // The sans-IO core names NICs (`NicId`, `DeviceMask`) but discovers none.
    ("orbitte-proto", &["orbitte-wire", "orbitte-topology"]),
    (
        "orbitte-engine",
        &[
            "orbitte-proto",
            "orbitte-memory",
            "orbitte-verbs",
            "orbitte-topology",
            "orbitte-wire",
            "orbitte-cuda",
        ],
    ),
    (
        "orbitte",
        &[
            "orbitte-engine",
            "orbitte-proto",
            "orbitte-memory",
            "orbitte-topology",
            "orbitte-wire",
            "orbitte-verbs",
            "orbitte-cuda",
        ],
    ),
    (
        "orbitte-cli",
        &[
            "orbitte",
            "orbitte-proto",
            "orbitte-engine",
            "orbitte-memory",
            "orbitte-topology",
            "orbitte-wire",
            "orbitte-verbs",
            "orbitte-cuda",
        ],
    ),
    // The wheel's `orbitte` script runs the command's own code.
    (
        "orbitte-py",
        &[
            "orbitte",
            "orbitte-cli",
            "orbitte-proto",
            "orbitte-engine",
            "orbitte-memory",
            "orbitte-topology",
            "orbitte-wire",
            "orbitte-verbs",
            "orbitte-cuda",
        ],
    ),
    // The C API sits on the facade, and on orbitte-cuda for device memory
    // (as orbitte-py does).
    ("orbitte-capi", &["orbitte", "orbitte-cuda"]),
    // The NIXL plugin sits on the C API alone.
    ("orbitte-nixl", &["orbitte-capi"]),
    // `cargo xtask attack` builds and mutates wire frames.
    ("xtask", &["orbitte-wire"]),
];

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("unexpected argument `{a}`; tidy takes none"));
    }
    let problems = check(&crate::workspace::root())?;
    if problems.is_empty() {
        println!("tidy: ok");
        Ok(())
    } else {
        for p in &problems {
            eprintln!("tidy: {p}");
        }
        Err(format!("{} problem(s) found", problems.len()))
    }
}

/// Runs every check and returns the problems found (empty when tidy).
pub(crate) fn check(root: &Path) -> Result<Vec<String>, String> {
    let packages = metadata(root)?;
    let mut problems = Vec::new();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED_DEPS.iter().copied().collect();
    for pkg in &packages {
        let Some(ok) = allowed.get(pkg.name.as_str()) else {
            problems.push(format!(
                "workspace member `{}` is not in xtask/src/tidy.rs ALLOWED_DEPS; add it with its \
                 permitted dependencies (and update ARCHITECTURE.md)",
                pkg.name
            ));
            continue;
        };
        for dep in &pkg.orbitte_deps {
            // A dev-dependency of a crate on itself turns on its test
            // features for its integration tests; it crosses no layer.
            if *dep != pkg.name && !ok.contains(&dep.as_str()) {
                problems.push(format!(
                    "`{}` depends on `{dep}`, which ARCHITECTURE.md's layers do not allow",
                    pkg.name
                ));
            }
        }
        if pkg.name == "xtask" {
            continue;
        }
        let may_be_unsafe = UNSAFE_ALLOWED.contains(&pkg.name.as_str());
        for root_file in &pkg.target_roots {
            let text = read(root_file)?;
            if !may_be_unsafe && !text.contains("#![forbid(unsafe_code)]") {
                problems.push(format!(
                    "{} lacks `#![forbid(unsafe_code)]` (only {} may contain unsafe)",
                    rel(root, root_file),
                    UNSAFE_ALLOWED.join(", ")
                ));
            }
        }
        for (_, dir) in SANS_IO_DIRS.iter().filter(|(name, _)| *name == pkg.name) {
            for file in rust_files(&pkg.dir.join(dir)) {
                let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if SANS_IO_TEST_FILES.contains(&name) {
                    continue;
                }
                let text = read(&file)?;
                problems.extend(io_in_sans_io(&text).into_iter().map(|(line, what)| {
                    format!(
                        "{}:{line}: `{what}` in a sans-IO layer (no threads, sockets or \
                         clock there: take time as an argument, leave I/O to the driver)",
                        rel(root, &file)
                    )
                }));
            }
        }
        if may_be_unsafe {
            for file in rust_files(&pkg.dir) {
                let text = read(&file)?;
                problems.extend(undocumented_unsafe(&text).into_iter().map(|line| {
                    format!(
                        "{}:{line}: `unsafe` without a `// SAFETY:` comment",
                        rel(root, &file)
                    )
                }));
            }
        }
    }
    for dir in NO_IMPORT_CIRCLES {
        match crate::circles::circles(&root.join(dir)) {
            Ok(circles) => problems.extend(circles.iter().map(|c| circle_problem(dir, c))),
            Err(e) => problems.push(format!("{dir}: cannot look for import circles: {e}")),
        }
    }
    if let Some(p) = fmt_problem(root) {
        problems.push(p);
    }
    Ok(problems)
}

/// An import circle between files of the crate in `dir`, on one line: its
/// files, one imported name per edge, and the fix.
fn circle_problem(dir: &str, circle: &Circle) -> String {
    let edges: Vec<String> = circle
        .edges
        .iter()
        .map(|e| {
            let more = match e.names {
                0 | 1 => String::new(),
                n => format!(" (+{} more)", n - 1),
            };
            format!("{} -> {}: {}{more}", e.from, e.to, e.example)
        })
        .collect();
    format!(
        "{dir}/src: import circle between {} ({}); move what both sides of an edge use into a \
         file below both (`cargo xtask circles {dir}` shows the layering)",
        circle.files.join(", "),
        edges.join("; ")
    )
}

struct Package {
    name: String,
    dir: PathBuf,
    orbitte_deps: Vec<String>,
    target_roots: Vec<PathBuf>,
}

fn metadata(root: &Path) -> Result<Vec<Package>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| {
            format!("cannot run `{cargo} metadata`: {e}; is the Rust toolchain installed?")
        })?;
    if !out.status.success() {
        return Err(format!(
            "`cargo metadata` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("`cargo metadata` printed invalid JSON: {e}"))?;
    let mut packages = Vec::new();
    for p in v["packages"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap_or_default());
        let dir = manifest.parent().map(Path::to_path_buf).unwrap_or_default();
        let orbitte_deps = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["path"].is_string())
            .filter_map(|d| d["name"].as_str())
            .filter(|n| n.starts_with("orbitte"))
            .map(str::to_string)
            .collect();
        let target_roots = p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| {
                !t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "custom-build"))
            })
            .filter_map(|t| t["src_path"].as_str())
            .map(PathBuf::from)
            .collect();
        packages.push(Package {
            name,
            dir,
            orbitte_deps,
            target_roots,
        });
    }
    Ok(packages)
}

/// Line numbers (1-based) of `unsafe` blocks or impls with no `SAFETY:`
/// comment on the same line or within the three lines above.
fn undocumented_unsafe(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut bad = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let is_block = code.contains("unsafe {") || code.trim_end().ends_with("unsafe");
        let is_impl = code.contains("unsafe impl");
        if !(is_block || is_impl) || code.contains("unsafe fn") || code.contains("unsafe extern") {
            continue;
        }
        if !has_safety_comment(&lines, i) {
            bad.push(i + 1);
        }
    }
    bad
}

/// Lines (1-based) of code, comments and an inline `#[cfg(test)] mod`
/// at the end of the file aside, that name a thread, socket or clock API,
/// with the name.
fn io_in_sans_io(text: &str) -> Vec<(usize, &'static str)> {
    let mut found = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|next| next.trim_start().starts_with("mod ") && next.ends_with('{'))
        {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        for what in SANS_IO_FORBIDDEN {
            if code.contains(what) {
                found.push((i + 1, *what));
            }
        }
    }
    found
}

/// Whether line `i`, or the comment block (and attributes) right above it,
/// or the statement it continues (up to three lines back), says `SAFETY:`.
fn has_safety_comment(lines: &[&str], i: usize) -> bool {
    if lines[i].contains("SAFETY:") {
        return true;
    }
    let mut j = i;
    let mut code_lines = 0;
    while j > 0 {
        j -= 1;
        let t = lines[j].trim_start();
        if t.contains("SAFETY:") {
            return true;
        }
        if t.starts_with("//") || t.starts_with("#[") {
            continue;
        }
        // A statement split over lines (`let x =` then `unsafe {`).
        code_lines += 1;
        if code_lines > 3 || t.is_empty() || t.ends_with(';') || t.ends_with('}') {
            return false;
        }
    }
    false
}

fn fmt_problem(root: &Path) -> Option<String> {
    let out = Command::new("cargo")
        .args(["fmt", "--all", "--", "--check"])
        .current_dir(root)
        .output();
    match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            let files: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("Diff in "))
                .take(5)
                .collect();
            Some(format!(
                "code is not formatted ({}); run `cargo fmt --all`",
                files.join("; ")
            ))
        }
        Err(e) => Some(format!(
            "cannot run `cargo fmt`: {e}; install rustfmt (`rustup component add rustfmt`)"
        )),
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            // file_type() does not follow symlinks: sysfs fixtures contain
            // the same link loops real sysfs has.
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(p);
                }
            } else if kind.is_file()
                && name.ends_with(".rs")
                && !p.to_string_lossy().contains("generated")
            {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn read(p: &Path) -> Result<String, String> {
    std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_is_tidy() {
        let problems = check(&crate::workspace::root()).expect("tidy could run");
        assert!(
            problems.is_empty(),
            "tidy found problems:\n{}",
            problems.join("\n")
        );
    }

    #[test]
    fn an_import_circle_is_named_by_its_files_and_edges_with_the_fix() {
        let edge = |from: &str, to: &str, example: &str, names| crate::circles::Edge {
            from: from.into(),
            to: to.into(),
            example: example.into(),
            names,
        };
        let circle = Circle {
            files: vec!["a.rs".into(), "b/mod.rs".into()],
            edges: vec![
                edge("a.rs", "b/mod.rs", "Thing", 3),
                edge("b/mod.rs", "a.rs", "shared", 1),
            ],
        };
        let p = circle_problem("crates/orbitte-x", &circle);
        assert!(
            p.starts_with("crates/orbitte-x/src: import circle between a.rs, b/mod.rs ("),
            "{p}"
        );
        assert!(
            p.contains("a.rs -> b/mod.rs: Thing (+2 more); b/mod.rs -> a.rs: shared)"),
            "{p}"
        );
        assert!(p.contains("into a file below both"), "{p}");
        assert!(p.contains("`cargo xtask circles crates/orbitte-x`"), "{p}");
        assert!(!p.contains('\n'), "{p}");
    }

    #[test]
    fn io_in_a_sans_io_layer_is_found_and_comments_are_not() {
        let text = "// Instant::now is the driver's\nlet t = Instant::now();\n\
                    use std::thread;\nfn f(now: Instant) {}\n";
        assert_eq!(
            io_in_sans_io(text),
            vec![(2, "Instant::now"), (3, "std::thread")]
        );
    }

    #[test]
    fn an_inline_test_module_at_the_end_may_read_the_clock() {
        let text = "fn f() {}\n#[cfg(test)]\nmod tests;\nfn g() { Instant::now(); }\n\
                    #[cfg(test)]\nmod more {\n    fn t() { Instant::now(); }\n}\n";
        assert_eq!(io_in_sans_io(text), vec![(4, "Instant::now")]);
    }

    #[test]
    fn unsafe_without_safety_comment_is_found() {
        let text = "fn a() {\n    unsafe { x() }\n}\n// SAFETY: fine\nunsafe impl Send for A {}\n";
        assert_eq!(undocumented_unsafe(text), vec![2]);
    }

    #[test]
    fn long_safety_comment_blocks_count() {
        let text = "// SAFETY: a\n// b\n// c\n// d\n// e\nunsafe { x() }\n";
        assert!(undocumented_unsafe(text).is_empty());
        let text = "// SAFETY: a\nfoo();\nunsafe { x() }\n";
        assert_eq!(undocumented_unsafe(text), vec![3]);
    }

    #[test]
    fn unsafe_fn_declarations_are_not_blocks() {
        assert!(undocumented_unsafe("pub unsafe fn f() {}\n").is_empty());
    }
}
