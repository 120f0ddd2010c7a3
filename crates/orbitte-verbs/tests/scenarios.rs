//! The sim-versus-hardware comparison: one set of
//! scenarios, each a function of a [`Rig`] (a provider and a device), run
//! on the sim provider always and on the native provider when
//! `ORBITTE_TEST_DEVICE` names a device (`rxe0` in the Soft-RoCE guest of
//! `cargo xtask softroce test`; `mlx5_0` on a host with a NIC). Without it
//! the native half prints `skipped: <reason>`.
//!
//! Every scenario asserts exact statuses, opcodes, byte counts and bytes.
//! Where the sim and rxe legitimately differ, the scenario does not accept
//! either answer: it asks [`Rig::expect`] for this provider's answer, and
//! that answer must be written down in [`DIFFERENCES`] (scenario, sim
//! expectation, rxe expectation, reason), which docs/verbs.md repeats
//! ("Sim versus rxe"). Other native devices (mlx5, ...) are held to the
//! sim's column, which follows the InfiniBand specification.
//!
//! Connections are loopback: two QPs on the same device connected to each
//! other. The sim runs with background (real-time) delivery so that the
//! same waiting code serves both providers.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use orbitte_memory::HostMemory;
use orbitte_verbs::native::NativeProvider;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};
use orbitte_verbs::{
    Access, AsyncEvent, Completion, CompletionQueue, Context, GidType, InitAttrs, LinkLayer,
    MemoryRegion, Mtu, PortState, ProtectionDomain, Provider, QpCaps, QpState, QueuePair, RecvWr,
    RegisterError, RemoteAddr, Route, RtrAttrs, RtsAttrs, SendOp, SendWr, Sge, UnquiescedCause,
    WcOpcode, WcStatus,
};

/// One documented, deliberate difference between the sim (which follows
/// the specification and mlx5) and rxe.
struct Difference {
    /// The key [`Rig::expect`] is called with.
    scenario: &'static str,
    /// `Debug` of what the sim (and other native devices) must give.
    sim: &'static str,
    /// `Debug` of what rxe must give.
    rxe: &'static str,
    /// Why they differ.
    reason: &'static str,
}

/// Every place where the sim and rxe differ, with the reason. docs/verbs.md
/// ("Sim versus rxe") lists the same rows; a test checks that it names each.
const DIFFERENCES: &[Difference] = &[
    Difference {
        scenario: "rkey_of_a_local_only_region",
        sim: "SameAsLkey",
        rxe: "Zero",
        reason: "rxe gives a region without remote access rkey 0 (rxe_mr_init); \
                 mlx5 and the sim return one key for both. Never hand out the rkey of a \
                 local-only region: it is meaningless either way",
    },
    Difference {
        scenario: "local_sge_with_an_invalid_lkey",
        sim: "LocalProtection",
        rxe: "LocalQpOperation",
        reason: "an lkey that names no region of the QP's PD (unknown, or another PD's): \
                 the specification and mlx5 report a local protection error; rxe's \
                 copy_data fails its key lookup with EINVAL, which the requester reports as \
                 a local QP operation error. An SGE outside a valid region is a local \
                 protection error on both",
    },
    Difference {
        scenario: "receive_posted_on_an_error_qp",
        sim: "FlushesAtOnce",
        rxe: "FlushesAfterModifyToError",
        reason: "a receive posted to a QP the device moved to the error state must complete \
                 with a flush error (the sim flushes it when posted, mlx5 as soon as it \
                 sees it); rxe's user-space post_recv only writes the queue and nothing \
                 runs the responder of an errored QP, so the receive stays queued (none \
                 arrived within 10 s in the guest) until the QP is moved to error again \
                 with ibv_modify_qp (`into_error`), which flushes it. Sends posted to an \
                 errored QP flush on both (post_send rings the kernel)",
    },
    Difference {
        scenario: "receive_shorter_than_the_send",
        sim: "(RemoteInvalidRequest, LocalLength)",
        rxe: "(RemoteOperation, LocalQpOperation)",
        reason: "the specification (and mlx5) report a length error at the responder and \
                 an invalid request NAK at the requester; rxe's copy_data reports every \
                 receive-side copy failure as a malformed WQE (class A, remote operation \
                 error NAK)",
    },
    Difference {
        scenario: "receive_sge_with_a_bad_lkey",
        sim: "(RemoteOperation, LocalProtection)",
        rxe: "(RemoteOperation, LocalQpOperation)",
        reason: "the requester sees a remote operation error on both; rxe reports the \
                 responder's failed receive as a malformed WQE (local QP operation error) \
                 where the specification and mlx5 report a local protection error",
    },
    Difference {
        scenario: "write_to_a_qp_without_remote_write",
        sim: "RemoteAccess",
        rxe: "RemoteInvalidRequest",
        reason: "the responder QP's access flags forbid the operation: the specification \
                 (and mlx5) NAK it as a remote access error; rxe's check_op_valid treats \
                 it as an unsupported opcode (invalid request NAK)",
    },
    Difference {
        scenario: "read_from_a_qp_without_remote_read",
        sim: "RemoteAccess",
        rxe: "RemoteInvalidRequest",
        reason: "as for a WRITE to a QP without remote write",
    },
    Difference {
        scenario: "responder_events_after_a_remote_access_error",
        sim: "[\"QpAccessError\"]",
        rxe: "[]",
        reason: "the specification raises IBV_EVENT_QP_ACCESS_ERR on the responder QP \
                 (mlx5 does, and so does the sim); rxe moves the responder QP to the error \
                 state without an async event",
    },
];

/// Which device family a rig drives: picks the column of [`DIFFERENCES`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Flavor {
    Sim,
    Rxe,
    /// Another native driver (mlx5_core, ...): held to the sim's column.
    Hardware(String),
}

/// A provider and the device the scenarios run on.
struct Rig {
    provider: Arc<dyn Provider>,
    device: String,
    port: u8,
    flavor: Flavor,
    /// The sim fabric (to count its objects); `None` on native.
    fabric: Option<SimFabric>,
}

impl Rig {
    /// A fresh sim fabric with one RoCE device.
    fn sim() -> Self {
        let fabric = SimFabric::new(
            SimDescription::new(vec![SimDeviceDesc::roce("sim0", [10, 0, 0, 1])])
                .with_delivery(Delivery::Background),
            0x5eed,
        );
        Self {
            provider: fabric.provider(),
            device: "sim0".into(),
            port: 1,
            flavor: Flavor::Sim,
            fabric: Some(fabric),
        }
    }

