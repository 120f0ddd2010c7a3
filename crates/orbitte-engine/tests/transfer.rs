//! End-to-end transfers between two engines on the sim fabric, data
//! checked byte for byte.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use common::*;
use orbitte_engine::{
    Access, DrainStatus, RangeId, RemoteEffect, Status, SubmitError, TransferRequest,
};
use orbitte_verbs::sim::Delivery;

#[test]
fn write_and_read_between_two_engines_check_every_byte() {
    let fabric = fabric(2, Delivery::Background, 1);
    let a = builder(&fabric, "a", 2).build().unwrap();
    let b = builder(&fabric, "b", 2).build().unwrap();
    let len = 100_000;
    let src = region(len, 1);
    let dst = region(len, 2);
    let ra = register(&a, &src, Access::LocalOnly);
    let rb = register(&b, &dst, Access::REMOTE_READ_WRITE);
    let (peer_b, _) = connect(&a, &b);
    assert_eq!(peer_b.rails.len(), 2, "{peer_b:?}");
    let range = RangeId(rb.id.0);
    let ids = a
        .submit(&[TransferRequest::write(ra.id, 0, peer_b.id, range, 0, len as u64).label(7)])
        .unwrap();
    let o = a.wait(ids[0], Duration::from_secs(5)).unwrap();
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(o.label, 7);
    assert_eq!(o.completed_prefix, len as u64);
    assert_eq!(o.slices, 25);
    assert_eq!(o.remote_effect, RemoteEffect::Complete);
    assert_eq!(o.drain, DrainStatus::Drained);
    assert_eq!(dst.to_vec(0, len).unwrap(), pattern(len, 1));
    // READ back a window into another place of A's memory.
    src.fill(0, len, 0).unwrap();
    let ids = a
        .submit(&[TransferRequest::read(
            ra.id, 10, peer_b.id, range, 5000, 50_000,
        )])
        .unwrap();
    let o = a.wait(ids[0], Duration::from_secs(5)).unwrap();
    assert!(o.is_complete(), "{o:?}");
    assert_eq!(o.remote_effect, RemoteEffect::None);
    assert_eq!(
        src.to_vec(10, 50_000).unwrap(),
        pattern(len, 1)[5000..55_000]
    );
    assert_eq!(a.outstanding_slices(), 0);
}

#[test]
fn a_mixed_batch_stripes_over_eight_rails_and_every_byte_arrives() {
    let fabric = fabric(8, Delivery::Background, 2);
    let a = builder(&fabric, "a", 8).build().unwrap();
    let b = builder(&fabric, "b", 8).build().unwrap();
    let len = 1 << 20;
    let la = region(len, 3);
    let rb_mem = region(len, 4);
    let ra = register(&a, &la, Access::LocalOnly);
    let rb = register(&b, &rb_mem, Access::REMOTE_READ_WRITE);
    let (peer, _) = connect(&a, &b);
    assert_eq!(peer.rails.len(), 8);
    let range = RangeId(rb.id.0);
    // First half: 8 WRITEs local -> remote; second half: 8 READs remote -> local.
    let chunk = (len / 16) as u64;
    let mut batch = Vec::new();
    for i in 0..8u64 {
        batch.push(
            TransferRequest::write(ra.id, i * chunk, peer.id, range, i * chunk, chunk).label(i),
        );
    }
    for i in 8..16u64 {
        batch.push(
            TransferRequest::read(ra.id, i * chunk, peer.id, range, i * chunk, chunk).label(i),
        );
    }
    let ids = a.submit(&batch).unwrap();
    let outcomes = a.wait_all(&ids, Duration::from_secs(10)).unwrap();
    assert!(outcomes.iter().all(|o| o.is_complete()), "{outcomes:?}");
    let half = len / 2;
    assert_eq!(rb_mem.to_vec(0, half).unwrap(), pattern(len, 3)[..half]);
    assert_eq!(la.to_vec(half, half).unwrap(), pattern(len, 4)[half..]);
    // The remote half that was only read is untouched; the local half that
    // was only written from is untouched.
    assert_eq!(rb_mem.to_vec(half, half).unwrap(), pattern(len, 4)[half..]);
    assert_eq!(la.to_vec(0, half).unwrap(), pattern(len, 3)[..half]);
    assert_eq!(a.outstanding_slices(), 0);
}

