//! `EngineState` contract tests on virtual time: a scripted transport
//! moves real bytes between a registration and a peer's published range,
//! and the clock moves only when a test advances it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitte_topology::DeviceMask;
use orbitte_wire::handshake::Established;
use orbitte_wire::{self as wire, Epoch, SourceId};

use super::{EngineState, Transmit};
use crate::TransferRequest;
use crate::core::CoreConfig;
use crate::error::{RegisterRefusal, UnregisterRefusal};
use crate::notification::{Armed, Notification, NotificationStatus};
use crate::outcome::{
    DrainStatus, Outcome, RailRefusal, RequestError, RequestId, Status, SubmitError,
};
use crate::registration::{Access, Budgets, Charges, Resources};
use crate::{
    Op, PathKind, PeerId, PostError, RailId, RailSpec, RangeId, RegistrationId, SliceFailure,
    SliceStatus, SliceToken, TransportEvent, WorkItem,
};

/// Memory of the tests: bytes grown on demand (a range never written
/// reads as zeros, so a test can register more than it touches).
#[derive(Debug)]
pub(super) struct TestMemory {
    len: usize,
    bytes: std::sync::Mutex<Vec<u8>>,
}

impl TestMemory {
    pub(super) fn alloc(len: usize) -> Arc<Self> {
        Arc::new(Self {
            len,
            bytes: std::sync::Mutex::new(Vec::new()),
        })
    }

    fn check(&self, offset: usize, n: usize) -> Result<(), String> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(format!("{offset}+{n} outside {} bytes", self.len)),
        }
    }

    pub(super) fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), String> {
        self.check(offset, data.len())?;
        let mut b = self.bytes.lock().unwrap();
        if b.len() < offset + data.len() {
            b.resize(offset + data.len(), 0);
        }
        b[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    pub(super) fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        self.check(offset, out.len())?;
        let b = self.bytes.lock().unwrap();
        for (i, o) in out.iter_mut().enumerate() {
            *o = b.get(offset + i).copied().unwrap_or(0);
        }
        Ok(())
    }

    pub(super) fn to_vec(&self, offset: usize, n: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0; n];
        self.read_at(offset, &mut out)?;
        Ok(out)
    }
}

/// A memory region of the tests: its keys only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TestRegion {
    pub(super) addr: u64,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
}

/// The resources the tests give the state.
#[derive(Debug)]
pub(super) struct Test;

impl Resources for Test {
    type Memory = Arc<TestMemory>;
    type Region = TestRegion;
    type Unquiesced = String;

    fn len(memory: &Arc<TestMemory>) -> u64 {
        memory.len as u64
    }

    fn address(_: &Arc<TestMemory>) -> u64 {
        0x1000
    }

    fn local_key(region: &TestRegion) -> (u64, u32) {
        (region.addr, region.lkey)
    }

    fn rkey(region: &TestRegion) -> u32 {
        region.rkey
    }

    fn fence_reason(cleanup: &String) -> String {
        format!("unquiesced {cleanup}")
    }
}

/// An access token for the tests' registrations.
pub(super) const TOKEN: wire::AccessToken = wire::AccessToken(0x5eed);

pub(super) const SLICE: u32 = 1024;
/// Bytes of the local registration and of the peer's range.
pub(super) const SIZE: usize = 16 * 1024;
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_millis(100);
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_millis(50);

pub(super) fn config() -> CoreConfig {
    CoreConfig {
        slice_size: SLICE,
        tcp_slice_size: 0,
        request_timeout: REQUEST_TIMEOUT,
        drain_timeout: DRAIN_TIMEOUT,
    }
}

/// What the scripted transport does with the next item of a rail.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Fate {
    Ok,
    /// Moves half the bytes, then reports an error completion.
    ErrorHalf,
    /// Never reports (until flushed).
    Hang,
}

/// An `EngineState` with one local registration, one peer with one
/// published range, and rails to it; the "remote" is a second buffer.
pub(super) struct Sim {
    pub(super) st: EngineState<Test>,
    pub(super) now: Instant,
    pub(super) local: Arc<TestMemory>,
    pub(super) remote: Arc<TestMemory>,
    pub(super) reg: RegistrationId,
    pub(super) peer: PeerId,
    pub(super) range: RangeId,
    pub(super) rails: Vec<RailId>,
    queues: Vec<VecDeque<(WorkItem, bool)>>,
    /// The rail is in error: what remains on it is flushed.
    broken: Vec<bool>,
    pub(super) outcomes: HashMap<RequestId, Outcome>,
    work: Vec<WorkItem>,
    /// The next post accepts only this many items, then fails.
    pub(super) fail_next_post: Option<usize>,
    /// Every data item the transport accepted.
    pub(super) accepted: Vec<WorkItem>,
    /// Notifications the state asked to send, not answered yet.
    pub(super) transmits: Vec<Transmit>,
}

/// A peer's range `id` of [`SIZE`] bytes, remotely readable and writable.
fn descriptor(id: u64) -> wire::RangeDescriptor {
    wire::RangeDescriptor {
        range_id: wire::RangeId(id),
        address: 0x10_0000,
        length: SIZE as u64,
        access: Access::REMOTE_READ_WRITE.wire_flags(),
        token: wire::AccessToken(9),
        rkeys: Vec::new(),
        local: None,
    }
}

/// The local registration's bytes before any request.
pub(super) fn local_before() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| pattern(SIZE, 3))
}

/// The peer's range's bytes before any request.
pub(super) fn remote_before() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| pattern(SIZE, 101))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

impl Sim {
    /// Rails of the given (depth, signal interval), tcp path, no NIC.
    pub(super) fn new(rails: &[(u32, u32)]) -> Self {
        let mut st = EngineState::<Test>::new(config(), Budgets::default());
        let local = TestMemory::alloc(SIZE);
        let remote = TestMemory::alloc(SIZE);
        local.write_at(0, local_before()).expect("in range");
        remote.write_at(0, remote_before()).expect("in range");
        let reg = st
            .register_unpinned(local.clone(), Access::REMOTE_READ_WRITE, TOKEN)
            .expect("not fenced")
            .id;
        let range = RangeId(7);
        let desc = descriptor(range.0);
        let peer = st.open_peer(
            SourceId::new("peer").expect("valid"),
            Epoch::MIN,
            std::slice::from_ref(&desc),
        );
        let rails: Vec<RailId> = rails
            .iter()
            .map(|&(depth, interval)| {
                st.add_rail(RailSpec {
                    path: PathKind::Tcp,
                    peer,
                    nic: None,
                    remote_nic: None,
                    max_in_flight: depth,
                    signal_interval: interval,
                })
            })
            .collect();
        let n = rails.len();
        Self {
            st,
            now: Instant::now(),
            local,
            remote,
            reg,
            peer,
            range,
            rails,
            queues: vec![VecDeque::new(); n],
            broken: vec![false; n],
            outcomes: HashMap::new(),
            work: Vec::new(),
            fail_next_post: None,
            accepted: Vec::new(),
            transmits: Vec::new(),
        }
    }