    /// The native device named by `ORBITTE_TEST_DEVICE`, or why not.
    fn native() -> Result<Self, String> {
        let provider: Arc<dyn Provider> = Arc::new(NativeProvider::new());
        let Ok(device) = std::env::var("ORBITTE_TEST_DEVICE") else {
            let why = match provider.devices() {
                Ok(list) if list.is_empty() => "no rdma devices".to_owned(),
                Ok(list) => format!(
                    "devices present ({}) but ORBITTE_TEST_DEVICE is not set",
                    list.iter()
                        .map(|d| d.identity.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Err(e) => e.to_string(),
            };
            return Err(format!("ORBITTE_TEST_DEVICE is not set ({why})"));
        };
        let port = std::env::var("ORBITTE_TEST_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(1);
        let info = provider
            .devices()
            .map_err(|e| format!("device list: {e}"))?
            .into_iter()
            .find(|d| d.identity.name == device)
            .ok_or_else(|| format!("ORBITTE_TEST_DEVICE={device} is not in the device list"))?;
        let flavor = match info.driver.as_deref() {
            Some("rxe" | "rdma_rxe") => Flavor::Rxe,
            Some(d) => Flavor::Hardware(d.to_owned()),
            None => Flavor::Hardware("unknown".into()),
        };
        Ok(Self {
            provider,
            device,
            port,
            flavor,
            fabric: None,
        })
    }

    /// This provider's answer where the sim and rxe differ. `scenario`
    /// must be a row of [`DIFFERENCES`] whose columns are `sim` and `rxe`.
    fn expect<T: Debug>(&self, scenario: &str, sim: T, rxe: T) -> T {
        let row = DIFFERENCES
            .iter()
            .find(|d| d.scenario == scenario)
            .unwrap_or_else(|| panic!("{scenario:?} is not a row of DIFFERENCES"));
        assert_eq!(format!("{sim:?}"), row.sim, "DIFFERENCES[{scenario}].sim");
        assert_eq!(format!("{rxe:?}"), row.rxe, "DIFFERENCES[{scenario}].rxe");
        match self.flavor {
            Flavor::Rxe => rxe,
            Flavor::Sim | Flavor::Hardware(_) => sim,
        }
    }
}

/// Runs `scenario` on the sim, then on the native device: skipped (with
/// why) only while `ORBITTE_TEST_DEVICE` is unset; once it names a device,
/// a device that cannot be used fails the test.
fn each(name: &str, scenario: fn(&Rig)) {
    println!("== {name} on sim");
    scenario(&Rig::sim());
    match Rig::native() {
        Ok(rig) => {
            println!("== {name} on {} ({:?})", rig.device, rig.flavor);
            scenario(&rig);
        }
        Err(why) if std::env::var_os("ORBITTE_TEST_DEVICE").is_some() => {
            panic!("{name}: ORBITTE_TEST_DEVICE is set, so the native half must run: {why}")
        }
        Err(why) => println!("skipped: {name} on the native provider: {why}"),
    }
}

/// The prefix of an IPv4-mapped GID (`::ffff:a.b.c.d`).
const V4_MAPPED: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// An open device with a PD and what connections need.
struct Dev {
    ctx: Context,
    pd: ProtectionDomain,
    port: u8,
    gid_index: u8,
    route: Route,
    mtu: Mtu,
}

fn open(rig: &Rig) -> Dev {
    let ctx = rig.provider.open(&rig.device).expect("open the device");
    let attr = ctx.query_port(rig.port).expect("query the port");
    assert_eq!(attr.state, PortState::Active, "port {} active", rig.port);
    let gids = ctx.gids(rig.port).expect("gid table");
    let gid_index = match std::env::var("ORBITTE_TEST_GID_INDEX")
        .ok()
        .filter(|_| rig.flavor != Flavor::Sim)
        .and_then(|s| s.parse().ok())
    {
        Some(i) => i,
        None => gids
            .iter()
            .find(|g| g.valid && g.gid_type == Some(GidType::RoceV2) && g.gid.0[..12] == V4_MAPPED)
            .or_else(|| {
                gids.iter()
                    .find(|g| g.valid && g.gid_type == Some(GidType::RoceV2))
            })
            .or_else(|| gids.iter().find(|g| g.valid))
            .map(|g| g.index)
            .expect("a valid gid"),
    };
    let gid = ctx.query_gid(rig.port, gid_index).expect("query the gid");
    let route = if attr.link_layer == LinkLayer::InfiniBand {
        Route::Lid(attr.lid)
    } else {
        Route::Gid(gid.gid)
    };
    let pd = ctx.alloc_pd().expect("pd");
    Dev {
        ctx,
        pd,
        port: rig.port,
        gid_index: gid_index as u8,
        route,
        mtu: attr.active_mtu,
    }
}

/// Two QPs `a` and `b` on one device connected to each other, each with
/// its own send and receive CQ.
struct Link {
    a: QueuePair,
    b: QueuePair,
    a_send: CompletionQueue,
    a_recv: CompletionQueue,
    b_send: CompletionQueue,
    b_recv: CompletionQueue,
}

/// How to connect a [`Link`].
#[derive(Clone, Copy)]
struct LinkOpts {
    /// `a`'s RNR retry count (7 = forever).
    rnr_retry: u8,
    /// What `b` accepts as a responder.
    b_access: Access,
}

impl Default for LinkOpts {
    fn default() -> Self {
        Self {
            rnr_retry: 7,
            b_access: Access::remote_read_write(),
        }
    }
}

fn link(dev: &Dev, opts: LinkOpts) -> Link {
    let cq = || dev.ctx.create_cq(64).expect("cq");
    let (a_send, a_recv, b_send, b_recv) = (cq(), cq(), cq(), cq());
    let a = dev
        .pd
        .create_qp(&a_send, &a_recv, QpCaps::default())
        .expect("qp a");
    let b = dev
        .pd
        .create_qp(&b_send, &b_recv, QpCaps::default())
        .expect("qp b");
    let (ea, eb) = (
        a.endpoint(dev.route, 0x1111, dev.mtu),
        b.endpoint(dev.route, 0x2222, dev.mtu),
    );
    let a = a
        .connect(
            InitAttrs::new(dev.port),
            RtrAttrs::new(eb, dev.gid_index),
            RtsAttrs {
                rnr_retry: opts.rnr_retry,
                ..RtsAttrs::new(0x1111)
            },
        )
        .expect("connect a");
    let b = b
        .connect(
            InitAttrs {
                access: opts.b_access,
                ..InitAttrs::new(dev.port)
            },
            RtrAttrs::new(ea, dev.gid_index),
            RtsAttrs::new(0x2222),
        )
        .expect("connect b");
    Link {
        a,
        b,
        a_send,
        a_recv,
        b_send,
        b_recv,
    }
}

fn buffer(dev: &Dev, len: usize, access: Access) -> (Arc<HostMemory>, MemoryRegion) {
    let mem = HostMemory::alloc(len).expect("alloc");
    let mr = dev
        .pd
        .register(mem.clone(), 0..len, access)
        .expect("register");
    (mem, mr)
}

/// Waits for exactly `n` completions (60 one-second waits at most), then
/// checks that no more are queued.
fn reap(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let got = reap_up_to(cq, n, 60);
    assert_eq!(got.len(), n, "expected {n} completions, got {got:?}");
    assert_eq!(drain(cq), [], "more completions than expected");
    got
}

/// Up to `n` completions within `secs` one-second waits.
fn reap_up_to(cq: &CompletionQueue, n: usize, secs: u32) -> Vec<Completion> {
    let mut got = drain(cq);
    for _ in 0..secs {
        if got.len() >= n {
            break;
        }
        cq.wait(Duration::from_secs(1)).expect("wait");
        got.extend(drain(cq));
    }
    got
}

/// What the CQ holds now (never blocks).
fn drain(cq: &CompletionQueue) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut buf = [Completion::default(); 8];
    loop {
        let k = cq.poll(&mut buf).expect("poll");
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            return got;
        }
    }
}

/// Waits (bounded) until the device reports `want` for `qp`; returns the
/// last state seen. The responder may change state just after the
/// requester's completion.
fn settle<S: orbitte_verbs::qp_state::State>(qp: &QueuePair<S>, want: QpState) -> QpState {
    let mut now = qp.state().expect("query qp");
    for _ in 0..100 {
        if now == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        now = qp.state().expect("query qp");
    }
    now
}

fn ok(wr_id: u64, opcode: WcOpcode, byte_len: u32, qp_num: u32) -> Completion {
    Completion {
        wr_id,
        status: WcStatus::Success,
        opcode: Some(opcode),
        byte_len,
        imm: None,
        qp_num,
        vendor_err: 0,
    }
}

/// The fields an error completion defines (the rest are normalised by
/// both providers: no opcode, no immediate, byte count 0).
fn status_of(c: &[Completion]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|c| (c.wr_id, c.status)).collect()
}

fn assert_error_completions(c: &[Completion], qpn: u32) {
    for c in c {
        assert_eq!(
            (c.opcode, c.byte_len, c.imm, c.qp_num),
            (None, 0, None, qpn),
            "error completion fields: {c:?}"
        );
    }
}

