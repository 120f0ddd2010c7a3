//! The tcp and local rows of the capability matrix: each path proves
//! itself with a real loopback request (a WRITE then a READ of 64 KiB,
//! bytes checked) through its transport, then checks that nothing is
//! outstanding on the local buffers.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use orbitte_memory::HostMemory;
use orbitte_wire::{AccessFlags, Epoch, PeerTable, RangeDescriptor, SourceId};

use super::{Listener, PublicationTable, SessionConfig, SharedPeerTable};
use crate::capability::{Check, PathRow};
use crate::transport::local::LocalTransport;
use crate::transport::tcp::{TcpPeerLink, TcpTransport};
use crate::transport::{
    EventSink, Op, PathKind, PeerId, PostContext, RailId, RangeId, RegistrationId, SliceStatus,
    SliceToken, TransportEvent, WorkItem,
};

const LEN: usize = 64 << 10;

fn skip(why: &str) -> Check {
    Check::Skipped { why: why.into() }
}
const BOUND: Duration = Duration::from_secs(10);
const FIX_LOOPBACK: &str =
    "check that the loopback interface is up and that the process may open sockets";

#[derive(Default)]
struct Collect {
    events: Mutex<Vec<TransportEvent>>,
    cv: Condvar,
}

impl EventSink for Collect {
    fn deliver(&self, events: &mut Vec<TransportEvent>) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(events);
        self.cv.notify_all();
    }
}

