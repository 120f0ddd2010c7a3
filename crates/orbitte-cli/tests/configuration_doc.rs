//! Keeps docs/configuration.md in step with the code:
//! - every `ORBITTE_*` name that appears as a string literal in the code
//!   users run (Rust and the Python package: `src/`, `python/`, benches,
//!   examples, xtask) is in the doc, and every
//!   name in the doc exists in the code (integration tests included);
//! - every name of `orbitte_topology::ENV_VARS` is in the doc;
//! - every `EngineBuilder` option and every `SessionConfig` field is named;
//! - every key that `orbitte serve --check --json` prints is named, and the
//!   doc's full example passes `orbitte serve --check`.
#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt as _;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn doc() -> String {
    std::fs::read_to_string(root().join("docs/configuration.md"))
        .expect("docs/configuration.md exists")
}

/// `ORBITTE_[A-Z0-9_]+` tokens of `text` (a trailing `_` marks a prefix,
/// not a name, and is skipped).
fn env_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("ORBITTE_") {
        let start = i + pos;
        let prev_ok =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start + "ORBITTE_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_uppercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        let name = &text[start..end];
        if prev_ok && !name.ends_with('_') {
            out.insert(name.to_owned());
        }
        i = end;
    }
    out
}

/// Every `.rs` file under `dir`, not following symlinks (the topology
/// fixtures contain sysfs's symlink loops).
fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        let p = e.path();
        if ft.is_dir() && !p.ends_with("target") && !p.ends_with("fixtures") {
            source_files(&p, out);
        } else if ft.is_file() && p.extension().is_some_and(|x| x == "rs" || x == "py") {
            out.push(p);
        }
    }
}

/// `ORBITTE_*` names inside string literals of the code (comments do not
/// count: a name must be used to exist). With `user_facing`, only the code
/// that users run or configure (`src/`, `benches/`, `examples/`, xtask),
/// not the integration tests' own markers for their child processes.
fn code_env_names(user_facing: bool) -> BTreeSet<String> {
    let mut files = Vec::new();
    source_files(&root().join("crates"), &mut files);
    source_files(&root().join("xtask"), &mut files);
    let mut out = BTreeSet::new();
    for f in files {
        // This test names variables only to look for them.
        if f.ends_with("tests/configuration_doc.rs") {
            continue;
        }
        if user_facing && f.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        let python = f.extension().is_some_and(|x| x == "py");
        for line in text.lines() {
            // Python quotes with either mark and comments with `#`.
            let code = if python {
                line.split('#')
                    .next()
                    .unwrap_or_default()
                    .replace('\'', "\"")
            } else {
                line.split("//").next().unwrap_or_default().to_owned()
            };
            for lit in code.split('"').skip(1).step_by(2) {
                out.extend(env_names(lit));
            }
        }
    }
    out
}

#[test]
fn every_environment_variable_in_the_code_is_documented_and_vice_versa() {
    let doc = doc();
    let documented = env_names(&doc);
    let undocumented: Vec<_> = code_env_names(true)
        .difference(&documented)
        .cloned()
        .collect();
    assert!(
        undocumented.is_empty(),
        "add to docs/configuration.md: {undocumented:?}"
    );
    let code = code_env_names(false);
    let unknown: Vec<_> = documented.difference(&code).collect();
    assert!(
        unknown.is_empty(),
        "docs/configuration.md names variables no code uses: {unknown:?}"
    );
    for v in orbitte_topology::ENV_VARS {
        assert!(
            doc.contains(&format!("`{v}`")),
            "{v} missing from the table"
        );
    }
}

/// `pub fn NAME(mut self` in the engine's builder, `pub NAME:` in
/// `SessionConfig`.
fn engine_option_names() -> Vec<String> {
    let builder =
        std::fs::read_to_string(root().join("crates/orbitte-engine/src/config.rs")).unwrap();
    let mut names: Vec<String> = builder
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub fn "))
        .filter(|l| l.contains("(mut self"))
        .filter_map(|l| l.split('(').next())
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 10, "EngineBuilder options found: {names:?}");
    let session =
        std::fs::read_to_string(root().join("crates/orbitte-engine/src/session/mod.rs")).unwrap();
    let start = session
        .find("pub struct SessionConfig")
        .expect("SessionConfig");
    let body = &session[start..];
    let body = &body[..body.find("\n}").unwrap()];
    let fields: Vec<String> = body
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split(':').next())
        .filter(|n| !n.contains(' '))
        .map(str::to_owned)
        .collect();
    assert!(fields.len() >= 5, "SessionConfig fields found: {fields:?}");
    names.extend(fields);
    names
}

#[test]
fn every_engine_option_and_session_setting_is_documented() {
    let doc = doc();
    let missing: Vec<_> = engine_option_names()
        .into_iter()
        .filter(|n| !doc.contains(&format!("`{n}(")) && !doc.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "add to docs/configuration.md: {missing:?}"
    );
}

/// The ```toml block under "## Full example".
fn full_example(doc: &str) -> String {
    let at = doc
        .find("## Full example")
        .expect("a `## Full example` section");
    let rest = &doc[at..];
    let start = rest.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = rest[start..].find("```").expect("closed block");
    rest[start..start + end].to_owned()
}

fn keys(prefix: &str, v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if v.is_object()
                    || (v.is_array()
                        && v.as_array()
                            .is_some_and(|a| a.first().is_some_and(|x| x.is_object())))
                {
                    keys(&key, v, out);
                } else {
                    out.insert(key);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for i in items {
                keys(prefix, i, out);
            }
        }
        _ => {}
    }
}

#[test]
fn every_config_key_is_documented_and_the_full_example_is_valid() {
    let doc = doc();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("orbitte.toml");
    std::fs::write(&file, full_example(&doc)).unwrap();
    let out = Command::cargo_bin("orbitte")
        .unwrap()
        .args([
            "serve",
            "--config",
            file.to_str().unwrap(),
            "--check",
            "--json",
        ])
        .env("ORBITTE_LOG", "error")
        .envs(orbitte_topology::ENV_VARS.iter().map(|v| (*v, "auto")))
        .env_remove("ORBITTE_RDMA_WHITELIST")
        .env_remove("ORBITTE_RDMA_BLACKLIST")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the full example is refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut all = BTreeSet::new();
    keys("", &v["config"], &mut all);
    all.remove("rdma_table");
    assert!(all.len() >= 20, "{all:?}");
    let missing: Vec<_> = all
        .iter()
        .filter(|k| !doc.contains(&format!("`{k}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "add these keys to docs/configuration.md: {missing:?}"
    );
}

#[test]
fn env_name_scanner_finds_names_and_skips_prefixes() {
    let found = env_names("x ORBITTE_LOG, \"ORBITTE_RDMA_\" yORBITTE_NO ORBITTE_RDMA_PORT=1");
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        ["ORBITTE_LOG", "ORBITTE_RDMA_PORT"]
    );
}