/// The kinds of the async events queued on `ctx` now.
fn event_kinds(ctx: &Context) -> Vec<String> {
    let mut kinds = Vec::new();
    while let Some(ev) = ctx.next_async_event(Duration::ZERO).expect("async event") {
        let text = format!("{ev:?}");
        let kind = text.split([' ', '{', '(']).next().unwrap_or_default();
        // Port and GID events come from the link, not from the scenario.
        if !matches!(
            ev,
            AsyncEvent::PortActive { .. } | AsyncEvent::GidChange { .. }
        ) {
            kinds.push(kind.to_owned());
        }
    }
    kinds
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

/// Objects come up in order, a parent in use refuses to close without
/// destroying anything, explicit closes in order succeed, and dropping in
/// the "wrong" order (context first) still tears down QP, CQ, MR, PD,
/// context, including a QP with work outstanding.
fn lifecycle_and_teardown_order(rig: &Rig) {
    let counts = || rig.fabric.as_ref().map(SimFabric::counts);
    if let Some(c) = counts() {
        assert_eq!(c, Default::default(), "a fresh fabric is empty");
    }
    let dev = open(rig);
    let l = link(&dev, LinkOpts::default());
    let (mem, mr) = buffer(&dev, 4096, Access::remote_read_write());
    let Link {
        mut a,
        b,
        a_send,
        a_recv,
        b_send,
        b_recv,
    } = l;
    let s = [mr.sge(0, 64).unwrap()];
    a.post_send(&[SendWr::write(1, &s, mr.remote(1024).unwrap())])
        .unwrap();
    assert_eq!(
        reap(&a_send, 1),
        [ok(1, WcOpcode::RdmaWrite, 64, a.qp_num())]
    );
    if let Some(c) = counts() {
        assert_eq!((c.contexts, c.pds, c.mrs, c.cqs, c.qps), (1, 1, 1, 4, 2));
    }

    // A parent in use: the handle is released, nothing is destroyed.
    for e in [
        dev.pd.clone().close().unwrap_err(),
        dev.ctx.clone().close().unwrap_err(),
        a_send.clone().close().unwrap_err(),
    ] {
        assert!(
            matches!(e.cause, UnquiescedCause::InUse { holders } if holders >= 1),
            "{e}"
        );
        assert!(!e.cleanup.retained, "{e}");
    }

    // Explicit teardown in order: every destroy succeeds.
    a.close().expect("close qp a");
    b.close().expect("close qp b");
    for cq in [a_send, a_recv, b_send, b_recv] {
        cq.close().expect("close cq");
    }
    mr.close().expect("dereg");
    assert_eq!(
        Arc::strong_count(&mem),
        1,
        "the region let go of its memory"
    );
    let Dev { ctx, pd, .. } = dev;
    pd.close().expect("dealloc pd");
    ctx.close().expect("close context");
    if let Some(c) = counts() {
        assert_eq!(c, Default::default());
    }

    // Dropped context-first, with a SEND stuck waiting for a receive (RNR,
    // retried forever): the QP still goes first, then CQ, MR, PD, context.
    let dev = open(rig);
    let mut l = link(&dev, LinkOpts::default());
    let (mem, mr) = buffer(&dev, 4096, Access::remote_read_write());
    let s = [mr.sge(0, 64).unwrap()];
    l.a.post_send(&[SendWr::send(1, &s, None)]).unwrap();
    assert_eq!(drain(&l.a_send), [], "the send waits for a receive");
    let Dev { ctx, pd, .. } = dev;
    drop(ctx);
    drop(pd);
    drop(mr);
    let Link {
        a,
        b,
        a_send,
        a_recv,
        b_send,
        b_recv,
    } = l;
    drop((a_send, a_recv, b_send, b_recv));
    if let Some(c) = counts() {
        // Only the region had no other holder: outstanding work does not
        // keep it (deregistering under work is allowed; the work fails).
        assert_eq!((c.contexts, c.pds, c.mrs, c.cqs, c.qps), (1, 1, 0, 4, 2));
    }
    drop(b);
    a.close().expect("close a qp with work outstanding");
    assert_eq!(
        Arc::strong_count(&mem),
        1,
        "the region let go of its memory"
    );
    if let Some(c) = counts() {
        assert_eq!(c, Default::default());
    }
}

#[test]
fn lifecycle_and_teardown() {
    each("lifecycle_and_teardown_order", lifecycle_and_teardown_order);
}

/// How the rkey of a region relates to its lkey.
#[derive(Debug, PartialEq, Eq)]
enum RkeyOf {
    SameAsLkey,
    Zero,
    Other,
}

fn rkey_of(mr: &MemoryRegion) -> RkeyOf {
    match mr.rkey() {
        k if k == mr.lkey() => RkeyOf::SameAsLkey,
        0 => RkeyOf::Zero,
        _ => RkeyOf::Other,
    }
}

/// Registration in every access mode; keys are distinct among live
/// regions and change across re-registration; the typed refusals.
fn registration_access_modes_and_keys(rig: &Rig) {
    let dev = open(rig);
    let mem = HostMemory::alloc(3 * 4096).unwrap();
    let modes = [
        Access::NONE,
        Access::local_only(),
        Access::LOCAL_WRITE | Access::REMOTE_READ,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        Access::remote_read_write(),
    ];
    let mut live = Vec::new();
    for access in modes {
        let mr = dev
            .pd
            .register(mem.clone(), 4096..12288, access)
            .expect("register");
        assert_eq!(
            (mr.access(), mr.len(), mr.addr()),
            (access, 8192, mem.as_ptr() as u64 + 4096)
        );
        assert_ne!(mr.lkey(), 0, "{access:?}");
        let want = if access.is_remote() {
            RkeyOf::SameAsLkey
        } else {
            rig.expect(
                "rkey_of_a_local_only_region",
                RkeyOf::SameAsLkey,
                RkeyOf::Zero,
            )
        };
        assert_eq!(rkey_of(&mr), want, "{access:?}");
        println!("{access:?}: lkey {:#x} rkey {:#x}", mr.lkey(), mr.rkey());
        live.push(mr);
    }
    let mut lkeys: Vec<u32> = live.iter().map(MemoryRegion::lkey).collect();
    lkeys.sort_unstable();
    lkeys.dedup();
    assert_eq!(lkeys.len(), modes.len(), "one buffer, five distinct keys");

    // Re-registration gets a new key, so a stale key cannot reach the new
    // region (the bad-key scenario checks what a stale key does).
    let old = live.pop().unwrap();
    let old_key = old.lkey();
    old.close().expect("dereg");
    let new = dev
        .pd
        .register(mem.clone(), 0..4096, Access::remote_read_write())
        .unwrap();
    assert_ne!(new.lkey(), old_key, "a re-registration reuses no key");

    // Refused before the device is asked.
    assert!(matches!(
        dev.pd.register(mem.clone(), 0..0, Access::local_only()),
        Err(RegisterError::OutOfRange { .. })
    ));
    assert!(matches!(
        dev.pd
            .register(mem.clone(), 0..4096 * 4, Access::local_only()),
        Err(RegisterError::OutOfRange { .. })
    ));
    assert!(matches!(
        dev.pd.register(mem, 0..4096, Access::REMOTE_WRITE),
        Err(RegisterError::InvalidAccess { .. })
    ));
}

#[test]
fn registration_and_keys() {
    each(
        "registration_access_modes_and_keys",
        registration_access_modes_and_keys,
    );
}

/// RESET -> INIT -> RTR -> RTS, with the device's state after each step;
/// a refused transition hands the QP back unchanged.
fn rc_loopback_to_rts(rig: &Rig) {
    let dev = open(rig);
    let cq = dev.ctx.create_cq(16).unwrap();
    let a = dev.pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let b = dev.pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    assert_ne!(a.qp_num(), b.qp_num());
    assert_eq!(a.state().unwrap(), QpState::Reset);
    let (ea, eb) = (
        a.endpoint(dev.route, 7, dev.mtu),
        b.endpoint(dev.route, 9, dev.mtu),
    );
    assert_eq!((ea.qpn, ea.psn), (a.qp_num(), 7));
    let a = a.init(InitAttrs::new(dev.port)).unwrap();
    assert_eq!(a.state().unwrap(), QpState::Init);
    // A source GID index past the table: refused, the QP comes back in INIT.
    let len = dev.ctx.query_port(dev.port).unwrap().gid_table_len;
    let bad = RtrAttrs::new(eb, u8::try_from(len).unwrap_or(u8::MAX));
    let e = a.rtr(bad).unwrap_err();
    println!("rtr with sgid index {len}: {}", e.error);
    let a = e.qp;
    assert_eq!(a.state().unwrap(), QpState::Init);
    let a = a.rtr(RtrAttrs::new(eb, dev.gid_index)).unwrap();
    assert_eq!(a.state().unwrap(), QpState::Rtr);
    let a = a.rts(RtsAttrs::new(7)).unwrap();
    assert_eq!(a.state().unwrap(), QpState::Rts);
    let b = b
        .connect(
            InitAttrs::new(dev.port),
            RtrAttrs::new(ea, dev.gid_index),
            RtsAttrs::new(9),
        )
        .unwrap();
    assert_eq!(b.state().unwrap(), QpState::Rts);
    let a = a.into_error().unwrap();
    assert_eq!(a.state().unwrap(), QpState::Error);
    assert_eq!(drain(&cq), [], "nothing was outstanding");
}

#[test]
fn loopback_to_rts() {
    each("rc_loopback_to_rts", rc_loopback_to_rts);
}

/// WRITE, READ, SEND with immediate and WRITE with immediate moving
/// checked bytes, with exact completions on both sides.
fn write_read_send_with_imm(rig: &Rig) {
    let dev = open(rig);
    let Link {
        mut a,
        mut b,
        a_send,
        b_recv,
        ..
    } = link(&dev, LinkOpts::default());
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let (mem_a, mr_a) = buffer(&dev, 8192, Access::remote_read_write());
    let (mem_b, mr_b) = buffer(&dev, 8192, Access::remote_read_write());
    // More than one MTU (1024 on rxe): multi-packet transfers.
    let pattern: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    mem_a.write_at(0, &pattern).unwrap();

    // WRITE a[0..3000] -> b[500..3500], then READ it back into a[4000..].
    let src = [mr_a.sge(0, 1000).unwrap(), mr_a.sge(1000, 2000).unwrap()];
    let dst = [mr_a.sge(4000, 3000).unwrap()];
    a.post_send(&[
        SendWr::write(1, &src, mr_b.remote(500).unwrap()),
        SendWr::read(2, &dst, mr_b.remote(500).unwrap()),
    ])
    .unwrap();
    assert_eq!(
        reap(&a_send, 2),
        [
            ok(1, WcOpcode::RdmaWrite, 3000, qa),
            ok(2, WcOpcode::RdmaRead, 3000, qa)
        ]
    );
    assert_eq!(mem_b.to_vec(500, 3000).unwrap(), pattern);
    assert_eq!(mem_a.to_vec(4000, 3000).unwrap(), pattern);
    assert_eq!(mem_b.to_vec(499, 1).unwrap(), [0]);
    assert_eq!(mem_b.to_vec(3500, 1).unwrap(), [0]);

    // SEND with immediate: two SGEs gathered, scattered into two.
    let recv = [mr_b.sge(6000, 10).unwrap(), mr_b.sge(7000, 100).unwrap()];
    b.post_recv(&[RecvWr {
        wr_id: 70,
        sges: &recv,
    }])
    .unwrap();
    mem_a.write_at(100, b"0123456789abcdef").unwrap();
    let send = [mr_a.sge(100, 10).unwrap(), mr_a.sge(110, 6).unwrap()];
    a.post_send(&[SendWr::send(3, &send, Some(0xdead_beef))])
        .unwrap();
    let c = reap(&a_send, 1);
    println!("send with imm, requester: {c:?}");
    // The immediate belongs to the receiver: no provider reports one in
    // the requester's completion (rxe and mlx5 flag an undefined value;
    // the native provider drops it).
    assert_eq!(c, [ok(3, WcOpcode::Send, 16, qa)]);
    assert_eq!(
        reap(&b_recv, 1),
        [Completion {
            imm: Some(0xdead_beef),
            ..ok(70, WcOpcode::Recv, 16, qb)
        }]
    );
    assert_eq!(mem_b.to_vec(6000, 10).unwrap(), b"0123456789");
    assert_eq!(mem_b.to_vec(7000, 6).unwrap(), b"abcdef");
    assert_eq!(mem_b.to_vec(7006, 1).unwrap(), [0]);

    // SEND without immediate, and WRITE with immediate (consumes a receive
    // with no SGEs; its byte count is the WRITE's).
    let recv = [mr_b.sge(7200, 64).unwrap()];
    b.post_recv(&[
        RecvWr {
            wr_id: 71,
            sges: &recv,
        },
        RecvWr {
            wr_id: 72,
            sges: &[],
        },
    ])
    .unwrap();
    let small = [mr_a.sge(0, 40).unwrap()];
    let w = SendWr {
        op: SendOp::Write {
            remote: mr_b.remote(0).unwrap(),
            imm: Some(5),
        },
        ..SendWr::write(5, &src, mr_b.remote(0).unwrap())
    };
    a.post_send(&[SendWr::send(4, &small, None), w]).unwrap();
    let c = reap(&a_send, 2);
    println!("send and write with imm, requester: {c:?}");
    assert_eq!(
        c,
        [
            ok(4, WcOpcode::Send, 40, qa),
            ok(5, WcOpcode::RdmaWrite, 3000, qa)
        ]
    );
    assert_eq!(
        reap(&b_recv, 2),
        [
            ok(71, WcOpcode::Recv, 40, qb),
            Completion {
                imm: Some(5),
                ..ok(72, WcOpcode::RecvRdmaWithImm, 3000, qb)
            }
        ]
    );
    assert_eq!(mem_b.to_vec(7200, 40).unwrap(), pattern[..40]);
    assert_eq!(
        mem_b.to_vec(0, 3000).unwrap(),
        mem_a.to_vec(0, 3000).unwrap()
    );
}

#[test]
fn write_read_send_imm() {
    each("write_read_send_with_imm", write_read_send_with_imm);
}

/// Only signaled requests complete (errors aside), in posting order per
/// QP, with two QPs sharing one send CQ; unsignaled work still happens.
fn selective_signaling_and_order(rig: &Rig) {
    let dev = open(rig);
    let shared_cq = dev.ctx.create_cq(64).unwrap();
    let (mem_a, mr_a) = buffer(&dev, 8192, Access::remote_read_write());
    let (mem_b, mr_b) = buffer(&dev, 8192, Access::remote_read_write());
    mem_a.fill(0, 4096, 0x5a).unwrap();
    // Two connected pairs whose requesters share `shared_cq`.
    let mut qps = Vec::new();
    for psn in [100, 300] {
        let rcq = dev.ctx.create_cq(16).unwrap();
        let x = dev
            .pd
            .create_qp(&shared_cq, &rcq, QpCaps::default())
            .unwrap();
        let y = dev.pd.create_qp(&rcq, &rcq, QpCaps::default()).unwrap();
        let (ex, ey) = (
            x.endpoint(dev.route, psn, dev.mtu),
            y.endpoint(dev.route, psn + 1, dev.mtu),
        );
        let x = x
            .connect(
                InitAttrs::new(dev.port),
                RtrAttrs::new(ey, dev.gid_index),
                RtsAttrs::new(psn),
            )
            .unwrap();
        let y = y
            .connect(
                InitAttrs::new(dev.port),
                RtrAttrs::new(ex, dev.gid_index),
                RtsAttrs::new(psn + 1),
            )
            .unwrap();
        qps.push((x, y, rcq));
    }
    let s = |i: usize| [mr_a.sge(i * 100, 100).unwrap()];
    let (s0, s1, s2, s3, s4) = (s(0), s(1), s(2), s(3), s(4));
    let r = |i: usize| mr_b.remote(i * 100).unwrap();
    let rd = [mr_a.sge(5000, 100).unwrap()];
    let (p, q) = qps.split_at_mut(1);
    let (x1, x2) = (&mut p[0].0, &mut q[0].0);
    x1.post_send(&[
        SendWr::write(1, &s0, r(0)).signaled(false),
        SendWr::write(2, &s1, r(1)),
        SendWr::write(3, &s2, r(2)).signaled(false),
        SendWr::write(4, &s3, r(3)).signaled(false),
        SendWr::read(5, &rd, r(0)),
    ])
    .unwrap();
    x2.post_send(&[
        SendWr::write(11, &s4, r(10)),
        SendWr::write(12, &s4, r(11)).signaled(false),
        SendWr::write(13, &s4, r(12)),
    ])
    .unwrap();
    let (q1, q2) = (x1.qp_num(), x2.qp_num());
    let got = reap(&shared_cq, 4);
    let on =
        |qpn: u32| -> Vec<Completion> { got.iter().copied().filter(|c| c.qp_num == qpn).collect() };
    assert_eq!(
        on(q1),
        [
            ok(2, WcOpcode::RdmaWrite, 100, q1),
            ok(5, WcOpcode::RdmaRead, 100, q1)
        ]
    );
    assert_eq!(
        on(q2),
        [
            ok(11, WcOpcode::RdmaWrite, 100, q2),
            ok(13, WcOpcode::RdmaWrite, 100, q2)
        ]
    );
    // Every write happened, signaled or not, and the READ saw the first.
    assert_eq!(mem_b.to_vec(0, 400).unwrap(), vec![0x5a; 400]);
    assert_eq!(mem_b.to_vec(1000, 300).unwrap(), vec![0x5a; 300]);
    assert_eq!(mem_a.to_vec(5000, 100).unwrap(), vec![0x5a; 100]);
    for (_, _, rcq) in &qps {
        assert_eq!(drain(rcq), []);
    }
}

#[test]
fn selective_signaling() {
    each(
        "selective_signaling_and_order",
        selective_signaling_and_order,
    );
}

/// What a failing request on a fresh link left behind.
struct Failed {
    /// `a`'s send completions: the failing request and the WRITE after it.
    send: Vec<Completion>,
    link: Link,
    mem_a: Arc<HostMemory>,
    mem_b: Arc<HostMemory>,
    mr_a: MemoryRegion,
    mr_b: MemoryRegion,
}

/// A fresh link `a -> b`; `a`'s 4 KiB region (remote read/write, filled
/// with 0xee) and `b`'s (registered with `b_mr`, zeroed); `case` builds
/// the request (wr_id 9) from them. It is posted with a valid WRITE
/// (wr_id 10) behind it; both complete, the second flushed.
fn failing(
    dev: &Dev,
    opts: LinkOpts,
    b_mr: Access,
    case: impl FnOnce(&MemoryRegion, &MemoryRegion) -> (SendOp, Vec<Sge>),
) -> Failed {
    let mut link = link(dev, opts);
    let (mem_a, mr_a) = buffer(dev, 4096, Access::remote_read_write());
    mem_a.fill(0, 4096, 0xee).unwrap();
    let (mem_b, mr_b) = buffer(dev, 4096, b_mr);
    let (op, sges) = case(&mr_a, &mr_b);
    let next = [mr_a.sge(0, 64).unwrap()];
    let wr = SendWr {
        wr_id: 9,
        op,
        sges: &sges,
        signaled: true,
    };
    link.a
        .post_send(&[wr, SendWr::write(10, &next, mr_b.remote(0).unwrap())])
        .unwrap();
    let send = reap(&link.a_send, 2);
    assert_eq!(send[1].wr_id, 10);
    assert_eq!(
        send[1].status,
        WcStatus::WrFlush,
        "later work flushes: {send:?}"
    );
    assert_error_completions(&send, link.a.qp_num());
    assert_eq!(link.a.state().unwrap(), QpState::Error);
    Failed {
        send,
        link,
        mem_a,
        mem_b,
        mr_a,
        mr_b,
    }
}

fn write_to(remote: RemoteAddr) -> SendOp {
    SendOp::Write { remote, imm: None }
}

fn read_from(remote: RemoteAddr) -> SendOp {
    SendOp::Read { remote }
}

/// Unknown, stale and foreign rkeys: `RemoteAccess`, nothing written or
/// read, the requester's next request flushes, the responder QP goes to
/// the error state.
fn bad_rkey(rig: &Rig) {
    let dev = open(rig);
    let bad = |mr: &MemoryRegion| RemoteAddr {
        addr: mr.addr(),
        rkey: mr.rkey().wrapping_add(0x1000),
    };
    for (what, read) in [("write", false), ("read", true)] {
        let f = failing(
            &dev,
            LinkOpts::default(),
            Access::remote_read_write(),
            |a, b| {
                let op = if read {
                    read_from(bad(b))
                } else {
                    write_to(bad(b))
                };
                (op, vec![a.sge(0, 64).unwrap()])
            },
        );
        assert_eq!(
            status_of(&f.send)[0],
            (9, WcStatus::RemoteAccess),
            "bad rkey {what}"
        );
        assert_eq!(f.mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096]);
        assert_eq!(f.mem_a.to_vec(0, 4096).unwrap(), vec![0xee; 4096]);
        assert_eq!(
            settle(&f.link.b, QpState::Error),
            QpState::Error,
            "responder"
        );
    }

    // A stale rkey: the region was deregistered before the request.
    let f = failing(
        &dev,
        LinkOpts::default(),
        Access::remote_read_write(),
        |a, _| {
            let (_mem, mr) = buffer(&dev, 4096, Access::remote_read_write());
            let stale = mr.remote(0).unwrap();
            mr.close().unwrap();
            (write_to(stale), vec![a.sge(0, 64).unwrap()])
        },
    );
    assert_eq!(
        status_of(&f.send)[0],
        (9, WcStatus::RemoteAccess),
        "stale rkey"
    );

    // A region of another PD.
    let other_pd = dev.ctx.alloc_pd().unwrap();
    let other_mem = HostMemory::alloc(4096).unwrap();
    let other = other_pd
        .register(other_mem.clone(), 0..4096, Access::remote_read_write())
        .unwrap();
    let f = failing(
        &dev,
        LinkOpts::default(),
        Access::remote_read_write(),
        |a, _| {
            (
                write_to(other.remote(0).unwrap()),
                vec![a.sge(0, 64).unwrap()],
            )
        },
    );
    assert_eq!(
        status_of(&f.send)[0],
        (9, WcStatus::RemoteAccess),
        "other pd's rkey"
    );
    assert_eq!(other_mem.to_vec(0, 4096).unwrap(), vec![0; 4096]);
}

