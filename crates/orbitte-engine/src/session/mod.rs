//! Sessions: connections between engines that speak the wire protocol.
//!
//! A session starts with the wire handshake (`challenge` from the
//! responder, `hello` from the initiator, `hello-ack` back): protocol
//! version, source id, authoritative epoch, capabilities, and, when a
//! cluster secret is configured, an HMAC proof each way. The responder
//! admits the initiator into its [`PeerTable`](orbitte_wire::PeerTable)
//! and the initiator admits the responder into its own, so the epoch rule
//! holds in both directions: an older epoch is rejected (also from the same
//! address), a newer one replaces the source and drops its old sessions and
//! cached descriptors, an equal one is a reconnect.
//!
//! After the handshake the responder sends its publications
//! (`segment-publication`: the p2p metadata), then serves tcp data requests
//! ([`crate::transport::tcp`]) until either side leaves.
//!
//! The listener's accept loop waits on epoll on one of its I/O threads
//! (`io_threads` of them, event loops that also run every handshake and
//! serve every tcp data session) and takes each connection as it
//! arrives; the kernel queues up
//! to 1024 of them meanwhile (capped by `net.core.somaxconn`), so a burst
//! of unauthenticated connections does not drop a legitimate peer's SYN.
//!
//! Bounds (each is a [`SessionConfig`] field): a peer that connects and
//! does not authenticate is closed after `preauth_timeout` (or
//! `handshake_timeout`, if shorter), and such peers hold at most
//! `max_unauthenticated` connections (`max_unauthenticated_per_address`
//! from one address), apart from the `max_sessions` of authenticated ones
//! (a newcomer past `max_sessions` closes the tcp data session idle the
//! longest, at least `evict_idle_after`, or is refused before its
//! hello-ack);
//! before the handshake no frame over 4 KiB is read; a frame that starts
//! must finish within `frame_timeout` (truncated frames) and its body is
//! buffered as it arrives; malformed frames close the session at once; a
//! target serves one request per connection at a time and reads the next
//! only after answering, so a flooding peer is throttled by its own TCP
//! window, and each whole answer must move within `io_timeout`; an
//! authenticated session without requests is closed after `idle_timeout`;
//! at most `max_connections_per_source` connections per source. Every close
//! is logged with its reason (`tracing` warn when abnormal, info when not,
//! peer text escaped) and kept in [`ClosedSession`] records. Every line a
//! peer can cause is logged within a per-second budget for its kind
//! (`refusal_logs_per_second`, module `log_budget`); the lines left out
//! are counted, and the next one logged carries the count.
//!
//! On a [`TransferEngine`](crate::TransferEngine): the engine's own
//! [`Listener`] (`EngineBuilder::listen`, serving data sessions, same-host
//! mapping and rdma control sessions, told apart by `hello.purpose`),
//! `TransferEngine::connect` (initiator, path policy in [`path`]),
//! [`TcpControlLink`] (the control link over a session's socket), and
//! [`probe`] for the capability rows. The path policy and the limits are
//! in `docs/paths.md`.

pub(crate) mod accept;
pub(crate) mod activity;
mod connect;
mod control_conn;
#[cfg(test)]
mod control_tests;
mod data;
pub(crate) mod handshake;
pub(crate) mod io;
mod keys;
mod link;
pub(crate) mod listener;
pub(crate) mod log_budget;
pub(crate) mod net;
pub(crate) mod nonblocking;
pub mod path;
pub mod probe;
pub(crate) mod publications;
pub(crate) mod serving;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use orbitte_wire::auth::{AuthError, ClusterSecret, ListenerToken};
use orbitte_wire::{
    AdmitError, Capabilities, DecodeError, EncodeError, Epoch, ErrorCode, HostId, SourceId,
};

pub use connect::{ConnectError, ConnectOptions, PathPreference, Peer};
pub use handshake::Handshake;
pub use keys::PeerKeys;
pub use link::TcpControlLink;
pub use listener::{ListenError, Listener, ListenerStats};
pub use publications::{PublicationTable, Published, RangeLookup, ServedMemory};
#[cfg(feature = "testing")]
pub use serving::ClosedSession;

