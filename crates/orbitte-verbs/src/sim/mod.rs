//! The simulated fabric: RDMA devices in this process that behave like
//! hardware where it matters, with deterministic fault injection.
//!
//! # Building one
//! ```
//! use orbitte_verbs::sim::{SimDescription, SimDeviceDesc, SimFabric};
//! use orbitte_verbs::Provider;
//!
//! let fabric = SimFabric::new(
//!     SimDescription::new(vec![
//!         SimDeviceDesc::roce("sim0", [10, 0, 0, 1]),
//!         SimDeviceDesc::roce("sim1", [10, 0, 0, 2]),
//!     ]),
//!     42, // seed
//! );
//! let provider = fabric.provider(); // Arc<dyn Provider> for the engine
//! assert_eq!(provider.devices().unwrap().len(), 2);
//! ```
//! Two engines on one fabric ("two hosts") each get a provider that sees
//! only their devices: [`SimFabric::provider_for`].
//!
//! # Time and delivery
//! Posted work is executed by the fabric, never inside `post_send`, so
//! completions arrive asynchronously and in order per QP:
//! - [`Delivery::Manual`] (virtual time, the default): nothing moves until
//!   the test calls [`SimFabric::step`] (execute the next due work
//!   request), [`SimFabric::drive`] (until nothing can run) or
//!   [`SimFabric::advance`] (everything due within a virtual duration).
//!   Fully deterministic for a seed. `CompletionQueue::wait` does not drive:
//!   drive from the test thread, or wait on another thread.
//! - [`Delivery::Background`] (real time): a fabric thread executes work as
//!   it becomes due (latency from [`SimTiming`]) and wakes waiters. Order
//!   per QP is still guaranteed; interleaving across QPs follows real time.
//!   Out of work, it watches for posts for a while before it sleeps.
//!
//! A completion queue keeps its entries behind its own lock (polling never
//! waits for the fabric lock, and an empty queue is polled without any).
//!
//! Each work request's due time is `post time + base latency + bytes /
//! bandwidth + seeded jitter`, never earlier than the previous one on the
//! same QP. Among due requests the earliest runs first (ties by posting
//! order).
//!
//! # Hardware behaviour kept
//! - MR keys are checked at execution like a NIC: unknown/stale key, range
//!   outside the region, PD mismatch, or missing access flags produce
//!   `LocalProtection` (local SGE) or `RemoteAccess` (rkey) completions;
//!   no byte is written outside registered memory.
//! - Any error completion moves the RC QP to the error state; later and
//!   outstanding work completes with `WrFlush`. Remote access violations
//!   also move the responder QP to error with `QpAccessError`.
//! - Unreachable peers (port down, different network, wrong QPN/GID, PSN
//!   mismatch, GID type mismatch) produce `RetryExceeded`.
//! - SEND consumes the peer's receives in order; with `rnr_retry` 7 a SEND
//!   waits for a receive, otherwise it fails `RnrRetryExceeded`. A SEND
//!   whose local SGEs do not fit fails `LocalProtection` without waiting. A SEND
//!   larger than the receive fails `LocalLength` at the responder and
//!   `RemoteInvalidRequest` at the requester.
//! - Send queue slots are freed when a completion is polled, including the
//!   unsignaled requests before it: a QP posting only unsignaled work fills
//!   up (`QueueFull`).
//!
//! # Faults
//! [`SimFabric::faults`] returns a [`Faults`] handle; see its methods.

mod exec;
mod objects;
mod state;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::context::Context;
use crate::error::{DeviceListError, ObjectKind, OpenError};
use crate::provider::Provider;
use crate::types::{
    AsyncEvent, DeviceIdentity, DeviceInfo, Gid, GidEntry, GidType, LinkLayer, Mtu, NodeAccess,
    PortState, ProviderKind, QpState, Speed, UverbsNode, Width,
};
use crate::wr::{SendOp, Sge, WcStatus};

use state::State;

/// How completions are delivered (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// Virtual time: the test calls `step`/`drive`/`advance`.
    #[default]
    Manual,
    /// Real time: a fabric thread delivers completions when due.
    Background,
}

