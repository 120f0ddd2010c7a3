//! What a same-host peer can do with the memory the local path hands it:
//! at most what the range allows. A read-only range's fd cannot be turned
//! into a writable mapping by any process (a read-write reopen of
//! `/proc/self/fd/N`, a writable mapping, a write), and only a process of
//! the engine's uid, or one proving the cluster secret, maps at all. The
//! other-uid cases run the probe as uid 65534 (needs root); they report
//! `skipped: <reason>` without root, except under CI=true, where they fail.
#![forbid(unsafe_code)]

mod net_support;

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, pattern, untouched};
use orbitte_engine::transport::PeerId;
use orbitte_engine::transport::local::fetch_handout;
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_wire::auth::ClusterSecret;
use orbitte_wire::{AccessFlags, RangeDescriptor};

const LEN: usize = 1 << 16;
const NOBODY: u32 = 65534;

fn secret() -> ClusterSecret {
    ClusterSecret::new(b"local-access-cluster-secret-0123456789".to_vec()).unwrap()
}

/// Everything a peer holding `fd` tries in order to write through it;
/// each entry is what happened (`ok` or the error).
fn attempts(fd: OwnedFd) -> [(&'static str, String); 3] {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let verdict = |r: Result<(), String>| match r {
        Ok(()) => "ok".to_owned(),
        Err(e) => e,
    };
    let reopen = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| e.to_string());
    let write = match &reopen {
        Ok(f) => {
            let mut f = f;
            verdict(f.write_all(b"owned").map_err(|e| e.to_string()))
        }
        Err(e) => format!("no writable fd ({e})"),
    };
    // A writable shared mapping through the reopened fd when there is one,
    // else through the fd as handed out.
    let map_fd: OwnedFd = match reopen.as_ref() {
        Ok(f) => f.try_clone().unwrap().into(),
        Err(_) => fd,
    };
    let map = verdict(
        HostMemory::map_shared(map_fd, LEN, true)
            .map(|_| ())
            .map_err(|e| e.to_string()),
    );
    [
        ("reopen-rw", verdict(reopen.map(|_| ()))),
        ("write", write),
        ("map-rw", map),
    ]
}

/// Fetches the handout of the target at `addr` as initiator `source`.
fn fetch(
    addr: std::net::SocketAddr,
    source: &str,
    secret: Option<ClusterSecret>,
) -> Result<Vec<(RangeDescriptor, OwnedFd)>, String> {
    let mut c = cfg(source, 1);
    c.cluster_secret = secret;
    let i = Initiator::new(c, CoreConfig::default());
    let (_, link) = i
        .connect_tcp(PeerId(1), addr, 1)
        .map_err(|e| e.to_string())?;
    fetch_handout(&i.cfg, &i.peers, &link.handshake.peer).map_err(|e| e.to_string())
}

/// A target `name` (its local socket is named after it) with one
/// read-write and one read-only range.
fn target(
    name: &str,
    secret: Option<ClusterSecret>,
) -> (Target, u64, u64, std::sync::Arc<HostMemory>) {
    let mut c = cfg(name, 3);
    c.cluster_secret = secret;
    let t = Target::start(c);
    let rw_mem = HostMemory::alloc(LEN).unwrap();
    let ro_mem = HostMemory::alloc(LEN).unwrap();
    pattern(&ro_mem, 7);
    let rw = t.ranges.publish(rw_mem, RW).unwrap();
    let ro = t
        .ranges
        .publish(ro_mem.clone(), AccessFlags::REMOTE_READ)
        .unwrap();
    (t, rw.0, ro.0, ro_mem)
}

#[test]
fn a_read_only_range_cannot_be_written_through_its_fd_even_by_the_same_uid() {
    net_support::logs();
    let (t, rw, ro, ro_mem) = target("same-uid-target", None);
    let handout = fetch(t.addr(), "same-uid-peer", None).unwrap();
    let mut seen = Vec::new();
    for (desc, fd) in handout {
        seen.push(desc.range_id.0);
        if desc.range_id.0 == rw {
            // The writable range maps writable.
            HostMemory::map_shared(fd, LEN, true).unwrap();
            continue;
        }
        assert_eq!(desc.range_id.0, ro);
        for (what, got) in attempts(fd) {
            // The reopen itself may succeed (root ignores the mode); the
            // seal refuses every way to write.
            if what != "reopen-rw" {
                assert_ne!(got, "ok", "{what} through a read-only range's fd");
            }
        }
    }
    seen.sort();
    assert_eq!(seen, vec![rw, ro]);
    untouched(&ro_mem, 7);
    // The owner still writes its own memory (its mapping stays writable).
    ro_mem.fill(0, 8, 1).unwrap();
    assert_eq!(ro_mem.to_vec(0, 8).unwrap(), vec![1; 8]);
}

