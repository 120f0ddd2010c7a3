//! Where `serve` and `bench` publish and find engines: peer-to-peer (the
//! default: an initiator names its target by address and the target's
//! ranges travel over the session) or etcd (`etcd://HOST:PORT[/PREFIX]`:
//! every engine stores its record under `PREFIX/engines/SOURCE_ID` with a
//! lease, and an initiator names its target by source id).

use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::time::Duration;

use orbitte::TransferEngine;
use orbitte_engine::metadata::PeerRecord;
use orbitte_engine::metadata::etcd::EtcdMetadata;
use serde::Serialize;

use crate::failure::Failure;

/// The key prefix when the URL names none.
pub(crate) const DEFAULT_PREFIX: &str = "/orbitte";

/// How long a dead engine's record survives in etcd.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(10);

/// A metadata setting: `p2p` or `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Metadata {
    /// Descriptors travel over the session; peers are named by address.
    P2p,
    /// Records in etcd; peers are named by source id.
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
    },
}

/// Written as it is given: `p2p` or the etcd URL.
impl std::fmt::Display for Metadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::P2p => f.write_str("p2p"),
            Self::Etcd { endpoints, prefix } => write!(f, "etcd://{}{prefix}", endpoints.join(",")),
        }
    }
}

impl Serialize for Metadata {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Metadata {
    /// Parses `p2p` or an `etcd://` URL.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        const EXPECTED: &str = "`p2p` or `etcd://HOST:PORT[/PREFIX]`, e.g. etcd://127.0.0.1:2379";
        if s == "p2p" {
            return Ok(Self::P2p);
        }
        let Some(rest) = s.strip_prefix("etcd://") else {
            return Err(format!(
                "`{s}` is not a metadata service: expected {EXPECTED}"
            ));
        };
        let (hosts, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let prefix = if prefix.is_empty() {
            DEFAULT_PREFIX
        } else {
            prefix
        };
        let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
        for e in &endpoints {
            let port_ok = e
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0));
            if !port_ok {
                return Err(format!(
                    "`{s}`: etcd endpoint `{e}` is not HOST:PORT: expected {EXPECTED}"
                ));
            }
        }
        if prefix.chars().any(char::is_control) {
            return Err(format!("`{s}`: the key prefix has control characters"));
        }
        Ok(Self::Etcd {
            endpoints,
            prefix: prefix.to_owned(),
        })
    }

    /// Connects to etcd (`None` for p2p). `flag` names where the setting
    /// came from, for the error.
    pub(crate) fn connect(&self, flag: &str) -> Result<Option<EtcdMetadata>, Failure> {
        match self {
            Self::P2p => Ok(None),
            Self::Etcd { endpoints, prefix } => EtcdMetadata::connect(endpoints, prefix, LEASE_TTL)
                .map(Some)
                .map_err(|e| {
                    Failure::failed(format!(
                        "{flag}: {e} (start etcd there, or leave the setting out for peer-to-peer metadata)"
                    ))
                }),
        }
    }
}

/// The address peers reach `listen` at: itself when it names an address,
/// else this host's address on the route to the etcd servers.
pub(crate) fn advertised(listen: SocketAddr, meta: &Metadata) -> SocketAddr {
    if !listen.ip().is_unspecified() {
        return listen;
    }
    let Metadata::Etcd { endpoints, .. } = meta else {
        return listen;
    };
    let route = endpoints
        .iter()
        .filter_map(|e| e.to_socket_addrs().ok()?.next())
        .find_map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).ok())
        .and_then(|s| s.local_addr().ok());
    match route {
        Some(local) => SocketAddr::new(local.ip(), listen.port()),
        None => listen,
    }
}

/// Publishes `engine`'s ranges, served at `addr`, under its source id.
pub(crate) fn publish(
    store: &mut EtcdMetadata,
    engine: &TransferEngine,
    addr: SocketAddr,
    host_id: &str,
) -> Result<(), Failure> {
    let record = PeerRecord::from_publication(
        engine.source_id(),
        addr,
        host_id,
        &engine.segment_publication(),
    );
    store.publish(&record).map_err(|e| {
        Failure::failed(format!(
            "cannot publish {} to etcd: {e}",
            engine.source_id()
        ))
    })
}

/// The address and epoch etcd records for `source`.
pub(crate) fn resolve(store: &EtcdMetadata, source: &str) -> Result<(SocketAddr, u64), Failure> {
    let record = store
        .lookup(source)
        .map_err(|e| Failure::failed(format!("etcd lookup of {source} failed: {e}")))?
        .ok_or_else(|| {
            Failure::failed(format!(
                "etcd has no engine named {source} (not started, stopped more than {} s ago, or published under another prefix): check --peer and the prefix of --metadata",
                LEASE_TTL.as_secs()
            ))
        })?;
    let addr = record.listen_addr.parse().map_err(|_| {
        Failure::failed(format!(
            "etcd's record of {source} has the address `{}`, which is not ip:port",
            record.listen_addr.escape_debug()
        ))
    })?;
    Ok((addr, record.epoch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_endpoints_and_prefix() {
        assert_eq!(Metadata::parse("p2p"), Ok(Metadata::P2p));
        for url in ["p2p", "etcd://a:1,b:2/orbitte/c"] {
            assert_eq!(Metadata::parse(url).unwrap().to_string(), url);
        }
        assert_eq!(
            Metadata::parse("etcd://127.0.0.1:2379"),
            Ok(Metadata::Etcd {
                endpoints: vec!["127.0.0.1:2379".into()],
                prefix: "/orbitte".into()
            })
        );
        assert_eq!(
            Metadata::parse("etcd://a:1,b:2/orbitte/cluster-a/"),
            Ok(Metadata::Etcd {
                endpoints: vec!["a:1".into(), "b:2".into()],
                prefix: "/orbitte/cluster-a".into()
            })
        );
        for bad in [
            "etcd://",
            "etcd://host",
            "etcd://:1",
            "etcd://h:0",
            "http://h:1",
            "zk://h:1",
        ] {
            assert!(Metadata::parse(bad).is_err(), "{bad}");
        }
    }
}