/// Latency model of the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimTiming {
    /// Fixed latency of every work request.
    pub base_latency: Duration,
    /// Bandwidth in bytes per second (0 = infinite).
    pub bytes_per_sec: u64,
    /// Up to this much extra latency, drawn from the seed.
    pub jitter: Duration,
}

impl Default for SimTiming {
    fn default() -> Self {
        Self {
            base_latency: Duration::from_micros(2),
            bytes_per_sec: 12_500_000_000,
            jitter: Duration::ZERO,
        }
    }
}

/// One port of a simulated device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimPortDesc {
    /// Initial state.
    pub state: PortState,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Largest MTU.
    pub max_mtu: Mtu,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// Link width.
    pub width: Width,
    /// Lane speed.
    pub speed: Speed,
    /// LID (InfiniBand; 0 on Ethernet).
    pub lid: u16,
    /// Ports connect only to ports with the same network number.
    pub network: u32,
    /// GID table (invalid entries allowed).
    pub gids: Vec<GidEntry>,
}

/// One simulated device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDeviceDesc {
    /// Device name.
    pub name: String,
    /// Node GUID.
    pub guid: u64,
    /// Driver name reported in diagnostics.
    pub driver: String,
    /// Whether "this process" may open the uverbs node (anything but
    /// `ReadWrite` makes `open` fail with EACCES, as on a real host).
    pub uverbs_access: NodeAccess,
    /// Most memory regions (registration beyond fails ENOMEM).
    pub max_mr: u32,
    /// Largest registration in bytes (beyond fails EINVAL).
    pub max_mr_size: u64,
    /// Most queue pairs.
    pub max_qp: u32,
    /// Most work requests per queue.
    pub max_qp_wr: u32,
    /// Most SGEs per work request.
    pub max_sge: u32,
    /// Most CQ entries.
    pub max_cqe: u32,
    /// Ports, numbered from 1.
    pub ports: Vec<SimPortDesc>,
}

impl SimDeviceDesc {
    fn base(name: &str, ports: Vec<SimPortDesc>) -> Self {
        let guid = name.bytes().fold(0x0002_c903_0000_0000_u64, |h, b| {
            h.rotate_left(5) ^ u64::from(b)
        });
        Self {
            name: name.to_owned(),
            guid,
            driver: "sim".to_owned(),
            uverbs_access: NodeAccess::ReadWrite,
            max_mr: 1 << 16,
            max_mr_size: 1 << 40,
            max_qp: 1 << 12,
            max_qp_wr: 1 << 14,
            max_sge: 16,
            max_cqe: 1 << 16,
            ports,
        }
    }

    /// A RoCE device with one active Ethernet port (netdev `<name>-eth`):
    /// GID 0 is RoCE v1 link-local, GID 1 RoCE v2 `::ffff:<ipv4>`.
    pub fn roce(name: &str, ipv4: [u8; 4]) -> Self {
        let netdev = Some(format!("{name}-eth"));
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        ll[12..16].copy_from_slice(&ipv4);
        let port = SimPortDesc {
            state: PortState::Active,
            link_layer: LinkLayer::Ethernet,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu1024,
            width: Width::X4,
            speed: Speed::Edr,
            lid: 0,
            network: 0,
            gids: vec![
                GidEntry {
                    index: 0,
                    gid: Gid(ll),
                    valid: true,
                    gid_type: Some(GidType::RoceV1),
                    netdev: netdev.clone(),
                },
                GidEntry {
                    index: 1,
                    gid: Gid::from_ipv4(ipv4),
                    valid: true,
                    gid_type: Some(GidType::RoceV2),
                    netdev,
                },
            ],
        };
        Self::base(name, vec![port])
    }

    /// An InfiniBand device with one active port and LID `lid`; GID 0 is
    /// the link-local IB GID.
    pub fn infiniband(name: &str, lid: u16) -> Self {
        let mut dev = Self::base(name, Vec::new());
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..16].copy_from_slice(&dev.guid.to_be_bytes());
        dev.ports.push(SimPortDesc {
            state: PortState::Active,
            link_layer: LinkLayer::InfiniBand,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            width: Width::X4,
            speed: Speed::Hdr,
            lid,
            network: 0,
            gids: vec![GidEntry {
                index: 0,
                gid: Gid(g),
                valid: true,
                gid_type: Some(GidType::Ib),
                netdev: None,
            }],
        });
        dev
    }
}