/// The smallest `SessionConfig::socket_buffer`: the kernel doubles what
/// is asked for, and a buffer below one segment (64 KiB on loopback)
/// stalls a session on zero-window probes for seconds at a time.
pub const MIN_SOCKET_BUFFER: usize = 64 << 10;

/// The default [`SessionConfig::unsent_limit`]: two loopback segments.
/// Enough that a rail refills its socket long before the kernel runs out
/// of what it was given, small enough that a target with hundreds of busy
/// peers is not sent their queued payloads from its own thread.
pub const DEFAULT_UNSENT_LIMIT: u32 = 128 << 10;

/// The default [`SessionConfig::io_threads`]: the loops never wait for a
/// socket (every session on them is served in bounded, non-blocking
/// turns), so two keep up with thousands of peers, idle or busy.
pub const DEFAULT_IO_THREADS: usize = 2;

/// Settings shared by both ends of sessions.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// This engine's stable identity.
    pub source_id: SourceId,
    /// This engine's authoritative epoch (newer after every restart).
    pub epoch: Epoch,
    /// This host's identity (the local path compares it).
    pub host_id: HostId,
    /// With a secret, every session must prove it (both directions).
    pub cluster_secret: Option<ClusterSecret>,
    /// The key this engine's listener (and its same-host mapping server)
    /// requires instead of `cluster_secret`: derived from the access token
    /// it publishes in its metadata (and the cluster secret, if any; see
    /// `ClusterSecret::access_key`). `None`: the cluster secret.
    pub access_key: Option<ClusterSecret>,
    /// The listener token `access_key` was derived from, which the
    /// engine's etcd record carries (`None`: no token).
    pub listener_token: Option<ListenerToken>,
    /// The keys this engine proves to peers that listen with an access
    /// key, recorded when it connects to them with their token.
    pub peer_keys: PeerKeys,
    /// Capabilities offered in the hello.
    pub capabilities: Capabilities,
    /// A peer must complete the handshake within this.
    pub handshake_timeout: Duration,
    /// A frame that started must be complete (header and body, or a data
    /// frame's fixed part) within this.
    pub frame_timeout: Duration,
    /// With requests outstanding, a connection that brings no answer for
    /// this long is declared dead (initiator); a target moves each whole
    /// answer (a READ's payload, a WRITE's payload) within this or closes
    /// the session, however the peer paces its reads.
    pub io_timeout: Duration,
    /// A target closes an authenticated session idle (no request) for this
    /// long; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// A target closes a connection that has not authenticated within this
    /// (or within `handshake_timeout`, whichever is shorter).
    pub preauth_timeout: Duration,
    /// Connections a target holds at once that have not authenticated yet.
    /// They do not count against `max_sessions`; when all are taken, the
    /// oldest is closed to make room for a new one.
    pub max_unauthenticated: usize,
    /// Of those, how many may come from one IP address; more are refused.
    pub max_unauthenticated_per_address: usize,
    /// Lines a target logs per second of each kind a peer can cause:
    /// refused and abnormally closed sessions; sessions closed normally,
    /// newer epochs adopted and local handouts; rdma peers accepted;
    /// accept failures. The rest are counted and the count is logged (as
    /// `left_out`) with the next line of that kind.
    pub refusal_logs_per_second: u32,
    /// Authenticated sessions a target serves at once. A newcomer past it
    /// takes the slot of the tcp data session idle the longest (see
    /// `evict_idle_after`); when none can be closed it is refused before
    /// its hello-ack, with `resource-exhausted` naming this limit.
    pub max_sessions: usize,
    /// When all `max_sessions` are taken, a newcomer closes (`goodbye`,
    /// reason `idle`) the tcp data session that has had no request for the
    /// longest, if that is at least this long and it is not serving one
    /// now; `None`: no session is closed and the newcomer is refused. rdma
    /// control links and same-host mapping sessions are never closed so.
    pub evict_idle_after: Option<Duration>,
    /// Connections a target accepts at once from one source.
    pub max_connections_per_source: usize,
    /// tcp requests an initiator keeps outstanding per connection
    /// (pipelining depth).
    pub max_in_flight_per_connection: u32,
    /// Send and receive buffer size asked for on every tcp data session
    /// once it is admitted (`None`, the default: the kernel's autotuning).
    /// A fixed receive buffer turns autotuning off, and with payloads sent
    /// by `sendfile` (page references on loopback, which count whole pages
    /// against it) a fixed 4 MiB one filled up: zero windows, dropped
    /// segments and retransmission timeouts stalled READs of 1 MiB blocks
    /// for hundreds of milliseconds (docs/performance.md). The kernel caps
    /// it at `net.core.wmem_max` and `rmem_max`. Never applied before
    /// authentication. At least [`MIN_SOCKET_BUFFER`](crate::MIN_SOCKET_BUFFER) (the engine's
    /// builder refuses less).
    pub socket_buffer: Option<usize>,
    /// Bytes an initiator's tcp rail leaves unsent in its socket at most
    /// (`TCP_NOTSENT_LOWAT`; bytes sent and not yet acknowledged do not
    /// count): the rest of its queued requests and WRITE payloads waits in
    /// the rail, which sends more when the socket reports that it is below
    /// the mark. Without it, a rail fills its socket's whole send buffer
    /// (autotuned up to `net.ipv4.tcp_wmem`'s maximum, 4 MiB by default),
    /// and what the peer's window does not take yet is sent later from
    /// wherever the window update is processed: on one host, by the
    /// target's own thread. `None`: the kernel's default
    /// (`net.ipv4.tcp_notsent_lowat`, no limit unless set); the kernel
    /// reads 0 the same way, so the engine's builder refuses `Some(0)`.
    /// Best effort: a kernel that refuses it leaves the default.
    pub unsent_limit: Option<u32>,
    /// The engine's I/O threads: event loops (epoll) that run the accept
    /// loop, every handshake, every tcp data session and tcp rail, every
    /// mapping session and rdma control link, however many peers are
    /// connected or connecting; also the most copy workers the local path
    /// runs at once for all its rails. At least 1 (0 is taken as 1).
    pub io_threads: usize,
    /// Send memfd-backed memory with `sendfile` (see
    /// `transport::tcp::payload`); off: with `sendmsg` straight from the
    /// mapping, as every other memory is sent. Received payloads always go
    /// straight from the socket into the mapping.
    pub zero_copy: bool,
    /// Test knob: the target sleeps this long before serving each request
    /// (makes "killed mid-batch" deterministic).
    #[cfg(any(test, feature = "testing"))]
    pub serve_delay: Duration,
    /// Where admitted sessions get their ids. Sessions admitted into an
    /// engine's peer table must use the engine's numbering
    /// (`TransferEngine::session_config` sets it).
    pub session_ids: SessionIds,
}

