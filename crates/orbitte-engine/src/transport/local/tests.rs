//! Where a local rail copies: the posting thread for the front of a post
//! to an idle rail, a copy worker for the rest and for anything posted
//! while a worker holds the rail's items.

use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

use super::*;
use crate::transport::{RegistrationId, SliceToken};

/// A sink that records each delivery and holds the delivering worker
/// until the test lets it go.
struct HoldingSink {
    delivered: Mutex<mpsc::Sender<Vec<TransportEvent>>>,
    go: Mutex<mpsc::Receiver<()>>,
}

impl EventSink for HoldingSink {
    fn deliver(&self, events: &mut Vec<TransportEvent>) {
        let batch = std::mem::take(events);
        let _ = self.delivered.lock().unwrap().send(batch);
        let _ = self
            .go
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(30));
    }
}

struct Ctx(Arc<HostMemory>);

impl PostContext for Ctx {
    fn memory(&self, registration: RegistrationId) -> Option<&Arc<HostMemory>> {
        (registration == RegistrationId(1)).then_some(&self.0)
    }
    fn local_key(&self, _: RegistrationId, _: u32) -> Option<(u64, u32)> {
        None
    }
    fn remote_range(
        &self,
        _: PeerId,
        _: crate::transport::RangeId,
    ) -> Option<&orbitte_wire::RangeDescriptor> {
        None
    }
}

const SLICE: u32 = 64 << 10;

fn write(token: u64, index: u64) -> WorkItem {
    WorkItem {
        token: SliceToken(token),
        rail: RailId(0),
        op: Op::Write,
        registration: RegistrationId(1),
        local_offset: index * u64::from(SLICE),
        peer: PeerId(1),
        range: crate::transport::RangeId(7),
        remote_offset: index * u64::from(SLICE),
        len: SLICE,
        signaled: true,
    }
}

fn tokens(events: &[TransportEvent]) -> Vec<u64> {
    events
        .iter()
        .map(|e| match e {
            TransportEvent::Completed {
                token,
                status: SliceStatus::Success,
                released: true,
                ..
            } => token.0,
            other => panic!("not a released success: {other:?}"),
        })
        .collect()
}

#[test]
fn an_idle_rail_copies_the_front_here_and_a_busy_one_queues_behind_its_worker() {
    let (delivered, deliveries) = mpsc::channel();
    let (go, hold) = mpsc::channel();
    let sink = Arc::new(HoldingSink {
        delivered: Mutex::new(delivered),
        go: Mutex::new(hold),
    });
    let local = LocalTransport::new(sink, 2);
    let per_post = INLINE_BYTES / u64::from(SLICE);
    let items = 2 * per_post + 1;
    let len = usize::try_from(items * u64::from(SLICE)).unwrap();
    let remote = HostMemory::alloc(len).unwrap();
    let src = HostMemory::alloc(len).unwrap();
    src.fill(0, len, 0x5a).unwrap();
    // The target's end stays open: the target is alive.
    let (here, _target) = UnixStream::pair().unwrap();
    let mapped = Mapped {
        target: Arc::new(TargetSession::watch(&here)),
        memory: remote.clone(),
        base: 0,
        length: len as u64,
    };
    local
        .maps
        .write()
        .unwrap()
        .insert(PeerId(1), crate::Map::from_iter([(RangeId(7), mapped)]));
    local.start_rails(PeerId(1), &[RailId(0)]).unwrap();
    let ctx = Ctx(src);

    // An idle rail: the first INLINE_BYTES are copied by this thread and
    // reported in `done`, the rest goes to the worker.
    let first: Vec<WorkItem> = (0..2 * per_post).map(|i| write(i, i)).collect();
    let mut done = Vec::new();
    local
        .post_inline_items(RailId(0), &first, &ctx, &mut done)
        .unwrap();
    assert_eq!(tokens(&done), (0..per_post).collect::<Vec<_>>());
    let copied = usize::try_from(INLINE_BYTES).unwrap();
    assert!(remote.to_vec(0, copied).unwrap().iter().all(|b| *b == 0x5a));
    // The worker reports the rest, and is held inside that delivery.
    let worker = deliveries.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(
        tokens(&worker),
        (per_post..2 * per_post).collect::<Vec<_>>()
    );

    // While the worker holds items, a post queues behind it.
    let mut done = Vec::new();
    let last = [write(items - 1, items - 1)];
    local
        .post_inline_items(RailId(0), &last, &ctx, &mut done)
        .unwrap();
    assert!(done.is_empty(), "{done:?}");
    go.send(()).unwrap();
    let worker = deliveries.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(tokens(&worker), vec![items - 1]);
    go.send(()).unwrap();
    assert!(remote.to_vec(0, len).unwrap().iter().all(|b| *b == 0x5a));
    local.close(RailId(0));
    // The worker's last delivery: the rail is down.
    let end = deliveries.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(
        matches!(end.as_slice(), [TransportEvent::RailDown { .. }]),
        "{end:?}"
    );
    go.send(()).unwrap();
}