/// What the fabric is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDescription {
    /// Devices, in listing order.
    pub devices: Vec<SimDeviceDesc>,
    /// How completions are delivered.
    pub delivery: Delivery,
    /// Latency model.
    pub timing: SimTiming,
}

impl SimDescription {
    /// Devices with manual (virtual-time) delivery and default timing.
    pub fn new(devices: Vec<SimDeviceDesc>) -> Self {
        Self {
            devices,
            delivery: Delivery::Manual,
            timing: SimTiming::default(),
        }
    }

    /// Same description with another delivery mode.
    pub fn with_delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// Same description with another latency model.
    pub fn with_timing(mut self, timing: SimTiming) -> Self {
        self.timing = timing;
        self
    }
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Signalled on async events and state changes (event waiters wait on
    /// it; completion waiters wait on their queue's bell, `CqRing::bell`).
    pub(crate) cond: Condvar,
    /// Signalled on new work and on what may unblock stalled work (the
    /// fabric thread waits on it).
    pub(crate) work: Condvar,
    /// Bumped with every ring of `work` (`wake_work`), so that the fabric
    /// thread can watch for new work without the lock.
    pub(crate) posts: AtomicU64,
    /// Send WRs posted on the lock-free path and not yet moved to their
    /// send queues ([`State::absorb`]).
    pub(crate) rung: AtomicU64,
    /// The fabric thread is about to sleep, or sleeps, on `work`: a
    /// lock-free post must take the fabric lock once to wake it.
    pub(crate) sleeping: AtomicBool,
    /// Posts take the fabric lock from now on: send faults were installed
    /// or sends recorded at some point (the lock-free path sees neither;
    /// clearing them does not set this back).
    pub(crate) locked_posts: AtomicBool,
    /// Posting order over the whole fabric (ties of due time).
    pub(crate) seq: AtomicU64,
    pub(crate) desc: SimDescription,
    pub(crate) start: Instant,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimShared")
            .field("devices", &self.desc.devices.len())
            .finish()
    }
}

impl Shared {
    /// The fabric lock. Whoever takes it first moves the send WRs posted
    /// without it into their queues, so every look at the state sees every
    /// post that returned before it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.rung.load(Ordering::Acquire) != 0 {
            self.rung.store(0, Ordering::SeqCst);
            st.absorb();
        }
        st
    }

    /// Whether a post may skip the fabric lock (see [`state::Doorbell`]).
    pub(crate) fn lock_free_posts(&self) -> bool {
        self.desc.delivery == Delivery::Background
            && self.desc.timing.jitter.is_zero()
            && !self.locked_posts.load(Ordering::Acquire)
    }

    /// After `n` lock-free posts: counts them for the next taker of the
    /// lock and wakes the fabric thread. If it is going to sleep, taking
    /// the lock once (it holds it until it waits) makes sure it hears the
    /// notification.
    pub(crate) fn rang(&self, n: u64) {
        self.rung.fetch_add(n, Ordering::SeqCst);
        self.posts.fetch_add(1, Ordering::AcqRel);
        if self.sleeping.load(Ordering::SeqCst) {
            drop(self.lock());
            self.work.notify_all();
        }
    }

    /// Current fabric time: virtual (manual) or elapsed real time.
    pub(crate) fn now(&self, st: &State) -> Duration {
        match self.desc.delivery {
            Delivery::Manual => st.now,
            Delivery::Background => self.start.elapsed(),
        }
    }

    pub(crate) fn identity(&self, device: usize) -> DeviceIdentity {
        let d = &self.desc.devices[device];
        DeviceIdentity {
            provider: ProviderKind::Sim,
            name: d.name.clone(),
            guid: d.guid,
        }
    }

    /// Wakes every waiter and the fabric thread (a fault, a state change).
    pub(crate) fn wake_all(&self) {
        self.cond.notify_all();
        self.wake_work();
    }

    /// Wakes the fabric thread: new work, or what may unblock stalled work.
    pub(crate) fn wake_work(&self) {
        self.posts.fetch_add(1, Ordering::AcqRel);
        self.work.notify_all();
    }

    pub(crate) fn device_index(&self, name: &str) -> Option<usize> {
        self.desc.devices.iter().position(|d| d.name == name)
    }
}

