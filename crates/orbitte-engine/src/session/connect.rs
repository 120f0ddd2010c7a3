//! What connecting to another engine takes and gives: the path preference
//! and options ([`ConnectOptions`]), the opened [`Peer`] with its path,
//! rails and fallbacks, and why a connect failed ([`ConnectError`]).

use std::net::SocketAddr;

use orbitte_wire::auth::ListenerToken;

use super::SessionError;
use super::path::NoPath;
use crate::PeerInfo;
use crate::error::OpenPeerError;
use crate::request::{PeerRef, RemoteRange};
use crate::transport::local::LocalError;
use crate::transport::{PathKind, PeerId, RailId};

/// Which path a peer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathPreference {
    /// The policy (docs/paths.md): local when it applies and works, else
    /// rdma when both sides have usable rails and the peer serves rdma
    /// control links, else tcp. Every path given up on the way is a
    /// reported fallback.
    #[default]
    Auto,
    /// Exactly this path (`Tcp`, `Local` or `Rdma`), or an error naming why
    /// not.
    Only(PathKind),
}

/// How [`TransferEngine::connect_with`](crate::TransferEngine::connect_with) opens a peer.
///
/// ```
/// use orbitte_engine::{ConnectOptions, PathKind};
/// let opts = ConnectOptions::new().path(PathKind::Tcp).rails(4);
/// assert_eq!(opts.rails, 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// The path policy (default: [`PathPreference::Auto`]).
    pub prefer: PathPreference,
    /// tcp connections or local worker threads to open (default 2; at
    /// least 1). rdma opens one rail per usable NIC whatever this says.
    pub rails: usize,
    /// The peer's listener token, from the metadata it published (default
    /// none): every session to it then proves the key derived from it
    /// (and the cluster secret, if any), which a peer listening with an
    /// listener token requires. Kept for the peer's later sessions (rails,
    /// recovery, the local path).
    pub token: Option<ListenerToken>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            prefer: PathPreference::Auto,
            rails: 2,
            token: None,
        }
    }
}

impl ConnectOptions {
    /// The defaults: automatic path, 2 rails.
    pub fn new() -> Self {
        Self::default()
    }

    /// Exactly this path, never another one.
    pub fn path(mut self, path: PathKind) -> Self {
        self.prefer = PathPreference::Only(path);
        self
    }

    /// This many tcp connections or local worker threads.
    pub fn rails(mut self, rails: usize) -> Self {
        self.rails = rails;
        self
    }

    /// Prove the key of this listener token (from the peer's metadata).
    pub fn token(mut self, token: ListenerToken) -> Self {
        self.token = Some(token);
        self
    }
}

/// An open peer: the handle [`TransferEngine::connect`](crate::TransferEngine::connect) returns.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The engine's view of the peer (id for requests, ranges, rails).
    pub info: PeerInfo,
    /// The path its requests take.
    pub path: PathKind,
    /// Paths that applied but could not be used, with the reason (also
    /// logged as warnings).
    pub fell_back: Vec<(PathKind, String)>,
    /// Rails added for it.
    pub rails: Vec<RailId>,
    /// Rails of an older epoch of the same source that were closed.
    pub closed_rails: Vec<RailId>,
}

impl Peer {
    /// The peer's id (what requests name).
    pub fn id(&self) -> PeerId {
        self.info.id
    }

    /// Its source id.
    pub fn source_id(&self) -> &str {
        &self.info.source_id
    }

    /// Its authoritative epoch.
    pub fn epoch(&self) -> orbitte_wire::Epoch {
        self.info.epoch
    }

    /// The ranges it published when it was opened, in range id order.
    pub fn ranges(&self) -> &[RemoteRange] {
        &self.info.ranges
    }
}

impl From<&Peer> for PeerRef {
    fn from(p: &Peer) -> Self {
        (&p.info).into()
    }
}

/// Why [`TransferEngine::connect`](crate::TransferEngine::connect) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The tcp session failed (refused, stale epoch, authentication, ...).
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The engine refused the peer (fenced, stale publication).
    #[error(transparent)]
    Engine(#[from] OpenPeerError),
    /// The local path was required and failed.
    #[error(transparent)]
    Local(#[from] LocalError),
    /// No path can be used.
    #[error(transparent)]
    NoPath(#[from] NoPath),
    /// Ask for `Auto`, `Only(Tcp)`, `Only(Local)` or `Only(Rdma)`.
    #[error("{0} peers are not opened here: use PathPreference::Auto or Only(tcp|local|rdma)")]
    Unsupported(PathKind),
    /// The metadata service failed (not the peer's fault).
    #[cfg(feature = "etcd")]
    #[error(transparent)]
    Metadata(#[from] crate::metadata::MetadataError),
    /// `connect_by_name` on an engine built without cluster metadata.
    #[error("connecting by name needs cluster metadata: build the engine with EngineBuilder::etcd")]
    NoMetadata,
    /// The metadata service has no record of the source.
    #[error("no record of {source_id} in the cluster metadata (expired or never published)")]
    NotInMetadata {
        /// The source id looked up.
        source_id: String,
    },
    /// The record's address does not parse.
    #[error("the metadata record of {source_id} has a bad address {addr:?}")]
    RecordAddress {
        /// The source id.
        source_id: String,
        /// The address as recorded.
        addr: String,
        /// Why it does not parse.
        #[source]
        source: std::net::AddrParseError,
    },
    /// The record's listener token is not a token.
    #[error("the metadata record of {source_id} has a bad listener token: {source}")]
    RecordToken {
        /// The source id.
        source_id: String,
        /// Why it is not one.
        #[source]
        source: orbitte_wire::auth::AuthError,
    },
    /// The engine at the recorded address is older than the record.
    #[error(
        "{source_id} at {addr} answered with epoch {answered}, older than its record's {recorded}"
    )]
    OlderThanRecord {
        /// The source id.
        source_id: String,
        /// Where it was reached.
        addr: SocketAddr,
        /// The epoch it answered with.
        answered: u64,
        /// The epoch recorded.
        recorded: u64,
    },
}