    /// Adds a rail (tcp path, depth 4, every item signaled) on `nic`.
    pub(super) fn add_rail(&mut self, nic: Option<u32>) -> RailId {
        let rail = self.st.add_rail(RailSpec {
            path: PathKind::Tcp,
            peer: self.peer,
            nic,
            remote_nic: None,
            max_in_flight: 4,
            signal_interval: 1,
        });
        self.rails.push(rail);
        self.queues.push(VecDeque::new());
        self.broken.push(false);
        rail
    }

    pub(super) fn request(&self, op: Op, local: u64, remote: u64, len: u64) -> TransferRequest {
        let r = match op {
            Op::Read => TransferRequest::read,
            Op::Write => TransferRequest::write,
        };
        r(self.reg, local, self.peer, self.range, remote, len).label(local)
    }

    pub(super) fn submit(
        &mut self,
        batch: &[TransferRequest],
    ) -> Result<Vec<RequestId>, SubmitError> {
        self.st.submit(self.now, batch, DeviceMask::ALL)
    }

    /// Submits a batch carrying a notification of `bytes`, the way the
    /// driver does: admit, submit to the core, track.
    pub(super) fn submit_notifying(
        &mut self,
        batch: &[TransferRequest],
        bytes: &[u8],
    ) -> Result<Vec<RequestId>, SubmitError> {
        let reqs = self.st.admit(batch, DeviceMask::ALL)?;
        let armed = Armed::check(batch, Notification::new(bytes))
            .expect("one peer, a small notification")
            .on_rails(&reqs);
        let ids = self.st.core.submit(self.now, reqs)?;
        self.st.track_notification(&ids, armed);
        Ok(ids)
    }

    /// Rail index of a rail id.
    fn index(&self, rail: RailId) -> usize {
        self.rails
            .iter()
            .position(|r| *r == rail)
            .expect("a rail of this sim")
    }

    /// Posts what the core has, collects outcomes and flushes.
    pub(super) fn pump(&mut self) {
        self.work.clear();
        self.st.core.poll_work(&mut self.work);
        let mut start = 0;
        while start < self.work.len() {
            let rail = self.work[start].rail;
            let end = self.work[start..]
                .iter()
                .position(|w| w.rail != rail)
                .map_or(self.work.len(), |p| start + p);
            let accepted = self
                .fail_next_post
                .take()
                .map_or(end - start, |k| k.min(end - start));
            let i = self.index(rail);
            for w in &self.work[start..start + accepted] {
                self.queues[i].push_back((*w, false));
                self.accepted.push(*w);
            }
            if accepted < end - start {
                let err = PostError {
                    rail,
                    posted: accepted,
                    reason: "injected post failure".into(),
                };
                let run = self.work[start..end].to_vec();
                self.st.core.handle_post_error(self.now, &err, &run);
            }
            start = end;
        }
        self.st.collect_outcomes();
        while let Some(t) = self.st.poll_transmit() {
            self.transmits.push(t);
        }
        let mut arrived = Vec::new();
        self.st.outcomes.take_arrived(&mut arrived);
        for id in arrived {
            let o = self.st.outcomes.remove(&id).expect("arrived, not taken");
            assert!(
                self.outcomes.insert(o.request, o).is_none(),
                "one outcome per request"
            );
        }
        while let Some((rail, marker)) = self.st.core.poll_flush(self.now) {
            self.flush_marked(rail, marker);
        }
    }

    fn copy(&self, w: &WorkItem, len: usize) {
        let (l, r) = (w.local_offset as usize, w.remote_offset as usize);
        let mut buf = vec![0; len];
        let (from, to, at_from, at_to) = match w.op {
            Op::Write => (&self.local, &self.remote, l, r),
            Op::Read => (&self.remote, &self.local, r, l),
        };
        from.read_at(at_from, &mut buf).expect("in range");
        to.write_at(at_to, &buf).expect("in range");
    }

    /// Executes the head item of rail `i` with `fate`; reports it if
    /// signaled (or failed). Returns false if nothing ran.
    pub(super) fn step(&mut self, i: usize, fate: Fate) -> bool {
        let Some((w, _)) = self.queues[i].front().copied() else {
            return false;
        };
        if self.broken[i] {
            self.queues[i].pop_front();
            self.report(w, SliceStatus::Failed(SliceFailure::Flushed));
            return true;
        }
        match fate {
            Fate::Hang => {
                if let Some(front) = self.queues[i].front_mut() {
                    front.1 = true;
                }
                return false;
            }
            Fate::Ok => {
                self.queues[i].pop_front();
                self.copy(&w, w.len as usize);
                if w.signaled {
                    self.report(w, SliceStatus::Success);
                }
            }
            Fate::ErrorHalf => {
                self.queues[i].pop_front();
                self.copy(&w, w.len as usize / 2);
                self.broken[i] = true;
                let status = SliceFailure::Completion {
                    status: "IBV_WC_RETRY_EXC_ERR".into(),
                    code: 12,
                };
                self.report(w, SliceStatus::Failed(status));
            }
        }
        true
    }

    /// Whether the head item of rail `i` hangs.
    pub(super) fn hung(&self, i: usize) -> bool {
        self.queues[i].front().is_some_and(|q| q.1)
    }

    fn report(&mut self, w: WorkItem, status: SliceStatus) {
        let ev = TransportEvent::Completed {
            rail: w.rail,
            token: w.token,
            status,
            released: true,
        };
        self.st.core.handle_event(self.now, ev);
    }

    /// The flush: the rail to error, then a signaled marker that reports
    /// after everything queued before it.
    fn flush_marked(&mut self, rail: RailId, marker: SliceToken) {
        let i = self.index(rail);
        self.broken[i] = true;
        let m = WorkItem {
            token: marker,
            rail,
            op: Op::Write,
            registration: RegistrationId(0),
            local_offset: 0,
            peer: PeerId(0),
            range: RangeId(0),
            remote_offset: 0,
            len: 0,
            signaled: true,
        };
        self.queues[i].push_back((m, false));
        self.flush(i);
    }