#[test]
fn bad_rkeys() {
    each("bad_rkey", bad_rkey);
}

/// The responder of a remote access error, in detail: its QP goes to
/// error, its posted receive flushes, and the async event differs.
fn remote_access_error_at_the_responder(rig: &Rig) {
    let dev = open(rig);
    let mut l = link(&dev, LinkOpts::default());
    let (mem_a, mr_a) = buffer(&dev, 4096, Access::remote_read_write());
    let (mem_b, mr_b) = buffer(&dev, 4096, Access::remote_read_write());
    mem_a.fill(0, 4096, 1).unwrap();
    // Only events raised from here on count.
    event_kinds(&dev.ctx);
    let rs = [mr_b.sge(2048, 64).unwrap()];
    l.b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &rs,
    }])
    .unwrap();
    let s = [mr_a.sge(0, 64).unwrap()];
    let bad = RemoteAddr {
        addr: mr_b.addr(),
        rkey: mr_b.rkey().wrapping_add(0x1000),
    };
    l.a.post_send(&[SendWr::write(9, &s, bad)]).unwrap();
    assert_eq!(
        status_of(&reap(&l.a_send, 1)),
        [(9, WcStatus::RemoteAccess)]
    );
    assert_eq!(settle(&l.b, QpState::Error), QpState::Error, "responder");
    let r = reap_up_to(&l.b_recv, 1, 10);
    println!("responder's receive after the error: {r:?}");
    assert_eq!(
        status_of(&r),
        [(1, WcStatus::WrFlush)],
        "responder's receive"
    );
    assert_eq!(mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096]);
    let events = event_kinds(&dev.ctx);
    println!("events: {events:?}");
    let want = rig.expect(
        "responder_events_after_a_remote_access_error",
        vec!["QpAccessError".to_owned()],
        vec![],
    );
    assert_eq!(events, want);
}