/// A simulated RDMA fabric. Cheap to clone; all clones are the same
/// fabric.
#[derive(Debug, Clone)]
pub struct SimFabric {
    shared: Arc<Shared>,
}

impl SimFabric {
    /// Builds a fabric from a description and a seed. With
    /// [`Delivery::Background`] this starts the fabric thread, which exits
    /// when every handle to the fabric (and its objects) is gone.
    pub fn new(desc: SimDescription, seed: u64) -> Self {
        let state = State::new(&desc, seed);
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            cond: Condvar::new(),
            work: Condvar::new(),
            posts: AtomicU64::new(0),
            rung: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            locked_posts: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            desc,
            start: Instant::now(),
        });
        if shared.desc.delivery == Delivery::Background {
            exec::spawn_background(Arc::downgrade(&shared));
        }
        Self { shared }
    }

    /// A provider seeing every device.
    pub fn provider(&self) -> Arc<dyn Provider> {
        Arc::new(SimProvider {
            shared: self.shared.clone(),
            visible: None,
        })
    }

    /// A provider seeing only the named devices (one "host" on the
    /// fabric). Unknown names are ignored.
    pub fn provider_for(&self, devices: &[&str]) -> Arc<dyn Provider> {
        let visible = devices
            .iter()
            .filter_map(|n| self.shared.device_index(n))
            .collect();
        Arc::new(SimProvider {
            shared: self.shared.clone(),
            visible: Some(visible),
        })
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> Faults {
        Faults {
            shared: self.shared.clone(),
        }
    }

    /// Current fabric time.
    pub fn now(&self) -> Duration {
        let st = self.shared.lock();
        self.shared.now(&st)
    }

    /// Executes the next due work request (manual delivery), advancing
    /// virtual time to its due time. Returns whether one ran.
    pub fn step(&self) -> bool {
        let mut st = self.shared.lock();
        let ran = exec::step(&self.shared, &mut st, None);
        let bells = st.take_bells();
        drop(st);
        state::ring(&bells);
        if ran {
            self.shared.cond.notify_all();
        }
        ran
    }

    /// Steps until nothing can run (stalled work and sends waiting for a
    /// receive stay). Returns how many work requests ran.
    pub fn drive(&self) -> usize {
        let mut n = 0;
        while self.step() {
            n += 1;
        }
        n
    }

    /// Runs everything due within `d` of now, then moves virtual time
    /// forward by `d`. Returns how many work requests ran.
    pub fn advance(&self, d: Duration) -> usize {
        let mut st = self.shared.lock();
        let until = st.now + d;
        let mut n = 0;
        while exec::step(&self.shared, &mut st, Some(until)) {
            n += 1;
        }
        if st.now < until {
            st.now = until;
        }
        let bells = st.take_bells();
        drop(st);
        state::ring(&bells);
        self.shared.cond.notify_all();
        n
    }

    /// Work requests posted and not yet executed (stalled ones included).
    pub fn pending(&self) -> usize {
        self.shared.lock().pending()
    }

    /// Starts (`true`) or stops recording the send work requests the
    /// fabric accepts; [`take_sends`](Self::take_sends) hands them out.
    /// Refused posts are not recorded; posts to a QP in the error state
    /// (accepted, then flushed) are.
    pub fn record_sends(&self, on: bool) {
        let mut st = self.shared.lock();
        if on {
            self.shared.locked_posts.store(true, Ordering::Release);
            st.sent.get_or_insert_with(Vec::new);
        } else {
            st.sent = None;
        }
    }

    /// The send work requests recorded since the last call, oldest first
    /// (empty when not recording).
    pub fn take_sends(&self) -> Vec<SentWr> {
        self.shared
            .lock()
            .sent
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The send work requests the fabric holds now: accepted and neither
    /// executed nor flushed (stalled ones included), in posting order per
    /// QP. While one of them names a buffer, the "NIC" may still use it.
    pub fn outstanding_sends(&self) -> Vec<SentWr> {
        let st = self.shared.lock();
        st.qps
            .iter()
            .flat_map(|(&(d, qpn), qp)| {
                let device = &self.shared.desc.devices[d].name;
                qp.sq.iter().map(move |p| SentWr {
                    device: device.clone(),
                    qpn,
                    wr_id: p.wr_id,
                    op: p.op,
                    sges: p.sges.to_vec(),
                })
            })
            .collect()
    }
}

/// A send work request the fabric accepted (see
/// [`SimFabric::record_sends`] and [`SimFabric::outstanding_sends`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentWr {
    /// Device of the QP it was posted to.
    pub device: String,
    /// That QP's number.
    pub qpn: u32,
    /// The caller's identifier.
    pub wr_id: u64,
    /// What it does.
    pub op: SendOp,
    /// Its local buffers.
    pub sges: Vec<Sge>,
}

