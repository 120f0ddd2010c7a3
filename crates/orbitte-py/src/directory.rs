//! Where peers are found: peer-to-peer (a session id is the peer's
//! "host:port") or etcd (a session id is the peer's source id, looked up
//! in its record; an id with no record is tried as "host:port").
//!
//! With etcd the engine stores its record (source id, epoch, listen
//! address, publications) under `PREFIX/engines/SOURCE_ID` with a lease, as
//! `orbitte serve --metadata etcd://...` does, so Python and command-line
//! engines find each other.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

use orbitte::TransferEngine;
use orbitte_engine::metadata::PeerRecord;
use orbitte_engine::metadata::etcd::EtcdMetadata;

/// The key prefix when the URL names none (the same as `orbitte serve`).
const DEFAULT_PREFIX: &str = "/orbitte";
/// How long a dead engine's record survives.
const LEASE_TTL: Duration = Duration::from_secs(10);

/// Peer-to-peer, or an etcd store holding this engine's lease.
pub(crate) enum Directory {
    P2p,
    Etcd {
        store: Mutex<EtcdMetadata>,
        endpoints: Vec<String>,
    },
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::P2p => f.write_str("p2p"),
            Self::Etcd { endpoints, .. } => write!(f, "etcd {}", endpoints.join(",")),
        }
    }
}

/// `etcd://H:P[,H:P...][/PREFIX]` or a bare `H:P[,H:P...]` (Mooncake's
/// form of an etcd endpoint): the endpoints and the prefix.
pub(crate) fn parse_etcd(url: &str) -> Result<(Vec<String>, String), String> {
    let rest = url.strip_prefix("etcd://").unwrap_or(url);
    if rest.contains("://") {
        return Err(format!(
            "metadata server {url:?}: only P2PHANDSHAKE and etcd (etcd://HOST:PORT[/PREFIX] or HOST:PORT) are supported"
        ));
    }
    let (hosts, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    for e in &endpoints {
        let ok = e
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0));
        if !ok {
            return Err(format!(
                "metadata server {url:?}: etcd endpoint {e:?} is not HOST:PORT"
            ));
        }
    }
    let prefix = if prefix.is_empty() {
        DEFAULT_PREFIX
    } else {
        prefix
    };
    Ok((endpoints, prefix.to_owned()))
}

impl Directory {
    /// Connects to etcd at `url`.
    pub(crate) fn etcd(url: &str) -> Result<Self, String> {
        let (endpoints, prefix) = parse_etcd(url)?;
        let store = EtcdMetadata::connect(&endpoints, &prefix, LEASE_TTL)
            .map_err(|e| format!("metadata server {url:?}: {e}"))?;
        Ok(Self::Etcd {
            store: Mutex::new(store),
            endpoints,
        })
    }

    /// The session address of the peer named `session`, with the listener
    /// token its etcd record carries.
    pub(crate) fn address_of(&self, session: &str) -> Result<(SocketAddr, Option<String>), String> {
        if let Self::Etcd { store, .. } = self {
            let record = store
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .lookup(session)
                .map_err(|e| format!("etcd lookup of {session:?} failed: {e}"))?;
            if let Some(r) = record {
                let at = r.listen_addr.parse().map_err(|_| {
                    format!(
                        "etcd's record of {session:?} has the address {:?}, which is not ip:port",
                        r.listen_addr
                    )
                })?;
                return Ok((at, r.listener_token));
            }
        }
        let bad = |why: String| {
            let named = match self {
                Self::P2p => "",
                Self::Etcd { .. } => "no etcd record of that name, and ",
            };
            format!(
                "session id {session:?}: {named}{why}; write it as \"host:port\" (port from the target's get_rpc_port())"
            )
        };
        let at = session
            .to_socket_addrs()
            .map_err(|e| bad(e.to_string()))?
            .next()
            .ok_or_else(|| bad("it resolves to no address".into()))?;
        Ok((at, None))
    }

    /// Stores (or refreshes) `engine`'s record: served at `listen`, its
    /// current publications. Nothing for p2p.
    pub(crate) fn publish(
        &self,
        engine: &TransferEngine,
        listen: SocketAddr,
        host_id: &str,
        token: Option<String>,
    ) -> Result<(), String> {
        let Self::Etcd { store, endpoints } = self else {
            return Ok(());
        };
        let at = advertised(listen, endpoints);
        let mut record = PeerRecord::from_publication(
            engine.source_id(),
            at,
            host_id,
            &engine.segment_publication(),
        );
        record.listener_token = token;
        store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .publish(&record)
            .map_err(|e| format!("cannot publish {} to etcd: {e}", engine.source_id()))
    }
}

/// The address peers reach `listen` at: itself when it names an address,
/// else this host's address on the route to the etcd servers.
fn advertised(listen: SocketAddr, endpoints: &[String]) -> SocketAddr {
    if !listen.ip().is_unspecified() {
        return listen;
    }
    endpoints
        .iter()
        .filter_map(|e| e.to_socket_addrs().ok()?.next())
        .find_map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).ok())
        .and_then(|s| s.local_addr().ok())
        .map_or(listen, |local| SocketAddr::new(local.ip(), listen.port()))
}
