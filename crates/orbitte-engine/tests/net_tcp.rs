//! tcp path: one-sided READ/WRITE between engines over sockets, checked end
//! to end, and the target's checks (token, bounds, access, range).
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, pattern, request};
use orbitte_engine::outcome::{DrainStatus, RemoteEffect, Status};
use orbitte_engine::transport::{Op, PathKind, PeerId, SliceFailure};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_wire::{AccessFlags, AccessToken};

const BOUND: Duration = Duration::from_secs(30);

fn core() -> CoreConfig {
    CoreConfig {
        slice_size: 64 * 1024,
        tcp_slice_size: 0,
        request_timeout: Duration::from_secs(20),
        drain_timeout: Duration::from_secs(5),
    }
}

fn roundtrip(zero_copy: bool, rails: usize) {
    net_support::logs();
    let mut tcfg = cfg("target", 7);
    tcfg.zero_copy = zero_copy;
    let t = Target::start(tcfg);
    let remote = HostMemory::alloc(8 << 20).unwrap();
    pattern(&remote, 1);
    let range = t.ranges.publish(remote.clone(), RW).unwrap();

    let mut icfg = cfg("initiator", 3);
    icfg.zero_copy = zero_copy;
    let i = Initiator::new(icfg, core());
    let src = HostMemory::alloc(4 << 20).unwrap();
    pattern(&src, 2);
    // Memory without a memfd of its own: the scratch-buffer path.
    let dst_owner = HostMemory::alloc(8 << 20).unwrap();
    let dst = HostMemory::map_shared(
        dst_owner.memfd().unwrap().try_clone_to_owned().unwrap(),
        8 << 20,
        true,
    )
    .unwrap();
    let (src_reg, dst_reg) = (
        i.driver.register(src.clone()),
        i.driver.register(dst.clone()),
    );
    let peer = PeerId(1);
    let (r, link) = i.connect_tcp(peer, t.addr(), rails).unwrap();
    assert_eq!(link.handshake.peer.source_id.as_str(), "target");
    assert_eq!(link.ranges.len(), 1);

    // WRITE 4 MiB - 3 bytes at remote offset 1 MiB + 5, striped over the rails.
    let len = (4 << 20) - 3;
    let w = i.driver.submit(vec![request(
        1,
        Op::Write,
        src_reg,
        0,
        peer,
        range.0,
        (1 << 20) + 5,
        len,
        &r,
    )]);
    let o = i.driver.wait(w[0], BOUND);
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(o.completed_prefix, len);
    assert_eq!(o.remote_effect, RemoteEffect::Complete);
    assert_eq!(o.drain, DrainStatus::Drained);
    assert_eq!(
        remote.to_vec((1 << 20) + 5, len as usize).unwrap(),
        src.to_vec(0, len as usize).unwrap()
    );
    // Bytes around the written window are untouched.
    let fresh = HostMemory::alloc(8 << 20).unwrap();
    pattern(&fresh, 1);
    assert_eq!(
        remote.to_vec(0, (1 << 20) + 5).unwrap(),
        fresh.to_vec(0, (1 << 20) + 5).unwrap()
    );
    let end = (1 << 20) + 5 + len as usize;
    assert_eq!(
        remote.to_vec(end, (8 << 20) - end).unwrap(),
        fresh.to_vec(end, (8 << 20) - end).unwrap()
    );

    // READ all 8 MiB back, two requests in one batch.
    let ids = i.driver.submit(vec![
        request(2, Op::Read, dst_reg, 0, peer, range.0, 0, 3 << 20, &r),
        request(
            3,
            Op::Read,
            dst_reg,
            3 << 20,
            peer,
            range.0,
            3 << 20,
            5 << 20,
            &r,
        ),
    ]);
    for id in ids {
        let o = i.driver.wait(id, BOUND);
        assert_eq!(o.status, Status::Complete, "{o:?}");
        assert_eq!(o.remote_effect, RemoteEffect::None);
    }
    assert_eq!(
        dst.to_vec(0, 8 << 20).unwrap(),
        remote.to_vec(0, 8 << 20).unwrap()
    );
    assert_eq!(t.listener.stats().admitted, rails as u64);
}

#[test]
fn tcp_read_and_write_move_exact_bytes_over_several_pipelined_connections() {
    roundtrip(true, 4);
}

#[test]
fn tcp_without_zero_copy_moves_the_same_bytes() {
    roundtrip(false, 2);
}