    /// The rail to error: every queued item reports flushed.
    pub(super) fn flush(&mut self, i: usize) {
        self.broken[i] = true;
        while self.step(i, Fate::Ok) {}
    }

    /// The rail goes down (its port paused) and its queue is flushed.
    pub(super) fn rail_down(&mut self, i: usize) {
        let ev = TransportEvent::RailDown {
            rail: self.rails[i],
            reason: "port paused".into(),
        };
        self.st.core.handle_event(self.now, ev);
        self.flush(i);
    }

    pub(super) fn advance(&mut self, d: Duration) {
        self.now += d;
        self.st.core.handle_timeout(self.now);
        self.pump();
    }

    /// Runs every rail until nothing moves.
    pub(super) fn run_ok(&mut self) {
        loop {
            self.pump();
            let mut any = false;
            for i in 0..self.queues.len() {
                while !self.hung(i) && self.step(i, Fate::Ok) {
                    any = true;
                }
            }
            if !any {
                self.pump();
                break;
            }
        }
    }
}

#[test]
fn bytes_arrive_and_every_request_has_its_outcome() {
    let mut sim = Sim::new(&[(4, 2), (4, 1)]);
    let w = sim.request(Op::Write, 0, 0, 5000);
    let r = sim.request(Op::Read, 8192, 12288, 3000);
    let ids = sim.submit(&[w, r]).unwrap();
    sim.run_ok();
    for id in &ids {
        let o = &sim.outcomes[id];
        assert_eq!(o.status, Status::Complete, "{o:?}");
        assert_eq!(o.drain, DrainStatus::Drained, "{o:?}");
    }
    let (local, remote) = (local_before(), remote_before());
    assert_eq!(sim.remote.to_vec(0, 5000).unwrap(), local[..5000]);
    assert_eq!(sim.remote.to_vec(5000, 100).unwrap(), remote[5000..5100]);
    assert_eq!(sim.local.to_vec(8192, 3000).unwrap(), remote[12288..15288]);
    assert_eq!(sim.local.to_vec(11192, 100).unwrap(), local[11192..11292]);
    // Both rails carried slices.
    for rail in &sim.rails {
        assert!(sim.accepted.iter().any(|w| w.rail == *rail), "{rail:?}");
    }
}

#[test]
fn a_bad_request_refuses_the_whole_batch_and_nothing_is_posted() {
    let mut sim = Sim::new(&[(4, 1)]);
    let good = sim.request(Op::Write, 0, 0, 100);
    let cases = [
        (
            sim.request(Op::Write, 0, SIZE as u64 - 10, 11),
            "remote out of range",
        ),
        (
            sim.request(Op::Read, SIZE as u64, 0, 1),
            "local out of range",
        ),
        (sim.request(Op::Read, 0, 0, 0), "zero length"),
        (sim.request(Op::Read, u64::MAX, 0, 2), "overflow"),
        (
            TransferRequest::read(RegistrationId(99), 0, sim.peer, sim.range, 0, 1),
            "unknown registration",
        ),
        (
            TransferRequest::read(sim.reg, 0, PeerId(42), sim.range, 0, 1),
            "unknown peer",
        ),
        (
            TransferRequest::read(sim.reg, 0, sim.peer, RangeId(8), 0, 1),
            "unpublished range",
        ),
    ];
    for (bad, what) in cases {
        let err = sim.submit(&[good, bad.label(77)]).unwrap_err();
        let SubmitError::Invalid {
            index,
            label,
            error,
        } = &err
        else {
            panic!("{what}: {err:?}");
        };
        assert_eq!((*index, *label), (1, 77), "{what}: {err:?}");
        match what {
            "remote out of range" => assert!(
                matches!(error, RequestError::OutOfRange { side: "remote", .. }),
                "{err:?}"
            ),
            "local out of range" => assert!(
                matches!(error, RequestError::OutOfRange { side: "local", .. }),
                "{err:?}"
            ),
            "zero length" => assert_eq!(error, &RequestError::ZeroLength),
            "overflow" => assert!(matches!(error, RequestError::Overflow { .. }), "{err:?}"),
            "unknown registration" => {
                assert_eq!(error, &RequestError::UnpublishedLocal(RegistrationId(99)))
            }
            "unknown peer" => assert_eq!(error, &RequestError::UnknownPeer(PeerId(42))),
            _ => assert!(
                matches!(error, RequestError::UnpublishedRemote { .. }),
                "{err:?}"
            ),
        }
    }
    assert!(matches!(sim.submit(&[]), Err(SubmitError::Empty)));
    sim.pump();
    assert!(sim.accepted.is_empty(), "nothing posted");
    assert_eq!(sim.st.core.outstanding_slices(), 0);
    assert_eq!(sim.st.tables.regs[&sim.reg.0].undrained(), 0, "no pin kept");
}

#[test]
fn rail_choice_skips_masked_and_down_rails_and_names_each() {
    let mut sim = Sim::new(&[(4, 1)]);
    let masked = sim.add_rail(Some(5));
    let only_0 = DeviceMask::of([orbitte_topology::NicId(0)]);
    sim.st.core.handle_event(
        sim.now,
        TransportEvent::RailDown {
            rail: sim.rails[0],
            reason: "port paused".into(),
        },
    );
    let w = sim.request(Op::Write, 0, 0, 10);
    let err = sim.st.submit(sim.now, &[w], only_0).unwrap_err();
    let SubmitError::Invalid {
        error: RequestError::NoRail { peer, why },
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*peer, sim.peer);
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(
        matches!(&why[0], RailRefusal::Down { rail, reason } if *rail == sim.rails[0] && reason.contains("paused")),
        "{why:?}"
    );
    assert!(
        matches!(&why[1], RailRefusal::OutsideMask { rail, .. } if *rail == masked),
        "{why:?}"
    );
    // With the mask allowing NIC 5, the masked rail takes the request.
    let ids = sim.st.submit(sim.now, &[w], DeviceMask::ALL).unwrap();
    sim.pump();
    assert_eq!(ids.len(), 1);
    assert!(sim.accepted.iter().all(|w| w.rail == masked));
    assert!(!sim.accepted.is_empty());
}

