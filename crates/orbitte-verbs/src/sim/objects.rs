//! The sim's backend objects: thin ids into the fabric state.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use orbitte_memory::DmaBuffer;

use super::Shared;
use super::state::{
    CqRec, CqRing, Doorbell, FaultState, MrRec, PendingRecv, PendingSend, QpKey, QpRec, Retired,
    SendFaultKind, Sges,
};
use crate::backend::{ContextOps, CqOps, Destroy, MrOps, PdOps, QpOps, Transition};
use crate::error::{
    AllocPdError, AsyncEventError, CreateCqError, CreateQpError, ModifyError, NativeError,
    ObjectKind, PollError, PostError, PostErrorKind, QueryError, RegisterError, WaitError,
};
use crate::types::{
    Access, AsyncEvent, DeviceAttr, GidEntry, LinkLayer, NodeAccess, PortAttr, QpCaps, QpState,
    Route,
};
use crate::wr::{Completion, RecvWr, SendWr};

const EINVAL: i32 = libc::EINVAL;

/// Longest single wait (a year): `Duration::MAX` means "forever" to callers
/// and must not overflow `Instant`.
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// Waits on `cond` (paired with `lock`) until `check` finds something
/// (`Some`) or `timeout` passes (`None`). `check` runs under `lock`, first
/// before any wait.
fn wait_for<S, T>(
    lock: &Mutex<S>,
    cond: &Condvar,
    timeout: Duration,
    mut check: impl FnMut(&mut S) -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout.min(MAX_WAIT);
    let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(found) = check(&mut st) {
            return Some(found);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        st = cond
            .wait_timeout(st, deadline - now)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

fn destroy_fault(
    shared: &Shared,
    device: usize,
    kind: ObjectKind,
    call: &'static str,
) -> Result<(), NativeError> {
    match shared.lock().faults.destroy(device, kind) {
        Some(errno) => Err(NativeError::new(call, errno)),
        None => Ok(()),
    }
}

/// Opens device `d`: EACCES without uverbs access, or an injected failure.
pub(crate) fn open(shared: &Arc<Shared>, d: usize) -> Result<SimContext, NativeError> {
    if let NodeAccess::Denied { errno } = shared.desc.devices[d].uverbs_access {
        return Err(NativeError::new("ibv_open_device", errno));
    }
    if shared.desc.devices[d].uverbs_access == NodeAccess::Missing {
        return Err(NativeError::new("ibv_open_device", libc::ENODEV));
    }
    let mut st = shared.lock();
    if let Some(errno) = FaultState::count(&mut st.faults.opens, d) {
        return Err(NativeError::new("ibv_open_device", errno));
    }
    let id = st.id();
    st.contexts.insert(id, (d, VecDeque::new()));
    Ok(SimContext {
        shared: shared.clone(),
        id,
        device: d,
    })
}

#[derive(Debug)]
pub(crate) struct SimContext {
    shared: Arc<Shared>,
    id: u64,
    device: usize,
}

impl SimContext {
    fn port_desc(&self, port: u8) -> Result<&super::SimPortDesc, QueryError> {
        let ports = &self.shared.desc.devices[self.device].ports;
        usize::from(port)
            .checked_sub(1)
            .and_then(|i| ports.get(i))
            .ok_or(QueryError::InvalidPort {
                port,
                ports: ports.len() as u8,
            })
    }
}

impl Destroy for SimContext {
    fn destroy(&self) -> Result<(), NativeError> {
        destroy_fault(
            &self.shared,
            self.device,
            ObjectKind::Context,
            "ibv_close_device",
        )?;
        self.shared.lock().contexts.remove(&self.id);
        Ok(())
    }
}

impl ContextOps for SimContext {
    fn query_device(&self) -> Result<DeviceAttr, QueryError> {
        let d = &self.shared.desc.devices[self.device];
        Ok(DeviceAttr {
            phys_port_cnt: d.ports.len() as u8,
            max_mr: d.max_mr,
            max_mr_size: d.max_mr_size,
            max_qp: d.max_qp,
            max_qp_wr: d.max_qp_wr,
            max_sge: d.max_sge,
            max_cqe: d.max_cqe,
            max_qp_rd_atom: 16,
            fw_ver: "sim".to_owned(),
        })
    }

    fn query_port(&self, port: u8) -> Result<PortAttr, QueryError> {
        let desc = self.port_desc(port)?;
        let state = self.shared.lock().devs[self.device].ports[usize::from(port) - 1];
        Ok(PortAttr {
            port,
            state,
            link_layer: desc.link_layer,
            max_mtu: desc.max_mtu,
            active_mtu: desc.active_mtu,
            width: desc.width,
            speed: desc.speed,
            lid: desc.lid,
            gid_table_len: desc.gids.len() as u32,
        })
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, QueryError> {
        let desc = self.port_desc(port)?;
        let len = desc.gids.len() as u32;
        let mut e = desc
            .gids
            .get(index as usize)
            .cloned()
            .ok_or(QueryError::InvalidGidIndex { port, index, len })?;
        e.index = index;
        Ok(e)
    }

    fn alloc_pd(&self) -> Result<Box<dyn PdOps>, AllocPdError> {
        let mut st = self.shared.lock();
        let id = st.id();
        st.pds.insert(id, self.device);
        Ok(Box::new(SimPd {
            shared: self.shared.clone(),
            id,
            device: self.device,
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Box<dyn CqOps>, CreateCqError> {
        let max = self.shared.desc.devices[self.device].max_cqe;
        if depth == 0 || depth > max {
            return Err(CreateCqError::InvalidDepth { depth, max });
        }
        let mut st = self.shared.lock();
        let id = st.id();
        let ring = Arc::new(CqRing::default());
        st.cqs.insert(
            id,
            CqRec {
                device: self.device,
                depth,
                ring: ring.clone(),
            },
        );
        Ok(Box::new(SimCq {
            ring,
            shared: self.shared.clone(),
            id,
            device: self.device,
        }))
    }

    fn next_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>, AsyncEventError> {
        Ok(wait_for(
            &self.shared.state,
            &self.shared.cond,
            timeout,
            |st| st.contexts.get_mut(&self.id).and_then(|c| c.1.pop_front()),
        ))
    }
}

#[derive(Debug)]
struct SimPd {
    shared: Arc<Shared>,
    id: u64,
    device: usize,
}

impl Destroy for SimPd {
    fn destroy(&self) -> Result<(), NativeError> {
        destroy_fault(
            &self.shared,
            self.device,
            ObjectKind::ProtectionDomain,
            "ibv_dealloc_pd",
        )?;
        let mut st = self.shared.lock();
        // As the kernel: a PD that still holds a memory region is busy.
        if st.mrs.values().any(|m| m.pd == self.id) {
            return Err(NativeError::new("ibv_dealloc_pd", libc::EBUSY));
        }
        st.pds.remove(&self.id);
        Ok(())
    }
}

impl PdOps for SimPd {
    fn register(
        &self,
        buf: &Arc<dyn DmaBuffer>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MrOps>, RegisterError> {
        let identity = self.shared.identity(self.device);
        let desc = &self.shared.desc.devices[self.device];
        let err = |errno| RegisterError::Native {
            device: identity.clone(),
            len,
            source: NativeError::new("ibv_reg_mr", errno),
        };
        let mut st = self.shared.lock();
        if let Some(errno) = FaultState::count(&mut st.faults.regs, self.device) {
            return Err(err(errno));
        }
        if len as u64 > desc.max_mr_size {
            return Err(err(EINVAL));
        }
        if st.devs[self.device].mrs >= desc.max_mr {
            return Err(err(libc::ENOMEM));
        }
        let rt = &mut st.devs[self.device];
        rt.mrs += 1;
        let index = rt.next_key_index;
        rt.next_key_index += 1;
        let key = (index << 8) | (st.rng.next() & 0xff) as u32;
        let addr = buf.as_ptr() as u64 + offset as u64;
        st.mrs.insert(
            (self.device, key),
            MrRec {
                pd: self.id,
                buf: buf.clone(),
                offset,
                len,
                addr,
                access,
            },
        );
        Ok(Box::new(SimMr {
            shared: self.shared.clone(),
            device: self.device,
            key,
        }))
    }

    fn create_qp(
        &self,
        send_cq: &dyn CqOps,
        recv_cq: &dyn CqOps,
        caps: &QpCaps,
    ) -> Result<Box<dyn QpOps>, CreateQpError> {
        let identity = self.shared.identity(self.device);
        let desc = &self.shared.desc.devices[self.device];
        let cq_id = |cq: &dyn CqOps| cq.as_any().downcast_ref::<SimCq>().map(|c| c.id);
        let (Some(scq), Some(rcq)) = (cq_id(send_cq), cq_id(recv_cq)) else {
            return Err(CreateQpError::ForeignCq {
                cq_device: "native".into(),
                pd_device: identity.name,
            });
        };
        let too_big = |wr: u32, sge: u32| wr == 0 || wr > desc.max_qp_wr || sge > desc.max_sge;
        if too_big(caps.max_send_wr, caps.max_send_sge)
            || too_big(caps.max_recv_wr, caps.max_recv_sge)
        {
            return Err(CreateQpError::InvalidCaps {
                caps: *caps,
                max_wr: desc.max_qp_wr,
                max_sge: desc.max_sge,
            });
        }
        let mut st = self.shared.lock();
        if st.devs[self.device].qps >= desc.max_qp {
            return Err(CreateQpError::Native {
                device: identity,
                source: NativeError::new("ibv_create_qp", libc::ENOMEM),
            });
        }
        let rt = &mut st.devs[self.device];
        rt.qps += 1;
        let qpn = rt.next_qpn & 0x00ff_ffff;
        rt.next_qpn += 1;
        let doorbell = Arc::new(Mutex::new(Doorbell::default()));
        let retired = Arc::new(Retired::default());
        st.qps.insert(
            (self.device, qpn),
            QpRec {
                pd: self.id,
                send_cq: scq,
                recv_cq: rcq,
                caps: *caps,
                state: QpState::Reset,
                port: 0,
                access: Access::NONE,
                rtr: None,
                reaches: None,
                rts: None,
                sq: VecDeque::new(),
                rq: VecDeque::new(),
                doorbell: doorbell.clone(),
                rq_posted: 0,
                retired: retired.clone(),
                unsignaled: 0,
            },
        );
        Ok(Box::new(SimQp {
            shared: self.shared.clone(),
            key: (self.device, qpn),
            caps: *caps,
            doorbell,
            retired,
        }))
    }
}

#[derive(Debug)]
struct SimMr {
    shared: Arc<Shared>,
    device: usize,
    key: u32,
}

impl Destroy for SimMr {
    fn destroy(&self) -> Result<(), NativeError> {
        destroy_fault(
            &self.shared,
            self.device,
            ObjectKind::MemoryRegion,
            "ibv_dereg_mr",
        )?;
        let mut st = self.shared.lock();
        if st.mrs.remove(&(self.device, self.key)).is_some() {
            st.devs[self.device].mrs -= 1;
        }
        Ok(())
    }
}

impl MrOps for SimMr {
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
}

#[derive(Debug)]
pub(crate) struct SimCq {
    shared: Arc<Shared>,
    /// The queue's entries (`CqRec::ring`).
    ring: Arc<CqRing>,
    id: u64,
    device: usize,
}

impl Destroy for SimCq {
    fn destroy(&self) -> Result<(), NativeError> {
        destroy_fault(
            &self.shared,
            self.device,
            ObjectKind::CompletionQueue,
            "ibv_destroy_cq",
        )?;
        let removed = self.shared.lock().cqs.remove(&self.id);
        if let Some(rec) = removed {
            let mut q = rec.ring.lock();
            q.destroyed = true;
            rec.ring.refresh(&q);
            drop(q);
            rec.ring.bell.notify_all();
        }
        Ok(())
    }
}

impl CqOps for SimCq {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn poll(&self, out: &mut [Completion]) -> Result<usize, PollError> {
        if !self.ring.filled.load(Ordering::Acquire) {
            return Ok(0);
        }
        let mut q = self.ring.lock();
        if q.destroyed {
            return Ok(0);
        }
        if q.overflowed && q.entries.is_empty() {
            return Err(PollError::Native(NativeError::new(
                "ibv_poll_cq",
                libc::EOVERFLOW,
            )));
        }
        let mut n = 0;
        // Each polled completion frees its queue slots (and those of the
        // unsignaled requests it covers).
        while n < out.len() {
            let Some(e) = q.entries.pop_front() else {
                break;
            };
            out[n] = e.wc;
            e.slots.sq.fetch_add(e.sq_retire, Ordering::AcqRel);
            e.slots.rq.fetch_add(e.rq_retire, Ordering::AcqRel);
            n += 1;
        }
        self.ring.refresh(&q);
        Ok(n)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, WaitError> {
        let ready = wait_for(&self.ring.queue, &self.ring.bell, timeout, |q| {
            if q.destroyed {
                Some(false)
            } else if !q.entries.is_empty() || q.overflowed {
                Some(true)
            } else {
                None
            }
        });
        Ok(ready.unwrap_or(false))
    }
}

#[derive(Debug)]
struct SimQp {
    shared: Arc<Shared>,
    key: QpKey,
    caps: QpCaps,
    doorbell: Arc<Mutex<Doorbell>>,
    retired: Arc<Retired>,
}

impl SimQp {
    /// Posts on the lock-free path ([`Doorbell`]), or returns `None` when
    /// the QP is not in RTS and the post must take the fabric lock. Checks
    /// and results are those of the locked path for a QP in RTS.
    fn post_send_unlocked(&self, wrs: &[SendWr<'_>]) -> Option<Result<(), PostError>> {
        let qpn = self.key.1;
        let timing = self.shared.desc.timing;
        let mut db = self.doorbell.lock().unwrap_or_else(|e| e.into_inner());
        if !db.ready {
            return None;
        }
        let now = self.shared.start.elapsed();
        let before = db.rung.len();
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(kind) = db.check(wr, &self.caps, &self.retired) {
                result = Err(PostError { qpn, index, kind });
                break;
            }
            let due = db.accept(wr, now, &timing, 0);
            let seq = self.shared.seq.fetch_add(1, Ordering::Relaxed) + 1;
            db.rung.push(PendingSend::of(wr, due, seq, None));
        }
        let rung = db.rung.len() - before;
        drop(db);
        if rung > 0 {
            self.shared.rang(rung as u64);
        }
        Some(result)
    }

    fn invalid(&self, to: QpState, reason: impl Into<String>) -> ModifyError {
        ModifyError::InvalidAttr {
            to,
            reason: reason.into(),
        }
    }
}

impl Destroy for SimQp {
    fn destroy(&self) -> Result<(), NativeError> {
        destroy_fault(
            &self.shared,
            self.key.0,
            ObjectKind::QueuePair,
            "ibv_destroy_qp",
        )?;
        let mut st = self.shared.lock();
        if let Some(qp) = st.qps.remove(&self.key) {
            qp.doorbell().ready = false;
            st.devs[self.key.0].qps -= 1;
        }
        Ok(())
    }
}

impl QpOps for SimQp {
    fn qp_num(&self) -> u32 {
        self.key.1
    }

    fn modify(&self, t: &Transition) -> Result<(), ModifyError> {
        let to = t.target();
        let native = |errno| ModifyError::Native {
            qpn: self.key.1,
            to,
            source: NativeError::new("ibv_modify_qp", errno),
        };
        let dev = &self.shared.desc.devices[self.key.0];
        let mut st = self.shared.lock();
        let Some(qp) = st.qps.get_mut(&self.key) else {
            return Err(native(EINVAL));
        };
        match *t {
            Transition::Init(a) => {
                if qp.state != QpState::Reset {
                    return Err(native(EINVAL));
                }
                if a.port == 0 || usize::from(a.port) > dev.ports.len() {
                    return Err(self.invalid(
                        to,
                        format!("port {} does not exist on {}", a.port, dev.name),
                    ));
                }
                qp.port = a.port;
                qp.access = a.access;
                qp.set_state(QpState::Init);
            }
            Transition::Rtr(a) => {
                if qp.state != QpState::Init {
                    return Err(native(EINVAL));
                }
                let port = &dev.ports[usize::from(qp.port) - 1];
                if a.path_mtu > port.active_mtu {
                    return Err(self.invalid(
                        to,
                        format!(
                            "path mtu {} above the port's active mtu {}",
                            a.path_mtu.bytes(),
                            port.active_mtu.bytes()
                        ),
                    ));
                }
                match a.remote.route {
                    Route::Gid(_) => {
                        if !port
                            .gids
                            .get(usize::from(a.sgid_index))
                            .is_some_and(|g| g.valid)
                        {
                            return Err(self.invalid(
                                to,
                                format!("source gid index {} is not a valid entry", a.sgid_index),
                            ));
                        }
                    }
                    Route::Lid(_) if port.link_layer == LinkLayer::Ethernet => {
                        return Err(self.invalid(to, "an ethernet (RoCE) port needs a gid route"));
                    }
                    Route::Lid(_) => {}
                }
                qp.rtr = Some(a);
                qp.reaches = super::exec::route_target(
                    &self.shared,
                    self.key.0,
                    qp.port,
                    a.sgid_index,
                    a.remote.route,
                )
                .map(|(d, p, _)| (d, p));
                qp.set_state(QpState::Rtr);
            }
            Transition::Rts(a) => {
                if qp.state != QpState::Rtr {
                    return Err(native(EINVAL));
                }
                qp.rts = Some(a);
                qp.set_state(QpState::Rts);
            }
            Transition::Error => {
                st.qp_to_error(&self.shared, self.key, None);
                let bells = st.take_bells();
                drop(st);
                super::state::ring(&bells);
                self.shared.wake_all();
            }
        }
        Ok(())
    }

    fn state(&self) -> Result<QpState, QueryError> {
        let st = self.shared.lock();
        Ok(st.qps.get(&self.key).map_or(QpState::Error, |q| q.state))
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        if self.shared.lock_free_posts()
            && let Some(r) = self.post_send_unlocked(wrs)
        {
            return r;
        }
        let qpn = self.key.1;
        let err = |index, kind| PostError { qpn, index, kind };
        let name = &self.shared.desc.devices[self.key.0].name;
        let timing = self.shared.desc.timing;
        let mut st = self.shared.lock();
        let now = self.shared.now(&st);
        for (i, wr) in wrs.iter().enumerate() {
            let Some(qp) = st.qps.get(&self.key) else {
                return Err(err(i, PostErrorKind::InvalidState(QpState::Error)));
            };
            if !matches!(qp.state, QpState::Rts | QpState::Error) {
                return Err(err(i, PostErrorKind::InvalidState(qp.state)));
            }
            if let Err(kind) = qp.doorbell().check(wr, &qp.caps, &qp.retired) {
                return Err(err(i, kind));
            }
            let errored = qp.state == QpState::Error;
            let (depth, state) = (qp.caps.max_send_wr, qp.state);
            let fault = st.faults.send(name, qpn, state);
            if let Some(SendFaultKind::RefusePost { errno }) = fault {
                // As the native provider reports a refused post: ENOMEM is a
                // full queue, anything else the driver's errno. The requests
                // before this one stay posted.
                let kind = if errno == libc::ENOMEM {
                    PostErrorKind::QueueFull { depth }
                } else {
                    PostErrorKind::Native(NativeError::new("ibv_post_send", errno))
                };
                let bells = st.take_bells();
                drop(st);
                super::state::ring(&bells);
                self.shared.wake_all();
                return Err(err(i, kind));
            }
            let jitter = if timing.jitter.is_zero() {
                0
            } else {
                st.rng.next() % (timing.jitter.as_nanos() as u64 + 1)
            };
            let seq = self.shared.seq.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(sent) = st.sent.as_mut() {
                sent.push(super::SentWr {
                    device: name.clone(),
                    qpn,
                    wr_id: wr.wr_id,
                    op: wr.op,
                    sges: wr.sges.to_vec(),
                });
            }
            let Some(qp) = st.qps.get_mut(&self.key) else {
                continue;
            };
            let due = qp.doorbell().accept(wr, now, &timing, jitter);
            let pending = PendingSend::of(wr, due, seq, fault);
            if errored {
                st.complete_send(self.key, &pending, crate::wr::WcStatus::WrFlush, 0);
            } else {
                qp.sq.push_back(pending);
            }
        }
        // New work wakes the fabric thread; a post to a QP in the error
        // state rings the bell of the queue it flushed to.
        let bells = st.take_bells();
        drop(st);
        super::state::ring(&bells);
        self.shared.wake_work();
        Ok(())
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let qpn = self.key.1;
        let err = |index, kind| PostError { qpn, index, kind };
        let mut st = self.shared.lock();
        for (i, wr) in wrs.iter().enumerate() {
            let Some(qp) = st.qps.get_mut(&self.key) else {
                return Err(err(i, PostErrorKind::InvalidState(QpState::Error)));
            };
            if !matches!(
                qp.state,
                QpState::Init | QpState::Rtr | QpState::Rts | QpState::Error
            ) {
                return Err(err(i, PostErrorKind::InvalidState(qp.state)));
            }
            if wr.sges.len() > qp.caps.max_recv_sge as usize {
                return Err(err(
                    i,
                    PostErrorKind::TooManySges {
                        sges: wr.sges.len(),
                        max: qp.caps.max_recv_sge,
                    },
                ));
            }
            if qp.rq_outstanding() >= qp.caps.max_recv_wr {
                return Err(err(
                    i,
                    PostErrorKind::QueueFull {
                        depth: qp.caps.max_recv_wr,
                    },
                ));
            }
            qp.rq_posted = qp.rq_posted.wrapping_add(1);
            if qp.state == QpState::Error {
                st.complete_recv(
                    self.key,
                    wr.wr_id,
                    crate::wr::WcStatus::WrFlush,
                    crate::wr::WcOpcode::Recv,
                    0,
                    None,
                );
            } else {
                qp.rq.push_back(PendingRecv {
                    wr_id: wr.wr_id,
                    sges: Sges::from_slice(wr.sges),
                });
            }
        }
        let bells = st.take_bells();
        drop(st);
        super::state::ring(&bells);
        self.shared.wake_all();
        Ok(())
    }
}
