//! Every ```sh and ```toml example in docs/*.md runs as written.
//!
//! - A shell example runs with bash in a scratch directory, with the
//!   `orbitte` this test built first on the PATH (through a wrapper that
//!   records each invocation's exit status), in its own process group that
//!   is killed afterwards, within a time bound. Each `orbitte` line must
//!   have run and ended with status 0, or 1 where the command ran and found
//!   a problem on this machine (no RDMA device: the test prints the line);
//!   status 2 (the example's usage is wrong) or a crash fails.
//! - A TOML example is read by the command's own loader: `orbitte serve
//!   --check` for a file with `[engine]`, `orbitte topology --config` on a
//!   recorded tree for an `[rdma]`-only file.
//! - An example that needs what a test cannot have (hardware, root, cargo
//!   itself) is marked `<!-- no-run: REASON -->` on the line above it; the
//!   test lists each with its reason.
#![forbid(unsafe_code)]

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on one shell example (the quick start's sweep takes the longest).
const BOUND: Duration = Duration::from_secs(300);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[derive(Debug)]
struct Example {
    /// `docs/quickstart.md:55`
    at: String,
    lang: String,
    body: String,
    no_run: Option<String>,
}

fn examples() -> Vec<Example> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    let mut out = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let lang = lines[i].strip_prefix("```").unwrap_or_default();
            if lang != "sh" && lang != "toml" {
                i += 1;
                continue;
            }
            let start = i;
            let end = (i + 1..lines.len())
                .find(|&j| lines[j] == "```")
                .unwrap_or_else(|| panic!("{name}:{}: the block is not closed", i + 1));
            let no_run = start
                .checked_sub(1)
                .and_then(|p| lines[p].strip_prefix("<!-- no-run:"))
                .and_then(|r| r.strip_suffix("-->"))
                .map(|r| r.trim().to_owned());
            out.push(Example {
                at: format!("{name}:{}", start + 1),
                lang: lang.to_owned(),
                body: lines[start + 1..end].join("\n") + "\n",
                no_run,
            });
            i = end + 1;
        }
    }
    out
}

/// A directory holding an `orbitte` that runs the built binary and
/// appends `STATUS ARGS` to `log` (`stopped ARGS` when the example stops
/// it, as it stops a server it started in the background).
fn wrapper(dir: &Path, log: &Path) -> PathBuf {
    let bin = assert_cmd::cargo::cargo_bin("orbitte");
    let dir = dir.join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "#!/bin/sh\n{bin:?} \"$@\" &\npid=$!\ntrap 'kill $pid 2>/dev/null; wait $pid; echo \"stopped $*\" >> {log:?}; exit 143' TERM INT\nwait $pid\nrc=$?\necho \"$rc $*\" >> {log:?}\nexit $rc\n",
        bin = bin.display().to_string(),
        log = log.display().to_string()
    );
    let path = dir.join("orbitte");
    std::fs::write(&path, script).unwrap();
    let chmod = Command::new("chmod")
        .arg("755")
        .arg(&path)
        .status()
        .unwrap();
    assert!(chmod.success());
    dir
}

/// The lines of a shell example that start an `orbitte` command.
fn orbitte_lines(body: &str) -> usize {
    body.lines()
        .filter(|l| l.trim_start().starts_with("orbitte "))
        .count()
}

fn run_shell(e: &Example) -> Result<Vec<String>, String> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("orbitte.log");
    let bin = wrapper(dir.path(), &log);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(&e.body)
        .current_dir(&work)
        .env("PATH", path)
        .env("ORBITTE_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    for v in orbitte_topology::ENV_VARS {
        cmd.env_remove(v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + BOUND;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // What the example stopped finishes (the wrapper records it), then
    // whatever it left running (a target, a server) goes too.
    let group = format!("-{}", child.id());
    let alive = || {
        Command::new("kill")
            .args(["-0", "--", &group])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let settle = Instant::now() + Duration::from_secs(10);
    while alive() && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill")
        .args(["-KILL", "--", &group])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
    let stderr = {
        use std::io::Read as _;
        let mut s = String::new();
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut s);
        }
        s
    };
    if status.is_none() {
        return Err(format!("did not finish within {} s", BOUND.as_secs()));
    }
    let runs: Vec<(i32, String)> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (rc, args) = l.split_once(' ').unwrap_or((l, ""));
            let rc = if rc == "stopped" {
                -1
            } else {
                rc.parse().ok()?
            };
            Some((rc, args.to_owned()))
        })
        .collect();
    let want = orbitte_lines(&e.body);
    if runs.len() < want {
        return Err(format!(
            "{} of its {want} orbitte lines ran; stderr: {stderr}",
            runs.len()
        ));
    }
    let mut notes = Vec::new();
    for (rc, args) in runs {
        match rc {
            0 | -1 => {}
            1 => notes.push(format!(
                "`orbitte {args}` exited 1: it ran and found a problem on this machine"
            )),
            _ => {
                return Err(format!("`orbitte {args}` exited {rc}; stderr: {stderr}"));
            }
        }
    }
    if want == 0 && status.is_some_and(|s| !s.success()) {
        return Err(format!("failed: {stderr}"));
    }
    Ok(notes)
}

fn check_toml(e: &Example) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("example.toml");
    std::fs::write(&file, &e.body).unwrap();
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("orbitte"));
    if e.body.lines().any(|l| l.trim() == "[engine]") {
        cmd.args(["serve", "--check", "--config"]).arg(&file);
    } else {
        let tree = root().join("crates/orbitte-topology/tests/fixtures/cx7-roce");
        cmd.args(["topology", "--config"])
            .arg(&file)
            .arg("--sysfs-root")
            .arg(tree);
    }
    cmd.env("ORBITTE_LOG", "error");
    for v in orbitte_topology::ENV_VARS {
        cmd.env_remove(v);
    }
    let out = cmd.output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn every_shell_and_toml_example_in_the_docs_runs() {
    let all = examples();
    assert!(
        all.iter().filter(|e| e.no_run.is_none()).count() >= 5,
        "too few runnable examples: {all:#?}"
    );
    let mut failures = Vec::new();
    for e in &all {
        if let Some(reason) = &e.no_run {
            assert!(
                !reason.is_empty(),
                "{}: a no-run mark needs its reason",
                e.at
            );
            println!("not run: {} ({}): {reason}", e.at, e.lang);
            continue;
        }
        let result = if e.lang == "toml" {
            check_toml(e).map(|()| Vec::new())
        } else {
            run_shell(e)
        };
        match result {
            Ok(notes) => {
                println!("ran: {} ({})", e.at, e.lang);
                for n in notes {
                    println!("  {n}");
                }
            }
            Err(why) => failures.push(format!("{} ({}): {why}", e.at, e.lang)),
        }
    }
    assert!(
        failures.is_empty(),
        "examples that fail:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_example_scanner_finds_blocks_and_their_marks() {
    let all = examples();
    let quick: Vec<&Example> = all
        .iter()
        .filter(|e| e.at.starts_with("docs/quickstart.md"))
        .collect();
    assert!(quick.iter().any(|e| e.no_run.is_some()), "{quick:#?}");
    assert!(
        quick.iter().any(|e| orbitte_lines(&e.body) >= 3),
        "{quick:#?}"
    );
    assert!(all.iter().any(|e| e.lang == "toml"));
}