#[test]
fn an_admission_taken_in_pieces_builds_what_the_whole_batch_does_rails_rotating() {
    // Three runs: READs on the registration, WRITEs on a second one, READs
    // on the first again.
    let batch = |sim: &mut Sim| -> Vec<TransferRequest> {
        let other = sim
            .st
            .register_unpinned(TestMemory::alloc(SIZE), Access::REMOTE_READ_WRITE, TOKEN)
            .unwrap()
            .id;
        (0..9u64)
            .map(|i| match i {
                4..7 => {
                    TransferRequest::write(other, i * 64, sim.peer, sim.range, i * 64, 64).label(i)
                }
                _ => sim.request(Op::Read, i * 64, i * 64, 64),
            })
            .collect()
    };
    let (mut whole, mut pieces) = (Sim::new(&[(4, 1); 3]), Sim::new(&[(4, 1); 3]));
    let (a, b) = (batch(&mut whole), batch(&mut pieces));
    let all = whole.st.admit(&a, DeviceMask::ALL).unwrap();
    let mut admission = pieces.st.validate(&b, DeviceMask::ALL).unwrap();
    assert_eq!(admission.len(), 9);
    let mut built: Vec<_> = admission.by_ref().take(2).collect();
    assert_eq!(admission.len(), 7);
    built.extend(admission.by_ref().take(3));
    built.extend(admission);
    let seen = |reqs: &[crate::core::CoreRequest]| {
        reqs.iter()
            .map(|r| {
                let reg = r.registration;
                (r.label, r.op, reg, r.remote_offset, r.rails.to_vec())
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(seen(&built), seen(&all));
    // Each request holds its own registration, the run's decision it was
    // built from: six on the first, three on the second.
    let other = b[4].registration;
    let held = |sim: &Sim, reg: RegistrationId| sim.st.tables.regs[&reg.0].undrained();
    assert_eq!(held(&pieces, pieces.reg), 6);
    assert_eq!(held(&pieces, other), 3);
    // Each request's first rail rotates over the three, across the run
    // boundaries and into the next batch.
    let rails = &whole.rails;
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.rails[0], rails[i % 3], "request {i}");
        assert_eq!(r.rails.len(), 3);
    }
    let next = pieces.st.admit(&b[..1], DeviceMask::ALL).unwrap();
    assert_eq!(next[0].rails[0], rails[9 % 3]);
    drop((built, next));
    assert_eq!(held(&pieces, pieces.reg), 0);
    assert_eq!(held(&pieces, other), 0);
}

#[test]
fn admission_refuses_more_slices_than_the_core_counts() {
    // One-byte slices: a request of more than u32::MAX bytes has more
    // slices than the core numbers. The memory is sparse (never touched).
    let big: usize = 5 << 30;
    let mut st = EngineState::<Test>::new(
        CoreConfig {
            slice_size: 1,
            ..config()
        },
        Budgets::default(),
    );
    let local = TestMemory::alloc(big);
    let reg = st
        .register_unpinned(local, Access::REMOTE_READ_WRITE, TOKEN)
        .expect("not fenced")
        .id;
    let desc = wire::RangeDescriptor {
        length: big as u64,
        ..descriptor(7)
    };
    let peer = st.open_peer(
        SourceId::new("peer").expect("valid"),
        Epoch::MIN,
        std::slice::from_ref(&desc),
    );
    st.add_rail(tcp_rail(peer));
    let most = u64::from(u32::MAX);
    let read = |len: u64| TransferRequest::read(reg, 0, peer, RangeId(7), 0, len).label(len);
    let fits = st
        .admit(&[read(most)], DeviceMask::ALL)
        .expect("u32::MAX slices");
    st.core.check(&fits).expect("the core agrees");
    let err = st
        .validate(&[read(most), read(most + 1)], DeviceMask::ALL)
        .map(|a| a.len())
        .unwrap_err();
    assert!(
        matches!(
            err,
            SubmitError::Invalid {
                index: 1,
                label,
                error: RequestError::Overflow { len, .. },
            } if label == most + 1 && len == most + 1
        ),
        "{err:?}"
    );
    let mut over = fits;
    over[0].len = most + 1;
    assert!(
        matches!(
            st.core.check(&over),
            Err(SubmitError::Invalid {
                error: RequestError::Overflow { .. },
                ..
            })
        ),
        "the core refuses it as well"
    );
}

#[test]
fn a_fenced_state_admits_nothing() {
    let mut sim = Sim::new(&[(4, 1)]);
    sim.st
        .fence("unquiesced during shutdown: MR destroy failed");
    let w = sim.request(Op::Write, 0, 0, 10);
    let err = sim.submit(&[w]).unwrap_err();
    assert!(
        matches!(&err, SubmitError::Fenced { index: 0, reason, .. } if reason.contains("MR destroy failed")),
        "{err:?}"
    );
    let mem = TestMemory::alloc(4096);
    let err = sim
        .st
        .register_unpinned(mem, Access::LocalOnly, TOKEN)
        .unwrap_err();
    assert!(matches!(err, RegisterRefusal::Fenced { .. }), "{err:?}");
    sim.pump();
    assert!(sim.accepted.is_empty());
}

#[test]
fn a_registration_stays_until_its_requests_drained_on_virtual_time() {
    let mut sim = Sim::new(&[(4, 1)]);
    let w = sim.request(Op::Write, 0, 0, 2 * u64::from(SLICE));
    let ids = sim.submit(&[w]).unwrap();
    sim.pump();
    assert!(!sim.step(0, Fate::Hang), "the first slice hangs");
    let err = sim.st.take_registration(sim.reg).unwrap_err();
    assert!(
        matches!(err, UnregisterRefusal::Undrained { requests: 1, .. }),
        "{err:?}"
    );
    // The request times out logically; its slices stay with the transport.
    sim.advance(REQUEST_TIMEOUT);
    let o = &sim.outcomes[&ids[0]];
    assert_eq!(o.status, Status::TimedOut, "{o:?}");
    assert!(matches!(o.drain, DrainStatus::Pending { .. }), "{o:?}");
    assert!(sim.st.take_registration(sim.reg).is_err());
    // Past the drain timeout the rail is flushed, which drains it.
    sim.advance(DRAIN_TIMEOUT);
    assert_eq!(sim.st.core.drain_status(ids[0]), DrainStatus::Drained);
    let entry = sim.st.take_registration(sim.reg).unwrap();
    assert_eq!(entry.charge, Charges::default());
    assert_eq!(sim.st.ledger.in_use, Charges::default());
    assert!(matches!(
        sim.st.take_registration(sim.reg),
        Err(UnregisterRefusal::Unknown(_))
    ));
}

#[test]
fn a_closed_rail_is_reaped_once_its_work_drained() {
    let mut sim = Sim::new(&[(4, 1), (4, 1)]);
    let w = sim.request(Op::Write, 0, 0, 4 * u64::from(SLICE));
    let ids = sim.submit(&[w]).unwrap();
    sim.pump();
    assert!(!sim.step(0, Fate::Hang), "rail 0 holds its slices");
    let mut reapable = Vec::new();
    // An idle rail is not kept for reaping: the driver destroys it now.
    sim.step(1, Fate::Ok);
    sim.step(1, Fate::Ok);
    sim.pump();
    let idle = sim.rails[1];
    assert!(!sim.st.close_rail(idle, sim.now, true));
    // A busy one waits until its work in flight drained.
    let busy = sim.rails[0];
    assert!(sim.st.close_rail(busy, sim.now, true));
    sim.st.take_reapable(&mut reapable);
    assert!(reapable.is_empty(), "{reapable:?}");
    // The next pump flushes the closed rail, which drains it.
    sim.pump();
    sim.st.take_reapable(&mut reapable);
    assert_eq!(reapable, [busy]);
    reapable.clear();
    sim.st.take_reapable(&mut reapable);
    assert!(reapable.is_empty(), "handed back once");
    sim.pump();
    let o = &sim.outcomes[&ids[0]];
    assert_ne!(o.status, Status::Complete, "{o:?}");
    assert_eq!(sim.st.core.drain_status(ids[0]), DrainStatus::Drained);
}

#[test]
fn unquiesced_evidence_is_kept_and_fences_admission() {
    let mut sim = Sim::new(&[(4, 1)]);
    let u = "during unregister of registration 3: MR lkey 0x12 on s0: EBUSY".to_owned();
    sim.st.record_unquiesced(u.clone());
    assert_eq!(sim.st.unquiesced, [u]);
    let reason = sim.st.fenced().expect("fenced").to_string();
    assert!(
        reason.contains("unquiesced during unregister of registration 3"),
        "{reason}"
    );
    let w = sim.request(Op::Write, 0, 0, 10);
    let err = sim.submit(&[w]).unwrap_err();
    assert!(
        matches!(&err, SubmitError::Fenced { reason: r, .. } if r.contains("registration 3")),
        "{err:?}"
    );
}

#[test]
fn outcomes_wait_to_be_taken_and_say_once_which_arrived() {
    let mut sim = Sim::new(&[(4, 1)]);
    let a = sim.request(Op::Write, 0, 0, 10);
    let b = sim.request(Op::Read, 100, 100, 10);
    let ids = sim.submit(&[a, b]).unwrap();
    sim.run_ok();
    for id in &ids {
        let o = sim.outcomes.remove(id).expect("made");
        sim.st.outcomes.insert(*id, o);
    }
    let mut arrived = Vec::new();
    sim.st.outcomes.take_arrived(&mut arrived);
    assert_eq!(arrived, ids);
    arrived.clear();
    sim.st.outcomes.take_arrived(&mut arrived);
    assert!(arrived.is_empty(), "reported once");
    assert!(sim.st.outcomes.contains_key(&ids[1]));
    let o = sim.st.outcomes.remove(&ids[1]).expect("not taken yet");
    assert_eq!((o.request, o.status), (ids[1], Status::Complete));
    assert!(sim.st.outcomes.remove(&ids[1]).is_none(), "taken once");
    assert!(sim.st.outcomes.contains_key(&ids[0]));
}

// ---- notifications ----

/// The notification status of a request's outcome.
fn notification(sim: &Sim, id: RequestId) -> &NotificationStatus {
    &sim.outcomes[&id].notification
}

/// A sim with `rails` and a batch of `n` 100-byte WRITEs carrying the
/// notification "kv ready", posted.
fn notifying(rails: &[(u32, u32)], n: u64) -> (Sim, Vec<RequestId>) {
    let mut sim = Sim::new(rails);
    let batch: Vec<_> = (0..n)
        .map(|k| sim.request(Op::Write, 200 * k, 200 * k, 100))
        .collect();
    let ids = sim.submit_notifying(&batch, b"kv ready").unwrap();
    sim.pump();
    (sim, ids)
}

/// [`notifying`] with one WRITE.
fn notifying_write(rails: &[(u32, u32)]) -> (Sim, RequestId) {
    let (sim, ids) = notifying(rails, 1);
    (sim, ids[0])
}

fn why_not_sent(sim: &Sim, id: RequestId) -> &str {
    match notification(sim, id) {
        NotificationStatus::NotSent { why } => why,
        other => panic!("expected NotSent, got {other:?}"),
    }
}

#[test]
fn a_notification_waits_for_the_last_outcome_then_goes_out_on_the_batchs_rail() {
    let (mut sim, ids) = notifying(&[(4, 1)], 2);
    assert!(sim.step(0, Fate::Ok), "the first request completes");
    sim.pump();
    assert!(sim.outcomes.is_empty(), "held: {:?}", sim.outcomes);
    assert!(sim.st.notifications.holds(ids[0]));
    assert!(!sim.st.notifications.holds(ids[1]), "not made yet");
    assert!(sim.transmits.is_empty(), "not before the last outcome");
    assert!(sim.step(0, Fate::Ok));
    sim.pump();
    let t = sim
        .transmits
        .pop()
        .expect("a transmit once every request completed");
    assert!(sim.transmits.is_empty(), "one per batch");
    assert_eq!(t.rails, [sim.rails[0]]);
    match wire::decode_exact(&t.frame) {
        Ok((wire::Frame::Notification(n), _)) => {
            assert_eq!(
                (n.notification_id, n.payload.as_slice()),
                (t.id, &b"kv ready"[..])
            );
        }
        other => panic!("not a notification frame: {other:?}"),
    }
    // The outcomes stay held while the driver sends, and while the
    // target has not answered.
    sim.pump();
    assert!(sim.outcomes.is_empty());
    assert!(sim.st.notifications.holds(ids[1]));
    sim.st.notification_sent(t.id, Ok(t.rails[0]));
    sim.pump();
    assert!(sim.outcomes.is_empty(), "held until the target answers");
    answer(
        &mut sim,
        t.rails[0],
        t.id,
        wire::NotificationVerdict::QUEUED,
    );
    sim.pump();
    for id in &ids {
        assert_eq!(sim.outcomes[id].status, Status::Complete);
        assert_eq!(notification(&sim, *id), &NotificationStatus::Sent);
        assert!(!sim.st.notifications.holds(*id));
    }
    assert_eq!(sim.st.notifications.pending(), 0);
    // A second answer for the same notification changes nothing.
    sim.st.notification_sent(t.id, Err(vec!["late".into()]));
    let mut arrived = Vec::new();
    sim.st.outcomes.take_arrived(&mut arrived);
    assert!(arrived.is_empty(), "{arrived:?}");
}

/// The target's answer to notification `id`, on `rail`.
fn answer(sim: &mut Sim, rail: RailId, id: u64, verdict: wire::NotificationVerdict) {
    let answer = wire::NotificationAnswer {
        notification_id: id,
        verdict,
        limit: 1024,
    };
    sim.st.handle_event(
        sim.now,
        TransportEvent::NotificationAnswered { rail, answer },
    );
}

#[test]
fn a_refused_notification_is_reported_on_every_outcome_of_its_batch_with_the_fix() {
    let (mut sim, ids) = notifying(&[(4, 1), (4, 1)], 2);
    while sim.step(0, Fate::Ok) || sim.step(1, Fate::Ok) {}
    sim.pump();
    let t = sim.transmits.pop().expect("a transmit");
    sim.st.notification_sent(t.id, Ok(t.rails[0]));
    // An answer on another rail, or for another notification, is no
    // answer to this one.
    let other = *sim.rails.iter().find(|r| **r != t.rails[0]).unwrap();
    answer(&mut sim, other, t.id, wire::NotificationVerdict::QUEUED);
    answer(
        &mut sim,
        t.rails[0],
        t.id + 7,
        wire::NotificationVerdict::QUEUED,
    );
    sim.pump();
    assert!(sim.outcomes.is_empty(), "{:?}", sim.outcomes);
    answer(
        &mut sim,
        t.rails[0],
        t.id,
        wire::NotificationVerdict::INBOX_FULL,
    );
    sim.pump();
    for id in &ids {
        assert_eq!(sim.outcomes[id].status, Status::Complete);
        match notification(&sim, *id) {
            NotificationStatus::Refused { why } => {
                assert!(why.contains("1024 unread notifications"), "{why}");
                assert!(why.contains("must read its notifications"), "{why}");
            }
            other => panic!("expected Refused, got {other:?}"),
        }
    }
    assert_eq!(sim.st.notifications.pending(), 0);
}

#[test]
fn a_rail_that_goes_down_or_closes_before_the_answer_leaves_the_notification_unconfirmed() {
    for close in [false, true] {
        let (mut sim, id) = notifying_write(&[(4, 1)]);
        sim.step(0, Fate::Ok);
        sim.pump();
        let t = sim.transmits.pop().expect("a transmit");
        sim.st.notification_sent(t.id, Ok(t.rails[0]));
        sim.pump();
        assert!(sim.outcomes.is_empty());
        if close {
            sim.st.close_rail(t.rails[0], sim.now, false);
        } else {
            let ev = TransportEvent::RailDown {
                rail: t.rails[0],
                reason: "peer reset".into(),
            };
            sim.st.handle_event(sim.now, ev);
        }
        sim.pump();
        match notification(&sim, id) {
            NotificationStatus::Unconfirmed { why } => {
                assert!(why.contains("may or may not"), "{why}");
                assert!(close || why.contains("peer reset"), "{why}");
            }
            other => panic!("expected Unconfirmed, got {other:?}"),
        }
        // A late answer changes nothing.
        answer(
            &mut sim,
            t.rails[0],
            t.id,
            wire::NotificationVerdict::QUEUED,
        );
        let mut arrived = Vec::new();
        sim.st.outcomes.take_arrived(&mut arrived);
        assert!(arrived.is_empty(), "{arrived:?}");
    }
}

#[test]
fn a_batch_that_times_out_on_virtual_time_withholds_its_notification() {
    let (mut sim, ids) = notifying(&[(4, 1)], 2);
    assert!(sim.step(0, Fate::Ok));
    assert!(!sim.step(0, Fate::Hang), "the second request hangs");
    sim.advance(REQUEST_TIMEOUT - Duration::from_millis(1));
    assert!(sim.outcomes.is_empty(), "held until the batch resolves");
    sim.advance(Duration::from_millis(1));
    assert!(
        sim.transmits.is_empty(),
        "nothing to send: {:?}",
        sim.transmits
    );
    assert_eq!(sim.outcomes[&ids[0]].status, Status::Complete);
    assert_eq!(sim.outcomes[&ids[1]].status, Status::TimedOut);
    for id in &ids {
        let why = why_not_sent(&sim, *id);
        assert!(why.contains("TimedOut"), "{why}");
    }
    assert_eq!(sim.st.notifications.pending(), 0);
}

#[test]
fn a_notification_passes_over_closed_and_down_rails_and_names_every_refusal() {
    let (mut sim, id) = notifying_write(&[(4, 1), (4, 1), (4, 1)]);
    for i in 0..3 {
        sim.step(i, Fate::Ok);
    }
    // Before the pump that resolves the batch: one rail goes down, one
    // is closed and taken off the peer.
    let (up, down, closed) = (sim.rails[0], sim.rails[1], sim.rails[2]);
    sim.rail_down(1);
    assert!(!sim.st.close_rail(closed, sim.now, false), "idle");
    // Taken off the peer, as a path switch does.
    let peer = sim.st.tables.peers.get_mut(&sim.peer.0).expect("open");
    peer.rails.retain(|r| *r != closed);
    sim.pump();
    let t = sim.transmits.pop().expect("one rail is left");
    assert_eq!(t.rails, [up]);
    assert!(sim.outcomes.is_empty(), "held while the driver sends");
    sim.st
        .notification_sent(t.id, Err(vec![format!("rail {}: session closed", up.0)]));
    sim.pump();
    assert_eq!(sim.outcomes[&id].status, Status::Complete);
    let why = why_not_sent(&sim, id);
    for part in [
        format!("rail {} was closed", closed.0),
        format!("rail {} down: port paused", down.0),
        format!("rail {}: session closed", up.0),
    ] {
        assert!(why.contains(&part), "{part:?} in {why}");
    }
}

#[test]
fn a_batch_with_no_usable_rail_left_is_not_sent_and_never_reaches_the_driver() {
    let (mut sim, id) = notifying_write(&[(4, 1)]);
    sim.step(0, Fate::Ok);
    sim.rail_down(0);
    sim.pump();
    assert!(sim.transmits.is_empty());
    let why = why_not_sent(&sim, id);
    assert!(why.contains("down: port paused"), "{why}");
}

/// Why a batch of one request was refused.
fn refused(submitted: Result<Vec<RequestId>, SubmitError>) -> RequestError {
    match submitted {
        Err(SubmitError::Invalid { error, .. }) => error,
        other => panic!("expected a refused request, got {other:?}"),
    }
}

// ---- Host Direct registration ----

#[test]
fn host_direct_charges_every_copy_up_front_and_refuses_past_either_budget() {
    let budgets = Budgets {
        max_mrs: 5,
        max_bytes: 64 * 1024,
    };
    let mut st = EngineState::<Test>::new(config(), budgets);
    let r = st
        .reserve_host_direct(4096, Access::REMOTE_READ_WRITE, 2)
        .unwrap();
    let four = Charges {
        mrs: 4,
        bytes: 4 * 4096,
    };
    assert_eq!((r.charge, st.ledger.in_use), (four, four));
    // A registration made meanwhile sees the reservation.
    let err = st
        .reserve_host_direct(4096, Access::REMOTE_READ_WRITE, 1)
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegisterRefusal::ResourceExhausted {
                resource: "memory regions",
                asked: 2,
                in_use: 4,
                limit: 5
            }
        ),
        "{err:?}"
    );
    let err = st
        .reserve_host_direct(64 * 1024, Access::LocalOnly, 1)
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegisterRefusal::ResourceExhausted {
                resource: "registered bytes",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(st.ledger.in_use, four, "a refusal charges nothing");
    // Abandoned with one copy that could not be released: it stays charged.
    let kept = st.abandon_host_direct(r, 1);
    let one = Charges {
        mrs: 1,
        bytes: 4096,
    };
    assert_eq!((kept, st.ledger.in_use), (one, one));
    st.fence("unquiesced during release");
    let err = st
        .reserve_host_direct(4096, Access::LocalOnly, 1)
        .unwrap_err();
    assert!(matches!(err, RegisterRefusal::Fenced { .. }), "{err:?}");
    assert_eq!(st.ledger.in_use, one);
}