#[test]
fn remote_access_error_responder() {
    each(
        "remote_access_error_at_the_responder",
        remote_access_error_at_the_responder,
    );
}

/// Remote ranges outside the region (past the end, before the start,
/// straddling the end): `RemoteAccess`, nothing written or read.
fn out_of_bounds_remote_access(rig: &Rig) {
    let dev = open(rig);
    type Case = fn(&MemoryRegion, &MemoryRegion) -> (SendOp, Vec<Sge>);
    let cases: [(&str, Case); 4] = [
        ("write straddling the end", |a, b| {
            let r = RemoteAddr {
                addr: b.addr() + 4096 - 16,
                rkey: b.rkey(),
            };
            (write_to(r), vec![a.sge(0, 64).unwrap()])
        }),
        ("read straddling the end", |a, b| {
            let r = RemoteAddr {
                addr: b.addr() + 4096 - 16,
                rkey: b.rkey(),
            };
            (read_from(r), vec![a.sge(0, 64).unwrap()])
        }),
        ("write before the start", |a, b| {
            let r = RemoteAddr {
                addr: b.addr() - 64,
                rkey: b.rkey(),
            };
            (write_to(r), vec![a.sge(0, 64).unwrap()])
        }),
        ("write past the end", |a, b| {
            let r = RemoteAddr {
                addr: b.addr() + 4096,
                rkey: b.rkey(),
            };
            (write_to(r), vec![a.sge(0, 1).unwrap()])
        }),
    ];
    for (what, case) in cases {
        let f = failing(&dev, LinkOpts::default(), Access::remote_read_write(), case);
        assert_eq!(status_of(&f.send)[0], (9, WcStatus::RemoteAccess), "{what}");
        assert_eq!(f.mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096], "{what}");
        assert_eq!(f.mem_a.to_vec(0, 4096).unwrap(), vec![0xee; 4096], "{what}");
    }
}