impl Collect {
    /// Waits for the completion of `token`: (success, released).
    fn wait(&self, token: SliceToken) -> Result<(), String> {
        let deadline = Instant::now() + BOUND;
        let mut g = self.events.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(i) = g.iter().position(
                |e| matches!(e, TransportEvent::Completed { token: t, .. } if *t == token),
            ) {
                let TransportEvent::Completed {
                    status, released, ..
                } = g.remove(i)
                else {
                    return Err("internal: event changed".into());
                };
                return match (status, released) {
                    (SliceStatus::Success, true) => Ok(()),
                    (SliceStatus::Success, false) => {
                        Err("completed but the buffer was not released".into())
                    }
                    (SliceStatus::Failed(f), _) => Err(f.to_string()),
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("no completion within {BOUND:?}"));
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

struct Ctx {
    regs: HashMap<RegistrationId, Arc<HostMemory>>,
    ranges: HashMap<RangeId, RangeDescriptor>,
}

impl PostContext for Ctx {
    fn memory(&self, r: RegistrationId) -> Option<&Arc<HostMemory>> {
        self.regs.get(&r)
    }
    fn local_key(&self, _: RegistrationId, _: u32) -> Option<(u64, u32)> {
        None
    }
    fn remote_range(&self, _: PeerId, range: RangeId) -> Option<&RangeDescriptor> {
        self.ranges.get(&range)
    }
}

struct Setup {
    _listener: Listener,
    cfg: SessionConfig,
    peers: SharedPeerTable,
    addr: std::net::SocketAddr,
    remote: Arc<HostMemory>,
    src: Arc<HostMemory>,
    dst: Arc<HostMemory>,
}

fn setup(path: PathKind) -> Result<Setup, Check> {
    let fail = |e: String| Check::Fail {
        reason: e,
        fix: FIX_LOOPBACK.into(),
    };
    let id = SourceId::new(format!(
        "orbitte-probe-{}-{}",
        path.name(),
        std::process::id()
    ))
    .map_err(|e| fail(e.to_string()))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let epoch = Epoch::choose(now, None).map_err(|e| fail(e.to_string()))?;
    let target_cfg = SessionConfig::new(id, epoch);
    let ranges = PublicationTable::new();
    let alloc =
        |n| HostMemory::alloc(n).map_err(|e| fail(format!("cannot allocate probe memory: {e}")));
    let (remote, src, dst) = (alloc(LEN)?, alloc(LEN)?, alloc(LEN)?);
    for i in 0..LEN / 4096 {
        src.fill(i * 4096, 4096, (i as u8).wrapping_mul(37).wrapping_add(1))
            .map_err(|e| fail(e.to_string()))?;
    }
    ranges
        .publish(
            remote.clone(),
            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )
        .map_err(|e| fail(e.to_string()))?;
    let tpeers = Arc::new(Mutex::new(PeerTable::new(target_cfg.source_id.clone())));
    let listener = Listener::bind(
        target_cfg,
        tpeers,
        ranges,
        "127.0.0.1:0"
            .parse()
            .map_err(|_| fail("bad address".into()))?,
    )
    .map_err(|e| fail(format!("cannot listen on loopback: {e}")))?;
    if path == PathKind::Local && !listener.serves_local() {
        return Err(Check::Fail {
            reason: "cannot bind the local path's abstract unix socket".into(),
            fix: "run in a network namespace that allows abstract unix sockets".into(),
        });
    }
    let cfg = SessionConfig::new(
        SourceId::new(format!("orbitte-probe-initiator-{}", std::process::id()))
            .map_err(|e| fail(e.to_string()))?,
        epoch,
    );
    let peers = Arc::new(Mutex::new(PeerTable::new(cfg.source_id.clone())));
    let addr = listener.local_addr();
    Ok(Setup {
        _listener: listener,
        cfg,
        peers,
        addr,
        remote,
        src,
        dst,
    })
}

fn item(token: u64, rail: RailId, op: Op, reg: u64, range: RangeId) -> WorkItem {
    WorkItem {
        token: SliceToken(token),
        rail,
        op,
        registration: RegistrationId(reg),
        local_offset: 0,
        peer: PeerId(0),
        range,
        remote_offset: 0,
        len: LEN as u32,
        signaled: true,
    }
}

/// Posts work items on the probed transport.
type Post<'a> = dyn FnMut(&[WorkItem], &Ctx) -> Result<(), String> + 'a;

/// WRITE `src` to the range, READ it back into `dst`, compare.
fn exchange(
    post: &mut Post<'_>,
    sink: &Collect,
    s: &Setup,
    rail: RailId,
    range: RangeId,
    ranges: HashMap<RangeId, RangeDescriptor>,
) -> (Check, Check) {
    let ctx = Ctx {
        regs: HashMap::from([
            (RegistrationId(1), s.src.clone()),
            (RegistrationId(2), s.dst.clone()),
        ]),
        ranges,
    };
    let steps = [(1, Op::Write, 1), (2, Op::Read, 2)];
    for (token, op, reg) in steps {
        if let Err(e) = post(&[item(token, rail, op, reg, range)], &ctx) {
            return (
                Check::Fail {
                    reason: e,
                    fix: FIX_LOOPBACK.into(),
                },
                skip("completion failed"),
            );
        }
        if let Err(e) = sink.wait(SliceToken(token)) {
            return (
                Check::Fail {
                    reason: format!("loopback {op}: {e}"),
                    fix: FIX_LOOPBACK.into(),
                },
                skip("completion failed"),
            );
        }
    }
    let same = |a: &HostMemory, b: &HostMemory| a.to_vec(0, LEN).ok() == b.to_vec(0, LEN).ok();
    if !same(&s.src, &s.remote) || !same(&s.src, &s.dst) {
        return (
            Check::Fail {
                reason: "loopback bytes differ after WRITE and READ".into(),
                fix: "report a bug".into(),
            },
            skip("completion failed"),
        );
    }
    // Every completion came with `released: true` (checked in `wait`), and
    // nothing else is outstanding: drained.
    let left = sink.events.lock().unwrap_or_else(|p| p.into_inner()).len();
    let drain = if left == 0 {
        Check::Pass
    } else {
        Check::Fail {
            reason: format!("{left} unexpected transport events"),
            fix: "report a bug".into(),
        }
    };
    (Check::Pass, drain)
}

/// A row for `path` whose build passed and whose discovery is the probe
/// target of [`setup`] (`None`, and the row says why, when that failed).
fn start_row(path: PathKind, note: &str) -> (PathRow, Option<Setup>) {
    let mut row = PathRow {
        path,
        build: Check::Pass,
        discovery: Check::Pass,
        completion: skip("discovery failed"),
        drain: skip("discovery failed"),
        notes: vec![note.into()],
    };
    match setup(path) {
        Ok(s) => (row, Some(s)),
        Err(c) => {
            row.discovery = c;
            (row, None)
        }
    }
}

/// Opens one loopback tcp session to the probe target as `rail`,
/// reporting to `sink`; the completion check when that fails.
fn open_loopback(
    s: &Setup,
    sink: Arc<dyn EventSink>,
    rail: RailId,
) -> Result<(Arc<TcpTransport>, TcpPeerLink), Check> {
    let tcp = TcpTransport::new(s.cfg.clone(), s.peers.clone(), sink);
    match tcp.open_rails(PeerId(0), s.addr, &[rail]) {
        Ok(link) => Ok((tcp, link)),
        Err(e) => Err(Check::Fail {
            reason: format!("loopback session failed: {e}"),
            fix: FIX_LOOPBACK.into(),
        }),
    }
}

/// The first range the probe target published, with the range table
/// [`exchange`] wants; the completion check when there is none.
fn first_range(link: &TcpPeerLink) -> Result<(RangeId, HashMap<RangeId, RangeDescriptor>), Check> {
    let Some(first) = link.ranges.first().cloned() else {
        return Err(Check::Fail {
            reason: "loopback target published nothing".into(),
            fix: "report a bug".into(),
        });
    };
    let range = RangeId(first.range_id.0);
    Ok((range, HashMap::from([(range, first)])))
}

/// The tcp row: build pass; discovery = a loopback listener; completion =
/// a loopback WRITE and READ through [`TcpTransport`]; drain = released.
pub fn tcp_row() -> PathRow {
    let (mut row, s) = start_row(
        PathKind::Tcp,
        "a loopback request proves this host's tcp stack, not the route to a remote peer",
    );
    let Some(s) = s else { return row };
    let sink = Arc::new(Collect::default());
    let rail = RailId(0);
    let (tcp, link) = match open_loopback(&s, sink.clone(), rail) {
        Ok(l) => l,
        Err(c) => {
            row.completion = c;
            return row;
        }
    };
    let (range, ranges) = match first_range(&link) {
        Ok(r) => r,
        Err(c) => {
            row.completion = c;
            return row;
        }
    };
    let mut post =
        |items: &[WorkItem], ctx: &Ctx| tcp.post_items(rail, items, ctx).map_err(|e| e.to_string());
    (row.completion, row.drain) = exchange(&mut post, &sink, &s, rail, range, ranges);
    tcp.close(rail);
    row
}

/// The local row: discovery = the local server's unix socket and a
/// shareable memfd; completion = a WRITE and READ through the mapping;
/// drain = released.
pub fn local_row() -> PathRow {
    let (mut row, s) = start_row(
        PathKind::Local,
        "only peers on this host and network namespace with memfd-backed ranges use it",
    );
    let Some(s) = s else { return row };
    let sink = Arc::new(Collect::default());
    // The tcp session brings the identity and the descriptors (p2p).
    let (tcp, link) = match open_loopback(&s, Arc::new(Collect::default()), RailId(1)) {
        Ok(l) => l,
        Err(c) => {
            row.completion = c;
            return row;
        }
    };
    let local = LocalTransport::new(sink.clone(), s.cfg.io_threads);
    let rail = RailId(0);
    if let Err(e) = local.attach(&s.cfg, &s.peers, PeerId(0), &link.handshake.peer, &[rail]) {
        row.discovery = Check::Fail {
            reason: format!("cannot map the peer's memory: {e}"),
            fix: "check that memfd_create and SCM_RIGHTS work (seccomp, sandbox)".into(),
        };
        row.completion = skip("discovery failed");
        tcp.close(RailId(1));
        return row;
    }
    let (range, ranges) = match first_range(&link) {
        Ok(r) => r,
        Err(c) => {
            row.completion = c;
            return row;
        }
    };
    let mut post = |items: &[WorkItem], ctx: &Ctx| {
        local
            .post_items(rail, items, ctx)
            .map_err(|e| e.to_string())
    };
    (row.completion, row.drain) = exchange(&mut post, &sink, &s, rail, range, ranges);
    local.close(rail);
    tcp.close(RailId(1));
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_local_rows_pass_on_loopback() {
        let t = tcp_row();
        assert_eq!(
            (&t.build, &t.discovery, &t.completion, &t.drain),
            (&Check::Pass, &Check::Pass, &Check::Pass, &Check::Pass),
            "{t:?}"
        );
        let l = local_row();
        assert_eq!(
            (&l.build, &l.discovery, &l.completion, &l.drain),
            (&Check::Pass, &Check::Pass, &Check::Pass, &Check::Pass),
            "{l:?}"
        );
    }
}
