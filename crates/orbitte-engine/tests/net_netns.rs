//! Several hosts on one machine: engines in two network namespaces joined
//! by a veth pair; the link is cut mid-transfer and the outcome arrives
//! within the timeout, saying what is known.
//!
//! Needs root and iproute2 (`ip`): otherwise the test prints
//! `skipped: <reason>`, except under CI=true, where it fails.
#![forbid(unsafe_code)]

mod net_support;

use std::process::Command;
use std::time::Duration;

use net_support::child::{self, ROLE};
use net_support::{Initiator, cfg, pattern, request};
use orbitte_engine::outcome::{DrainStatus, RemoteEffect, Status};
use orbitte_engine::transport::{Op, PeerId};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;

const BOUND: Duration = Duration::from_secs(90);

#[test]
#[ignore = "entry point for child processes of the other tests"]
fn child_entry() {
    match std::env::var(ROLE).as_deref() {
        Ok("target") => net_support::run_child_target(),
        Ok("initiator") => run_initiator(),
        _ => {}
    }
}

/// Transfers in a loop until one does not complete; prints each step.
fn run_initiator() {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let mut c = cfg("a-side", 1);
    c.io_timeout = Duration::from_secs(1);
    let core = CoreConfig {
        slice_size: 64 << 10,
        tcp_slice_size: 0,
        request_timeout: Duration::from_secs(4),
        drain_timeout: Duration::from_secs(3),
    };
    let i = Initiator::new(c, core);
    let src = HostMemory::alloc(8 << 20).unwrap();
    pattern(&src, 1);
    let reg = i.driver.register(src);
    let range: u64 = var("NET_RANGE").parse().unwrap();
    let (rails, _) = i
        .connect_tcp(PeerId(1), var("NET_TARGET").parse().unwrap(), 2)
        .unwrap();
    for n in 0..10_000u32 {
        let id = i.driver.submit(vec![request(
            1,
            Op::Write,
            reg,
            0,
            PeerId(1),
            range,
            0,
            8 << 20,
            &rails,
        )])[0];
        let o = i.driver.wait(id, BOUND);
        if o.status == Status::Complete {
            println!("DONE {n}");
            continue;
        }
        let drained = i.driver.wait_drain(id, BOUND) == DrainStatus::Drained;
        let effect = match o.remote_effect {
            RemoteEffect::None => "none",
            RemoteEffect::Possible { .. } => "possible",
            RemoteEffect::Complete => "complete",
        };
        println!(
            "OUTCOME status={:?} prefix={} len={} effect={effect} failure={} drained={drained}",
            o.status,
            o.completed_prefix,
            o.len,
            o.failure
                .map(|f| f.to_string().replace(' ', "_"))
                .unwrap_or_else(|| "none".into())
        );
        return;
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces and a veth pair; removed on drop, whatever happened.
struct Netns {
    a: String,
    b: String,
}

/// Removes namespaces left by an earlier run that was killed before its
/// cleanup ran (their creator's pid is gone).
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let mut parts = name.split('-');
        if parts.next() != Some("orbt") {
            continue;
        }
        let pid = parts.nth(1).unwrap_or_default();
        if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl Netns {
    fn create(tag: &str) -> Result<Self, String> {
        remove_stale();
        let id = std::process::id();
        let n = Self {
            a: format!("orbt-{tag}-{id}-a"),
            b: format!("orbt-{tag}-{id}-b"),
        };
        let (va, vb) = (format!("ob{id}{tag}a"), format!("ob{id}{tag}b"));
        debug_assert!(va.len() <= 15, "interface names are at most 15 bytes");
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        ip(&[
            "link", "add", &va, "netns", &n.a, "type", "veth", "peer", "name", &vb, "netns", &n.b,
        ])?;
        for (ns, dev, addr) in [(&n.a, &va, "192.0.2.1/30"), (&n.b, &vb, "192.0.2.2/30")] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }

    fn cut(&self) -> Result<(), String> {
        let id = std::process::id();
        ip(&["-n", &self.a, "link", "set", &format!("ob{id}cuta"), "down"])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// `Err(reason)` when this machine cannot run the test.
fn can_run() -> Result<(), String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("1").to_owned())
        });
    if uid.as_deref() != Some("0") {
        return Err("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("iproute2 (`ip`) is not installed".into()),
    }
}

#[test]
fn cutting_the_link_between_namespaces_mid_transfer_gives_an_outcome_within_the_timeout() {
    net_support::logs();
    if net_support::skip_unless_ready("the namespace test", can_run().err()) {
        return;
    }
    let ns = Netns::create("cut").expect("create namespaces");
    let exec = |n: &str| ["ip", "netns", "exec", n].map(str::to_owned);
    let (ea, eb) = (exec(&ns.a), exec(&ns.b));
    let target = child::spawn(
        "child_entry",
        &eb.iter().map(String::as_str).collect::<Vec<_>>(),
        &[
            (ROLE, "target".into()),
            ("NET_SOURCE", "b-side".into()),
            ("NET_EPOCH", "1".into()),
            ("NET_ADDR", "192.0.2.2:7400".into()),
            ("NET_DELAY_MS", "4".into()),
            ("NET_SIZE", (8 << 20).to_string()),
        ],
    );
    let ready = target.expect("READY", BOUND);
    let range = ready.split_whitespace().nth(2).unwrap().to_owned();
    let initiator = child::spawn(
        "child_entry",
        &ea.iter().map(String::as_str).collect::<Vec<_>>(),
        &[
            (ROLE, "initiator".into()),
            ("NET_TARGET", "192.0.2.2:7400".into()),
            ("NET_RANGE", range),
        ],
    );
    // The link works: two full transfers across the namespaces.
    initiator.expect("DONE 1", BOUND);
    ns.cut().expect("cut the link");
    let outcome = initiator.expect("OUTCOME", BOUND);
    println!("{outcome}");
    let field = |k: &str| {
        outcome
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        matches!(field("status").as_str(), "Failed" | "TimedOut"),
        "{outcome}"
    );
    let (prefix, len): (u64, u64) = (
        field("prefix").parse().unwrap(),
        field("len").parse().unwrap(),
    );
    assert!(prefix < len, "{outcome}");
    assert!(
        matches!(field("effect").as_str(), "possible" | "none"),
        "{outcome}"
    );
    if field("status") == "Failed" {
        assert!(
            field("failure").contains("tcp"),
            "failure names the tcp rail: {outcome}"
        );
    }
    assert_eq!(field("drained"), "true", "{outcome}");
    drop(initiator);
    drop(target);
    drop(ns);
}
