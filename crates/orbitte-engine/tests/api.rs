//! The entry path as an application uses it: build with `listen`, connect
//! by address, `register`, requests built from handles (a registration's
//! byte range, a peer's published range or a remote address), one outcome.
#![forbid(unsafe_code)]

use std::time::Duration;

use orbitte_engine::{
    Access, ConnectError, ConnectOptions, EngineBuilder, ListenError, MemoryPath, PathKind,
    Request, RequestError, Status, SubmitError, TransferEngine,
};
use orbitte_memory::HostMemory;

const BOUND: Duration = Duration::from_secs(30);
const LEN: usize = 1 << 20;

fn engine(name: &str, listen: bool) -> TransferEngine {
    let mut b = EngineBuilder::new(name).host_memory_without_rdma();
    if listen {
        b = b.listen("127.0.0.1:0".parse().unwrap());
    }
    b.build().unwrap()
}

#[test]
fn listen_connect_register_write_read_by_range_and_by_address() {
    let decode = engine("api-decode", true);
    let prefill = engine("api-prefill", false);
    let addr = decode.listen_addr().expect("listening");
    assert_ne!(addr.port(), 0, "the bound port is reported");
    assert_eq!(prefill.listen_addr(), None);

    let dst = HostMemory::alloc(LEN).unwrap();
    let published = decode.register(&dst, Access::RemoteReadWrite).unwrap();
    assert_eq!(published.path, MemoryPath::HostWithoutRdma);
    let src = HostMemory::alloc(LEN).unwrap();
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8).collect();
    src.write_at(0, &pattern).unwrap();
    let local = prefill.register(&src, Access::LocalOnly).unwrap();

    for path in [PathKind::Tcp, PathKind::Local] {
        let peer = prefill
            .connect_with(addr, ConnectOptions::new().path(path).rails(2))
            .unwrap();
        assert_eq!((peer.path, peer.source_id()), (path, "api-decode"));
        let remote = peer.ranges()[0];
        assert_eq!(remote.address, dst.as_ptr() as u64);
        assert_eq!(remote.len, LEN as u64);
        dst.fill(0, LEN, 0).unwrap();

        // WRITE the first half by range, the second half by address.
        let half = (LEN / 2) as u64;
        let ids = prefill
            .submit(&[
                Request::write(&local, 0..half).to(&remote, 0).label(1),
                Request::write(&local, half..2 * half)
                    .to_address(&peer, remote.address + half)
                    .label(2),
            ])
            .unwrap();
        for o in prefill.wait_all(&ids, BOUND).unwrap() {
            assert_eq!(o.status, Status::Complete, "{path}: {o:?}");
            prefill.wait_drain(o.request, BOUND).unwrap();
        }
        assert!(dst.to_vec(0, LEN).unwrap() == pattern, "{path}");

        // READ a window back by address into the start of the buffer.
        src.fill(0, LEN, 0).unwrap();
        let ids = prefill
            .submit(&[Request::read(&local, 0..4096).from_address(&peer, remote.address + 8192)])
            .unwrap();
        let o = prefill.wait(ids[0], BOUND).unwrap();
        assert_eq!(o.status, Status::Complete, "{o:?}");
        prefill.wait_drain(ids[0], BOUND).unwrap();
        assert_eq!(src.to_vec(0, 4096).unwrap(), pattern[8192..8192 + 4096]);
        src.write_at(0, &pattern).unwrap();

        // Addresses that no published range holds, or requests past its
        // end, are refused at submit with the address named.
        let end = remote.address + remote.len;
        let refused = |r: Request| match prefill.submit(&[r]) {
            Err(SubmitError::Invalid { error, .. }) => error,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(
            refused(Request::write(&local, 0..16).to_address(&peer, end)),
            RequestError::UnknownAddress {
                peer: peer.id(),
                address: end
            }
        );
        assert_eq!(
            refused(Request::read(&local, 0..16).from_address(&peer, end - 8)),
            RequestError::PastEnd {
                peer: peer.id(),
                address: end - 8,
                len: 16,
                end
            }
        );
        // A reversed local range is zero bytes: refused, nothing posted.
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = Request::write(&local, 8..0).to(&remote, 0);
        assert_eq!(refused(reversed), RequestError::ZeroLength);
    }
    assert_eq!(prefill.outstanding_slices(), 0);
    let _ = prefill.shutdown(Duration::from_secs(5));
    let _ = decode.shutdown(Duration::from_secs(5));
}

#[test]
fn one_listener_per_engine_and_clear_connect_errors() {
    let target = engine("api-target", false);
    let at = target.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    assert_eq!(target.listen_addr(), Some(at));
    assert!(matches!(
        target.listen("127.0.0.1:0".parse().unwrap()),
        Err(ListenError::AlreadyListening { at: a }) if a == at
    ));
    // The bound address is in use: building another listener there fails
    // with the address and the cause.
    let clash = EngineBuilder::new("api-clash")
        .host_memory_without_rdma()
        .listen(at)
        .build()
        .unwrap_err();
    assert!(clash.to_string().contains(&at.to_string()), "{clash}");

    let client = engine("api-client", false);
    // Nothing listens here any more once the target shut down.
    let _ = target.shutdown(Duration::from_secs(5));
    assert!(matches!(client.connect(at), Err(ConnectError::Session(_))));
    // Paths that no transport serves are refused as such.
    assert!(matches!(
        client.connect_with(at, ConnectOptions::new().path(PathKind::Nvlink)),
        Err(ConnectError::Unsupported(PathKind::Nvlink))
    ));
    // By name without cluster metadata: says what is missing.
    #[cfg(feature = "etcd")]
    assert!(matches!(
        client.connect_by_name("api-target"),
        Err(ConnectError::NoMetadata)
    ));
    let _ = client.shutdown(Duration::from_secs(5));
}

