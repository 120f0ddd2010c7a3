//! The `--json` output of doctor, topology and bench (`--peers` too) has the shape that
//! docs/json.md documents: every object the commands print (each variant
//! of a tagged object on its own) is shown in the page's examples with
//! exactly the same keys, and each key holds the same kind of value
//! (`null` stands for an absent optional value of any kind).
//!
//! The real output comes from this machine (doctor, topology, bench in
//! loopback) and from every recorded sysfs tree (topology). An example in
//! the page is a whole document, or one object at a place in a document,
//! named by a comment right above the block: `<!-- json: topology
//! discovered.slots[] -->` (several places may follow the command; a block
//! that is an array lists variants of the object at those places).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt as _;
use serde_json::Value;

/// Keys whose string value names the variant of a tagged object.
const TAGS: &[&str] = &[
    "command",
    "status",
    "outcome",
    "kind",
    "slot",
    "cause",
    "access",
    "problem",
    "gid_error",
];

/// Objects whose keys are data (NUMA node numbers), not names.
const MAPS: &[&str] = &["numa_distances"];

/// Per object (place and variant): each key and the kind of its value.
type Shapes = BTreeMap<String, BTreeMap<String, &'static str>>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Records the shape of `v`, found at `place` (`topology:selection.rails[]`).
fn shapes(place: &str, v: &Value, out: &mut Shapes) {
    match v {
        Value::Object(m) => {
            let mut id = place.to_owned();
            for t in TAGS {
                if let Some(Value::String(s)) = m.get(*t) {
                    id.push_str(&format!(" {t}={s}"));
                }
            }
            let last = place.rsplit(['.', ':']).next().unwrap_or_default();
            let map = MAPS.contains(&last);
            let entry = out.entry(id).or_default();
            for (k, child) in m {
                let k = if map { "*" } else { k.as_str() };
                let have = entry.entry(k.to_owned()).or_insert(kind(child));
                if *have == "null" {
                    *have = kind(child);
                }
            }
            for (k, child) in m {
                let k = if map { "*" } else { k.as_str() };
                let sep = if place.ends_with(':') { "" } else { "." };
                shapes(&format!("{place}{sep}{k}"), child, out);
            }
        }
        Value::Array(items) => {
            for i in items {
                shapes(&format!("{place}[]"), i, out);
            }
        }
        _ => {}
    }
}

/// The documented shapes: every ```json block of docs/json.md.
fn documented() -> (Shapes, usize) {
    let text = std::fs::read_to_string(root().join("docs/json.md")).expect("docs/json.md");
    let mut out = Shapes::new();
    let mut blocks = 0;
    let mut last_comment = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(c) = line
            .strip_prefix("<!-- json: ")
            .and_then(|c| c.strip_suffix(" -->"))
        {
            last_comment = Some(c.to_owned());
            continue;
        }
        if line != "```json" {
            if !line.trim().is_empty() {
                last_comment = None;
            }
            continue;
        }
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        let body = body.join("\n");
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("a json block of docs/json.md does not parse: {e}\n{body}"));
        blocks += 1;
        match last_comment.take() {
            Some(at) => {
                // `CMD PLACE...`: the same object at each place; an array
                // lists several variants of it.
                let mut words = at.split_whitespace();
                let cmd = words.next().unwrap_or_default();
                for path in words {
                    let place = format!("{cmd}:{path}");
                    match &v {
                        Value::Array(items) => {
                            for i in items {
                                shapes(&place, i, &mut out);
                            }
                        }
                        _ => shapes(&place, &v, &mut out),
                    }
                }
            }
            None => {
                let cmd = v["command"]
                    .as_str()
                    .expect("a whole document names its command");
                shapes(&format!("{cmd}:"), &v, &mut out);
            }
        }
    }
    (out, blocks)
}

fn orbitte_json(args: &[&str]) -> Value {
    orbitte_json_exiting(args, &[0])
}

