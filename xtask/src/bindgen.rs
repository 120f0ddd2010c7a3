//! `cargo xtask bindgen [--check]`: regenerate orbitte-verbs-sys's committed
//! bindings from the rdma-core headers vendored in that crate.
//!
//! The output must not depend on the machine: the headers are vendored
//! (rdma-core 44.0), the target triple is fixed, comments and layout tests
//! are off, only `ibv_*` items are kept, glibc's pthread types come from the
//! `libc` crate, and the result goes through the pinned toolchain's rustfmt
//! with the workspace's rustfmt.toml. libclang 14, 18 and 19 give identical
//! files; `build-and-check` runs `--check` under every libclang it finds.
//!
//! libclang is loaded at run time (bindgen's `runtime` feature), so xtask
//! builds without it. `LIBCLANG_PATH` picks the library (a directory or a
//! file), the one used is printed with the version the library reports
//! (`clang_getClangVersion`), `--expect-llvm N` fails unless that version is
//! LLVM N, and an inherited `CLANG_PATH` that points at a different LLVM
//! installation is warned about. A libclang shipped without its resource
//! headers (PyPI's `libclang` wheel) gets them through
//! `BINDGEN_EXTRA_CLANG_ARGS="-isystem DIR"`. Clang's own include
//! paths are not detected through a `clang` executable: libclang uses the
//! resource directory installed beside it, so a stray `CLANG_PATH` or a
//! newer `clang` on `PATH` cannot mix two LLVM releases.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The rdma-core release whose headers are vendored.
pub(crate) const RDMA_CORE_RELEASE: &str = "44.0";

/// The crate holding the vendored headers and the generated files.
const SYS_CRATE: &str = "crates/orbitte-verbs-sys";

/// The fixed target triple the bindings are generated for (see
/// docs/building.md: the committed file is for 64-bit Linux).
const TARGET: &str = "x86_64-unknown-linux-gnu";

/// One generated file: its path relative to the workspace root and its text.
struct Output {
    path: &'static str,
    text: String,
}

/// Whether `args` of the generator task `task` ask for `--check` (the only
/// argument such a generator takes).
pub(crate) fn check_flag(args: &[String], task: &str) -> Result<bool, String> {
    let mut check = false;
    for a in args {
        match a.as_str() {
            "--check" => check = true,
            other => {
                return Err(format!(
                    "unexpected argument `{other}`; usage: cargo xtask {task} [--check]"
                ));
            }
        }
    }
    Ok(check)
}

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    const USAGE: &str =
        "usage: cargo xtask bindgen [--check] [--expect-llvm N] [--libclang-version]";
    let mut check = false;
    let mut expect_llvm: Option<u32> = None;
    let mut version_only = false;
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--check" => check = true,
            "--libclang-version" => version_only = true,
            "--expect-llvm" => {
                let n = args.next().and_then(|n| n.parse().ok()).ok_or_else(|| {
                    format!("--expect-llvm takes an LLVM major version (18); {USAGE}")
                })?;
                expect_llvm = Some(n);
            }
            other => return Err(format!("unexpected argument `{other}`; {USAGE}")),
        }
    }
    let root = crate::workspace::root();
    let libclang = load_libclang()?;
    if version_only {
        println!("{}", libclang.version.as_deref().unwrap_or(""));
        return Ok(());
    }
    println!(
        "bindgen: libclang {} ({})",
        libclang.path.display(),
        libclang.version_label()
    );
    if let Some(warning) = clang_path_warning(&libclang) {
        eprintln!("bindgen: warning: {warning}");
    }
    if let Some(want) = expect_llvm {
        check_release(&libclang, want)?;
    }
    if let Some(extra) = std::env::var_os(EXTRA_CLANG_ARGS) {
        println!(
            "bindgen: {EXTRA_CLANG_ARGS}={}",
            extra.to_string_lossy().trim()
        );
    }
    let outputs = without_panic(|| generate(&root)).map_err(|stop| {
        format!(
            "bindgen stopped ({stop}) under libclang {}; it may be too old or broken: install \
             libclang-dev (LLVM 14 or newer) or point LIBCLANG_PATH at another one",
            libclang.path.display()
        )
    })??;
    if check {
        let mut drifted = Vec::new();
        for out in &outputs {
            let path = root.join(out.path);
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != out.text {
                drifted.push(format!(
                    "{} ({})",
                    out.path,
                    diff_summary(&committed, &out.text)
                ));
            }
        }
        if drifted.is_empty() {
            println!("bindgen: {} file(s) up to date", outputs.len());
            Ok(())
        } else {
            Err(format!(
                "committed bindings differ from the headers: {}; run `cargo xtask bindgen` and \
                 commit the result",
                drifted.join("; ")
            ))
        }
    } else {
        for out in &outputs {
            let path = root.join(out.path);
            std::fs::write(&path, &out.text)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            println!("bindgen: wrote {}", out.path);
        }
        Ok(())
    }
}