#[test]
fn memory_published_read_only_is_not_mapped_writable_through_another_publication() {
    let (t, _, ro, ro_mem) = target("two-publications-target", None);
    // The same memory published read-write as well: once the read-only
    // publication was handed out, the writable one is not mappable (the
    // fd would give write access the read-only range denies).
    let both = t.ranges.publish(ro_mem.clone(), RW).unwrap();
    let first = fetch(t.addr(), "first-peer", None).unwrap();
    let ids: Vec<u64> = first.iter().map(|(d, _)| d.range_id.0).collect();
    assert!(ids.contains(&ro), "{ids:?}");
    let second = fetch(t.addr(), "second-peer", None).unwrap();
    let ids: Vec<u64> = second.iter().map(|(d, _)| d.range_id.0).collect();
    assert!(
        !ids.contains(&both.0),
        "sealed memory handed out writable: {ids:?}"
    );
}

/// Why the other-uid probe cannot run here.
fn cannot_switch_uid() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        });
    (uid.as_deref() != Some("0")).then(|| "not root (the probe runs as uid 65534)".to_owned())
}

fn probe_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("orbitte-probe-{}", std::process::id()))
}

/// Runs `probe_child` as uid 65534 from a copy of this test binary that
/// the uid can execute; returns its stdout.
fn as_nobody(addr: std::net::SocketAddr, with_secret: bool) -> String {
    let dir = probe_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.join("probe");
    if !exe.exists() {
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = Command::new(&exe)
        .args([
            "probe_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PROBE_ADDR", addr.to_string())
        .env("PROBE_SECRET", if with_secret { "1" } else { "0" })
        .current_dir(&dir)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "probe failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn another_uid_maps_only_with_the_cluster_secret_and_never_gains_write() {
    net_support::logs();
    if net_support::skip_unless_ready("the other-uid probe", cannot_switch_uid()) {
        return;
    }
    // No secret: a process of another uid maps nothing.
    let (open, _, _, _) = target("no-secret-target", None);
    let out = as_nobody(open.addr(), false);
    assert!(
        out.contains("REFUSED") && out.contains("uid 65534") && out.contains("cluster secret"),
        "{out}"
    );
    assert!(!out.contains("RANGE"), "{out}");

    // With the secret: it maps, but a read-only range stays read-only.
    let (t, rw, ro, ro_mem) = target("secret-target", Some(secret()));
    let out = as_nobody(t.addr(), true);
    // The harness may print "test probe_child ... " in front of a line.
    let line = |id: u64| {
        let key = format!("RANGE {id} ");
        out.lines()
            .find_map(|l| l.find(&key).map(|at| l[at..].to_owned()))
            .unwrap_or_else(|| panic!("range {id} not handed out: {out}"))
    };
    let ro_line = line(ro);
    for what in ["reopen-rw", "write", "map-rw"] {
        assert!(
            !ro_line.contains(&format!("{what}=ok")),
            "{what} succeeded for uid 65534 on a read-only range: {ro_line}"
        );
    }
    assert!(line(rw).contains("rw-map=ok"), "{out}");
    untouched(&ro_mem, 7);
    let _ = std::fs::remove_dir_all(probe_dir());
}

/// The other-uid probe (run by `as_nobody`): fetches the handout and
/// tries to write through every fd it got.
#[test]
#[ignore = "run as a child by another_uid_maps_only_with_the_cluster_secret_and_never_gains_write"]
fn probe_child() {
    let addr = std::env::var("PROBE_ADDR").unwrap().parse().unwrap();
    let with_secret = std::env::var("PROBE_SECRET").as_deref() == Ok("1");
    let handout = match fetch(addr, "other-uid-peer", with_secret.then(secret)) {
        Ok(h) => h,
        Err(e) => {
            println!("REFUSED {e}");
            return;
        }
    };
    for (desc, fd) in handout {
        if desc.access.contains(AccessFlags::REMOTE_WRITE) {
            let ok = HostMemory::map_shared(fd, LEN, true).is_ok();
            println!(
                "RANGE {} rw-map={}",
                desc.range_id.0,
                if ok { "ok" } else { "err" }
            );
            continue;
        }
        let tried: Vec<String> = attempts(fd)
            .into_iter()
            .map(|(what, got)| format!("{what}={}", if got == "ok" { "ok" } else { "err" }))
            .collect();
        println!("RANGE {} {}", desc.range_id.0, tried.join(" "));
    }
    std::thread::sleep(Duration::from_millis(1));
}
