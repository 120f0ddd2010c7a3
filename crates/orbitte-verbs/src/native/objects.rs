//! Native backend objects: raw libibverbs pointers behind the backend
//! traits. The handle layer guarantees each is destroyed once, after its
//! children, and never used after a successful destroy.

use std::any::Any;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orbitte_memory::DmaBuffer;
use orbitte_verbs_sys::bindings as b;
use orbitte_verbs_sys::{self as sys, Verbs};

use super::sysfs;
use crate::backend::{ContextOps, CqOps, Destroy, MrOps, PdOps, QpOps, Transition};
use crate::error::{
    AllocPdError, AsyncEventError, CreateCqError, CreateQpError, ModifyError, NativeError,
    PollError, PostError, PostErrorKind, QueryError, RegisterError, WaitError,
};
use crate::types::{
    Access, AsyncEvent, DeviceAttr, DeviceIdentity, Gid, GidEntry, GidType, LinkLayer, Mtu,
    PortAttr, PortState, QpCaps, QpState, Route, Speed, Width,
};
use crate::wr::{Completion, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

// `Sge` is handed to the NIC as `ibv_sge` without copying.
const _: () = {
    assert!(size_of::<Sge>() == size_of::<b::ibv_sge>());
    assert!(align_of::<Sge>() == align_of::<b::ibv_sge>());
    assert!(std::mem::offset_of!(Sge, addr) == std::mem::offset_of!(b::ibv_sge, addr));
    assert!(std::mem::offset_of!(Sge, length) == std::mem::offset_of!(b::ibv_sge, length));
    assert!(std::mem::offset_of!(Sge, lkey) == std::mem::offset_of!(b::ibv_sge, lkey));
};

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A verbs return code as an errno (some return `errno`, some `-errno`,
/// a few -1 with `errno` set).
fn rc_errno(rc: i32) -> i32 {
    match rc {
        -1 => errno(),
        r if r < 0 => -r,
        r => r,
    }
}

/// `Ok` for a verbs call that returned 0, else the call's native error.
fn rc_check(call: &'static str, rc: i32) -> Result<(), NativeError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(NativeError::new(call, rc_errno(rc)))
    }
}

fn set_nonblocking(fd: RawFd) -> Result<(), i32> {
    // SAFETY: fcntl on an fd owned by libibverbs for this context; only
    // the O_NONBLOCK status flag changes.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(errno());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(errno());
    }
    Ok(())
}

/// Waits until `fd` is readable or `timeout` passes. `Ok(true)` when
/// readable (or interrupted: callers treat it as a spurious wakeup).
fn wait_readable(fd: RawFd, timeout: Duration) -> Result<bool, i32> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    match rc {
        0 => Ok(false),
        n if n > 0 => Ok(true),
        _ => match errno() {
            libc::EINTR => Ok(true),
            e => Err(e),
        },
    }
}

/// An open device.
#[derive(Debug)]
pub(super) struct NativeContext {
    verbs: Arc<Verbs>,
    ctx: NonNull<b::ibv_context>,
    identity: DeviceIdentity,
    ports: u8,
    max_cqe: u32,
    /// GID table length per port (index = port - 1), read at open.
    gid_lens: Vec<u32>,
}

// SAFETY: libibverbs contexts are thread safe (rdma-core documents every
// verb as safe to call from any thread); the pointer is only used through
// verbs, and the handle layer keeps it alive while used.
unsafe impl Send for NativeContext {}
// SAFETY: as for Send: shared use goes through thread-safe verbs only.
unsafe impl Sync for NativeContext {}

impl NativeContext {
    pub(super) fn open(
        verbs: Arc<Verbs>,
        dev: *mut b::ibv_device,
        identity: DeviceIdentity,
    ) -> Result<Self, NativeError> {
        // SAFETY: `dev` is a live entry of the caller's device list.
        let raw = unsafe { (verbs.ibv_open_device)(dev) };
        let Some(ctx) = NonNull::new(raw) else {
            return Err(NativeError::new("ibv_open_device", errno()));
        };
        let mut this = Self {
            verbs,
            ctx,
            identity,
            ports: 0,
            max_cqe: 0,
            gid_lens: Vec::new(),
        };
        // From here a failure closes the context through `destroy`.
        let init = (|| {
            // SAFETY: a live context; async_fd is a plain int field.
            let fd = unsafe { (*this.ctx.as_ptr()).async_fd };
            set_nonblocking(fd).map_err(|e| NativeError::new("fcntl(async_fd)", e))?;
            let attr = this.device_attr()?;
            this.ports = attr.phys_port_cnt;
            this.max_cqe = u32::try_from(attr.max_cqe).unwrap_or(0);
            for port in 1..=this.ports {
                let len = this.port_attr(port).map_or(0, |a| a.gid_tbl_len);
                this.gid_lens.push(u32::try_from(len).unwrap_or(0));
            }
            Ok(())
        })();
        if let Err(e) = init {
            let _ = this.destroy();
            return Err(e);
        }
        Ok(this)
    }