/// Runs `f`, turning a panic inside bindgen or clang-sys (an unsupported
/// libclang makes them panic) into its message, printed by no hook: the
/// user gets one line, not a backtrace.
fn without_panic<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Result<T, String> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(f);
    std::panic::set_hook(previous);
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into())
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    })
}

/// The environment variable bindgen reads extra clang arguments from
/// (`-isystem DIR` gives a libclang without resource headers its own).
pub(crate) const EXTRA_CLANG_ARGS: &str = "BINDGEN_EXTRA_CLANG_ARGS";

/// The libclang this process loaded.
pub(crate) struct Libclang {
    /// The file that was loaded, as clang-sys found it.
    pub(crate) path: PathBuf,
    /// What the library says it is (`clang_getClangVersion`:
    /// "Debian clang version 14.0.6").
    pub(crate) version: Option<String>,
    /// The LLVM major version: from `version`, else from the file's
    /// canonical path when it names one.
    pub(crate) major: Option<u32>,
    /// The oldest release with every function this library exports
    /// (clang-sys's probe), for a library that reports no version and whose
    /// path names none.
    symbols: Option<String>,
}

impl Libclang {
    fn version_label(&self) -> String {
        let root = install_root(&self.path);
        match (self.major, &self.version) {
            (Some(m), Some(v)) => format!("LLVM {m}: \"{v}\", {}", root.display()),
            (Some(m), None) => format!("LLVM {m} by its path, {}", root.display()),
            (None, _) => format!(
                "LLVM {} by its symbols, {}",
                self.symbols.as_deref().unwrap_or("?"),
                root.display()
            ),
        }
    }
}

/// Fails unless the loaded libclang is of LLVM release `want`: whatever
/// selected another one (`LIBCLANG_PATH`, an inherited `CLANG_PATH`) is
/// named.
fn check_release(libclang: &Libclang, want: u32) -> Result<(), String> {
    if libclang.major == Some(want) {
        return Ok(());
    }
    let got = libclang.major.map_or_else(
        || "of an unknown release".to_string(),
        |m| format!("LLVM {m}"),
    );
    let selected_by = match std::env::var_os("LIBCLANG_PATH") {
        Some(p) => format!("LIBCLANG_PATH={}", Path::new(&p).display()),
        None => "the default search (LIBCLANG_PATH is unset)".to_string(),
    };
    Err(format!(
        "libclang {} is {got}, not the expected LLVM {want}; {selected_by} selected it: point \
         LIBCLANG_PATH at an LLVM {want} libclang (its directory or the file)",
        libclang.path.display()
    ))
}

/// Loads libclang into this thread (where bindgen will find it) and says
/// which one it is. A missing libclang is one line naming the packages.
fn load_libclang() -> Result<Libclang, String> {
    if let Err(e) = clang_sys::load() {
        let first = e.lines().next().unwrap_or("not found").trim().to_string();
        let hint = match std::env::var_os("LIBCLANG_PATH") {
            Some(p) => format!(
                "LIBCLANG_PATH={} holds no usable libclang; point it at the directory of \
                 libclang.so or unset it",
                Path::new(&p).display()
            ),
            None => "install libclang-dev (or libclang1-NN with libclang-common-NN-dev), or set \
                     LIBCLANG_PATH to the directory holding libclang.so"
                .to_string(),
        };
        return Err(format!("libclang not found ({first}); {hint}"));
    }
    let Some(lib) = clang_sys::get_library() else {
        return Err("libclang was loaded but clang-sys does not report it; rerun".into());
    };
    let path = lib.path().to_path_buf();
    let version = clang_version();
    let major = version
        .as_deref()
        .and_then(clang_version_major)
        .or_else(|| llvm_major(&path));
    let symbols = lib.version().map(|v| v.to_string());
    Ok(Libclang {
        path,
        version,
        major,
        symbols,
    })
}

