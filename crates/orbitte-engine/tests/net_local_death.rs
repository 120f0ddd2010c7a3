//! The local path notices a dead target: after the process that serves a
//! mapping is killed, a WRITE into the mapping ends Failed with its remote
//! effect stated, within the request timeout, instead of "delivered" into
//! memory that no one reads any more.
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::child::{self, ROLE};
use net_support::{Initiator, cfg, pattern, request};
use orbitte_engine::outcome::{RemoteEffect, Status};
use orbitte_engine::transport::local::INLINE_BYTES;
use orbitte_engine::transport::{Op, PathKind, PeerId, SliceFailure};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_wire::RangeId;

const BOUND: Duration = Duration::from_secs(60);

/// Entry point of the child processes (does nothing in a normal run).
#[test]
#[ignore = "entry point for child processes of the other tests"]
fn child_entry() {
    if std::env::var(ROLE).as_deref() == Ok("target") {
        net_support::run_child_target();
    }
}

#[test]
fn a_write_after_the_local_target_died_fails_with_its_remote_effect_stated() {
    // The posting thread copies the first INLINE_BYTES, the rail's worker
    // the rest.
    write_after_death("mortal", 4 * INLINE_BYTES);
}

#[test]
fn a_small_write_copied_by_the_posting_thread_after_the_target_died_fails_too() {
    // Copied by the posting thread alone.
    const { assert!(64 << 10 <= INLINE_BYTES) };
    write_after_death("mortal-small", 64 << 10);
}

/// Writes `len` bytes while the target lives (complete), kills it, writes
/// again: the second write must not be reported delivered.
fn write_after_death(source: &str, len: u64) {
    net_support::logs();
    let mut p = child::spawn(
        "child_entry",
        &[],
        &[
            (ROLE, "target".into()),
            ("NET_SOURCE", source.into()),
            ("NET_EPOCH", "2".into()),
            ("NET_ADDR", "127.0.0.1:0".into()),
            ("NET_SIZE", len.to_string()),
        ],
    );
    let ready = p.expect("READY", BOUND);
    let mut it = ready.split_whitespace().skip(1);
    let addr = it.next().unwrap().parse().unwrap();
    let range = RangeId(it.next().unwrap().parse().unwrap());

    let core = CoreConfig {
        request_timeout: Duration::from_secs(20),
        ..CoreConfig::default()
    };
    let i = Initiator::new(cfg("survivor", 1), core);
    let (_, link) = i.connect_tcp(PeerId(1), addr, 1).unwrap();
    let rails = i.driver.add_rails(PathKind::Local, PeerId(1), 1, 64);
    i.local
        .attach(&i.cfg, &i.peers, PeerId(1), &link.handshake.peer, &rails)
        .unwrap();
    let src = HostMemory::alloc(len as usize).unwrap();
    pattern(&src, 4);
    let reg = i.driver.register(src.clone());
    let write = |label| {
        i.driver.submit(vec![request(
            label,
            Op::Write,
            reg,
            0,
            PeerId(1),
            range.0,
            0,
            len,
            &rails,
        )])[0]
    };
    // While the target lives, the local path delivers.
    let o = i.driver.wait(write(1), BOUND);
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(o.remote_effect, RemoteEffect::Complete);

    p.kill();
    let o = i.driver.wait(write(2), BOUND);
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert_ne!(
        o.remote_effect,
        RemoteEffect::Complete,
        "a write into a dead peer was reported delivered: {o:?}"
    );
    let failure = o.failure.as_ref().expect("failure information");
    assert_eq!(failure.path, PathKind::Local);
    match &failure.status {
        SliceFailure::RailDown(why) => assert!(why.contains("exited"), "{why}"),
        other => panic!("{other:?}"),
    }
}
