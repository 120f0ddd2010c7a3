//! Device context: the open device, its queries, and the objects it makes.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::ContextOps;
use crate::cq::CompletionQueue;
use crate::error::{
    AllocPdError, AsyncEventError, CreateCqError, ObjectKind, QueryError, Unquiesced,
};
use crate::pd::ProtectionDomain;
use crate::retain::Node;
use crate::types::{
    AsyncEvent, DeviceAttr, DeviceDiagnostics, DeviceIdentity, DeviceInfo, GidEntry, PortAttr,
    PortDiagnostics,
};

/// An open device. Cheap to clone; every PD and CQ holds a clone, so the
/// device closes after its last child.
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

#[derive(Debug)]
pub(crate) struct ContextInner {
    pub(crate) node: Node<dyn ContextOps>,
    pub(crate) info: DeviceInfo,
}

impl Context {
    pub(crate) fn from_backend(ops: Box<dyn ContextOps>, info: DeviceInfo) -> Self {
        let node = Node::new(
            ops,
            Box::new(()),
            ObjectKind::Context,
            info.identity.name.clone(),
            info.identity.clone(),
        );
        Self {
            inner: Arc::new(ContextInner { node, info }),
        }
    }

    pub(crate) fn ops(&self) -> &dyn ContextOps {
        match self.inner.node.ops() {
            Some(ops) => ops,
            // Unreachable: ops are only taken by close(self)/drop, which
            // need the last reference.
            None => unreachable_ops(),
        }
    }

    /// What the device list said about this device (identity, driver,
    /// uverbs node).
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// Provider, name and GUID.
    pub fn identity(&self) -> &DeviceIdentity {
        &self.inner.info.identity
    }

    /// Device limits.
    pub fn query_device(&self) -> Result<DeviceAttr, QueryError> {
        self.ops().query_device()
    }

    /// Port attributes (state, link layer, MTU, width/speed). Ports are
    /// 1-based.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, QueryError> {
        self.ops().query_port(port)
    }

    /// One GID table entry, with validity, type and netdev.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, QueryError> {
        self.ops().query_gid(port, index)
    }

    /// The whole GID table of a port (invalid entries included, marked).
    pub fn gids(&self, port: u8) -> Result<Vec<GidEntry>, QueryError> {
        let attr = self.query_port(port)?;
        (0..attr.gid_table_len)
            .map(|i| self.query_gid(port, i))
            .collect()
    }

    /// Everything the diagnostics of docs/troubleshooting.md need, as plain data: device info,
    /// limits, and per port its attributes and GID table up to its last
    /// valid entry (invalid entries before it are kept, marked). A port
    /// whose query fails is listed in `port_errors` instead of failing the
    /// whole.
    pub fn diagnostics(&self) -> Result<DeviceDiagnostics, QueryError> {
        let attr = self.query_device()?;
        let mut ports = Vec::new();
        let mut port_errors = Vec::new();
        for port in 1..=attr.phys_port_cnt {
            match self
                .query_port(port)
                .and_then(|a| Ok((self.gids(port)?, a)))
            {
                Ok((mut gids, attr)) => {
                    // Tables are filled from the front; drop the unused tail
                    // (rxe and mlx5 report 128..1024 entries).
                    let used = gids.iter().rposition(|g| g.valid).map_or(0, |i| i + 1);
                    gids.truncate(used);
                    ports.push(PortDiagnostics { attr, gids })
                }
                Err(e) => port_errors.push((port, e.to_string())),
            }
        }
        Ok(DeviceDiagnostics {
            info: self.info().clone(),
            attr,
            ports,
            port_errors,
        })
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, AllocPdError> {
        let ops = self.ops().alloc_pd()?;
        Ok(ProtectionDomain::new(self.clone(), ops))
    }

    /// Creates a completion queue of `depth` entries.
    pub fn create_cq(&self, depth: u32) -> Result<CompletionQueue, CreateCqError> {
        let ops = self.ops().create_cq(depth)?;
        Ok(CompletionQueue::new(self.clone(), ops, depth))
    }

    /// Next asynchronous event (port active/error, QP fatal, ...), waiting
    /// up to `timeout`; `Ok(None)` when none arrived. Events are
    /// acknowledged before they are returned.
    pub fn next_async_event(
        &self,
        timeout: Duration,
    ) -> Result<Option<AsyncEvent>, AsyncEventError> {
        self.ops().next_async_event(timeout)
    }

    /// Closes the device now. Fails with [`Unquiesced`] if PDs/CQs (or
    /// clones) still hold it, or if the native close fails (then the
    /// context is retained).
    pub fn close(self) -> Result<(), Unquiesced> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => inner.node.close(),
            Err(arc) => Err(arc.node.in_use(Arc::strong_count(&arc) - 1)),
        }
    }
}

/// Handles keep their backend until the last reference goes (only
/// `close(self)` and drop take it), so a live handle without one is a bug
/// in this crate, never a reaction to input.
#[cold]
pub(crate) fn unreachable_ops() -> ! {
    unreachable!("verbs handle used after its backend was destroyed")
}