/// The loaded libclang's own version string (`clang_getClangVersion`).
fn clang_version() -> Option<String> {
    use clang_sys::{clang_disposeString, clang_getCString, clang_getClangVersion};
    if !(clang_getClangVersion::is_loaded()
        && clang_getCString::is_loaded()
        && clang_disposeString::is_loaded())
    {
        return None;
    }
    // SAFETY: the three functions are loaded on this thread (checked above).
    // clang_getClangVersion takes no argument; the CXString it returns is
    // read while alive (the text copied before) and disposed of once.
    unsafe {
        let string = clang_getClangVersion();
        let text = clang_getCString(string);
        let version = (!text.is_null()).then(|| {
            std::ffi::CStr::from_ptr(text)
                .to_string_lossy()
                .trim()
                .to_string()
        });
        clang_disposeString(string);
        version.filter(|v| !v.is_empty())
    }
}

/// The LLVM major version in a libclang version string: "clang version
/// 18.1.1 (https://...)", "Debian clang version 14.0.6", "Ubuntu clang
/// version 18.1.3 (1ubuntu1)".
pub(crate) fn clang_version_major(version: &str) -> Option<u32> {
    let (_, rest) = version.split_once("clang version ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The LLVM major version named by a libclang or clang path
/// (`/usr/lib/llvm-14/...`, `libclang-19.so.1`, `clang-18`, Fedora's
/// `libclang.so.18.1`), following links.
pub(crate) fn llvm_major(path: &Path) -> Option<u32> {
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    for p in [&canonical, &path.to_path_buf()] {
        for comp in p.components().rev() {
            let s = comp.as_os_str().to_string_lossy();
            for prefix in ["llvm-", "libclang-", "clang-", "libclang.so."] {
                if let Some(rest) = s.strip_prefix(prefix) {
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    // `libclang.so.1` is the ABI soname, not a release.
                    match digits.parse() {
                        Ok(1) if prefix == "libclang.so." => {}
                        Ok(n) => return Some(n),
                        Err(_) => {}
                    }
                }
            }
        }
    }
    None
}

/// The installation a library or executable belongs to: the parent of its
/// `lib`/`bin` directory (`/usr/lib/llvm-14`). Links are not followed:
/// Debian's `/usr/lib/llvm-14/lib/libclang.so.1` points into the multiarch
/// directory, which belongs to no single release.
pub(crate) fn install_root(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(path);
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("lib" | "lib64" | "bin") => dir.parent().unwrap_or(dir).to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// A warning when `CLANG_PATH` names a clang from another installation than
/// the libclang in use (tools that detect include paths through it would
/// mix two LLVM releases' headers).
fn clang_path_warning(libclang: &Libclang) -> Option<String> {
    let clang_path = std::env::var_os("CLANG_PATH")?;
    let clang = PathBuf::from(&clang_path);
    if !clang.is_file() {
        return Some(format!(
            "CLANG_PATH={} is not a clang executable; unset it or point it at the clang of {}",
            clang.display(),
            install_root(&libclang.path).display()
        ));
    }
    let canonical = clang.canonicalize().unwrap_or_else(|_| clang.clone());
    let (clang_root, lib_root) = (install_root(&canonical), install_root(&libclang.path));
    let (clang_major, lib_major) = (llvm_major(&clang), libclang.major);
    let differs = match (clang_major, lib_major) {
        (Some(a), Some(b)) => a != b,
        _ => clang_root != lib_root,
    };
    differs.then(|| {
        format!(
            "inherited CLANG_PATH={} ({}) is a different installation than libclang {} ({}); \
             unset CLANG_PATH or point it at the clang of the same release",
            clang.display(),
            clang_major.map_or_else(|| clang_root.display().to_string(), |m| format!("LLVM {m}")),
            libclang.path.display(),
            lib_major.map_or_else(|| lib_root.display().to_string(), |m| format!("LLVM {m}")),
        )
    })
}

/// Runs bindgen twice over the vendored verbs.h: the public types and
/// constants, and the exported functions' declarations (kept private in the
/// crate, used only to check the run-time symbol table's signatures).
fn generate(root: &Path) -> Result<Vec<Output>, String> {
    let krate = root.join(SYS_CRATE);
    let include = krate.join("rdma-core/include");
    let header = include.join("infiniband/verbs.h");
    if !header.is_file() {
        return Err(format!(
            "{} is missing; the vendored rdma-core {RDMA_CORE_RELEASE} headers belong in {}",
            header.display(),
            include.display()
        ));
    }
    let banner = format!(
        "// @generated by `cargo xtask bindgen` from the rdma-core {RDMA_CORE_RELEASE} headers \
         in rdma-core/include; do not edit."
    );

    let aliases = uverbs_aliases(&include)?;
    let alias_enums: Vec<&str> = aliases.iter().map(|a| a.enum_name.as_str()).collect();
    let mut type_allowlist = "ibv_.*|verbs_context|_compat_ibv_port_attr".to_string();
    for e in &alias_enums {
        type_allowlist.push('|');
        type_allowlist.push_str(e);
    }
    let types = base_builder(&header, &include)?
        .allowlist_type(type_allowlist)
        .allowlist_var("IBV_.*")
        // glibc's types (whose internals differ between releases) come from libc.
        .blocklist_type(GLIBC_TYPES)
        .raw_line(banner.clone())
        .raw_line("pub use libc::{pthread_cond_t, pthread_mutex_t, timespec};");
    let mut types = name_anonymous_enum_types(&rustfmt(root, &bindgen_text(types)?)?);
    for a in &aliases {
        let generated = |name: &str| types.contains(&format!("pub const {name}: "));
        if generated(&a.target) && !generated(&a.alias) {
            types.push_str(&format!("pub use self::{} as {};\n", a.target, a.alias));
        }
    }
    let types = rustfmt(root, &types)?;

    let functions = base_builder(&header, &include)?
        .allowlist_function("_?ibv_.*")
        .allowlist_recursively(false)
        .raw_line(banner)
        .raw_line("use super::bindings::*;");
    let functions = bindgen_text(functions)?;

    Ok(vec![
        Output {
            path: "crates/orbitte-verbs-sys/src/generated/bindings.rs",
            text: types,
        },
        Output {
            path: "crates/orbitte-verbs-sys/src/generated/declarations.rs",
            text: rustfmt(root, &functions)?,
        },
    ])
}

/// `#define IBV_X IB_UVERBS_X` in verbs_api.h: a verbs constant that is
/// an enum constant of the kernel's uverbs headers. bindgen cannot evaluate
/// such a macro, so the enum is generated and the name re-exported.
struct UverbsAlias {
    alias: String,
    target: String,
    enum_name: String,
}

fn uverbs_aliases(include: &Path) -> Result<Vec<UverbsAlias>, String> {
    let read = |rel: &str| {
        let p = include.join(rel);
        std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))
    };
    let api = read("infiniband/verbs_api.h")?;
    let enums = [
        read("infiniband/ib_user_ioctl_verbs.h")?,
        read("rdma/ib_user_verbs.h")?,
    ];
    let mut aliases = Vec::new();
    for line in api.lines() {
        let mut words = line.split_whitespace();
        let (Some("#define"), Some(alias), Some(target), None) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        if !(alias.starts_with("IBV_") && target.starts_with("IB_UVERBS_")) {
            continue;
        }
        if let Some(enum_name) = enums.iter().find_map(|text| enclosing_enum(text, target)) {
            aliases.push(UverbsAlias {
                alias: alias.to_string(),
                target: target.to_string(),
                enum_name,
            });
        }
    }
    Ok(aliases)
}

/// The name of the C `enum NAME {` block that declares `constant`.
fn enclosing_enum(text: &str, constant: &str) -> Option<String> {
    let mut current: Option<&str> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("enum ") {
            current = rest.split_whitespace().next().filter(|n| *n != "{");
        } else if t.starts_with('}') {
            current = None;
        } else if let Some(name) = current {
            let first = t
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next();
            if first == Some(constant) {
                return Some(name.to_string());
            }
        }
    }
    None
}

