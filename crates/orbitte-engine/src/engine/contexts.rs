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
                    .spawn(move || crate::recovery::recovery_loop(&shared))
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
