//! The engine builder.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use orbitte_topology::{DeviceMask, RdmaConfig};
use orbitte_verbs::Provider;
use orbitte_wire::auth::{ClusterSecret, ListenerToken};
use orbitte_wire::{Epoch, SourceId};

use crate::error::BuildError;
use crate::metadata::MetadataMode;
use crate::registration::Budgets;
use crate::session::SessionConfig;

/// Builds a [`TransferEngine`](crate::TransferEngine).
///
/// ```no_run
/// use orbitte_engine::{EngineBuilder, Budgets};
/// let engine = EngineBuilder::new("prefill-0")
///     .budgets(Budgets { max_mrs: 1024, max_bytes: 64 << 30 })
///     .slice_size(64 * 1024)
///     .build()
///     .unwrap();
/// ```
#[derive(Clone)]
pub struct EngineBuilder {
    pub(crate) source_id: String,
    pub(crate) epoch: Option<u64>,
    pub(crate) last_epoch: Option<u64>,
    pub(crate) listen: Option<SocketAddr>,
    pub(crate) rdma: RdmaConfig,
    pub(crate) provider: Option<Arc<dyn Provider>>,
    pub(crate) budgets: Budgets,
    pub(crate) dispatch_mask: DeviceMask,
    pub(crate) slice_size: u32,
    pub(crate) request_timeout: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) max_in_flight: u32,
    pub(crate) signal_interval: u32,
    pub(crate) cluster_secret: Option<ClusterSecret>,
    pub(crate) secret_file: Option<PathBuf>,
    pub(crate) secret_env: bool,
    pub(crate) listener_token: Option<ListenerToken>,
    pub(crate) session_tuning: Vec<SessionTuning>,
    pub(crate) metadata: MetadataMode,
    pub(crate) host_without_rdma: bool,
    pub(crate) recovery: crate::recovery::RecoveryPolicy,
    pub(crate) staging: crate::staging::StagingConfig,
    pub(crate) metrics_peer_rows: usize,
    pub(crate) notification_inbox: crate::notify::InboxLimits,
}