    fn device_attr(&self) -> Result<b::ibv_device_attr, NativeError> {
        let mut attr = b::ibv_device_attr::default();
        // SAFETY: live context and a writable attr struct.
        let rc = unsafe { (self.verbs.ibv_query_device)(self.ctx.as_ptr(), &mut attr) };
        rc_check("ibv_query_device", rc)?;
        Ok(attr)
    }

    fn native(&self, source: NativeError) -> QueryError {
        QueryError::Native {
            device: self.identity.clone(),
            source,
        }
    }

    fn port_attr(&self, port: u8) -> Result<b::ibv_port_attr, QueryError> {
        if port == 0 || port > self.ports {
            return Err(QueryError::InvalidPort {
                port,
                ports: self.ports,
            });
        }
        let mut attr = b::ibv_port_attr::default();
        // SAFETY: live context and a writable attr struct.
        let rc = unsafe { self.verbs.query_port(self.ctx.as_ptr(), port, &mut attr) };
        rc_check("ibv_query_port", rc).map_err(|e| self.native(e))?;
        Ok(attr)
    }
}

impl Destroy for NativeContext {
    fn destroy(&self) -> Result<(), NativeError> {
        // SAFETY: called once, after every child was destroyed (ownership).
        let rc = unsafe { (self.verbs.ibv_close_device)(self.ctx.as_ptr()) };
        rc_check("ibv_close_device", rc)
    }
}

fn c_chars(field: &[core::ffi::c_char]) -> String {
    super::c_field(field)
}

impl ContextOps for NativeContext {
    fn query_device(&self) -> Result<DeviceAttr, QueryError> {
        let a = self.device_attr().map_err(|e| self.native(e))?;
        let u = |v: i32| u32::try_from(v).unwrap_or(0);
        Ok(DeviceAttr {
            phys_port_cnt: a.phys_port_cnt,
            max_mr: u(a.max_mr),
            max_mr_size: a.max_mr_size,
            max_qp: u(a.max_qp),
            max_qp_wr: u(a.max_qp_wr),
            max_sge: u(a.max_sge),
            max_cqe: u(a.max_cqe),
            max_qp_rd_atom: u(a.max_qp_rd_atom),
            fw_ver: c_chars(&a.fw_ver),
        })
    }

