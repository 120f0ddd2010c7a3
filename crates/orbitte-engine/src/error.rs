//! Errors, one enum per operation.
//!
//! Grouped by whose fault: the caller misused the API (bad input, fenced
//! engine), the local system failed (native errors, budgets), or the peer
//! said something wrong (handshake, protocol).

use std::sync::Arc;

use orbitte_cuda::PipelineError;
use orbitte_memory::MemoryError;
use orbitte_verbs as verbs;
use orbitte_wire as wire;

use crate::outcome::RequestId;
use crate::transport::RegistrationId;

/// A native cleanup that could not be established: the native owners, their
/// memory and their budget charges stay retained, and the engine is fenced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "engine {source_id} (epoch {epoch}) unquiesced during {during}: {failures} native destroy(s) failed \
     (first: {first}); {mrs} MRs / {bytes} bytes stay retained and charged; new admission is fenced",
    failures = .failures.len(),
    first = .failures.first().map(|f| f.to_string()).unwrap_or_default(),
    mrs = .retained.mrs, bytes = .retained.bytes
)]
pub struct Unquiesced {
    /// The source owner (this engine's source id).
    pub source_id: String,
    /// Its epoch.
    pub epoch: orbitte_wire::Epoch,
    /// What was being cleaned up (`unregister of registration 3`,
    /// `shutdown`, `release after a failed registration`).
    pub during: String,
    /// Each failed destroy, with device identity, native error and the
    /// cleanup evidence.
    pub failures: Vec<verbs::Unquiesced>,
    /// Charges that stay in the budgets for the retained copies.
    pub retained: orbitte_proto::registration::Charges,
}

impl Unquiesced {
    /// The reason admission is fenced with: what was being cleaned up and
    /// the first failure.
    pub(crate) fn fence_reason(&self) -> String {
        format!(
            "unquiesced during {}: {}",
            self.during,
            self.failures
                .first()
                .map(|f| f.to_string())
                .unwrap_or_default()
        )
    }
}

/// Why [`EngineBuilder::build`](crate::EngineBuilder::build) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The source id is not a valid wire source id.
    #[error("invalid source id: {0}; use 1..=255 printable bytes")]
    SourceId(#[source] wire::TextError),
    /// No epoch could be chosen.
    #[error(transparent)]
    Epoch(#[from] wire::EpochError),
    /// A setting is out of range.
    #[error("invalid setting {name}: {why}")]
    Setting {
        /// The setting.
        name: &'static str,
        /// Why.
        why: String,
    },
    /// The cluster secret's file (a setting or `ORBITTE_SECRET_FILE`)
    /// could not be used.
    #[error(transparent)]
    Secret(#[from] crate::secret::SecretFileError),
    /// The listener (`EngineBuilder::listen`) could not be bound.
    #[error(transparent)]
    Listen(#[from] crate::session::ListenError),
    /// The cluster metadata service could not be joined.
    #[error("cannot join the cluster metadata: {0}")]
    Metadata(#[source] crate::metadata::MetadataError),
    /// A thread of the engine could not be started.
    #[error("cannot start the engine's {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

/// Why [`TransferEngine::register_host`](crate::TransferEngine::register_host)
/// failed. Nothing was published; no copy is left behind (or, for
/// `Unquiesced`, what is left is retained and charged).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The range does not fit a budget. Published ranges are never evicted:
    /// retire unused registrations or raise the budget.
    #[error(
        "resource exhausted: {resource} budget: asked {asked}, in use {in_use}, limit {limit}; \
         retire unused registrations or raise the budget (published ranges are never evicted)"
    )]
    ResourceExhausted {
        /// `memory regions` or `registered bytes`.
        resource: &'static str,
        /// What the registration needs (all copies).
        asked: u64,
        /// Already charged.
        in_use: u64,
        /// The budget.
        limit: u64,
    },
    /// No NIC context could be prepared.
    #[error("no usable rdma context for host direct registration: {report}")]
    NoUsableNic {
        /// Why: the device listing failed, or the selection's report of
        /// every device and port with its reason.
        report: NicsUnavailable,
    },
    /// A native registration failed on one context. The copies already made
    /// were released. There is no automatic switch to staging.
    #[error(
        "registering {len} bytes ({copy} copy) on NIC ID {} ({device}) failed: {source}; \
         no automatic switch to staging was made",
        nic.0
    )]
    Native {
        /// NIC ID.
        nic: orbitte_topology::NicId,
        /// Device identity.
        device: Box<verbs::DeviceIdentity>,
        /// `local-access` or `remote-access`.
        copy: &'static str,
        /// Bytes.
        len: usize,
        /// The verbs error.
        #[source]
        source: Box<verbs::RegisterError>,
    },
    /// A registration failed part-way and releasing the copies already made
    /// failed too.
    #[error("{unquiesced} (after: {cause})")]
    Unquiesced {
        /// The release failure.
        unquiesced: Box<Unquiesced>,
        /// The registration failure that started the release.
        #[source]
        cause: Box<Self>,
    },
    /// The engine is fenced.
    #[error("engine is fenced, registration refused: {reason}")]
    Fenced {
        /// Why.
        reason: Arc<str>,
    },
    /// GPU memory asked for remote access: that is direct registration of
    /// GPU memory with NICs, which is not implemented. Nothing switches to
    /// another path.
    #[error(
        "{path}: not implemented: registering GPU memory directly with RDMA NICs needs \
         peer-memory or dma-buf support and hardware qualification; register the buffer with \
         Access::LocalOnly (cuda-staging) and publish host memory instead"
    )]
    NotImplemented {
        /// The path the registration would need (`gpudirect-rdma`).
        path: crate::transport::PathKind,
    },
    /// The cuda-staging lanes of the buffer's device could not be made
    /// (pipelines, pinned bounce buffers, their registration). Nothing of
    /// them is left registered; no other path is tried.
    #[error("cuda-staging on CUDA device {device}: {source}")]
    Staging {
        /// The CUDA device index.
        device: usize,
        /// Why.
        #[source]
        source: Box<StagingSetupError>,
    },
}