#[test]
fn out_of_bounds_remote() {
    each("out_of_bounds_remote_access", out_of_bounds_remote_access);
}

/// Remote access the region or the responder QP does not allow.
fn remote_access_without_permission(rig: &Rig) {
    let dev = open(rig);
    let write = |a: &MemoryRegion, b: &MemoryRegion| {
        (write_to(b.remote(0).unwrap()), vec![a.sge(0, 64).unwrap()])
    };
    let read = |a: &MemoryRegion, b: &MemoryRegion| {
        (read_from(b.remote(0).unwrap()), vec![a.sge(0, 64).unwrap()])
    };
    // The region forbids it.
    let regions: [(&str, Access, bool); 3] = [
        (
            "write to a remote-read-only region",
            Access::LOCAL_WRITE | Access::REMOTE_READ,
            false,
        ),
        (
            "read from a remote-write-only region",
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            true,
        ),
        ("write to a local-only region", Access::local_only(), false),
    ];
    for (what, access, is_read) in regions {
        let f = if is_read {
            failing(&dev, LinkOpts::default(), access, read)
        } else {
            failing(&dev, LinkOpts::default(), access, write)
        };
        assert_eq!(status_of(&f.send)[0], (9, WcStatus::RemoteAccess), "{what}");
        assert_eq!(f.mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096], "{what}");
        assert_eq!(f.mem_a.to_vec(0, 4096).unwrap(), vec![0xee; 4096], "{what}");
    }
    // The responder QP forbids it (its region allows it).
    let no_write = LinkOpts {
        b_access: Access::LOCAL_WRITE | Access::REMOTE_READ,
        ..LinkOpts::default()
    };
    let f = failing(&dev, no_write, Access::remote_read_write(), write);
    let want = rig.expect(
        "write_to_a_qp_without_remote_write",
        WcStatus::RemoteAccess,
        WcStatus::RemoteInvalidRequest,
    );
    assert_eq!(
        status_of(&f.send)[0],
        (9, want),
        "write to a qp without remote write"
    );
    assert_eq!(f.mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096]);
    let no_read = LinkOpts {
        b_access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ..LinkOpts::default()
    };
    let f = failing(&dev, no_read, Access::remote_read_write(), read);
    let want = rig.expect(
        "read_from_a_qp_without_remote_read",
        WcStatus::RemoteAccess,
        WcStatus::RemoteInvalidRequest,
    );
    assert_eq!(
        status_of(&f.send)[0],
        (9, want),
        "read from a qp without remote read"
    );
    assert_eq!(f.mem_a.to_vec(0, 4096).unwrap(), vec![0xee; 4096]);
}

#[test]
fn remote_without_permission() {
    each(
        "remote_access_without_permission",
        remote_access_without_permission,
    );
}

/// Local SGEs that do not fit their key: `LocalProtection` at the
/// requester, nothing sent; a receive SGE that does not fit fails both
/// sides (statuses by provider).
fn local_sge_errors(rig: &Rig) {
    let dev = open(rig);
    let other_pd = dev.ctx.alloc_pd().unwrap();
    let other_mem = HostMemory::alloc(4096).unwrap();
    let other = other_pd
        .register(other_mem, 0..4096, Access::remote_read_write())
        .unwrap();
    let (_ro_mem, ro) = buffer(&dev, 4096, Access::NONE);
    let invalid_lkey = rig.expect(
        "local_sge_with_an_invalid_lkey",
        WcStatus::LocalProtection,
        WcStatus::LocalQpOperation,
    );
    type Case<'a> = Box<dyn Fn(&MemoryRegion, &MemoryRegion) -> (SendOp, Vec<Sge>) + 'a>;
    let cases: Vec<(&str, WcStatus, Case<'_>)> = vec![
        (
            "write from an sge past the region's end",
            WcStatus::LocalProtection,
            Box::new(|a, b| {
                (
                    write_to(b.remote(0).unwrap()),
                    vec![Sge::new(a.addr() + 4000, 200, a.lkey())],
                )
            }),
        ),
        (
            "send from an sge before the region's start",
            WcStatus::LocalProtection,
            Box::new(|a, _| {
                (
                    SendOp::Send { imm: None },
                    vec![Sge::new(a.addr() - 64, 64, a.lkey())],
                )
            }),
        ),
        (
            "read into a region without local write",
            WcStatus::LocalProtection,
            Box::new(|_, b| {
                (
                    read_from(b.remote(0).unwrap()),
                    vec![ro.sge(0, 64).unwrap()],
                )
            }),
        ),
        (
            "write from an unknown lkey",
            invalid_lkey,
            Box::new(|a, b| {
                (
                    write_to(b.remote(0).unwrap()),
                    vec![Sge::new(a.addr(), 64, a.lkey().wrapping_add(0x1000))],
                )
            }),
        ),
        (
            "send from an unknown lkey",
            invalid_lkey,
            Box::new(|a, _| {
                (
                    SendOp::Send { imm: None },
                    vec![Sge::new(a.addr(), 64, a.lkey().wrapping_add(0x1000))],
                )
            }),
        ),
        (
            "write from another pd's region",
            invalid_lkey,
            Box::new(|_, b| {
                (
                    write_to(b.remote(0).unwrap()),
                    vec![other.sge(0, 64).unwrap()],
                )
            }),
        ),
    ];
    for (what, want, case) in cases {
        let f = failing(&dev, LinkOpts::default(), Access::remote_read_write(), case);
        assert_eq!(status_of(&f.send)[0], (9, want), "{what}");
        assert_eq!(f.mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096], "{what}");
        // The responder saw nothing: still ready.
        assert_eq!(f.link.b.state().unwrap(), QpState::Rts, "{what}");
    }

    // A receive whose SGE has a bad lkey.
    let mut l = link(&dev, LinkOpts::default());
    let (mem_a, mr_a) = buffer(&dev, 4096, Access::remote_read_write());
    let (mem_b, mr_b) = buffer(&dev, 4096, Access::remote_read_write());
    mem_a.fill(0, 64, 3).unwrap();
    let rs = [Sge::new(mr_b.addr(), 64, mr_b.lkey().wrapping_add(0x1000))];
    l.b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &rs,
    }])
    .unwrap();
    let s = [mr_a.sge(0, 64).unwrap()];
    l.a.post_send(&[SendWr::send(9, &s, None)]).unwrap();
    let c = reap(&l.a_send, 1);
    let r = reap(&l.b_recv, 1);
    println!("receive sge with a bad lkey: requester {c:?}, responder {r:?}");
    let want = rig.expect(
        "receive_sge_with_a_bad_lkey",
        (WcStatus::RemoteOperation, WcStatus::LocalProtection),
        (WcStatus::RemoteOperation, WcStatus::LocalQpOperation),
    );
    assert_eq!((c[0].wr_id, r[0].wr_id), (9, 1));
    assert_eq!((c[0].status, r[0].status), want);
    assert_error_completions(&r, l.b.qp_num());
    assert_eq!(mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096]);
    assert_eq!(settle(&l.b, QpState::Error), QpState::Error);
    assert_eq!(l.a.state().unwrap(), QpState::Error);
}

#[test]
fn local_sge_and_lkey_errors() {
    each("local_sge_errors", local_sge_errors);
}

