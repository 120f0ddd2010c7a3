//! The engine's own tcp and local transports ([`NetPaths`]), attached at
//! build, and the rdma control link kept open for each peer on the rdma
//! path.

use std::sync::Arc;

use super::{SessionConfig, TcpControlLink};
use crate::transport::local::LocalTransport;
use crate::transport::tcp::TcpTransport;
use crate::transport::{PeerId, TransportId};

/// The tcp and local transports of one engine.
#[derive(Debug)]
pub(crate) struct NetPaths {
    pub(crate) cfg: SessionConfig,
    pub(crate) tcp: Arc<TcpTransport>,
    pub(crate) tcp_id: TransportId,
    pub(crate) local: Arc<LocalTransport>,
    pub(crate) local_id: TransportId,
    /// The rdma control link of each peer on the rdma path (kept open
    /// while the peer is).
    pub(crate) links: std::sync::Mutex<std::collections::HashMap<PeerId, TcpControlLink>>,
}
