//! Which key a session proves: the listener's own, and the one an
//! initiator holds for each peer it was given a listener token for.
//!
//! A listener verifies hellos with its access key (from
//! [`EngineBuilder::listener_token`](crate::EngineBuilder::listener_token))
//! or, without one, with the cluster secret. An initiator proves, for a
//! peer it connected to with a token ([`ConnectOptions::token`](crate::ConnectOptions)),
//! that peer's key, on every session it opens to it afterwards (its tcp
//! rails, its rdma control link, its same-host mapping session, and the
//! sessions rail recovery re-opens); for every other peer, the cluster
//! secret.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use orbitte_wire::auth::ClusterSecret;

/// The keys an initiator proves to peers that listen with an access key,
/// by the address it dials and, once a session told it, by source id.
/// Clones share one table.
#[derive(Clone, Default)]
pub struct PeerKeys(Arc<RwLock<Keys>>);

#[derive(Default)]
struct Keys {
    by_addr: HashMap<SocketAddr, ClusterSecret>,
    by_source: HashMap<String, ClusterSecret>,
}

impl std::fmt::Debug for PeerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let k = self.0.read().unwrap_or_else(PoisonError::into_inner);
        write!(
            f,
            "PeerKeys({} address(es), {} source(s))",
            k.by_addr.len(),
            k.by_source.len()
        )
    }
}

impl PeerKeys {
    /// Sessions dialed to `addr` prove `key` from now on.
    pub(crate) fn set_addr(&self, addr: SocketAddr, key: ClusterSecret) {
        let mut k = self.0.write().unwrap_or_else(PoisonError::into_inner);
        k.by_addr.insert(addr, key);
    }

    /// Sessions opened to the engine `source` (found by its id, as the
    /// local path finds a same-host peer) prove `key` from now on.
    pub(crate) fn set_source(&self, source: &str, key: ClusterSecret) {
        let mut k = self.0.write().unwrap_or_else(PoisonError::into_inner);
        k.by_source.insert(source.to_owned(), key);
    }

    /// The key recorded for `addr`.
    pub(crate) fn for_addr(&self, addr: SocketAddr) -> Option<ClusterSecret> {
        let k = self.0.read().unwrap_or_else(PoisonError::into_inner);
        k.by_addr.get(&addr).cloned()
    }

    /// The key recorded for the engine `source`.
    pub(crate) fn for_source(&self, source: &str) -> Option<ClusterSecret> {
        let k = self.0.read().unwrap_or_else(PoisonError::into_inner);
        k.by_source.get(source).cloned()
    }
}