/// Session ids of net's handshakes. They share the engine's peer table with
/// the engine's own sessions (numbered from 1 by `new_session_id`), so they
/// start far above them and the two never collide.
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1 << 48);

/// A process-unique session id.
fn next_session_id() -> orbitte_wire::SessionId {
    orbitte_wire::SessionId(NEXT_SESSION.fetch_add(1, Ordering::Relaxed))
}

/// A source of session ids for a peer table.
#[derive(Clone)]
pub struct SessionIds(Arc<dyn Fn() -> orbitte_wire::SessionId + Send + Sync>);

impl SessionIds {
    /// Ids from `next`, which must never repeat one within its table.
    pub fn new(next: impl Fn() -> orbitte_wire::SessionId + Send + Sync + 'static) -> Self {
        Self(Arc::new(next))
    }

    /// A process-wide counter (for peer tables that only net's sessions
    /// use). It starts at 2^48, far above any engine's own numbering.
    pub fn process() -> Self {
        Self::new(next_session_id)
    }

    /// The next id.
    pub fn next(&self) -> orbitte_wire::SessionId {
        (self.0)()
    }
}

impl std::fmt::Debug for SessionIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionIds(..)")
    }
}

impl SessionConfig {
    /// Defaults for `source_id` at `epoch`, with this machine's host id.
    pub fn new(source_id: SourceId, epoch: Epoch) -> Self {
        Self {
            source_id,
            epoch,
            host_id: default_host_id(),
            cluster_secret: None,
            access_key: None,
            listener_token: None,
            peer_keys: PeerKeys::default(),
            capabilities: Capabilities::TCP | Capabilities::LOCAL,
            handshake_timeout: Duration::from_secs(5),
            frame_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(10),
            idle_timeout: None,
            preauth_timeout: Duration::from_secs(3),
            max_unauthenticated: 128,
            max_unauthenticated_per_address: 32,
            refusal_logs_per_second: 10,
            max_sessions: 256,
            evict_idle_after: Some(Duration::from_secs(1)),
            max_connections_per_source: 32,
            max_in_flight_per_connection: 64,
            socket_buffer: None,
            unsent_limit: Some(DEFAULT_UNSENT_LIMIT),
            io_threads: DEFAULT_IO_THREADS,
            zero_copy: true,
            #[cfg(any(test, feature = "testing"))]
            serve_delay: Duration::ZERO,
            session_ids: SessionIds::process(),
        }
    }