/// A change to the engine's session settings (see
/// [`EngineBuilder::session_settings`]).
pub(crate) type SessionTuning = Arc<dyn Fn(&mut SessionConfig) + Send + Sync>;

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("source_id", &self.source_id)
            .field("epoch", &self.epoch)
            .field("rdma", &self.rdma)
            .field("budgets", &self.budgets)
            .field("dispatch_mask", &self.dispatch_mask)
            .field("slice_size", &self.slice_size)
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// An engine whose source owner id is `source_id` (stable across
    /// restarts; the epoch tells incarnations apart).
    pub fn new(source_id: impl Into<String>) -> Self {
        Self {
            source_id: source_id.into(),
            epoch: None,
            last_epoch: None,
            listen: None,
            rdma: RdmaConfig::default(),
            provider: None,
            budgets: Budgets::default(),
            dispatch_mask: DeviceMask::ALL,
            slice_size: 64 * 1024,
            request_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            max_in_flight: 128,
            signal_interval: 16,
            cluster_secret: None,
            secret_file: None,
            secret_env: true,
            listener_token: None,
            session_tuning: Vec::new(),
            metadata: MetadataMode::P2p,
            host_without_rdma: false,
            recovery: crate::recovery::RecoveryPolicy::default(),
            staging: crate::staging::StagingConfig::default(),
            metrics_peer_rows: crate::metrics::MAX_PEER_ROWS,
            notification_inbox: crate::notify::InboxLimits::default(),
        }
    }

    /// How many unread notifications, and how many bytes of them, this
    /// engine keeps from each sender (default 1024 and 16 MiB), and how
    /// many bytes from all senders (default 256 MiB). A notification past
    /// any bound is refused and its sender told: the sender's batch says
    /// `Refused`. Raise them when senders send faster
    /// than the application reads in bursts; a notification larger than
    /// `per_peer_bytes` is always refused.
    pub fn notification_inbox(mut self, limits: crate::notify::InboxLimits) -> Self {
        self.notification_inbox = limits;
        self
    }

    /// Uses this authoritative epoch (must be newer than any earlier
    /// incarnation's). Default: wire's epoch rule (`Epoch::choose`) from the
    /// wall clock and [`last_epoch`](Self::last_epoch).
    pub fn epoch(mut self, epoch: u64) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// The last persisted epoch of this source owner: the chosen epoch is
    /// newer.
    pub fn last_epoch(mut self, epoch: u64) -> Self {
        self.last_epoch = Some(epoch);
        self
    }

    /// Makes [`build`](Self::build) bind one listener on `addr` (port 0:
    /// any free port; [`TransferEngine::listen_addr`](crate::TransferEngine::listen_addr)
    /// says which) that serves every session this engine accepts: tcp data
    /// sessions, same-host mapping (the local path) and rdma control links
    /// (queue pair exchange). The session's `hello` names what it is for, so
    /// peers need this one address only. Without `listen` the engine accepts
    /// nothing and can only connect to others.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// Every session (both directions, every path) must prove knowledge of
    /// this secret (HMAC over fresh nonces); peers without it are refused.
    /// Default: the file [`ORBITTE_SECRET_FILE`](crate::secret::SECRET_FILE_ENV)
    /// names, if it is set; else no secret (any host that reaches the port
    /// is admitted, and `build` warns when the listener is reachable beyond
    /// this host).
    pub fn cluster_secret(mut self, secret: ClusterSecret) -> Self {
        self.cluster_secret = Some(secret);
        self
    }

    /// [`cluster_secret`](Self::cluster_secret) read from a file (at least
    /// 16 random bytes: `head -c 32 /dev/urandom > FILE`) when the engine
    /// is built; an unreadable or short file is
    /// [`BuildError::Secret`](crate::BuildError::Secret).
    pub fn cluster_secret_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.secret_file = Some(path.into());
        self
    }

    /// Whether an engine without a secret of its own reads
    /// [`ORBITTE_SECRET_FILE`](crate::secret::SECRET_FILE_ENV) (default
    /// true; tests that build open engines in a process with it set turn
    /// it off).
    pub fn secret_from_env(mut self, read: bool) -> Self {
        self.secret_env = read;
        self
    }

    /// The listener admits only peers that hold this token (a capability
    /// published in the engine's metadata, which peers pass to
    /// [`ConnectOptions::token`](crate::ConnectOptions::token)) and, with a
    /// cluster secret, the secret too ([`ClusterSecret::access_key`]). So
    /// an engine whose metadata travels over a channel the operator trusts
    /// is closed to everyone else with no secret configured. Sessions this
    /// engine opens are unaffected.
    pub fn listener_token(mut self, token: ListenerToken) -> Self {
        self.listener_token = Some(token);
        self
    }

    /// The cluster secret this builder gives its engine: the one set in
    /// code, else the file's, else (unless turned off) the environment's.
    pub(crate) fn resolve_secret(&mut self) -> Result<(), BuildError> {
        if self.cluster_secret.is_some() {
            return Ok(());
        }
        if let Some(path) = &self.secret_file {
            self.cluster_secret = Some(crate::secret::read_secret_file(
                path,
                "setting cluster_secret_file",
            )?);
        } else if self.secret_env {
            self.cluster_secret = crate::secret::secret_from_env()?;
        }
        Ok(())
    }

    /// Makes [`register`](crate::TransferEngine::register) keep host memory
    /// off RDMA: no MR on any NIC (nothing charged), served by tcp and
    /// local only, and reported as
    /// [`MemoryPath::HostWithoutRdma`](crate::MemoryPath::HostWithoutRdma).
    /// The explicit choice for hosts without RDMA; without it a Host Direct
    /// failure is an error, never a fallback.
    pub fn host_memory_without_rdma(mut self) -> Self {
        self.host_without_rdma = true;
        self
    }

    /// The cuda-staging lanes made on each CUDA device at its first CUDA
    /// registration (default [`StagingConfig::default`](crate::staging::StagingConfig):
    /// two lanes of 4 MiB chunks). Their bounce buffers are Host Direct
    /// registrations, or none with
    /// [`host_memory_without_rdma`](Self::host_memory_without_rdma).
    pub fn cuda_staging(mut self, config: crate::staging::StagingConfig) -> Self {
        self.staging = config;
        self
    }

    /// Where peers find this engine and where it finds them by name.
    /// Default [`MetadataMode::P2p`]: descriptors travel over the session,
    /// peers are named by address ([`connect`](crate::TransferEngine::connect)).
    /// With [`MetadataMode::Etcd`] (cargo feature `etcd`) `build` connects
    /// to etcd and, when the engine [`listen`](Self::listen)s, stores its
    /// record (source id, epoch, listen address) under a lease it keeps
    /// alive; `TransferEngine::connect_by_name` looks peers up there.
    /// Listen on an address peers can dial (not `0.0.0.0`) when others
    /// find you through etcd.
    pub fn metadata(mut self, mode: MetadataMode) -> Self {
        self.metadata = mode;
        self
    }

    /// Adjusts the session settings (timeouts, connection bounds,
    /// pipelining depth; see [`SessionConfig`]) after the engine filled in
    /// its identity, [`handshake_timeout`](Self::handshake_timeout) and
    /// [`cluster_secret`](Self::cluster_secret). Applied in call order.
    pub fn session_settings(
        mut self,
        adjust: impl Fn(&mut SessionConfig) + Send + Sync + 'static,
    ) -> Self {
        self.session_tuning.push(Arc::new(adjust));
        self
    }

    /// RDMA device/port/GID selection (strict pins or discovery). The
    /// engine uses exactly this configuration and reads no environment
    /// variable; to honour `ORBITTE_RDMA_*` (as the `orbitte` command
    /// does), pass the result of `RdmaConfig::resolve`.
    pub fn rdma(mut self, config: RdmaConfig) -> Self {
        self.rdma = config;
        self
    }

    /// The verbs provider (default: native libibverbs; tests pass a sim).
    pub fn provider(mut self, provider: Arc<dyn Provider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Aggregate registration budgets (MR count and bytes).
    pub fn budgets(mut self, budgets: Budgets) -> Self {
        self.budgets = budgets;
        self
    }

    /// NIC IDs that may carry transfers (it does not reduce publication
    /// fan-out: registrations cover every prepared context).
    pub fn dispatch_mask(mut self, mask: DeviceMask) -> Self {
        self.dispatch_mask = mask;
        self
    }

    /// Bytes per slice (default 64 KiB). A request whose rails are all
    /// tcp is cut into slices of this size or 1 MiB, whichever is larger
    /// (each tcp slice costs a request frame and an answer); a request
    /// with a tcp rail, into slices of at most 16 MiB (the largest payload
    /// of a tcp frame).
    pub fn slice_size(mut self, bytes: u32) -> Self {
        self.slice_size = bytes;
        self
    }

    /// From submission to a logical timeout (default 10 s).
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// From an undrained outcome to flushing the rails that hold its slices
    /// (default 5 s).
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// Closes a session that authenticated but sends no request for this
    /// long (`None`, the default: never; the initiator's tcp rails to it go
    /// down and are not opened again on their own). Without it, a full
    /// listener still frees the slot of the session idle the longest for
    /// a newcomer ([`SessionConfig::evict_idle_after`]). The same as
    /// [`session_settings`](Self::session_settings) setting
    /// [`SessionConfig::idle_timeout`].
    pub fn idle_timeout(self, d: Option<Duration>) -> Self {
        self.session_settings(move |cfg| cfg.idle_timeout = d)
    }

    /// Bound on each control-link wait while opening a peer (default 5 s).
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.handshake_timeout = d;
        self
    }

    /// Most work requests in flight per queue pair (default 128).
    pub fn max_in_flight(mut self, n: u32) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Signal at least every `n` work requests (default 16).
    pub fn signal_interval(mut self, n: u32) -> Self {
        self.signal_interval = n;
        self
    }

    /// How rdma rails whose queue pair went to the error state are
    /// re-established (default: [`RecoveryPolicy::default`](crate::RecoveryPolicy)).
    pub fn rail_recovery(mut self, policy: crate::recovery::RecoveryPolicy) -> Self {
        self.recovery = policy;
        self
    }

    /// Peer rows the metrics keep apart (default
    /// [`MAX_PEER_ROWS`](crate::metrics::MAX_PEER_ROWS)): past them, the
    /// peers are counted together, per path, under the peer
    /// [`OTHER_PEERS`](crate::metrics::OTHER_PEERS). Peers choose their
    /// source ids, so this bounds the size of a metrics snapshot (and of
    /// its Prometheus text) whatever the number of peers that connect.
    pub fn metrics_peer_rows(mut self, n: usize) -> Self {
        self.metrics_peer_rows = n;
        self
    }

    /// The session settings of an engine with this identity.
    pub(crate) fn session_config(&self, source: &SourceId, epoch: Epoch) -> SessionConfig {
        let mut cfg = SessionConfig::new(source.clone(), epoch);
        cfg.handshake_timeout = self.handshake_timeout;
        cfg.cluster_secret = self.cluster_secret.clone();
        cfg.listener_token = self.listener_token;
        cfg.access_key = self
            .listener_token
            .map(|t| ClusterSecret::access_key(self.cluster_secret.as_ref(), &t));
        for adjust in &self.session_tuning {
            adjust(&mut cfg);
        }
        cfg
    }

    /// Refuses session settings that cannot work.
    pub(crate) fn check_sessions(cfg: &SessionConfig) -> Result<(), BuildError> {
        let min = crate::session::MIN_SOCKET_BUFFER;
        if let Some(n) = cfg.socket_buffer.filter(|n| *n < min) {
            return Err(BuildError::Setting {
                name: "socket_buffer",
                why: format!(
                    "{n} bytes is below the {} KiB floor (a socket buffer under one segment stalls a session on zero-window probes); ask for at least {min} bytes, or None for the kernel's autotuning",
                    min >> 10
                ),
            });
        }
        if cfg.unsent_limit == Some(0) {
            return Err(BuildError::Setting {
                name: "unsent_limit",
                why: "0 bytes would leave the kernel's default (the socket takes its whole send buffer); ask for at least 1 byte (the default is 128 KiB), or None for the kernel's default".to_owned(),
            });
        }
        Ok(())
    }

    pub(crate) fn checked(&self) -> Result<(SourceId, Epoch), BuildError> {
        let source = SourceId::new(self.source_id.clone()).map_err(BuildError::SourceId)?;
        let epoch = match self.epoch {
            Some(e) => Epoch::new(e)?,
            None => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                let last = self.last_epoch.map(Epoch::new).transpose()?;
                Epoch::choose(now, last)?
            }
        };
        if self.slice_size == 0 {
            return Err(BuildError::Setting {
                name: "slice_size",
                why: "must be at least 1 byte".into(),
            });
        }
        if self.notification_inbox.per_peer == 0 {
            return Err(BuildError::Setting {
                name: "notification_inbox.per_peer",
                why: "must be at least 1 (a target that keeps no notification refuses every one)"
                    .into(),
            });
        }
        if self.max_in_flight == 0 {
            return Err(BuildError::Setting {
                name: "max_in_flight",
                why: "must be at least 1".into(),
            });
        }
        if self.request_timeout.is_zero() {
            return Err(BuildError::Setting {
                name: "request_timeout",
                why: "must be nonzero".into(),
            });
        }
        Ok((source, epoch))
    }
}