    fn query_port(&self, port: u8) -> Result<PortAttr, QueryError> {
        let a = self.port_attr(port)?;
        Ok(PortAttr {
            port,
            state: PortState::from_raw(a.state),
            link_layer: LinkLayer::from_raw(a.link_layer),
            max_mtu: Mtu::from_raw(a.max_mtu).unwrap_or(Mtu::Mtu256),
            active_mtu: Mtu::from_raw(a.active_mtu).unwrap_or(Mtu::Mtu256),
            width: Width::from_raw(a.active_width),
            speed: Speed::from_raw(u32::from(a.active_speed)),
            lid: a.lid,
            gid_table_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
        })
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, QueryError> {
        if port == 0 || port > self.ports {
            return Err(QueryError::InvalidPort {
                port,
                ports: self.ports,
            });
        }
        let len = self
            .gid_lens
            .get(usize::from(port) - 1)
            .copied()
            .unwrap_or(0);
        if index >= len {
            return Err(QueryError::InvalidGidIndex { port, index, len });
        }
        let mut entry = b::ibv_gid_entry::default();
        // SAFETY: live context and a writable entry.
        let rc = unsafe {
            self.verbs
                .query_gid_ex(self.ctx.as_ptr(), u32::from(port), index, &mut entry, 0)
        };
        let invalid = GidEntry {
            index,
            gid: Gid::ZERO,
            valid: false,
            gid_type: None,
            netdev: None,
        };
        match rc {
            0 => {
                // SAFETY: every bit pattern of the union is a valid byte array.
                let gid = Gid(unsafe { entry.gid.raw });
                let gid_type = match entry.gid_type {
                    b::IBV_GID_TYPE_IB => Some(GidType::Ib),
                    b::IBV_GID_TYPE_ROCE_V1 => Some(GidType::RoceV1),
                    b::IBV_GID_TYPE_ROCE_V2 => Some(GidType::RoceV2),
                    _ => None,
                };
                Ok(GidEntry {
                    index,
                    gid,
                    valid: !gid.is_zero(),
                    gid_type,
                    netdev: sysfs::ifname(entry.ndev_ifindex),
                })
            }
            // An empty table entry.
            libc::ENODATA => Ok(invalid),
            // Library older than rdma-core 32: plain query plus sysfs.
            libc::EOPNOTSUPP => {
                let mut raw = b::ibv_gid::default();
                let i = i32::try_from(index).unwrap_or(i32::MAX);
                // SAFETY: live context and a writable gid.
                let rc =
                    unsafe { (self.verbs.ibv_query_gid)(self.ctx.as_ptr(), port, i, &mut raw) };
                rc_check("ibv_query_gid", rc).map_err(|e| self.native(e))?;
                // SAFETY: every bit pattern of the union is a valid byte array.
                let gid = Gid(unsafe { raw.raw });
                if gid.is_zero() {
                    return Ok(invalid);
                }
                let name = &self.identity.name;
                Ok(GidEntry {
                    index,
                    gid,
                    valid: true,
                    gid_type: sysfs::gid_type(name, port, index),
                    netdev: sysfs::gid_netdev(name, port, index),
                })
            }
            other => Err(self.native(NativeError::new("ibv_query_gid_ex", rc_errno(other)))),
        }
    }

    fn alloc_pd(&self) -> Result<Box<dyn PdOps>, AllocPdError> {
        // SAFETY: live context.
        let raw = unsafe { (self.verbs.ibv_alloc_pd)(self.ctx.as_ptr()) };
        let Some(pd) = NonNull::new(raw) else {
            return Err(AllocPdError::Native {
                device: self.identity.clone(),
                source: NativeError::new("ibv_alloc_pd", errno()),
            });
        };
        Ok(Box::new(NativePd {
            verbs: self.verbs.clone(),
            pd,
            identity: self.identity.clone(),
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Box<dyn CqOps>, CreateCqError> {
        if depth == 0 || depth > self.max_cqe {
            return Err(CreateCqError::InvalidDepth {
                depth,
                max: self.max_cqe,
            });
        }
        let native = |call, errno| CreateCqError::Native {
            device: self.identity.clone(),
            source: NativeError::new(call, errno),
        };
        // SAFETY: live context.
        let raw = unsafe { (self.verbs.ibv_create_comp_channel)(self.ctx.as_ptr()) };
        let Some(channel) = NonNull::new(raw) else {
            return Err(native("ibv_create_comp_channel", errno()));
        };
        let destroy_channel = || {
            // SAFETY: the channel was created above and has no CQ.
            unsafe { (self.verbs.ibv_destroy_comp_channel)(channel.as_ptr()) };
        };
        // SAFETY: a live channel; fd is a plain int field.
        let fd = unsafe { (*channel.as_ptr()).fd };
        if let Err(e) = set_nonblocking(fd) {
            destroy_channel();
            return Err(native("fcntl(comp_channel)", e));
        }
        let cqe = i32::try_from(depth).unwrap_or(i32::MAX);
        // SAFETY: live context and channel; no user context pointer.
        let raw = unsafe {
            (self.verbs.ibv_create_cq)(self.ctx.as_ptr(), cqe, ptr::null_mut(), channel.as_ptr(), 0)
        };
        let Some(cq) = NonNull::new(raw) else {
            let e = errno();
            destroy_channel();
            return Err(native("ibv_create_cq", e));
        };
        Ok(Box::new(NativeCq {
            verbs: self.verbs.clone(),
            cq,
            channel,
            fd,
            stash: Mutex::new(None),
        }))
    }

    fn next_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>, AsyncEventError> {
        let native = |call, e| AsyncEventError::Native(NativeError::new(call, e));
        // SAFETY: live context; async_fd is a plain int field.
        let fd = unsafe { (*self.ctx.as_ptr()).async_fd };
        if !wait_readable(fd, timeout).map_err(|e| native("poll(async_fd)", e))? {
            return Ok(None);
        }
        let mut ev = b::ibv_async_event::default();
        // SAFETY: live context (fd non-blocking), writable event.
        let rc = unsafe { (self.verbs.ibv_get_async_event)(self.ctx.as_ptr(), &mut ev) };
        if rc != 0 {
            return match errno() {
                libc::EAGAIN | libc::EINTR => Ok(None),
                e => Err(native("ibv_get_async_event", e)),
            };
        }
        // SAFETY: the union member read is the one `event_type` selects;
        // QP pointers stay valid until the event is acknowledged below.
        let event = unsafe {
            let port = || u8::try_from(ev.element.port_num).unwrap_or(0);
            let qpn = || {
                let qp = ev.element.qp;
                if qp.is_null() { 0 } else { (*qp).qp_num }
            };
            match ev.event_type {
                b::IBV_EVENT_PORT_ACTIVE => AsyncEvent::PortActive { port: port() },
                b::IBV_EVENT_PORT_ERR => AsyncEvent::PortError { port: port() },
                b::IBV_EVENT_GID_CHANGE => AsyncEvent::GidChange { port: port() },
                b::IBV_EVENT_QP_FATAL => AsyncEvent::QpFatal { qpn: qpn() },
                b::IBV_EVENT_QP_ACCESS_ERR => AsyncEvent::QpAccessError { qpn: qpn() },
                b::IBV_EVENT_QP_REQ_ERR => AsyncEvent::QpRequestError { qpn: qpn() },
                b::IBV_EVENT_CQ_ERR => AsyncEvent::CqError,
                b::IBV_EVENT_DEVICE_FATAL => AsyncEvent::DeviceFatal,
                raw => AsyncEvent::Other { raw },
            }
        };
        // SAFETY: acknowledges the event just read, once.
        unsafe { (self.verbs.ibv_ack_async_event)(&mut ev) };
        Ok(Some(event))
    }
}

#[derive(Debug)]
struct NativePd {
    verbs: Arc<Verbs>,
    pd: NonNull<b::ibv_pd>,
    identity: DeviceIdentity,
}

// SAFETY: a PD is used only through thread-safe verbs; the handle layer
// keeps it (and its context) alive while used.
unsafe impl Send for NativePd {}
// SAFETY: as for Send.
unsafe impl Sync for NativePd {}

impl Destroy for NativePd {
    fn destroy(&self) -> Result<(), NativeError> {
        // SAFETY: called once, after its MRs and QPs were destroyed.
        let rc = unsafe { (self.verbs.ibv_dealloc_pd)(self.pd.as_ptr()) };
        rc_check("ibv_dealloc_pd", rc)
    }
}

impl PdOps for NativePd {
    fn register(
        &self,
        buf: &Arc<dyn DmaBuffer>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MrOps>, RegisterError> {
        // The handle layer checked `offset + len <= buf.len()`.
        let addr = buf.as_ptr().wrapping_add(offset).cast();
        // SAFETY: a live PD; the range lies inside `buf`, which the memory
        // region handle keeps alive (and retains if dereg fails), so it
        // stays mapped until the MR is deregistered.
        let raw = unsafe {
            self.verbs
                .reg_mr(self.pd.as_ptr(), addr, len, access.bits())
        };
        let Some(mr) = NonNull::new(raw) else {
            return Err(RegisterError::Native {
                device: self.identity.clone(),
                len,
                source: NativeError::new("ibv_reg_mr", errno()),
            });
        };
        Ok(Box::new(NativeMr {
            verbs: self.verbs.clone(),
            mr,
        }))
    }

    fn create_qp(
        &self,
        send_cq: &dyn CqOps,
        recv_cq: &dyn CqOps,
        caps: &QpCaps,
    ) -> Result<Box<dyn QpOps>, CreateQpError> {
        let cq_of = |cq: &dyn CqOps| cq.as_any().downcast_ref::<NativeCq>().map(|c| c.cq);
        let (Some(scq), Some(rcq)) = (cq_of(send_cq), cq_of(recv_cq)) else {
            return Err(CreateQpError::ForeignCq {
                cq_device: "sim".into(),
                pd_device: self.identity.name.clone(),
            });
        };
        let mut init = b::ibv_qp_init_attr {
            send_cq: scq.as_ptr(),
            recv_cq: rcq.as_ptr(),
            cap: b::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: caps.max_recv_sge,
                max_inline_data: 0,
            },
            qp_type: b::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: a live PD and CQs of the same context (checked by the
        // handle layer, which also keeps them alive longer than the QP).
        let raw = unsafe { (self.verbs.ibv_create_qp)(self.pd.as_ptr(), &mut init) };
        let Some(qp) = NonNull::new(raw) else {
            return Err(CreateQpError::Native {
                device: self.identity.clone(),
                source: NativeError::new("ibv_create_qp", errno()),
            });
        };
        // SAFETY: a live QP; qp_num is a plain field.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        Ok(Box::new(NativeQp {
            verbs: self.verbs.clone(),
            qp,
            qpn,
            caps: *caps,
            port: std::sync::atomic::AtomicU8::new(1),
            scratch: Mutex::new(Scratch::default()),
        }))
    }
}

#[derive(Debug)]
struct NativeMr {
    verbs: Arc<Verbs>,
    mr: NonNull<b::ibv_mr>,
}

// SAFETY: an MR is only read (keys) and deregistered once; verbs are
// thread safe.
unsafe impl Send for NativeMr {}
// SAFETY: as for Send.
unsafe impl Sync for NativeMr {}

impl Destroy for NativeMr {
    fn destroy(&self) -> Result<(), NativeError> {
        // SAFETY: called once; the handle layer keeps the buffer alive
        // until this succeeds (and forever if it fails).
        let rc = unsafe { (self.verbs.ibv_dereg_mr)(self.mr.as_ptr()) };
        rc_check("ibv_dereg_mr", rc)
    }
}

impl MrOps for NativeMr {
    fn lkey(&self) -> u32 {
        // SAFETY: a live MR; lkey is a plain field.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: a live MR; rkey is a plain field.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
}

#[derive(Debug)]
struct NativeCq {
    verbs: Arc<Verbs>,
    cq: NonNull<b::ibv_cq>,
    channel: NonNull<b::ibv_comp_channel>,
    fd: RawFd,
    /// A completion `wait` polled while closing the arm/arrive race; the
    /// next `poll` returns it first. The lock also serializes polling.
    stash: Mutex<Option<Completion>>,
}

// SAFETY: polling and arming are serialized by `stash`; destroy happens
// once with no other user (ownership).
unsafe impl Send for NativeCq {}
// SAFETY: as for Send.
unsafe impl Sync for NativeCq {}

fn completion(wc: &b::ibv_wc) -> Completion {
    let status = WcStatus::from_raw(wc.status);
    let ok = status.is_success();
    // The immediate belongs to the receiver: only receive completions
    // define it. A requester's completion of a SEND or WRITE with
    // immediate may carry IBV_WC_WITH_IMM with an undefined value (mlx5,
    // rxe), so it is never reported there.
    let receive = matches!(wc.opcode, b::IBV_WC_RECV | b::IBV_WC_RECV_RDMA_WITH_IMM);
    let imm = (ok && receive && wc.wc_flags & b::IBV_WC_WITH_IMM != 0)
        // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate.
        .then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data }));
    Completion {
        wr_id: wc.wr_id,
        status,
        opcode: ok.then(|| WcOpcode::from_raw(wc.opcode)),
        byte_len: if ok { wc.byte_len } else { 0 },
        imm,
        qp_num: wc.qp_num,
        vendor_err: wc.vendor_err,
    }
}

impl NativeCq {
    fn poll_raw(&self, out: &mut [Completion]) -> Result<usize, PollError> {
        const CHUNK: usize = 16;
        let mut wcs = [b::ibv_wc::default(); CHUNK];
        let mut n = 0;
        while n < out.len() {
            let want = (out.len() - n).min(CHUNK);
            // SAFETY: a live CQ; `wcs` has room for `want` entries; polling
            // is serialized by the caller holding `stash`.
            let rc = unsafe { sys::ibv_poll_cq(self.cq.as_ptr(), want as i32, wcs.as_mut_ptr()) };
            if rc < 0 {
                return Err(PollError::Native(NativeError::new(
                    "ibv_poll_cq",
                    rc_errno(rc),
                )));
            }
            let got = rc as usize;
            for (o, wc) in out[n..].iter_mut().zip(&wcs[..got]) {
                *o = completion(wc);
            }
            n += got;
            if got < want {
                break;
            }
        }
        Ok(n)
    }
}

impl Destroy for NativeCq {
    fn destroy(&self) -> Result<(), NativeError> {
        // SAFETY: called once, after every QP using the CQ was destroyed;
        // every channel event was acknowledged in `wait`.
        let rc = unsafe { (self.verbs.ibv_destroy_cq)(self.cq.as_ptr()) };
        rc_check("ibv_destroy_cq", rc)?;
        // SAFETY: the channel's only CQ is gone.
        let rc = unsafe { (self.verbs.ibv_destroy_comp_channel)(self.channel.as_ptr()) };
        rc_check("ibv_destroy_comp_channel", rc)
    }
}

impl CqOps for NativeCq {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn poll(&self, out: &mut [Completion]) -> Result<usize, PollError> {
        let mut stash = self.stash.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        if !out.is_empty()
            && let Some(c) = stash.take()
        {
            out[0] = c;
            n = 1;
        }
        Ok(n + self.poll_raw(&mut out[n..])?)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, WaitError> {
        {
            let mut stash = self.stash.lock().unwrap_or_else(|e| e.into_inner());
            if stash.is_some() {
                return Ok(true);
            }
            // SAFETY: a live CQ with a completion channel.
            let rc = unsafe { sys::ibv_req_notify_cq(self.cq.as_ptr(), 0) };
            if rc != 0 {
                return Err(WaitError::Native(NativeError::new(
                    "ibv_req_notify_cq",
                    rc_errno(rc),
                )));
            }
            // A completion that arrived before arming raises no event.
            let mut one = [Completion::default()];
            let got = self
                .poll_raw(&mut one)
                .map_err(|PollError::Native(e)| WaitError::Native(e))?;
            if got == 1 {
                *stash = Some(one[0]);
                return Ok(true);
            }
        }
        let ready = wait_readable(self.fd, timeout)
            .map_err(|e| WaitError::Native(NativeError::new("poll(comp_channel)", e)))?;
        if ready {
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            // SAFETY: a live, non-blocking channel; out pointers valid.
            let rc =
                unsafe { (self.verbs.ibv_get_cq_event)(self.channel.as_ptr(), &mut cq, &mut ctx) };
            if rc == 0 && !cq.is_null() {
                // SAFETY: acknowledges the one event just read on this CQ.
                unsafe { (self.verbs.ibv_ack_cq_events)(cq, 1) };
            }
        }
        Ok(ready)
    }
}

/// Reused arrays of native work requests (no allocation per post once
/// grown).
#[derive(Default)]
struct Scratch {
    send: Vec<b::ibv_send_wr>,
    recv: Vec<b::ibv_recv_wr>,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("send_cap", &self.send.capacity())
            .finish()
    }
}

#[derive(Debug)]
struct NativeQp {
    verbs: Arc<Verbs>,
    qp: NonNull<b::ibv_qp>,
    qpn: u32,
    caps: QpCaps,
    /// Port from INIT, needed again for the RTR address vector.
    port: std::sync::atomic::AtomicU8,
    /// Serializes posting (the public API already posts through `&mut`).
    scratch: Mutex<Scratch>,
}

// SAFETY: posting is serialized by `scratch`; the raw WR arrays inside it
// point only at caller slices during a post call; other verbs are thread
// safe; destroy happens once with no other user.
unsafe impl Send for NativeQp {}
// SAFETY: as for Send.
unsafe impl Sync for NativeQp {}

impl Destroy for NativeQp {
    fn destroy(&self) -> Result<(), NativeError> {
        // SAFETY: called once; async events of the QP were acknowledged
        // when read.
        let rc = unsafe { (self.verbs.ibv_destroy_qp)(self.qp.as_ptr()) };
        rc_check("ibv_destroy_qp", rc)
    }
}

impl NativeQp {
    fn post_error(&self, index: usize, rc: i32, call: &'static str, depth: u32) -> PostError {
        let errno = rc_errno(rc);
        let kind = if errno == libc::ENOMEM {
            PostErrorKind::QueueFull { depth }
        } else {
            PostErrorKind::Native(NativeError::new(call, errno))
        };
        PostError {
            qpn: self.qpn,
            index,
            kind,
        }
    }

    /// Links the native work requests in `list` into one chain (each
    /// `next` points at the following entry; the last keeps its null) and
    /// hands its head and the bad-request out pointer to `post` (the verbs
    /// call `call`); a refusal names the position of the request the
    /// provider stopped at (the first when it named none), `depth` being
    /// the queue's depth for a full queue.
    fn post_chain<T>(
        &self,
        list: &mut Vec<T>,
        next: impl Fn(&mut T) -> &mut *mut T,
        call: &'static str,
        depth: u32,
        post: impl FnOnce(*mut T, &mut *mut T) -> i32,
    ) -> Result<(), PostError> {
        let base = list.as_mut_ptr();
        for i in 1..list.len() {
            *next(&mut list[i - 1]) = base.wrapping_add(i);
        }
        let mut bad = ptr::null_mut();
        let rc = post(base, &mut bad);
        if rc == 0 {
            return Ok(());
        }
        let index = if bad.is_null() {
            0
        } else {
            (bad as usize - base as usize) / size_of::<T>()
        };
        Err(self.post_error(index, rc, call, depth))
    }

    /// Posts with `post` the longest prefix of `wrs` whose SGE lists fit
    /// `max_sge` (when not empty), then refuses the first work request that
    /// does not fit: verbs would fail the whole chain at that entry anyway.
    fn post_fitting<W>(
        &self,
        wrs: &[W],
        sges: impl Fn(&W) -> usize,
        max_sge: u32,
        post: impl FnOnce(&[W]) -> Result<(), PostError>,
    ) -> Result<(), PostError> {
        let bad = wrs.iter().position(|w| sges(w) > max_sge as usize);
        let ok = &wrs[..bad.unwrap_or(wrs.len())];
        if !ok.is_empty() {
            post(ok)?;
        }
        match bad {
            Some(index) => Err(PostError {
                qpn: self.qpn,
                index,
                kind: PostErrorKind::TooManySges {
                    sges: sges(&wrs[index]),
                    max: max_sge,
                },
            }),
            None => Ok(()),
        }
    }
}

impl QpOps for NativeQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn modify(&self, t: &Transition) -> Result<(), ModifyError> {
        use std::sync::atomic::Ordering;
        let mut a = b::ibv_qp_attr::default();
        let mask = match *t {
            Transition::Init(i) => {
                a.qp_state = b::IBV_QPS_INIT;
                a.pkey_index = i.pkey_index;
                a.port_num = i.port;
                a.qp_access_flags = i.access.bits();
                self.port.store(i.port, Ordering::Relaxed);
                b::IBV_QP_STATE | b::IBV_QP_PKEY_INDEX | b::IBV_QP_PORT | b::IBV_QP_ACCESS_FLAGS
            }
            Transition::Rtr(r) => {
                a.qp_state = b::IBV_QPS_RTR;
                a.path_mtu = r.path_mtu.as_raw();
                a.dest_qp_num = r.remote.qpn;
                a.rq_psn = r.remote.psn & 0x00ff_ffff;
                a.max_dest_rd_atomic = r.max_dest_rd_atomic;
                a.min_rnr_timer = r.min_rnr_timer;
                a.ah_attr.port_num = self.port.load(Ordering::Relaxed);
                match r.remote.route {
                    Route::Lid(lid) => a.ah_attr.dlid = lid,
                    Route::Gid(gid) => {
                        a.ah_attr.is_global = 1;
                        a.ah_attr.grh.dgid.raw = gid.0;
                        a.ah_attr.grh.sgid_index = r.sgid_index;
                        a.ah_attr.grh.hop_limit = r.hop_limit;
                    }
                }
                b::IBV_QP_STATE
                    | b::IBV_QP_AV
                    | b::IBV_QP_PATH_MTU
                    | b::IBV_QP_DEST_QPN
                    | b::IBV_QP_RQ_PSN
                    | b::IBV_QP_MAX_DEST_RD_ATOMIC
                    | b::IBV_QP_MIN_RNR_TIMER
            }
            Transition::Rts(s) => {
                a.qp_state = b::IBV_QPS_RTS;
                a.sq_psn = s.sq_psn & 0x00ff_ffff;
                a.timeout = s.timeout;
                a.retry_cnt = s.retry_cnt;
                a.rnr_retry = s.rnr_retry;
                a.max_rd_atomic = s.max_rd_atomic;
                b::IBV_QP_STATE
                    | b::IBV_QP_SQ_PSN
                    | b::IBV_QP_TIMEOUT
                    | b::IBV_QP_RETRY_CNT
                    | b::IBV_QP_RNR_RETRY
                    | b::IBV_QP_MAX_QP_RD_ATOMIC
            }
            Transition::Error => {
                a.qp_state = b::IBV_QPS_ERR;
                b::IBV_QP_STATE
            }
        };
        // SAFETY: a live QP and a fully initialized attr for this mask.
        let rc = unsafe { (self.verbs.ibv_modify_qp)(self.qp.as_ptr(), &mut a, mask as i32) };
        if rc != 0 {
            return Err(ModifyError::Native {
                qpn: self.qpn,
                to: t.target(),
                source: NativeError::new("ibv_modify_qp", rc_errno(rc)),
            });
        }
        Ok(())
    }

    fn state(&self) -> Result<QpState, QueryError> {
        let mut a = b::ibv_qp_attr::default();
        let mut init = b::ibv_qp_init_attr::default();
        // SAFETY: a live QP; writable attr structs.
        let rc = unsafe {
            (self.verbs.ibv_query_qp)(self.qp.as_ptr(), &mut a, b::IBV_QP_STATE as i32, &mut init)
        };
        if rc != 0 {
            // SAFETY: a live QP; context and device pointers are set by
            // libibverbs for its lifetime.
            let name = unsafe { super::c_field(&(*(*(*self.qp.as_ptr()).context).device).name) };
            return Err(QueryError::Native {
                device: DeviceIdentity {
                    provider: crate::ProviderKind::Native,
                    name,
                    guid: 0,
                },
                source: NativeError::new("ibv_query_qp", rc_errno(rc)),
            });
        }
        Ok(QpState::from_raw(a.qp_state))
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let max = self.caps.max_send_sge;
        self.post_fitting(
            wrs,
            |w| w.sges.len(),
            max,
            |ok| {
                let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
                let list = &mut scratch.send;
                list.clear();
                for w in ok {
                    let mut n = b::ibv_send_wr {
                        wr_id: w.wr_id,
                        // The NIC only reads the SGEs; `Sge` is layout-identical
                        // to `ibv_sge` (asserted above).
                        sg_list: w.sges.as_ptr().cast_mut().cast(),
                        num_sge: w.sges.len() as i32,
                        send_flags: if w.signaled { b::IBV_SEND_SIGNALED } else { 0 },
                        ..Default::default()
                    };
                    match w.op {
                        SendOp::Write { remote, imm } => {
                            n.opcode = if imm.is_some() {
                                b::IBV_WR_RDMA_WRITE_WITH_IMM
                            } else {
                                b::IBV_WR_RDMA_WRITE
                            };
                            n.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
                            n.wr.rdma = b::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                                remote_addr: remote.addr,
                                rkey: remote.rkey,
                            };
                        }
                        SendOp::Read { remote } => {
                            n.opcode = b::IBV_WR_RDMA_READ;
                            n.wr.rdma = b::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                                remote_addr: remote.addr,
                                rkey: remote.rkey,
                            };
                        }
                        SendOp::Send { imm } => {
                            n.opcode = if imm.is_some() {
                                b::IBV_WR_SEND_WITH_IMM
                            } else {
                                b::IBV_WR_SEND
                            };
                            n.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
                        }
                    }
                    list.push(n);
                }
                let depth = self.caps.max_send_wr;
                self.post_chain(
                    list,
                    |w| &mut w.next,
                    "ibv_post_send",
                    depth,
                    |head, bad| {
                        // SAFETY: a live QP (in any state: the device reports a
                        // bad state as an error code); a valid chain whose SGE
                        // lists borrow `wrs`, alive for the call; posting is
                        // serialized by the lock.
                        unsafe { sys::ibv_post_send(self.qp.as_ptr(), head, bad) }
                    },
                )
            },
        )
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let max = self.caps.max_recv_sge;
        self.post_fitting(
            wrs,
            |w| w.sges.len(),
            max,
            |ok| {
                let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
                let list = &mut scratch.recv;
                list.clear();
                for w in ok {
                    list.push(b::ibv_recv_wr {
                        wr_id: w.wr_id,
                        next: ptr::null_mut(),
                        sg_list: w.sges.as_ptr().cast_mut().cast(),
                        num_sge: w.sges.len() as i32,
                    });
                }
                let depth = self.caps.max_recv_wr;
                self.post_chain(
                    list,
                    |w| &mut w.next,
                    "ibv_post_recv",
                    depth,
                    |head, bad| {
                        // SAFETY: as in post_send, for the receive chain.
                        unsafe { sys::ibv_post_recv(self.qp.as_ptr(), head, bad) }
                    },
                )
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(opcode: u32, status: u32, flags: u32) -> b::ibv_wc {
        let mut wc = b::ibv_wc {
            wr_id: 7,
            status,
            opcode,
            wc_flags: flags,
            byte_len: 16,
            qp_num: 3,
            ..Default::default()
        };
        wc.__bindgen_anon_1.imm_data = 0xdead_beef_u32.to_be();
        wc
    }

    /// The immediate is reported only for receive opcodes: a requester's
    /// completion with IBV_WC_WITH_IMM (mlx5, rxe) has an undefined value.
    #[test]
    fn immediate_only_in_receive_completions() {
        let with = b::IBV_WC_WITH_IMM;
        for (opcode, want) in [
            (b::IBV_WC_RECV, Some(0xdead_beef)),
            (b::IBV_WC_RECV_RDMA_WITH_IMM, Some(0xdead_beef)),
            (b::IBV_WC_SEND, None),
            (b::IBV_WC_RDMA_WRITE, None),
            (b::IBV_WC_RDMA_READ, None),
        ] {
            let c = completion(&wc(opcode, b::IBV_WC_SUCCESS, with));
            assert_eq!(c.imm, want, "opcode {opcode}");
            assert_eq!(c.opcode, Some(WcOpcode::from_raw(opcode)));
            assert_eq!((c.wr_id, c.byte_len, c.qp_num), (7, 16, 3));
        }
        // No flag: no immediate, even on a receive.
        assert_eq!(
            completion(&wc(b::IBV_WC_RECV, b::IBV_WC_SUCCESS, 0)).imm,
            None
        );
        // Error completions define nothing but the basics.
        let c = completion(&wc(b::IBV_WC_RECV, b::IBV_WC_WR_FLUSH_ERR, with));
        assert_eq!(
            (c.status, c.opcode, c.byte_len, c.imm),
            (WcStatus::WrFlush, None, 0, None)
        );
    }
}