/// A slice size above the largest payload of a tcp frame (16 MiB) still
/// moves every byte over tcp: the slices of a tcp request are cut down to
/// it, and its outcome counts them.
#[test]
fn a_slice_size_above_the_largest_tcp_payload_moves_every_byte_in_slices_of_it() {
    net_support::logs();
    let t = Target::start(cfg("target", 7));
    let len: u64 = 40 << 20;
    let remote = HostMemory::alloc(len as usize).unwrap();
    pattern(&remote, 6);
    let range = t.ranges.publish(remote.clone(), RW).unwrap();
    let i = Initiator::new(
        cfg("initiator", 3),
        CoreConfig {
            slice_size: 32 << 20,
            ..core()
        },
    );
    let (src, dst) = (
        HostMemory::alloc(len as usize).unwrap(),
        HostMemory::alloc(len as usize).unwrap(),
    );
    pattern(&src, 7);
    let (src_reg, dst_reg) = (
        i.driver.register(src.clone()),
        i.driver.register(dst.clone()),
    );
    let peer = PeerId(1);
    let (r, _) = i.connect_tcp(peer, t.addr(), 2).unwrap();
    // READ the range into `dst`, then WRITE `src` over it.
    for (label, op, reg, from, to) in [
        (1, Op::Read, dst_reg, &remote, &dst),
        (2, Op::Write, src_reg, &src, &remote),
    ] {
        let id = i
            .driver
            .submit(vec![request(label, op, reg, 0, peer, range.0, 0, len, &r)])[0];
        let o = i.driver.wait(id, BOUND);
        assert_eq!(o.status, Status::Complete, "{o:?}");
        assert_eq!(o.slices, 3, "16 + 16 + 8 MiB: {o:?}");
        assert!(
            to.to_vec(0, len as usize).unwrap() == from.to_vec(0, len as usize).unwrap(),
            "{op:?}: every byte moved"
        );
    }
}

fn failed_status(o: &orbitte_engine::outcome::Outcome) -> String {
    match &o.failure.as_ref().expect("failure info").status {
        SliceFailure::Completion { status, .. } => status.to_string(),
        other => panic!("unexpected failure {other:?}"),
    }
}

#[test]
fn target_refuses_wrong_token_bounds_access_and_range_and_never_touches_memory() {
    net_support::logs();
    let t = Target::start(cfg("target", 1));
    let rw = HostMemory::alloc(1 << 20).unwrap();
    pattern(&rw, 9);
    let ro = HostMemory::alloc(1 << 20).unwrap();
    pattern(&ro, 10);
    let rw_id = t.ranges.publish(rw.clone(), RW).unwrap();
    let ro_id = t
        .ranges
        .publish(ro.clone(), AccessFlags::REMOTE_READ)
        .unwrap();
    let view = t.ranges.publish_view(rw.clone(), 4096, 8192, RW).unwrap();
    let retired = t.ranges.publish(rw.clone(), RW).unwrap();
    assert!(t.ranges.retire(retired));

    let i = Initiator::new(cfg("initiator", 1), core());
    let local = HostMemory::alloc(1 << 20).unwrap();
    pattern(&local, 11);
    let reg = i.driver.register(local.clone());
    let peer = PeerId(1);
    let (rails, link) = i.connect_tcp(peer, t.addr(), 1).unwrap();
    assert_eq!(link.ranges.len(), 3, "retired range is not published");

    // Wrong access: WRITE to a read-only range.
    let o = i.driver.wait(
        i.driver.submit(vec![request(
            1,
            Op::Write,
            reg,
            0,
            peer,
            ro_id.0,
            0,
            4096,
            &rails,
        )])[0],
        BOUND,
    );
    assert_eq!(o.status, Status::Failed);
    assert!(failed_status(&o).contains("access-denied"), "{o:?}");
    assert_eq!(o.failure.as_ref().unwrap().path, PathKind::Tcp);
    // Past the end of a view (the view is 8 KiB inside a 1 MiB memory).
    let o = i.driver.wait(
        i.driver.submit(vec![request(
            2,
            Op::Write,
            reg,
            0,
            peer,
            view.0,
            4096,
            8192,
            &rails,
        )])[0],
        BOUND,
    );
    assert!(failed_status(&o).contains("out-of-bounds"), "{o:?}");
    // Retired range.
    let o = i.driver.wait(
        i.driver.submit(vec![request(
            3,
            Op::Read,
            reg,
            0,
            peer,
            retired.0,
            0,
            16,
            &rails,
        )])[0],
        BOUND,
    );
    assert!(failed_status(&o).contains("unknown-range"), "{o:?}");
    // Wrong token: forge the descriptor the initiator uses.
    let mut forged = link.ranges.clone();
    for d in &mut forged {
        d.token = AccessToken(d.token.0 ^ 1);
    }
    i.driver.set_remote(peer, &forged);
    let o = i.driver.wait(
        i.driver.submit(vec![request(
            4,
            Op::Write,
            reg,
            0,
            peer,
            rw_id.0,
            0,
            4096,
            &rails,
        )])[0],
        BOUND,
    );
    assert!(failed_status(&o).contains("bad-token"), "{o:?}");
    assert_eq!(o.completed_prefix, 0);
    let o = i.driver.wait(
        i.driver.submit(vec![request(
            5,
            Op::Read,
            reg,
            0,
            peer,
            rw_id.0,
            0,
            4096,
            &rails,
        )])[0],
        BOUND,
    );
    assert!(failed_status(&o).contains("bad-token"), "{o:?}");

    // Nothing changed anywhere, and the session still works afterwards.
    let (a, b, c) = (
        HostMemory::alloc(1 << 20).unwrap(),
        HostMemory::alloc(1 << 20).unwrap(),
        HostMemory::alloc(1 << 20).unwrap(),
    );
    pattern(&a, 9);
    pattern(&b, 10);
    pattern(&c, 11);
    assert!(rw.to_vec(0, 1 << 20).unwrap() == a.to_vec(0, 1 << 20).unwrap());
    assert!(ro.to_vec(0, 1 << 20).unwrap() == b.to_vec(0, 1 << 20).unwrap());
    assert!(
        local.to_vec(0, 1 << 20).unwrap() == c.to_vec(0, 1 << 20).unwrap(),
        "failed READs wrote nothing locally"
    );
    i.driver.set_remote(peer, &link.ranges);
    let o = i.driver.wait(
        i.driver.submit(vec![request(
            6,
            Op::Read,
            reg,
            0,
            peer,
            view.0,
            0,
            8192,
            &rails,
        )])[0],
        BOUND,
    );
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(
        local.to_vec(0, 8192).unwrap(),
        rw.to_vec(4096, 8192).unwrap()
    );
}