/// glibc types reached from verbs.h; their internals vary between glibc
/// releases, so they are taken from the `libc` crate instead.
const GLIBC_TYPES: &str = "pthread_mutex_t|pthread_cond_t|__pthread_.*|__atomic_wide_counter.*|timespec|__time_t|\
     __syscall_slong_t";

/// Replaces the aliases bindgen invents for anonymous C enums
/// (`pub type _bindgen_ty_13 = u32;`) with their integer type. The number
/// counts every anonymous item before it, system headers included, so it
/// would change with the glibc release; the integer type does not.
fn name_anonymous_enum_types(text: &str) -> String {
    let mut aliases: Vec<(String, String)> = Vec::new();
    let mut kept = String::with_capacity(text.len());
    for line in text.lines() {
        let alias = line
            .strip_prefix("pub type _bindgen_ty_")
            .and_then(|rest| rest.strip_suffix(';'))
            .and_then(|rest| rest.split_once(" = "));
        match alias {
            Some((n, ty)) if n.chars().all(|c| c.is_ascii_digit()) => {
                aliases.push((format!("_bindgen_ty_{n}"), ty.to_string()));
            }
            _ => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    // Longest names first, so `_bindgen_ty_1` never rewrites `_bindgen_ty_13`.
    aliases.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    for (name, ty) in &aliases {
        kept = replace_word(&kept, name, ty);
    }
    kept
}

/// Replaces `word` where it stands as a whole identifier.
fn replace_word(text: &str, word: &str, with: &str) -> String {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + word.len()..].chars().next();
        out.push_str(&rest[..at]);
        if before.is_some_and(is_ident) || after.is_some_and(is_ident) {
            out.push_str(word);
        } else {
            out.push_str(with);
        }
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}

fn base_builder(header: &Path, include: &Path) -> Result<bindgen::Builder, String> {
    let target = bindgen::RustTarget::stable(85, 0)
        .map_err(|e| format!("bindgen rejects Rust 1.85 as its target: {e}"))?;
    Ok(bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("--target={TARGET}"))
        .clang_arg(format!("-I{}", include.display()))
        // libclang finds its own resource headers; asking a `clang` found via
        // CLANG_PATH/PATH could mix releases (see the module docs).
        .detect_include_paths(false)
        .rust_target(target)
        .rust_edition(bindgen::RustEdition::Edition2024)
        .use_core()
        .ctypes_prefix("::core::ffi")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .translate_enum_integer_types(true)
        .layout_tests(false)
        .generate_comments(false)
        .derive_default(true)
        .merge_extern_blocks(true)
        .wrap_unsafe_ops(true)
        .formatter(bindgen::Formatter::None))
}