impl SentWr {
    /// Whether one of its local buffers overlaps `addr..addr + len`.
    pub fn touches(&self, addr: u64, len: u64) -> bool {
        self.sges
            .iter()
            .any(|s| s.addr() < addr + len && addr < s.addr() + u64::from(s.length()))
    }
}

/// Selects posted send work requests for a fault: the `nth` (1-based)
/// matching request posted after the fault is installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrMatch {
    /// Only on this device.
    pub device: Option<String>,
    /// Only on this QP number.
    pub qpn: Option<u32>,
    /// Which matching request (1 = the next one).
    pub nth: u32,
    /// Only requests posted while the QP is in this state.
    pub state: Option<QpState>,
}

impl WrMatch {
    /// The `nth` send work request posted anywhere from now on.
    pub fn nth(nth: u32) -> Self {
        Self {
            device: None,
            qpn: None,
            nth: nth.max(1),
            state: None,
        }
    }

    /// Restricted to a device.
    pub fn on_device(mut self, device: &str) -> Self {
        self.device = Some(device.to_owned());
        self
    }

    /// Restricted to a QP.
    pub fn on_qp(mut self, qpn: u32) -> Self {
        self.qpn = Some(qpn);
        self
    }

    /// Restricted to requests posted while their QP is in `state` (for
    /// example only to a ready QP, `QpState::Rts`, not to one in error).
    pub fn in_state(mut self, state: QpState) -> Self {
        self.state = Some(state);
        self
    }
}

/// Why a fault could not be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultError {
    /// No such device in the description.
    #[error("no sim device named {0:?}")]
    NoSuchDevice(String),
    /// No such port on the device.
    #[error("device {device} has no port {port}")]
    NoSuchPort {
        /// Device.
        device: String,
        /// Port.
        port: u8,
    },
    /// No such QP on the device.
    #[error("device {device} has no qp {qpn}")]
    NoSuchQp {
        /// Device.
        device: String,
        /// QP number.
        qpn: u32,
    },
}

/// Deterministic fault injection into a [`SimFabric`].
#[derive(Debug, Clone)]
pub struct Faults {
    shared: Arc<Shared>,
}

impl Faults {
    fn dev(&self, device: &str) -> Result<usize, FaultError> {
        self.shared
            .device_index(device)
            .ok_or_else(|| FaultError::NoSuchDevice(device.to_owned()))
    }

    fn port(&self, device: &str, port: u8) -> Result<usize, FaultError> {
        let d = self.dev(device)?;
        if port == 0 || usize::from(port) > self.shared.desc.devices[d].ports.len() {
            return Err(FaultError::NoSuchPort {
                device: device.to_owned(),
                port,
            });
        }
        Ok(d)
    }

    /// Takes a port down: `PortError` on every open context of the device;
    /// work using the port then fails `RetryExceeded`.
    pub fn port_down(&self, device: &str, port: u8) -> Result<(), FaultError> {
        let d = self.port(device, port)?;
        let mut st = self.shared.lock();
        st.set_port(d, port, PortState::Down, AsyncEvent::PortError { port });
        let bells = st.take_bells();
        drop(st);
        state::ring(&bells);
        self.shared.wake_all();
        Ok(())
    }