/// READs posted to an idle rail go out on the posting thread, a WRITE
/// through the rail's loop, and READs posted while the loop sends
/// queue behind it: end to end, against a target that pauses before each
/// request, every request completes and every byte lands where it should.
/// (The rail's own tests cover requests the socket could not take at once.)
#[test]
fn reads_posted_inline_and_a_write_through_the_writer_complete_in_order() {
    net_support::logs();
    let mut tcfg = cfg("target", 7);
    tcfg.serve_delay = Duration::from_micros(20);
    let t = Target::start(tcfg);
    let remote = HostMemory::alloc(1 << 20).unwrap();
    pattern(&remote, 5);
    let range = t.ranges.publish(remote.clone(), RW).unwrap();

    let mut icfg = cfg("initiator", 3);
    icfg.max_in_flight_per_connection = 4096;
    let i = Initiator::new(icfg, core());
    let src = HostMemory::alloc(64 << 10).unwrap();
    pattern(&src, 9);
    let dst = HostMemory::alloc(1 << 20).unwrap();
    let (src_reg, dst_reg) = (
        i.driver.register(src.clone()),
        i.driver.register(dst.clone()),
    );
    let peer = PeerId(1);
    let (r, _) = i.connect_tcp(peer, t.addr(), 1).unwrap();

    // READs of 16 bytes, each of its own piece of the range.
    let reads = |first: u64, n: u64| {
        (first..first + n)
            .map(|k| request(k, Op::Read, dst_reg, k * 16, peer, range.0, k * 16, 16, &r))
            .collect::<Vec<_>>()
    };
    let mut ids = i.driver.submit(reads(0, 2000));
    // Behind them: a WRITE past the READs' pieces, then more READs.
    let write_at = 512 << 10;
    ids.extend(i.driver.submit(vec![request(
        9000,
        Op::Write,
        src_reg,
        0,
        peer,
        range.0,
        write_at,
        4 << 10,
        &r,
    )]));
    ids.extend(i.driver.submit(reads(2000, 100)));
    for id in ids {
        let o = i.driver.wait(id, BOUND);
        assert_eq!(o.status, Status::Complete, "{o:?}");
    }
    assert_eq!(
        dst.to_vec(0, 2100 * 16).unwrap(),
        remote.to_vec(0, 2100 * 16).unwrap()
    );
    assert_eq!(
        remote.to_vec(write_at as usize, 4 << 10).unwrap(),
        src.to_vec(0, 4 << 10).unwrap()
    );
}