#[test]
fn a_published_host_direct_registration_serves_requests_until_retired() {
    use crate::registration::{MemoryPath, NicCopies};
    let mut sim = Sim::new(&[(4, 1)]);
    let before = sim.st.ledger.in_use;
    let access = Access::REMOTE_READ_WRITE;
    let r = sim.st.reserve_host_direct(SIZE as u64, access, 1).unwrap();
    let id = r.id;
    let memory = TestMemory::alloc(SIZE);
    let local = TestRegion {
        addr: 0x1000,
        lkey: 1,
        rkey: 0,
    };
    let remote = TestRegion {
        addr: 0x1000,
        lkey: 2,
        rkey: 0x22,
    };
    let copies = vec![NicCopies::<Test> {
        nic: 0,
        local,
        remote: Some(remote),
    }];
    // Not admitted before it is published.
    let w = TransferRequest::write(id, 0, sim.peer, sim.range, 0, 10);
    assert!(sim.submit(&[w]).is_err());
    let reg = sim
        .st
        .publish_host_direct(r, memory, copies, vec![(0, 0)], TOKEN);
    assert_eq!(
        (reg.id, reg.copies, reg.path, reg.len),
        (id, 2, MemoryPath::HostDirect, SIZE as u64)
    );
    let ids = sim.submit(&[w]).unwrap();
    sim.run_ok();
    assert_eq!(sim.outcomes[&ids[0]].status, Status::Complete);
    // Retire: new requests refused, the remote copy handed to the driver.
    let remote = sim.st.retire_registration(id).unwrap();
    assert_eq!(
        remote,
        [TestRegion {
            rkey: 0x22,
            ..remote[0]
        }]
    );
    assert_eq!(
        refused(sim.submit(&[w])),
        RequestError::UnpublishedLocal(id)
    );
    sim.st.retired_closed(id, 1);
    let left = Charges {
        mrs: 1,
        bytes: SIZE as u64,
    };
    assert_eq!(sim.st.tables.regs[&id.0].charge, left);
    assert_eq!(sim.st.ledger.in_use.mrs, before.mrs + 1);
    assert!(sim.st.retire_registration(id).unwrap().is_empty(), "once");
    let entry = sim.st.take_registration(id).unwrap();
    assert_eq!(sim.st.ledger.in_use, before);
    assert_eq!(
        entry
            .copies
            .iter()
            .map(|c| (c.local, c.remote))
            .collect::<Vec<_>>(),
        [(local, None)],
        "the local copy stays until the driver closes it"
    );
    assert!(matches!(
        sim.st.retire_registration(RegistrationId(999)),
        Err(UnregisterRefusal::Unknown(_))
    ));
}