    /// Brings a port back: `PortActive` on every open context of the device.
    pub fn port_up(&self, device: &str, port: u8) -> Result<(), FaultError> {
        let d = self.port(device, port)?;
        let mut st = self.shared.lock();
        st.set_port(d, port, PortState::Active, AsyncEvent::PortActive { port });
        let bells = st.take_bells();
        drop(st);
        state::ring(&bells);
        self.shared.wake_all();
        Ok(())
    }

    /// Moves a QP to the error state as a fatal error would: `QpFatal` on
    /// the device's contexts, outstanding work flushes with `WrFlush`.
    pub fn qp_fatal(&self, device: &str, qpn: u32) -> Result<(), FaultError> {
        let d = self.dev(device)?;
        let mut st = self.shared.lock();
        if !st.qps.contains_key(&(d, qpn)) {
            return Err(FaultError::NoSuchQp {
                device: device.to_owned(),
                qpn,
            });
        }
        st.qp_to_error(&self.shared, (d, qpn), Some(AsyncEvent::QpFatal { qpn }));
        let bells = st.take_bells();
        drop(st);
        state::ring(&bells);
        self.shared.wake_all();
        Ok(())
    }

    /// The matching send work request never completes: it and every later
    /// request on its QP wait until the QP is moved to the error state
    /// (then they flush) or destroyed.
    pub fn stall_send(&self, m: WrMatch) {
        self.shared.locked_posts.store(true, Ordering::Release);
        self.shared.lock().faults.sends.push(state::SendFault {
            m,
            seen: 0,
            kind: state::SendFaultKind::Stall,
        });
    }

    /// The matching send work request completes with `status` (not
    /// `Success`); with `apply_data` its bytes are moved first (a WRITE
    /// whose remote effect happened). The QP then moves to the error state.
    pub fn fail_send(&self, m: WrMatch, status: WcStatus, apply_data: bool) {
        self.shared.locked_posts.store(true, Ordering::Release);
        self.shared.lock().faults.sends.push(state::SendFault {
            m,
            seen: 0,
            kind: state::SendFaultKind::Fail { status, apply_data },
        });
    }

    /// `post_send` refuses the matching send work request with `errno`, as
    /// a driver does (`ibv_post_send` failing part-way through a batch):
    /// it returns [`PostError`](crate::PostError) whose `index` is the
    /// matching request's position in its batch, with
    /// [`PostErrorKind::QueueFull`](crate::PostErrorKind::QueueFull) for
    /// ENOMEM and [`PostErrorKind::Native`](crate::PostErrorKind::Native)
    /// (`ibv_post_send`, errno) otherwise. The requests before it in the
    /// batch are really posted and run; it and the rest of the batch are
    /// not posted. The QP's state does not change. Requests are counted in
    /// posting order, as for the other send faults.
    pub fn fail_post(&self, m: WrMatch, errno: i32) {
        self.shared.locked_posts.store(true, Ordering::Release);
        self.shared.lock().faults.sends.push(state::SendFault {
            m,
            seen: 0,
            kind: state::SendFaultKind::RefusePost { errno },
        });
    }

    /// The `nth` (1-based) memory registration from now on, on `device`
    /// (or any device with `None`), fails with `errno` (ENOMEM, EFAULT...).
    pub fn fail_registration(
        &self,
        device: Option<&str>,
        nth: u32,
        errno: i32,
    ) -> Result<(), FaultError> {
        let d = device.map(|n| self.dev(n)).transpose()?;
        self.shared.lock().faults.regs.push(state::CountFault {
            device: d,
            nth: nth.max(1),
            seen: 0,
            errno,
        });
        Ok(())
    }

    /// The `nth` (1-based) device open from now on, of `device` (or any
    /// device), fails with `errno`.
    pub fn fail_open(&self, device: Option<&str>, nth: u32, errno: i32) -> Result<(), FaultError> {
        let d = device.map(|n| self.dev(n)).transpose()?;
        self.shared.lock().faults.opens.push(state::CountFault {
            device: d,
            nth: nth.max(1),
            seen: 0,
            errno,
        });
        Ok(())
    }

    /// The next destroy of an object of `kind` on `device` fails with
    /// `errno` (EBUSY): `close` returns `Unquiesced` and the object is
    /// retained.
    pub fn fail_destroy(
        &self,
        device: &str,
        kind: ObjectKind,
        errno: i32,
    ) -> Result<(), FaultError> {
        let d = self.dev(device)?;
        self.shared.lock().faults.destroys.push((d, kind, errno));
        Ok(())
    }
}

