//! NIC contexts, initialized once on first use, and their poller threads.

use orbitte_topology::MemoryLocation;

use super::TransferEngine;
use super::poll::poll_loop;
use crate::error::NicsUnavailable;
use crate::nic;

impl TransferEngine {
    /// Initializes NIC contexts once (first Host Direct registration or
    /// first RDMA use). Returns the prepared NIC IDs, or why there are none.
    pub(crate) fn ensure_contexts(&self) -> Result<Vec<u32>, NicsUnavailable> {
        let mut st = self.lock();
        if st.init.is_none() {
            let init = nic::initialize(
                self.shared.provider.as_ref(),
                &st.listed,
                &self.shared.settings.rdma,
                (self.shared.settings.max_in_flight * 64).clamp(1024, 65536),
            );
            let mut order: Vec<u32> = match init
                .topology
                .rank_nics(MemoryLocation::Host { numa_node: None })
            {
                Ok(r) => r.into_iter().map(|a| a.nic.0).collect(),
                Err(_) => Vec::new(),
            };
            order.retain(|id| init.nics.iter().any(|n| n.id.0 == *id));
            for n in &init.nics {
                if !order.contains(&n.id.0) {
                    order.push(n.id.0);
                }
            }
            st.nic_order = order;
            let mut threads = self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for n in &init.nics {
                let shared = self.shared.clone();
                let (id, cq, ctx) = (n.id.0, n.cq.clone(), n.context.clone());
                let waiters = n.cq_waiters.clone();
                match std::thread::Builder::new()
                    .name(format!("orbitte-poll-{id}"))
                    .spawn(move || poll_loop(&shared, id, cq, ctx, &waiters))
                {
                    Ok(h) => threads.push(h),
                    Err(e) => tracing::error!(nic = id, error = %e, "poller thread did not start"),
                }
            }
            if !init.nics.is_empty() {
                let shared = self.shared.clone();
                match std::thread::Builder::new()
                    .name("orbitte-recovery".into())
                    .spawn(move || super::recovery::recovery_loop(&shared))
                {
                    Ok(h) => threads.push(h),
                    Err(e) => {
                        tracing::error!(error = %e, "rail recovery thread did not start")
                    }
                }
            }
            tracing::info!(contexts = init.nics.len(), "nic contexts initialized");
            st.init = Some(init);
        }
        let init = st.init.as_ref().map(|i| {
            (
                i.nics.iter().map(|n| n.id.0).collect::<Vec<_>>(),
                i.selection_error.clone(),
            )
        });
        match init {
            Some((ids, _)) if !ids.is_empty() => Ok(ids),
            Some((_, Some(err))) => Err(NicsUnavailable::Selection(err)),
            _ => Err(st
                .listing_error
                .clone()
                .map_or(NicsUnavailable::NonePrepared, NicsUnavailable::Listing)),
        }
    }
}

#[cfg(feature = "testing")]
impl TransferEngine {
    /// Registers `memory` on the protection domain of NIC ID `nic` and
    /// leaks the region on purpose
    /// ([`ProtectionDomain::leak_registration`](orbitte_verbs::ProtectionDomain::leak_registration)):
    /// the device then refuses that PD's destroy at
    /// [`shutdown`](crate::TransferEngine::shutdown), which must end
    /// `Unquiesced`. Returns the region's lkey.
    pub fn leak_registration_on(
        &self,
        nic: orbitte_topology::NicId,
        memory: std::sync::Arc<orbitte_memory::HostMemory>,
    ) -> Result<u32, crate::RegisterError> {
        self.ensure_contexts()
            .map_err(|report| crate::RegisterError::NoUsableNic { report })?;
        let st = self.lock();
        let Some(n) = st
            .init
            .as_ref()
            .and_then(|i| i.nics.iter().find(|n| n.id == nic))
        else {
            return Err(crate::RegisterError::NoUsableNic {
                report: NicsUnavailable::NoContext { nic },
            });
        };
        let len = memory.len();
        n.pd.leak_registration(memory, 0..len, orbitte_verbs::Access::LOCAL_WRITE)
            .map_err(|source| crate::RegisterError::Native {
                nic,
                device: Box::new(n.identity.clone()),
                copy: "leaked",
                len,
                source: Box::new(source),
            })
    }
}
