//! The engine builder.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use orbitte_topology::{DeviceMask, RdmaConfig};
use orbitte_verbs::Provider;
use orbitte_wire::{Epoch, SourceId};

use crate::error::BuildError;
use crate::registration::Budgets;

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
}

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
        }
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

    /// Address the tcp session listener binds (the net path).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
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

    /// Bytes per slice (default 64 KiB).
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