// ---- peers ----

fn established(source: &str, epoch: u64, admission: wire::Admission) -> Established {
    Established {
        peer: wire::Identity::new(
            SourceId::new(source).expect("valid"),
            Epoch::new(epoch).expect("valid"),
            wire::Capabilities::RDMA,
        ),
        admission,
        purpose: wire::SessionPurpose::DATA,
    }
}

fn publication(epoch: u64, ranges: &[u64]) -> wire::SegmentPublication {
    wire::SegmentPublication {
        epoch: Epoch::new(epoch).expect("valid"),
        ranges: ranges.iter().map(|&id| descriptor(id)).collect(),
    }
}

fn tcp_rail(peer: PeerId) -> RailSpec {
    RailSpec {
        path: PathKind::Tcp,
        peer,
        nic: None,
        remote_nic: None,
        max_in_flight: 4,
        signal_interval: 1,
    }
}

#[test]
fn a_reconnect_keeps_the_peer_and_its_rails_and_replaces_its_ranges() {
    let mut st = EngineState::<Test>::new(config(), Budgets::default());
    let s1 = wire::SessionId(1);
    let a = st.adopt_peer(
        s1,
        &established("b", 2, wire::Admission::New),
        &publication(2, &[7, 8]),
    );
    assert_eq!((a.replaced, a.retire.as_slice()), (None, &[][..]));
    let rail = st.add_rail(tcp_rail(a.peer));
    let s2 = wire::SessionId(2);
    let again = st.adopt_peer(
        s2,
        &established("b", 2, wire::Admission::Reconnect),
        &publication(2, &[8]),
    );
    assert_eq!((again.peer, again.replaced), (a.peer, None));
    assert!(again.retire.is_empty());
    let p = &st.tables.peers[&a.peer.0];
    assert_eq!(p.rails, [rail]);
    assert_eq!(p.sessions, [s1, s2]);
    assert_eq!(st.peer_session(a.peer), Some(s2));
    let mut ranges: Vec<_> = p.ranges.keys().copied().collect();
    ranges.sort();
    assert_eq!(ranges, [RangeId(8)]);
    // Another source is another peer.
    let c = st.adopt_peer(
        wire::SessionId(3),
        &established("c", 1, wire::Admission::New),
        &publication(1, &[]),
    );
    assert_ne!(c.peer, a.peer);
    assert_eq!(st.tables.peers.len(), 2);
}