#[test]
fn a_batch_of_hundreds_is_taken_in_piece_by_piece_and_every_byte_lands() {
    let fabric = fabric(2, Delivery::Background, 4);
    let a = builder(&fabric, "a", 2).build().unwrap();
    let b = builder(&fabric, "b", 2).build().unwrap();
    const N: u64 = 300;
    const CHUNK: u64 = 512;
    let len = (N * CHUNK) as usize;
    let la = region(len, 7);
    let rb_mem = region(len, 8);
    let ra = register(&a, &la, Access::LocalOnly);
    let rb = register(&b, &rb_mem, Access::REMOTE_READ_WRITE);
    let (peer, _) = connect(&a, &b);
    let range = RangeId(rb.id.0);
    // Runs of 20 WRITEs and 20 READs by turns: the runs change inside the
    // pieces a large batch is taken in by.
    let write = |i: u64| (i / 20).is_multiple_of(2);
    let batch: Vec<_> = (0..N)
        .map(|i| {
            let op = if write(i) {
                TransferRequest::write
            } else {
                TransferRequest::read
            };
            op(ra.id, i * CHUNK, peer.id, range, i * CHUNK, CHUNK).label(i)
        })
        .collect();
    // One bad request near the end refuses the whole batch: nothing moves.
    let mut bad = batch.clone();
    bad[280] = TransferRequest::write(ra.id, 0, peer.id, range, len as u64, 1).label(280);
    let err = a.submit(&bad).unwrap_err();
    assert!(
        matches!(
            err,
            SubmitError::Invalid {
                index: 280,
                label: 280,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(a.outstanding_slices(), 0);
    assert_eq!(rb_mem.to_vec(0, len).unwrap(), pattern(len, 8));
    assert_eq!(la.to_vec(0, len).unwrap(), pattern(len, 7));
    let ids = a.submit(&batch).unwrap();
    assert_eq!(ids.len(), N as usize);
    let outcomes = a.wait_all(&ids, Duration::from_secs(10)).unwrap();
    let labels: Vec<u64> = outcomes.iter().map(|o| o.label).collect();
    assert_eq!(labels, (0..N).collect::<Vec<_>>());
    assert!(outcomes.iter().all(|o| o.is_complete()), "{outcomes:?}");
    let (src, dst) = (pattern(len, 7), pattern(len, 8));
    let (local, remote) = (la.to_vec(0, len).unwrap(), rb_mem.to_vec(0, len).unwrap());
    for i in 0..N {
        let r = (i * CHUNK) as usize..((i + 1) * CHUNK) as usize;
        if write(i) {
            assert_eq!(remote[r.clone()], src[r.clone()], "WRITE {i} arrived");
            assert_eq!(local[r.clone()], src[r], "WRITE {i} source kept");
        } else {
            assert_eq!(local[r.clone()], dst[r.clone()], "READ {i} arrived");
            assert_eq!(remote[r.clone()], dst[r], "READ {i} source kept");
        }
    }
    assert_eq!(a.outstanding_slices(), 0);
}

#[test]
fn wait_ready_hands_over_every_arrived_outcome_in_order_at_once() {
    let fabric = fabric(2, Delivery::Background, 3);
    let a = builder(&fabric, "a", 2).build().unwrap();
    let b = builder(&fabric, "b", 2).build().unwrap();
    let len = 64 * 1024;
    let la = region(len, 5);
    let rb_mem = region(len, 6);
    let ra = register(&a, &la, Access::LocalOnly);
    let rb = register(&b, &rb_mem, Access::REMOTE_READ_WRITE);
    let (peer, _) = connect(&a, &b);
    let range = RangeId(rb.id.0);
    let chunk = (len / 8) as u64;
    let batch: Vec<_> = (0..8u64)
        .map(|i| {
            TransferRequest::write(ra.id, i * chunk, peer.id, range, i * chunk, chunk).label(i)
        })
        .collect();
    let ids = a.submit(&batch).unwrap();
    let bound = Duration::from_secs(10);
    // Once every request has drained, every outcome is there: one call
    // takes them all, in the order asked.
    for id in &ids {
        a.wait_drain(*id, bound).unwrap();
    }
    let mut out = Vec::new();
    assert_eq!(a.wait_ready(&ids, bound, &mut out).unwrap(), ids.len());
    let got: Vec<_> = out.iter().map(|o| (o.request, o.label)).collect();
    let want: Vec<_> = ids.iter().copied().zip(0..8u64).collect();
    assert_eq!(got, want);
    assert!(out.iter().all(|o| o.is_complete()), "{out:?}");
    assert_eq!(rb_mem.to_vec(0, len).unwrap(), pattern(len, 5));
    // Taken means gone; nothing asked, nothing taken.
    assert!(a.poll(ids[0]).is_none());
    assert_eq!(a.wait_ready(&[], bound, &mut out).unwrap(), 0);
    assert_eq!(out.len(), ids.len());
    // A batch waited for piece by piece comes out whole and in order.
    let ids = a.submit(&batch).unwrap();
    let mut out = Vec::new();
    let mut rest = &ids[..];
    while !rest.is_empty() {
        let taken = a.wait_ready(rest, bound, &mut out).unwrap();
        assert!((1..=rest.len()).contains(&taken), "{taken}");
        rest = &rest[taken..];
    }
    assert_eq!(out.iter().map(|o| o.request).collect::<Vec<_>>(), ids);
    assert!(out.iter().all(|o| o.is_complete()), "{out:?}");
}