fn incarnation(epoch: u64, at: std::net::SocketAddr) -> TransferEngine {
    EngineBuilder::new("api-restarting")
        .host_memory_without_rdma()
        .epoch(epoch)
        .listen(at)
        .build()
        .unwrap()
}

#[test]
fn a_handle_made_before_the_peer_restarted_is_refused_naming_both_epochs() {
    let first = incarnation(10, "127.0.0.1:0".parse().unwrap());
    let addr = first.listen_addr().expect("listening");
    let old_memory = HostMemory::alloc(4096).unwrap();
    first
        .register(&old_memory, Access::RemoteReadWrite)
        .unwrap();
    let initiator = engine("api-restart-initiator", false);
    let src = HostMemory::alloc(4096).unwrap();
    src.fill(0, 4096, 0xab).unwrap();
    let local = initiator.register(&src, Access::LocalOnly).unwrap();
    let opts = ConnectOptions::new().path(PathKind::Tcp);
    let old = initiator.connect_with(addr, opts).unwrap();
    let old_range = old.ranges()[0];
    assert_eq!(old_range.epoch.value(), 10);
    first.shutdown(BOUND).unwrap();
    drop(first);

    // The same source restarts at the same address with a newer epoch and
    // a range at the same place in its id space.
    let second = incarnation(11, addr);
    let new_memory = HostMemory::alloc(4096).unwrap();
    second
        .register(&new_memory, Access::RemoteReadWrite)
        .unwrap();
    let new = initiator.connect_with(addr, opts).unwrap();
    assert_eq!(new.epoch().value(), 11);
    assert_eq!(
        new.ranges()[0].range,
        old_range.range,
        "range ids repeat across epochs"
    );

    let restarted = |r: Request| match initiator.submit(&[r]).unwrap_err() {
        SubmitError::Invalid {
            error: RequestError::PeerRestarted {
                handle, current, ..
            },
            ..
        } => {
            assert_eq!((handle.value(), current.value()), (10, 11));
        }
        other => panic!("expected a refusal naming the restart, got {other}"),
    };
    // By the old handle's range, and by an address through the old handle
    // (an address the new incarnation may well hold too).
    restarted(Request::write(&local, 0..16).to(&old_range, 0));
    restarted(Request::write(&local, 0..16).to_address(&old, old_range.address));
    let text = initiator
        .submit(&[Request::read(&local, 0..16).from(&old_range, 0)])
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("restarted") && text.contains("epoch 10") && text.contains("epoch 11"),
        "{text}"
    );
    // An address of the old incarnation named by the bare id (not bound
    // to an epoch) is in no range now: the refusal says the peer restarted.
    assert_ne!(
        new.ranges()[0].address,
        old_range.address,
        "old memory still alive"
    );
    match initiator
        .submit(&[Request::write(&local, 0..16).to_address(new.id(), old_range.address)])
        .unwrap_err()
    {
        SubmitError::Invalid {
            error:
                RequestError::AddressAfterRestart {
                    previous, current, ..
                },
            ..
        } => assert_eq!((previous.value(), current.value()), (10, 11)),
        other => panic!("expected a refusal naming the restart, got {other}"),
    }
    // Nothing reached the new incarnation's memory.
    assert_eq!(new_memory.to_vec(0, 4096).unwrap(), vec![0; 4096]);
    // The new handle works.
    let ids = initiator
        .submit(&[Request::write(&local, 0..4096).to(&new.ranges()[0], 0)])
        .unwrap();
    assert_eq!(
        initiator.wait(ids[0], BOUND).unwrap().status,
        Status::Complete
    );
    assert_eq!(new_memory.to_vec(0, 4096).unwrap(), vec![0xab; 4096]);
}

/// A same-host target that shuts down stops serving its mapping at once:
/// a WRITE posted right after (its memory still mapped here, still
/// allocated by its owner) is not reported delivered.
#[test]
fn a_write_to_a_local_target_that_shut_down_is_not_reported_delivered() {
    let target = engine("api-closing-target", true);
    let initiator = engine("api-closing-initiator", false);
    let dst = HostMemory::alloc(LEN).unwrap();
    target.register(&dst, Access::RemoteReadWrite).unwrap();
    let src = HostMemory::alloc(LEN).unwrap();
    src.fill(0, LEN, 0xab).unwrap();
    let local = initiator.register(&src, Access::LocalOnly).unwrap();
    let peer = initiator
        .connect_with(
            target.listen_addr().unwrap(),
            ConnectOptions::new().path(PathKind::Local),
        )
        .unwrap();
    let remote = peer.ranges()[0];
    let ids = initiator
        .submit(&[Request::write(&local, 0..16).to(&remote, 0)])
        .unwrap();
    assert_eq!(
        initiator.wait(ids[0], BOUND).unwrap().status,
        Status::Complete
    );

    target.shutdown(BOUND).unwrap();
    dst.fill(0, 16, 0).unwrap();
    let late = match initiator.submit(&[Request::write(&local, 0..16).to(&remote, 0)]) {
        Ok(ids) => Some(initiator.wait(ids[0], BOUND).unwrap()),
        // Refused at submit (the rail is already down): nothing was posted.
        Err(SubmitError::Invalid {
            error: RequestError::NoRail { .. },
            ..
        }) => None,
        Err(e) => panic!("unexpected refusal: {e}"),
    };
    if let Some(o) = &late {
        assert_ne!(o.status, Status::Complete, "{o:?}");
    }
    let _ = initiator.shutdown(BOUND);
}