#[test]
fn a_newer_epoch_forgets_the_old_incarnation_and_hands_back_its_rails() {
    // The sim's peer is source "peer" at the first epoch, with one rail
    // holding a request that hangs, and a notifying batch in flight.
    let (mut sim, id) = notifying_write(&[(4, 1)]);
    assert!(!sim.step(0, Fate::Hang));
    let old = sim.peer;
    let replaced = wire::Admission::Replaced {
        previous: Epoch::MIN,
        invalidated: wire::Invalidation::default(),
    };
    let a = sim.st.adopt_peer(
        wire::SessionId(9),
        &established("peer", 5, replaced),
        &publication(5, &[sim.range.0]),
    );
    assert_ne!(a.peer, old);
    assert_eq!(a.replaced, Some(old));
    assert_eq!(a.retire, sim.rails);
    assert!(!sim.st.tables.peers.contains_key(&old.0));
    assert_eq!(sim.st.forget_peer(old), None, "gone already");
    // Requests naming the old incarnation are refused as made for the
    // incarnation that restarted, naming both epochs.
    let w = sim.request(Op::Write, 0, 0, 100);
    assert_eq!(
        refused(sim.submit(&[w])),
        RequestError::PeerRestarted {
            peer: old,
            handle: Epoch::MIN,
            current: Epoch::new(5).unwrap(),
        }
    );
    // So are requests for the new incarnation's id made from a handle of
    // the old epoch (an address resolved against a reopened session).
    let w = TransferRequest {
        peer: a.peer,
        ..sim.request(Op::Write, 0, 0, 100)
    }
    .for_epoch(Epoch::MIN);
    assert_eq!(
        refused(sim.submit(&[w])),
        RequestError::PeerRestarted {
            peer: a.peer,
            handle: Epoch::MIN,
            current: Epoch::new(5).unwrap(),
        }
    );
    // An id never seen is still an unknown peer.
    let w = TransferRequest {
        peer: PeerId(4242),
        ..sim.request(Op::Write, 0, 0, 100)
    };
    assert_eq!(
        refused(sim.submit(&[w])),
        RequestError::UnknownPeer(PeerId(4242))
    );
    // The driver retires the rails; the flush drains the hung request.
    for rail in &a.retire {
        assert!(sim.st.close_rail(*rail, sim.now, false), "busy");
    }
    sim.pump();
    assert_eq!(sim.st.core.drain_status(id), DrainStatus::Drained);
    sim.advance(REQUEST_TIMEOUT);
    assert_ne!(sim.outcomes[&id].status, Status::Complete);
    let why = why_not_sent(&sim, id);
    assert!(!why.is_empty());
    // The new incarnation has no rails until the driver adds some.
    let w2 = TransferRequest::write(sim.reg, 0, a.peer, sim.range, 0, 10);
    let err = refused(sim.submit(&[w2]));
    assert!(matches!(err, RequestError::NoRail { .. }), "{err:?}");
}