fn bindgen_text(builder: bindgen::Builder) -> Result<String, String> {
    let bindings = builder.generate().map_err(|e| {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or("").trim().to_string();
        if text.contains("stddef.h") || text.contains("stdint.h") {
            format!(
                "libclang cannot find its own headers ({first}); install \
                 libclang-common-NN-dev for the libclang in use, or, for a libclang shipped \
                 without them (PyPI's libclang wheel), pass clang's resource headers of the \
                 same release: {EXTRA_CLANG_ARGS}=\"-isystem DIR\" (LLVM 18: the ziglang \
                 0.13.0 wheel's ziglang/lib/include)"
            )
        } else if text.contains("file not found") {
            format!("a system header is missing ({first}); install libc6-dev and linux-libc-dev")
        } else {
            format!("bindgen failed: {first}")
        }
    })?;
    Ok(bindings.to_string())
}

/// Formats with the pinned toolchain's rustfmt and the workspace's
/// rustfmt.toml, exactly as `cargo fmt` will see the file.
fn rustfmt(root: &Path, text: &str) -> Result<String, String> {
    use std::io::Write;
    let rustfmt = std::env::var("RUSTFMT").unwrap_or_else(|_| "rustfmt".into());
    let mut child = Command::new(&rustfmt)
        .args(["--edition", "2024", "--config-path"])
        .arg(root.join("rustfmt.toml"))
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("cannot run `{rustfmt}`: {e}; install it with `rustup component add rustfmt`")
        })?;
    let mut stdin = child.stdin.take().ok_or("rustfmt has no stdin")?;
    let input = text.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child
        .wait_with_output()
        .map_err(|e| format!("rustfmt did not finish: {e}"))?;
    let _ = writer.join();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "rustfmt rejected the generated bindings: {}",
            err.lines().next().unwrap_or("").trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("rustfmt printed invalid UTF-8: {e}"))
}