/// The document `orbitte ARGS` prints, exiting with one of `codes`
/// (`topology --initialize` prints its report and exits 1 when it
/// initialized nothing).
fn orbitte_json_exiting(args: &[&str], codes: &[i32]) -> Value {
    let mut c = Command::cargo_bin("orbitte").unwrap();
    c.args(args).env("ORBITTE_LOG", "error");
    for v in orbitte_topology::ENV_VARS {
        c.env_remove(v);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.code().is_some_and(|c| codes.contains(&c)),
        "orbitte {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("orbitte {args:?}: {e}"))
}

fn real() -> Vec<Value> {
    let mut docs = vec![
        orbitte_json(&["doctor", "--json"]),
        orbitte_json(&["topology", "--json"]),
        orbitte_json_exiting(&["topology", "--json", "--initialize"], &[0, 1]),
        orbitte_json(&[
            "bench",
            "--json",
            "--quiet",
            "--duration",
            "0.1",
            "--check",
            "--block-size",
            "16K",
            "--batch-size",
            "2",
        ]),
    ];
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("sweep.svg");
    docs.push(orbitte_json(&[
        "bench",
        "--json",
        "--quiet",
        "--duration",
        "0.05",
        "--sweep",
        "--chart",
        chart.to_str().unwrap(),
        "--batch-size",
        "1",
        "--no-baseline",
    ]));
    docs.push(orbitte_json(&[
        "bench",
        "--json",
        "--peers",
        "1,2",
        "--duration",
        "0.05",
        "--blocks",
        "4K",
        "--batch-size",
        "1",
    ]));
    let fixtures = root().join("crates/orbitte-topology/tests/fixtures");
    let mut trees: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("sys").is_dir())
        .collect();
    trees.sort();
    assert!(trees.len() >= 4, "recorded trees: {trees:?}");
    for t in trees {
        docs.push(orbitte_json(&[
            "topology",
            "--json",
            "--sysfs-root",
            t.to_str().unwrap(),
        ]));
        // A strict pin that selects nothing: the failed selection.
        let f = dir.path().join("pin.toml");
        std::fs::write(&f, "[rdma]\ndevice = \"mlx5_1\"\nport = 1\ngid_index = 0\n").unwrap();
        docs.push(orbitte_json(&[
            "topology",
            "--json",
            "--sysfs-root",
            t.to_str().unwrap(),
            "--config",
            f.to_str().unwrap(),
        ]));
    }
    docs
}

#[test]
fn every_object_the_commands_print_is_documented_with_the_same_keys() {
    let (doc, blocks) = documented();
    assert!(blocks >= 3, "docs/json.md has {blocks} json blocks");
    let mut seen = Shapes::new();
    for d in real() {
        assert_eq!(d["schema_version"], 1, "{d}");
        let cmd = d["command"].as_str().expect("command").to_owned();
        shapes(&format!("{cmd}:"), &d, &mut seen);
    }
    let mut problems = Vec::new();
    for (id, keys) in &seen {
        let Some(documented) = doc.get(id) else {
            problems.push(format!(
                "not documented: `{id}` with keys {:?}",
                keys.keys().collect::<Vec<_>>()
            ));
            continue;
        };
        for (k, kind) in keys {
            match documented.get(k) {
                None => problems.push(format!("`{id}`: key `{k}` ({kind}) is not documented")),
                Some(d) if d != kind && *d != "null" && *kind != "null" => {
                    problems.push(format!("`{id}`: key `{k}` is {kind}, documented as {d}"))
                }
                Some(_) => {}
            }
        }
        for k in documented.keys() {
            if !keys.contains_key(k) {
                problems.push(format!("`{id}`: documented key `{k}` is not printed"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/json.md and the output differ:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_shape_walk_names_variants_by_their_tag() {
    let mut out = Shapes::new();
    let v: Value = serde_json::from_str(
        r#"{"command":"x","a":[{"kind":"one","n":1},{"kind":"two","s":null}],"numa_distances":{"0":[1]}}"#,
    )
    .unwrap();
    shapes("x:", &v, &mut out);
    assert_eq!(out["x:a[] kind=one"]["n"], "number");
    assert_eq!(out["x:a[] kind=two"]["s"], "null");
    assert!(out["x:numa_distances"].contains_key("*"));
}