/// Why this engine could make no rdma rail to a peer.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NoRdmaRail {
    /// No NIC context could be prepared here.
    #[error(transparent)]
    Contexts(NicsUnavailable),
    /// Every prepared NIC's port is not active.
    #[error("{}", InactivePort::list(.0))]
    PortsInactive(Vec<InactivePort>),
    /// The peer asked for a queue pair and no context is prepared.
    #[error("no prepared nic context")]
    NoContext,
}

/// A prepared NIC whose port is not active ([`NoRdmaRail::PortsInactive`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InactivePort {
    /// The NIC.
    pub nic: orbitte_topology::NicId,
    /// Its device name.
    pub device: String,
    /// The selected port.
    pub port: u8,
}

impl InactivePort {
    fn list(ports: &[Self]) -> String {
        ports
            .iter()
            .map(|p| {
                format!(
                    "NIC ID {} ({}) port {} not active",
                    p.nic.0, p.device, p.port
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Why no NIC context can serve Host Direct registration.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NicsUnavailable {
    /// The verbs provider could not list devices (local system).
    #[error(transparent)]
    Listing(Arc<verbs::DeviceListError>),
    /// Selection found no usable device and port: the topology's report
    /// names every one with its reason.
    #[error(transparent)]
    Selection(orbitte_topology::SelectionError),
    /// Devices were selected but none could be opened and prepared.
    #[error("no device could be opened and prepared")]
    NonePrepared,
    /// The NIC asked for has no prepared context.
    #[error("NIC ID {} has no prepared context", .nic.0)]
    NoContext {
        /// The NIC.
        nic: orbitte_topology::NicId,
    },
}

/// Why [`TransferEngine::unregister`](crate::TransferEngine::unregister) or
/// [`TransferEngine::retire`](crate::TransferEngine::retire) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UnregisterError {
    /// Not a live registration of this engine.
    #[error("unknown registration {0:?}")]
    Unknown(RegistrationId),
    /// Requests on it are still undrained: wait for their drain first.
    #[error("registration {id:?} still has {requests} undrained request(s); wait for drain first")]
    Undrained {
        /// The registration.
        id: RegistrationId,
        /// Undrained requests.
        requests: usize,
    },
    /// A native deregistration failed.
    #[error(transparent)]
    Unquiesced(Box<Unquiesced>),
}

/// Why a blocking wait returned without an outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The wait's own timeout passed first (the request still runs; its
    /// request timeout will end it).
    #[error("{0}: no outcome yet within the wait timeout; wait again or cancel")]
    TimedOut(RequestId),
    /// Not a request of this engine, or its outcome was already taken.
    #[error("{0}: unknown request, or its outcome was already taken")]
    Unknown(RequestId),
}

/// A drain wait ran out of time: transports still hold the request's local
/// bytes. Do not reuse the buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{request}: {slices} slice(s) still undrained after the wait; the buffer is not the caller's yet"
)]
pub struct DrainTimeout {
    /// The request.
    pub request: RequestId,
    /// Slices the transports still hold.
    pub slices: u32,
}

/// A control-channel failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// The other end went away.
    #[error("control link closed")]
    Closed,
    /// Nothing arrived in time.
    #[error("control link: nothing received within {0:?}")]
    TimedOut(std::time::Duration),
    /// The peer sent bytes that are not a valid frame (the peer's fault).
    #[error("control link: {0}")]
    Decode(#[source] wire::DecodeError),
    /// A frame of ours could not be encoded (a local fault).
    #[error("control link: {0}")]
    Encode(#[source] wire::EncodeError),
    /// A data frame (one with a payload) on the control link, which
    /// carries control frames only (sent: a local misuse; received: the
    /// peer's fault).
    #[error("control link: data frames do not travel on the control link ({})", if *.sent { "refused to send one" } else { "the peer sent one" })]
    DataFrame {
        /// Whether we tried to send it (else the peer sent it).
        sent: bool,
    },
    /// The peer speaks another protocol version (no fallback exists).
    #[error("peer speaks orbitte protocol version {theirs}, we speak {ours}; run the same release on both (no legacy fallback)", ours = orbitte_wire::PROTOCOL_VERSION)]
    Version {
        /// The peer's version.
        theirs: u16,
    },
    /// I/O failure of the link.
    #[error("control link i/o: {0}")]
    Io(#[source] Arc<std::io::Error>),
    /// The session under the link failed (a truncated frame, a bound hit).
    #[error("control link: {0}")]
    Session(#[source] Arc<crate::session::SessionError>),
}

/// Why opening a peer failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenPeerError {
    /// The control link failed.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The handshake failed (version, stale epoch, authentication, or the
    /// peer rejected us).
    #[error("handshake failed: {0}")]
    Handshake(#[from] wire::handshake::HandshakeError),
    /// The peer sent a frame that does not belong here.
    #[error("peer sent {got} while {expected} was expected")]
    Unexpected {
        /// What was expected.
        expected: &'static str,
        /// What came.
        got: wire::FrameType,
    },
    /// The peer refused (an `error` frame or a `connect-reject`).
    #[error("peer rejected the rdma connection: {code}: {message}")]
    Rejected {
        /// Its code.
        code: wire::ErrorCode,
        /// Its message.
        message: String,
    },
    /// A publication or retire for a peer that the epoch rule refuses.
    #[error(transparent)]
    Record(#[from] wire::RecordError),
    /// Not an open peer of this engine (never opened, or replaced by a
    /// newer epoch).
    #[error("unknown peer {}", .0.0)]
    UnknownPeer(crate::transport::PeerId),
    /// No local context can make a rail.
    #[error("no usable rail: {0}")]
    NoRail(NoRdmaRail),
    /// A verbs call failed while making a rail.
    #[error("making a rail on NIC ID {} ({device}) failed: {source}", .nic.0)]
    Verbs {
        /// NIC ID.
        nic: orbitte_topology::NicId,
        /// Device identity.
        device: String,
        /// The verbs error (or the value the wire cannot carry).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The engine is fenced.
    #[error("engine is fenced, peer refused: {0}")]
    Fenced(Arc<str>),
}

impl From<orbitte_proto::error::RegisterRefusal> for RegisterError {
    fn from(r: orbitte_proto::error::RegisterRefusal) -> Self {
        use orbitte_proto::error::RegisterRefusal as R;
        match r {
            R::ResourceExhausted {
                resource,
                asked,
                in_use,
                limit,
            } => Self::ResourceExhausted {
                resource,
                asked,
                in_use,
                limit,
            },
            R::Fenced { reason } => Self::Fenced { reason },
        }
    }
}

impl From<orbitte_proto::error::UnregisterRefusal> for UnregisterError {
    fn from(r: orbitte_proto::error::UnregisterRefusal) -> Self {
        use orbitte_proto::error::UnregisterRefusal as R;
        match r {
            R::Unknown(id) => Self::Unknown(id),
            R::Undrained { id, requests } => Self::Undrained { id, requests },
        }
    }
}

/// Why the cuda-staging lanes of a device could not be made. Nothing of
/// them is left registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagingSetupError {
    /// Depth or chunk size zero.
    #[error(
        "cuda-staging needs at least one pipeline and a chunk of at least one byte (asked depth \
         {depth}, chunk {chunk}); the default chunk is 4 MiB"
    )]
    Zero {
        /// Pipelines asked for.
        depth: usize,
        /// Chunk size asked for.
        chunk: usize,
    },
    /// A staging pipeline (streams, pinned bounce buffers) could not be made.
    #[error("cuda-staging pipeline {lane} on CUDA device {device}: {source}")]
    Pipeline {
        /// Pipeline index.
        lane: usize,
        /// CUDA device index.
        device: usize,
        /// Why.
        #[source]
        source: PipelineError,
    },
    /// The engine's view of a pinned bounce buffer
    /// (`HostMemory::from_dma_buffer`) could not be made.
    #[error("host view of bounce buffer {slot} of cuda-staging pipeline {lane}: {source}")]
    View {
        /// Pipeline index.
        lane: usize,
        /// Bounce buffer (0 or 1).
        slot: usize,
        /// Why.
        #[source]
        source: MemoryError,
    },
    /// Registering a bounce buffer with the engine failed. A registration
    /// error never switches silently to another path.
    #[error(
        "registering bounce buffer {slot} of cuda-staging pipeline {lane} ({bytes} bytes) with \
         the engine failed: {source}"
    )]
    Register {
        /// Pipeline index.
        lane: usize,
        /// Bounce buffer (0 or 1).
        slot: usize,
        /// Its size.
        bytes: usize,
        /// The engine's error.
        #[source]
        source: RegisterError,
    },
    /// A lane's thread could not be started.
    #[error("starting the thread of cuda-staging lane {lane}: {source}")]
    Thread {
        /// Lane index.
        lane: usize,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