/// A short description of how two texts differ: line counts and the first
/// differing line.
pub(crate) fn diff_summary(old: &str, new: &str) -> String {
    if old.is_empty() {
        return "missing".into();
    }
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let first = a
        .iter()
        .zip(&b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let only_old = a.iter().filter(|l| !b.contains(l)).count();
    let only_new = b.iter().filter(|l| !a.contains(l)).count();
    format!(
        "{} committed lines vs {} generated, {only_old} removed, {only_new} added, first \
         difference at line {}: `{}`",
        a.len(),
        b.len(),
        first + 1,
        b.get(first).or(a.get(first)).map_or("", |l| l.trim())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_reads_common_layouts() {
        assert_eq!(
            llvm_major(Path::new("/nonexistent/llvm-14/lib/libclang.so.1")),
            Some(14)
        );
        assert_eq!(
            llvm_major(Path::new("/nonexistent/lib/libclang-19.so.1")),
            Some(19)
        );
        assert_eq!(llvm_major(Path::new("/nonexistent/bin/clang-18")), Some(18));
        assert_eq!(
            llvm_major(Path::new("/nonexistent/lib64/libclang.so.18.1")),
            Some(18)
        );
        assert_eq!(llvm_major(Path::new("/nonexistent/lib/libclang.so")), None);
    }

    #[test]
    fn clang_version_major_reads_the_library_version_string() {
        assert_eq!(clang_version_major("clang version 18.1.1"), Some(18));
        assert_eq!(clang_version_major("Debian clang version 14.0.6"), Some(14));
        assert_eq!(
            clang_version_major("Ubuntu clang version 18.1.3 (1ubuntu1)"),
            Some(18)
        );
        assert_eq!(
            clang_version_major("clang version 19.1.7 (https://github.com/llvm/llvm-project x)"),
            Some(19)
        );
        assert_eq!(clang_version_major("LLVM 18.1.1"), None);
        assert_eq!(clang_version_major("clang version "), None);
    }

    #[test]
    fn a_libclang_of_another_release_fails_the_expectation() {
        let lib = |major| Libclang {
            path: "/nonexistent/clang/native/libclang.so".into(),
            version: None,
            major,
            symbols: None,
        };
        assert!(check_release(&lib(Some(18)), 18).is_ok());
        let err = check_release(&lib(Some(14)), 18).unwrap_err();
        assert!(
            err.contains("is LLVM 14, not the expected LLVM 18"),
            "{err}"
        );
        let err = check_release(&lib(None), 18).unwrap_err();
        assert!(err.contains("unknown release"), "{err}");
    }

    #[test]
    fn install_root_strips_lib_and_bin() {
        assert_eq!(
            install_root(Path::new("/nonexistent/llvm-14/lib/libclang.so.1")),
            PathBuf::from("/nonexistent/llvm-14")
        );
        assert_eq!(
            install_root(Path::new("/nonexistent/llvm-19/bin/clang")),
            PathBuf::from("/nonexistent/llvm-19")
        );
    }

    #[test]
    fn anonymous_enum_aliases_become_their_integer_type() {
        let text = "pub const A: _bindgen_ty_1 = 0;\npub type _bindgen_ty_1 = u32;\n\
                    pub const B: _bindgen_ty_13 = 1;\npub type _bindgen_ty_13 = i32;\n\
                    pub struct x__bindgen_ty_1;\n";
        assert_eq!(
            name_anonymous_enum_types(text),
            "pub const A: u32 = 0;\npub const B: i32 = 1;\npub struct x__bindgen_ty_1;\n"
        );
    }

    #[test]
    fn enclosing_enum_finds_the_declaring_block() {
        let text = "enum a_flags {\n\tA_ONE = 1,\n\tA_TWO = 2,\n};\nenum b {\n\tB_X,\n};\n";
        assert_eq!(enclosing_enum(text, "A_TWO").as_deref(), Some("a_flags"));
        assert_eq!(enclosing_enum(text, "B_X").as_deref(), Some("b"));
        assert_eq!(enclosing_enum(text, "A_T"), None);
    }

    /// `cargo test` catches drift too, wherever a libclang is installed.
    /// CI installs one (libclang1-14), so there a missing libclang fails.
    #[test]
    fn committed_bindings_match_the_vendored_headers() {
        if let Err(e) = load_libclang() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI installs libclang: {e}"
            );
            println!("skipped: {e}");
            return;
        }
        let root = crate::workspace::root();
        for out in generate(&root).expect("bindgen runs on the vendored headers") {
            let committed = std::fs::read_to_string(root.join(out.path)).unwrap_or_default();
            assert!(
                committed == out.text,
                "{} is stale ({}); run `cargo xtask bindgen`",
                out.path,
                diff_summary(&committed, &out.text)
            );
        }
    }

    #[test]
    fn a_panic_becomes_its_first_line() {
        assert_eq!(without_panic(|| 7), Ok(7));
        let stop = without_panic(|| -> u8 { panic!("libclang lacks clang_foo\nmore") });
        assert_eq!(stop, Err("libclang lacks clang_foo".to_string()));
    }

    #[test]
    fn diff_summary_names_the_first_difference() {
        let s = diff_summary("a\nb\nc\n", "a\nx\nc\n");
        assert!(s.contains("first difference at line 2: `x`"), "{s}");
        assert!(s.contains("1 removed, 1 added"), "{s}");
        assert_eq!(diff_summary("", "a"), "missing");
    }
}