/// SEND (and WRITE with immediate) with no receive posted and RNR retry 0:
/// `RnrRetryExceeded`; the requester goes to error, the responder does not.
fn rnr_without_a_receive(rig: &Rig) {
    let dev = open(rig);
    let opts = LinkOpts {
        rnr_retry: 0,
        ..LinkOpts::default()
    };
    let send = |a: &MemoryRegion, _: &MemoryRegion| {
        (SendOp::Send { imm: Some(1) }, vec![a.sge(0, 64).unwrap()])
    };
    let write_imm = |a: &MemoryRegion, b: &MemoryRegion| {
        (
            SendOp::Write {
                remote: b.remote(0).unwrap(),
                imm: Some(2),
            },
            vec![a.sge(0, 64).unwrap()],
        )
    };
    for (what, f) in [
        (
            "send",
            failing(&dev, opts, Access::remote_read_write(), send),
        ),
        (
            "write with imm",
            failing(&dev, opts, Access::remote_read_write(), write_imm),
        ),
    ] {
        println!("{what} without a receive: {:?}", f.send);
        assert_eq!(
            status_of(&f.send)[0],
            (9, WcStatus::RnrRetryExceeded),
            "{what}"
        );
        assert_eq!(f.link.b.state().unwrap(), QpState::Rts, "{what}: responder");
        assert_eq!(drain(&f.link.b_recv), [], "{what}");
        if what == "send" {
            assert_eq!(f.mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096]);
        }
    }
}

#[test]
fn rnr() {
    each("rnr_without_a_receive", rnr_without_a_receive);
}

/// A SEND longer than the posted receive fails both sides; statuses by
/// provider; no byte lands in the receive buffer.
fn receive_shorter_than_the_send(rig: &Rig) {
    let dev = open(rig);
    let mut l = link(&dev, LinkOpts::default());
    let (mem_a, mr_a) = buffer(&dev, 4096, Access::remote_read_write());
    let (mem_b, mr_b) = buffer(&dev, 4096, Access::remote_read_write());
    mem_a.fill(0, 64, 7).unwrap();
    let rs = [mr_b.sge(1000, 16).unwrap()];
    l.b.post_recv(&[
        RecvWr {
            wr_id: 5,
            sges: &rs,
        },
        RecvWr {
            wr_id: 6,
            sges: &rs,
        },
    ])
    .unwrap();
    let s = [mr_a.sge(0, 64).unwrap()];
    l.a.post_send(&[SendWr::send(2, &s, None), SendWr::send(3, &s, None)])
        .unwrap();
    let c = reap(&l.a_send, 2);
    let r = reap(&l.b_recv, 2);
    println!("send longer than the receive: requester {c:?} responder {r:?}");
    let want = rig.expect(
        "receive_shorter_than_the_send",
        (WcStatus::RemoteInvalidRequest, WcStatus::LocalLength),
        (WcStatus::RemoteOperation, WcStatus::LocalQpOperation),
    );
    assert_eq!((c[0].wr_id, r[0].wr_id), (2, 5));
    assert_eq!((c[0].status, r[0].status), want);
    assert_eq!(status_of(&c[1..]), [(3, WcStatus::WrFlush)]);
    assert_eq!(status_of(&r[1..]), [(6, WcStatus::WrFlush)]);
    assert_error_completions(&c, l.a.qp_num());
    assert_error_completions(&r, l.b.qp_num());
    assert_eq!(mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096]);
    assert_eq!(l.a.state().unwrap(), QpState::Error);
    assert_eq!(settle(&l.b, QpState::Error), QpState::Error);
}

#[test]
fn receive_too_small() {
    each(
        "receive_shorter_than_the_send",
        receive_shorter_than_the_send,
    );
}

/// Moving a QP to error with sends (one stuck on RNR, signaled and
/// unsignaled ones behind it) and receives outstanding flushes all of
/// them, each in posting order; the peer is not affected.
fn into_error_flushes_outstanding_work(rig: &Rig) {
    let dev = open(rig);
    let mut l = link(&dev, LinkOpts::default());
    let (mem_a, mr_a) = buffer(&dev, 4096, Access::remote_read_write());
    let (_mem_b, mr_b) = buffer(&dev, 4096, Access::remote_read_write());
    mem_a.fill(0, 4096, 9).unwrap();
    let rs = [mr_a.sge(2048, 64).unwrap()];
    l.a.post_recv(&[
        RecvWr {
            wr_id: 21,
            sges: &rs,
        },
        RecvWr {
            wr_id: 22,
            sges: &rs,
        },
    ])
    .unwrap();
    let s = [mr_a.sge(0, 64).unwrap()];
    l.a.post_send(&[
        SendWr::send(1, &s, None),
        SendWr::write(2, &s, mr_b.remote(0).unwrap()).signaled(false),
        SendWr::write(3, &s, mr_b.remote(64).unwrap()),
    ])
    .unwrap();
    // The SEND waits for a receive (RNR retried forever), the rest behind it.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(drain(&l.a_send), [], "nothing completes before the error");
    let Link {
        a,
        b,
        a_send,
        a_recv,
        b_send,
        b_recv,
    } = l;
    let qa = a.qp_num();
    let a = a.into_error().expect("to error");
    let c = reap(&a_send, 3);
    assert_eq!(
        status_of(&c),
        [
            (1, WcStatus::WrFlush),
            (2, WcStatus::WrFlush),
            (3, WcStatus::WrFlush)
        ]
    );
    assert_error_completions(&c, qa);
    let r = reap(&a_recv, 2);
    assert_eq!(
        status_of(&r),
        [(21, WcStatus::WrFlush), (22, WcStatus::WrFlush)]
    );
    assert_error_completions(&r, qa);
    assert_eq!(a.state().unwrap(), QpState::Error);
    assert_eq!(b.state().unwrap(), QpState::Rts, "the peer is not affected");
    assert_eq!(drain(&b_send), []);
    assert_eq!(drain(&b_recv), []);
}

#[test]
fn into_error_flushes() {
    each(
        "into_error_flushes_outstanding_work",
        into_error_flushes_outstanding_work,
    );
}

/// When a receive posted to an errored QP flushes.
#[derive(Debug)]
enum Flush {
    FlushesAtOnce,
    FlushesAfterModifyToError,
}

/// Posting to a QP the device moved to the error state (a failed request):
/// the post succeeds and every request, signaled or not, flushes.
fn post_on_an_error_qp(rig: &Rig) {
    let dev = open(rig);
    let mut f = failing(
        &dev,
        LinkOpts::default(),
        Access::remote_read_write(),
        |a, b| {
            (
                write_to(RemoteAddr {
                    addr: b.addr(),
                    rkey: b.rkey().wrapping_add(0x1000),
                }),
                vec![a.sge(0, 64).unwrap()],
            )
        },
    );
    let s = [f.mr_a.sge(0, 64).unwrap()];
    let r = f.mr_b.remote(0).unwrap();
    f.link
        .a
        .post_send(&[
            SendWr::write(31, &s, r),
            SendWr::write(32, &s, r).signaled(false),
            SendWr::send(33, &s, None),
        ])
        .expect("posting to an error qp succeeds");
    let c = reap(&f.link.a_send, 3);
    assert_eq!(
        status_of(&c),
        [
            (31, WcStatus::WrFlush),
            (32, WcStatus::WrFlush),
            (33, WcStatus::WrFlush)
        ]
    );
    assert_error_completions(&c, f.link.a.qp_num());
    let rs = [f.mr_a.sge(1024, 64).unwrap()];
    f.link
        .a
        .post_recv(&[RecvWr {
            wr_id: 41,
            sges: &rs,
        }])
        .expect("posting a receive to an error qp succeeds");
    let when = rig.expect(
        "receive_posted_on_an_error_qp",
        Flush::FlushesAtOnce,
        Flush::FlushesAfterModifyToError,
    );
    let qpn = f.link.a.qp_num();
    let Failed { link, mem_b, .. } = f;
    let r = match when {
        Flush::FlushesAtOnce => reap(&link.a_recv, 1),
        Flush::FlushesAfterModifyToError => {
            let early = drain(&link.a_recv);
            println!("receive posted on an error qp, before into_error: {early:?}");
            let a = link.a.into_error().expect("to error");
            let r = [early, reap_up_to(&link.a_recv, 1, 60)].concat();
            assert_eq!(a.state().unwrap(), QpState::Error);
            r
        }
    };
    assert_eq!(status_of(&r), [(41, WcStatus::WrFlush)]);
    assert_error_completions(&r, qpn);
    assert_eq!(mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096]);
}

#[test]
fn post_on_error_qp() {
    each("post_on_an_error_qp", post_on_an_error_qp);
}