#[test]
fn a_notification_to_a_peer_that_is_gone_is_not_sent() {
    let (mut sim, id) = notifying_write(&[(4, 1)]);
    sim.step(0, Fate::Ok);
    // Completed on the wire, then the peer is forgotten before the pump.
    assert_eq!(sim.st.forget_peer(sim.peer), Some(sim.rails.clone()));
    sim.pump();
    assert!(sim.transmits.is_empty());
    assert_eq!(sim.outcomes[&id].status, Status::Complete);
    let why = why_not_sent(&sim, id);
    assert!(why.contains("is gone"), "{why}");
}

#[test]
fn a_peer_gives_up_the_rails_of_one_path_and_keeps_the_others() {
    let mut sim = Sim::new(&[(4, 1), (4, 1)]);
    let rdma = sim.st.add_rail(RailSpec {
        path: PathKind::Rdma,
        nic: Some(0),
        remote_nic: Some(0),
        ..tcp_rail(sim.peer)
    });
    assert_eq!(sim.st.detach_rails(sim.peer, PathKind::Rdma), [rdma]);
    assert_eq!(sim.st.tables.peers[&sim.peer.0].rails, sim.rails);
    assert!(sim.st.detach_rails(sim.peer, PathKind::Rdma).is_empty());
    assert!(sim.st.detach_rails(PeerId(77), PathKind::Tcp).is_empty());
    // The tcp rails still carry requests.
    let w = sim.request(Op::Write, 0, 0, 10);
    let ids = sim.submit(&[w]).unwrap();
    sim.run_ok();
    assert_eq!(sim.outcomes[&ids[0]].status, Status::Complete);
    assert!(sim.accepted.iter().all(|w| w.rail != rdma));
}

#[test]
fn publications_and_retires_after_opening_change_what_is_admitted() {
    let mut sim = Sim::new(&[(4, 1)]);
    let at =
        |sim: &Sim, range: u64| TransferRequest::write(sim.reg, 0, sim.peer, RangeId(range), 0, 10);
    assert!(sim.submit(&[at(&sim, 11)]).is_err(), "not published yet");
    assert!(sim.st.apply_publication(sim.peer, &publication(1, &[11])));
    let ids = sim.submit(&[at(&sim, 11)]).unwrap();
    sim.run_ok();
    assert_eq!(sim.outcomes[&ids[0]].status, Status::Complete);
    let retire = wire::SegmentRetire {
        epoch: Epoch::MIN,
        range_ids: vec![wire::RangeId(11)],
    };
    assert!(sim.st.apply_retire(sim.peer, &retire));
    let err = refused(sim.submit(&[at(&sim, 11)]));
    assert!(
        matches!(err, RequestError::UnpublishedRemote { .. }),
        "{err:?}"
    );
    // The other range is untouched; an unknown peer changes nothing.
    assert!(sim.submit(&[at(&sim, sim.range.0)]).is_ok());
    assert!(!sim.st.apply_retire(PeerId(77), &retire));
    assert!(!sim.st.apply_publication(PeerId(77), &publication(1, &[1])));
    assert_eq!(sim.st.peer_session(PeerId(77)), None);
}