    /// The key this engine's listener verifies (its access key, else the
    /// cluster secret; `None`: open to every peer that speaks the protocol).
    pub fn listen_key(&self) -> Option<&ClusterSecret> {
        self.access_key.as_ref().or(self.cluster_secret.as_ref())
    }

    /// The key an initiator proves on a session dialed to `addr`: the one
    /// recorded for it, else the cluster secret.
    pub(crate) fn dial_key(&self, addr: Option<SocketAddr>) -> Option<ClusterSecret> {
        addr.and_then(|a| self.peer_keys.for_addr(a))
            .or_else(|| self.cluster_secret.clone())
    }

    /// The key an initiator proves on a session to the engine `source`
    /// found by its id: the one recorded for it, else the cluster secret.
    pub(crate) fn source_key(&self, source: &str) -> Option<ClusterSecret> {
        self.peer_keys
            .for_source(source)
            .or_else(|| self.cluster_secret.clone())
    }
}

/// Who is at the other end of a session, as admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// Its source id.
    pub source_id: SourceId,
    /// Its authoritative epoch.
    pub epoch: Epoch,
    /// What it offers.
    pub capabilities: Capabilities,
    /// Its address, for TCP sessions.
    pub addr: Option<SocketAddr>,
}

/// Why a session could not be opened or went down.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The socket failed.
    #[error("session i/o failed: {0}")]
    Io(#[from] std::io::Error),
    /// The peer took too long.
    #[error("peer did not send {what} in time; it was closed")]
    Timeout {
        /// What we waited for.
        what: &'static str,
    },
    /// Nothing arrived within the idle bound (not an error by itself).
    #[error("no frame arrived within the idle bound")]
    Idle,
    /// The peer closed the connection.
    #[error("peer closed the connection while {during}")]
    Closed {
        /// What we were doing.
        during: &'static str,
    },
    /// The peer sent bytes that are not a valid frame.
    #[error(transparent)]
    Malformed(#[from] DecodeError),
    /// A frame of ours could not be encoded (a local fault: a value out of
    /// the protocol's bounds).
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The peer sent a valid frame that is not allowed here.
    #[error("peer broke the protocol: {0}")]
    Protocol(String),
    /// The peer refused us with an error frame.
    #[error("peer refused the session: {code}: {message}")]
    Refused {
        /// Its code.
        code: ErrorCode,
        /// Its message.
        message: String,
    },
    /// Authentication failed (either side's fault; the message says which).
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The peer's identity is not admissible (stale epoch, version, own id).
    #[error(transparent)]
    Admit(#[from] AdmitError),
    /// A limit was reached.
    #[error("session limit reached: {0}")]
    Limit(String),
}

/// The default host id: machine id, boot id and network namespace, so
/// that processes in different network namespaces (which cannot reach each
/// other's abstract unix sockets) count as different hosts.
pub fn default_host_id() -> HostId {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let machine = read("/etc/machine-id");
    let boot = read("/proc/sys/kernel/random/boot_id");
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut id = format!("{machine}/{boot}/{netns}");
    id.truncate(255);
    HostId::new(id).unwrap_or_else(|_| HostId::new("unknown-host").expect("non-empty literal"))
}

/// `N` bytes from the OS CSPRNG (`/dev/urandom`).
pub(crate) fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    use std::io::Read;
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

/// Shared, lock-protected peer table of one engine.
pub type SharedPeerTable = Arc<std::sync::Mutex<orbitte_wire::PeerTable>>;
