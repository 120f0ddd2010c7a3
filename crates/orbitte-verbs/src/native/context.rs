//! The native device context: an open `ibv_context`.

use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orbitte_verbs_sys::Verbs;
use orbitte_verbs_sys::bindings as b;

use super::cq::NativeCq;
use super::os::{errno, rc_check, rc_errno, set_nonblocking, wait_readable};
use super::pd::NativePd;
use super::sysfs;
use crate::backend::{ContextOps, CqOps, Destroy, PdOps};
use crate::error::{AllocPdError, AsyncEventError, CreateCqError, NativeError, QueryError};
use crate::types::{
    AsyncEvent, DeviceAttr, DeviceIdentity, Gid, GidEntry, GidType, LinkLayer, Mtu, PortAttr,
    PortState, Speed, Width,
};

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