/// Draining a send queue the way the kernel's `ib_drain_sq` and the
/// engine's rail flush do: move a healthy QP to error on purpose
/// (`into_error`), then post a signaled marker (a zero-length WRITE with
/// rkey 0) on the `QueuePair<Errored>`. The work outstanding before the
/// transition flushes first, then the marker and everything posted after
/// it, in posting order, signaled or not; none of it executes (a WRITE
/// with a valid key posted behind the marker moves no byte), and the
/// healthy peer stays RTS with nothing completed.
fn post_after_into_error(rig: &Rig) {
    let dev = open(rig);
    let mut l = link(&dev, LinkOpts::default());
    let (mem_a, mr_a) = buffer(&dev, 4096, Access::remote_read_write());
    let (mem_b, mr_b) = buffer(&dev, 4096, Access::remote_read_write());
    mem_a.fill(0, 4096, 0x5a).unwrap();
    let s = [mr_a.sge(0, 64).unwrap()];
    // A SEND stuck on RNR (no receive at b, retried forever).
    l.a.post_send(&[SendWr::send(1, &s, None)]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(drain(&l.a_send), [], "nothing completes before the error");
    let Link {
        a,
        b,
        a_send,
        a_recv,
        b_send,
        b_recv,
    } = l;
    let qa = a.qp_num();
    let mut a = a.into_error().expect("to error");
    let marker = SendWr {
        wr_id: 9,
        op: SendOp::Write {
            remote: RemoteAddr { addr: 0, rkey: 0 },
            imm: None,
        },
        sges: &[],
        signaled: true,
    };
    let s2 = [mr_a.sge(64, 64).unwrap()];
    a.post_send(&[
        marker,
        SendWr::write(10, &s2, mr_b.remote(1024).unwrap()),
        SendWr::write(11, &s2, mr_b.remote(2048).unwrap()).signaled(false),
        SendWr::send(12, &s2, None),
    ])
    .expect("posting to a qp moved to error succeeds");
    let c = reap(&a_send, 5);
    assert_eq!(
        status_of(&c),
        [
            (1, WcStatus::WrFlush),
            (9, WcStatus::WrFlush),
            (10, WcStatus::WrFlush),
            (11, WcStatus::WrFlush),
            (12, WcStatus::WrFlush)
        ],
        "earlier work first, then the marker and what follows, in order"
    );
    assert_error_completions(&c, qa);
    assert_eq!(a.state().unwrap(), QpState::Error);
    // Receives posted to it flush too (rxe: once moved to error again).
    let rs = [mr_a.sge(1024, 64).unwrap()];
    a.post_recv(&[RecvWr {
        wr_id: 41,
        sges: &rs,
    }])
    .expect("posting a receive to a qp moved to error succeeds");
    let r = match rig.expect(
        "receive_posted_on_an_error_qp",
        Flush::FlushesAtOnce,
        Flush::FlushesAfterModifyToError,
    ) {
        Flush::FlushesAtOnce => reap(&a_recv, 1),
        Flush::FlushesAfterModifyToError => {
            let early = drain(&a_recv);
            println!("receive posted after into_error, before the second: {early:?}");
            let a = a.into_error().expect("to error again");
            let r = [early, reap_up_to(&a_recv, 1, 60)].concat();
            assert_eq!(a.state().unwrap(), QpState::Error);
            r
        }
    };
    assert_eq!(status_of(&r), [(41, WcStatus::WrFlush)]);
    assert_error_completions(&r, qa);
    // The peer saw nothing: no byte, no completion, still ready.
    assert_eq!(mem_b.to_vec(0, 4096).unwrap(), vec![0; 4096]);
    assert_eq!(b.state().unwrap(), QpState::Rts, "the peer is not affected");
    assert_eq!(drain(&b_send), []);
    assert_eq!(drain(&b_recv), []);
}

#[test]
fn post_after_into_error_flushes_and_never_executes() {
    each("post_after_into_error", post_after_into_error);
}

/// A batch whose third request fails: the signaled success before it
/// completes, the unsignaled one does not, the error comes in posting
/// order, and everything after it flushes (signaled or not).
fn error_in_the_middle_of_a_batch(rig: &Rig) {
    let dev = open(rig);
    let mut l = link(&dev, LinkOpts::default());
    let (mem_a, mr_a) = buffer(&dev, 4096, Access::remote_read_write());
    let (mem_b, mr_b) = buffer(&dev, 4096, Access::remote_read_write());
    mem_a.fill(0, 4096, 0x33).unwrap();
    let s = [mr_a.sge(0, 64).unwrap()];
    let bad = RemoteAddr {
        addr: mr_b.addr(),
        rkey: mr_b.rkey().wrapping_add(0x1000),
    };
    l.a.post_send(&[
        SendWr::write(1, &s, mr_b.remote(0).unwrap()),
        SendWr::write(2, &s, mr_b.remote(64).unwrap()).signaled(false),
        SendWr::write(3, &s, bad),
        SendWr::write(4, &s, mr_b.remote(128).unwrap()).signaled(false),
        SendWr::write(5, &s, mr_b.remote(192).unwrap()),
    ])
    .unwrap();
    let qa = l.a.qp_num();
    let c = reap(&l.a_send, 4);
    assert_eq!(c[0], ok(1, WcOpcode::RdmaWrite, 64, qa));
    assert_eq!(
        status_of(&c[1..]),
        [
            (3, WcStatus::RemoteAccess),
            (4, WcStatus::WrFlush),
            (5, WcStatus::WrFlush)
        ]
    );
    assert_error_completions(&c[1..], qa);
    assert_eq!(
        mem_b.to_vec(0, 128).unwrap(),
        vec![0x33; 128],
        "1 and 2 landed"
    );
    assert_eq!(mem_b.to_vec(128, 4096 - 128).unwrap(), vec![0; 4096 - 128]);
}

#[test]
fn error_mid_batch() {
    each(
        "error_in_the_middle_of_a_batch",
        error_in_the_middle_of_a_batch,
    );
}

/// The requester sends from a PSN the responder does not expect: the
/// responder drops the packets and the request ends `RetryExceeded` (the
/// sim at once, a device after its retries) with no byte written.
fn psn_mismatch(rig: &Rig) {
    let dev = open(rig);
    let cq = || dev.ctx.create_cq(16).unwrap();
    let (a_send, b_cq) = (cq(), cq());
    let a = dev
        .pd
        .create_qp(&a_send, &a_send, QpCaps::default())
        .unwrap();
    let b = dev.pd.create_qp(&b_cq, &b_cq, QpCaps::default()).unwrap();
    let (ea, eb) = (
        a.endpoint(dev.route, 1000, dev.mtu),
        b.endpoint(dev.route, 2000, dev.mtu),
    );
    let rts = |psn| RtsAttrs {
        timeout: 8,
        retry_cnt: 1,
        ..RtsAttrs::new(psn)
    };
    // `a` sends from 5000; `b` expects 1000.
    let mut a = a
        .connect(
            InitAttrs::new(dev.port),
            RtrAttrs::new(eb, dev.gid_index),
            rts(5000),
        )
        .unwrap();
    let b = b
        .connect(
            InitAttrs::new(dev.port),
            RtrAttrs::new(ea, dev.gid_index),
            rts(2000),
        )
        .unwrap();
    let (mem, mr) = buffer(&dev, 4096, Access::remote_read_write());
    mem.fill(0, 64, 1).unwrap();
    let s = [mr.sge(0, 64).unwrap()];
    a.post_send(&[SendWr::write(1, &s, mr.remote(1000).unwrap())])
        .unwrap();
    let c = reap(&a_send, 1);
    assert_eq!(status_of(&c), [(1, WcStatus::RetryExceeded)]);
    assert_error_completions(&c, a.qp_num());
    assert_eq!(mem.to_vec(1000, 64).unwrap(), vec![0; 64], "no byte landed");
    assert_eq!(a.state().unwrap(), QpState::Error);
    assert_eq!(
        b.state().unwrap(),
        QpState::Rts,
        "the responder is not affected"
    );
    assert_eq!(drain(&b_cq), []);
}

#[test]
fn psn_mismatch_is_retry_exceeded() {
    each("psn_mismatch", psn_mismatch);
}

/// Every row of the table is documented in docs/verbs.md, and its
/// reason is not empty.
#[test]
fn differences_are_documented() {
    let doc = include_str!("../../../docs/verbs.md");
    for d in DIFFERENCES {
        assert!(!d.reason.is_empty(), "{}", d.scenario);
        assert!(
            doc.contains(d.scenario),
            "docs/verbs.md does not name the difference {:?}",
            d.scenario
        );
    }
}