/// The [`Provider`] of a [`SimFabric`] (all devices, or one host's).
#[derive(Debug)]
pub struct SimProvider {
    shared: Arc<Shared>,
    visible: Option<Vec<usize>>,
}

impl SimProvider {
    fn visible(&self) -> Vec<usize> {
        match &self.visible {
            Some(v) => v.clone(),
            None => (0..self.shared.desc.devices.len()).collect(),
        }
    }

    fn info(&self, d: usize) -> DeviceInfo {
        let desc = &self.shared.desc.devices[d];
        DeviceInfo {
            identity: self.shared.identity(d),
            driver: Some(desc.driver.clone()),
            uverbs: Some(UverbsNode {
                path: format!("/dev/infiniband/uverbs{d}"),
                access: desc.uverbs_access.clone(),
            }),
            sysfs_path: None,
        }
    }
}

impl Provider for SimProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Sim
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>, DeviceListError> {
        Ok(self.visible().into_iter().map(|d| self.info(d)).collect())
    }

    fn open(&self, device: &str) -> Result<Context, OpenError> {
        let visible = self.visible();
        let Some(d) = visible
            .iter()
            .copied()
            .find(|&d| self.shared.desc.devices[d].name == device)
        else {
            return Err(OpenError::NoSuchDevice {
                name: device.to_owned(),
                available: visible
                    .iter()
                    .map(|&d| self.shared.desc.devices[d].name.clone())
                    .collect(),
            });
        };
        let ops = objects::open(&self.shared, d).map_err(|source| OpenError::Native {
            device: self.shared.identity(d),
            source,
        })?;
        Ok(Context::from_backend(Box::new(ops), self.info(d)))
    }
}

/// Live objects in the fabric (to check teardown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimCounts {
    /// Open contexts.
    pub contexts: usize,
    /// Protection domains.
    pub pds: usize,
    /// Memory regions.
    pub mrs: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Queue pairs.
    pub qps: usize,
}

impl SimFabric {
    /// How many objects of each kind exist now (retained ones included).
    pub fn counts(&self) -> SimCounts {
        let st = self.shared.lock();
        SimCounts {
            contexts: st.contexts.len(),
            pds: st.pds.len(),
            mrs: st.mrs.len(),
            cqs: st.cqs.len(),
            qps: st.qps.len(),
        }
    }

    /// How many objects of each kind exist now on the named device
    /// (retained ones included); `None` when the fabric has no such device.
    pub fn counts_on(&self, device: &str) -> Option<SimCounts> {
        let d = self.shared.device_index(device)?;
        let st = self.shared.lock();
        Some(SimCounts {
            contexts: st.contexts.values().filter(|c| c.0 == d).count(),
            pds: st.pds.values().filter(|&&pd| pd == d).count(),
            mrs: st.mrs.keys().filter(|k| k.0 == d).count(),
            cqs: st.cqs.values().filter(|cq| cq.device == d).count(),
            qps: st.qps.keys().filter(|k| k.0 == d).count(),
        })
    }

    /// The keys (lkey, which is also the rkey) of the memory regions that
    /// exist now on the named device, retained ones included, in ascending
    /// order; empty when the fabric has no such device.
    pub fn mr_keys(&self, device: &str) -> Vec<u32> {
        let Some(d) = self.shared.device_index(device) else {
            return Vec::new();
        };
        let st = self.shared.lock();
        st.mrs.keys().filter(|k| k.0 == d).map(|k| k.1).collect()
    }

    /// The memory regions that exist now on the named device, retained ones
    /// included, as (virtual address of the first byte, length), in key
    /// order; empty when the fabric has no such device.
    pub fn mr_ranges(&self, device: &str) -> Vec<(u64, usize)> {
        let Some(d) = self.shared.device_index(device) else {
            return Vec::new();
        };
        let st = self.shared.lock();
        st.mrs
            .iter()
            .filter(|(k, _)| k.0 == d)
            .map(|(_, mr)| (mr.addr, mr.len))
            .collect()
    }
}
