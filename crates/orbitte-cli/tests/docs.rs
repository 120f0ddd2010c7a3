//! The user docs hang together: docs/README.md links every page in docs/;
//! every relative link of the user docs (quick start, capabilities,
//! configuration, troubleshooting, the index and README.md) points at a
//! file that exists (anchors aside); troubleshooting keeps a section for
//! every symptom it answers.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The targets of `](target)` links in markdown text.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].to_owned());
        rest = &after[end..];
    }
    out
}

fn pages() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    v.sort();
    v
}

#[test]
fn the_index_links_every_page() {
    let index = std::fs::read_to_string(root().join("docs/README.md")).unwrap();
    let linked = links(&index);
    for page in pages() {
        let name = page.file_name().unwrap().to_str().unwrap().to_owned();
        if name == "README.md" {
            continue;
        }
        assert!(
            linked.contains(&name),
            "docs/README.md does not link {name}"
        );
    }
}

/// The index's glossary row names the glossary's terms a reader meets
/// first (the paths and the matrix included).
#[test]
fn the_index_names_the_glossary_terms() {
    let index = std::fs::read_to_string(root().join("docs/README.md")).unwrap();
    let glossary = std::fs::read_to_string(root().join("docs/glossary.md")).unwrap();
    let row = index
        .lines()
        .find(|l| l.starts_with("| [glossary.md](glossary.md)"))
        .expect("the glossary row");
    for term in [
        "source owner",
        "epoch",
        "Host Direct",
        "path",
        "capability matrix",
        "rail",
        "NIC ID",
        "inert slot",
        "dispatch mask",
        "Unquiesced",
    ] {
        let cell = format!(" {term},");
        let last = format!(" {term} |");
        assert!(
            row.contains(&cell) || row.contains(&last),
            "docs/README.md's glossary row lacks {term}: {row}"
        );
        assert!(
            glossary
                .to_lowercase()
                .contains(&format!("**{}.**", term.to_lowercase())),
            "docs/glossary.md defines no {term}"
        );
    }
}

#[test]
fn relative_links_of_the_user_docs_resolve() {
    // The pages this crate's owner writes, and the README's links.
    let files: Vec<PathBuf> = [
        "README.md",
        "docs/README.md",
        "docs/quickstart.md",
        "docs/capabilities.md",
        "docs/configuration.md",
        "docs/troubleshooting.md",
    ]
    .iter()
    .map(|f| root().join(f))
    .collect();
    let mut broken = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let dir = f.parent().unwrap();
        for l in links(&text) {
            if l.contains("://") || l.starts_with('#') || l.starts_with("mailto:") {
                continue;
            }
            let path = l.split('#').next().unwrap_or_default();
            if path.is_empty() || path.contains(' ') {
                continue;
            }
            if !dir.join(path).exists() {
                broken.push(format!("{}: {l}", f.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn troubleshooting_covers_every_symptom() {
    // The symptoms a user starts from, one section each (headings may be
    // reworded; each symptom must still be there).
    let t = std::fs::read_to_string(root().join("docs/troubleshooting.md")).unwrap();
    for needle in [
        "capability matrix",
        "crates.io",
        "bindings",
        "No RDMA device",
        "ResourceExhausted",
        "restart or a protocol change",
        "uncertain WRITE",
        "Unquiesced",
        "direct GPU RDMA",
    ] {
        assert!(
            t.contains(needle),
            "docs/troubleshooting.md lacks the section on `{needle}`"
        );
    }
}

#[test]
fn link_parser_finds_targets() {
    assert_eq!(links("a [x](b.md) c [y](../d#e) [z]"), ["b.md", "../d#e"]);
}

/// The user pages: every docs/*.md but the contributors' page on tests
/// (where test files are the subject) and the index.
fn user_pages() -> Vec<PathBuf> {
    pages()
        .into_iter()
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name != "testing.md" && name != "README.md"
        })
        .collect()
}

/// The test-file names (`tests/….rs`, `tests/….py`, `test_*.py`) and the
/// commit hashes (7 to 40 lowercase hex characters with at least one
/// letter and one digit, as a word) in a text.
fn history_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Paths: runs of path characters.
    let is_path = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    for token in text.split(|c: char| !is_path(c)) {
        let name = token.trim_end_matches('.');
        if let Some(i) = name.find("tests/") {
            let rest = &name[i..];
            if rest.ends_with(".rs") || rest.ends_with(".py") {
                out.push(name.to_owned());
                continue;
            }
        }
        let file = name.rsplit('/').next().unwrap_or_default();
        if file.starts_with("test_") && file.ends_with(".py") {
            out.push(name.to_owned());
        }
    }
    // Hashes: words of word characters.
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        let hex = word.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
        if (7..=40).contains(&word.len())
            && hex
            && word.chars().any(|c| c.is_ascii_digit())
            && word.chars().any(|c| c.is_ascii_lowercase())
        {
            out.push(word.to_owned());
        }
    }
    out
}

/// User pages say what the product does: the test that shows it is named
/// in docs/testing.md, the history in commit messages.
#[test]
fn user_pages_name_no_test_file_or_commit() {
    let mut hits = Vec::new();
    for page in user_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        for (n, line) in text.lines().enumerate() {
            for w in history_words(line) {
                hits.push(format!("docs/{name}:{}: {w}", n + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "user pages name test files or commits (say what the test shows, \
         or point at docs/testing.md; history goes in commit messages): {hits:#?}"
    );
}

#[test]
fn history_words_finds_test_files_and_hashes() {
    assert_eq!(
        history_words("see `crates/x/tests/gpu.rs`, tests/test_a.py and test_b.py."),
        ["crates/x/tests/gpu.rs", "tests/test_a.py", "test_b.py"]
    );
    assert_eq!(
        history_words("measured at a4656c8 (e3fc8970)"),
        ["a4656c8", "e3fc8970"]
    );
    // Words that only look like hashes or paths.
    assert!(history_words("deadbeef 1234567 0x7f3a9c1 abc123 A4656C8 tests/ test.rs").is_empty());
}
