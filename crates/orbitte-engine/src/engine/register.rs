//! Registration: Host Direct, tcp/local only, retire, unregister,
//! publication.

use std::sync::Arc;

use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_topology::{MemoryLocation, NicId};
use orbitte_verbs as verbs;
use orbitte_wire::{self as wire};

use super::TransferEngine;
use crate::error::{RegisterError, UnregisterError};
use crate::registration::{Access, NicCopies, Registration, close_copies};
use crate::transport::RegistrationId;

impl TransferEngine {
    /// Registers `memory` for requests and, unless `access` is
    /// [`Access::LocalOnly`], publishes it to peers. The returned
    /// [`Registration`] says which path serves it
    /// ([`MemoryPath`](crate::MemoryPath)).
    ///
    /// Host memory is a Host Direct registration
    /// ([`register_host_at`](Self::register_host_at): MRs on every usable
    /// NIC context, budgets charged per copy, all or nothing) unless the
    /// engine was built with
    /// [`host_memory_without_rdma`](crate::EngineBuilder::host_memory_without_rdma):
    /// then no MR is made and tcp and local serve it. A Host Direct failure
    /// is an error, never a silent switch to another path.
    pub fn register(
        &self,
        memory: impl Into<crate::registration::Memory>,
        access: Access,
    ) -> Result<Registration, RegisterError> {
        match memory.into() {
            crate::registration::Memory::Host { memory, location } => {
                if self.shared.host_without_rdma {
                    self.register_host_without_rdma(memory, access)
                } else {
                    self.register_host_at(memory, access, location)
                }
            }
            crate::registration::Memory::Cuda(buffer) => self.register_cuda(buffer, access),
        }
    }

    /// Host Direct registration: prepares MRs on every prepared NIC context
    /// (paused ports included, whatever the dispatch mask), one copy per
    /// context for `Access::LocalOnly`, two for a remotely accessible one, and
    /// publishes the range only when all succeeded. The memory's location
    /// is unknown: rails are used in NIC ID order.
    pub fn register_host(
        &self,
        memory: Arc<HostMemory>,
        access: Access,
    ) -> Result<Registration, RegisterError> {
        self.register_host_at(memory, access, MemoryLocation::Host { numa_node: None })
    }

    /// [`register_host`](Self::register_host) for memory at a known
    /// location (NUMA node): requests on it stripe over rails in affinity
    /// order (PCIe distance, then NUMA distance, then NIC ID), best first.
    pub fn register_host_at(
        &self,
        memory: Arc<HostMemory>,
        access: Access,
        location: MemoryLocation,
    ) -> Result<Registration, RegisterError> {
        if let Some(reason) = self.lock().engine.core().fenced().cloned() {
            return Err(RegisterError::Fenced { reason });
        }
        self.ensure_contexts()
            .map_err(|report| RegisterError::NoUsableNic { report })?;
        let len = memory.len();
        let (reservation, pds, nic_order) = {
            let mut st = self.lock();
            let nics = st.init.as_ref().map(|i| &i.nics[..]).unwrap_or(&[]);
            let pds: Vec<_> = nics
                .iter()
                .map(|n| (n.id.0, n.pd.clone(), n.identity.clone()))
                .collect();
            let ranked = st
                .init
                .as_ref()
                .and_then(|i| i.topology.rank_nics(location).ok())
                .unwrap_or_default();
            let nic_order = crate::registration::affinity_classes(&ranked);
            let reservation = st
                .engine
                .reserve_host_direct(len as u64, access, pds.len())?;
            (reservation, pds, nic_order)
        };
        let id = reservation.id.0;
        let span = tracing::debug_span!("register_host", id, len, ?access);
        let _g = span.enter();
        let buf: Arc<dyn DmaBuffer> = memory.clone();
        let mut copies = Vec::with_capacity(pds.len());
        let mut failure = None;
        for (nic, pd, identity) in &pds {
            let local = match pd.register(buf.clone(), 0..len, verbs::Access::LOCAL_WRITE) {
                Ok(m) => m,
                Err(source) => {
                    failure = Some(RegisterError::Native {
                        nic: NicId(*nic),
                        device: Box::new(identity.clone()),
                        copy: "local-access",
                        len,
                        source: Box::new(source),
                    });
                    break;
                }
            };
            let remote = match crate::registration::remote_verbs(access) {
                None => None,
                Some(a) => match pd.register(buf.clone(), 0..len, a) {
                    Ok(m) => Some(m),
                    Err(source) => {
                        copies.push(NicCopies {
                            nic: *nic,
                            local,
                            remote: None,
                        });
                        failure = Some(RegisterError::Native {
                            nic: NicId(*nic),
                            device: Box::new(identity.clone()),
                            copy: "remote-access",
                            len,
                            source: Box::new(source),
                        });
                        break;
                    }
                },
            };
            copies.push(NicCopies {
                nic: *nic,
                local,
                remote,
            });
        }
        if let Some(err) = failure {
            // Release the copies made so far; a release that fails leaves
            // them retained (verbs keeps the owners and memory) and charged.
            let failures = close_copies(copies);
            let mut st = self.lock();
            let retained = st.engine.abandon_host_direct(reservation, failures.len());
            tracing::warn!(error = %err, "host registration failed; copies released");
            if !failures.is_empty() {
                let u = self.unquiesced_from(
                    format!("release after a failed registration of {len} bytes"),
                    failures,
                    retained,
                );
                self.record_unquiesced(&mut st, &u);
                return Err(RegisterError::Unquiesced {
                    unquiesced: Box::new(u),
                    cause: Box::new(err),
                });
            }
            return Err(err);
        }
        let reg = self.lock().engine.publish_host_direct(
            reservation,
            memory,
            copies,
            nic_order,
            crate::registration::fresh_token(),
        );
        tracing::debug!(id, copies = reg.copies, "registration published");
        Ok(reg)
    }

    /// Registers a range for the tcp and local paths only: no MR is made on
    /// any NIC (nothing is charged) and the rdma path is never offered for
    /// it. An explicit choice for hosts without RDMA, never a fallback:
    /// [`register_host`](Self::register_host) does not switch to it.
    pub fn register_host_without_rdma(
        &self,
        memory: Arc<HostMemory>,
        access: Access,
    ) -> Result<Registration, RegisterError> {
        let reg = self.lock().engine.register_unpinned(
            memory,
            access,
            crate::registration::fresh_token(),
        )?;
        tracing::debug!(
            id = reg.id.0,
            len = reg.len,
            "registration published for tcp/local only"
        );
        Ok(reg)
    }

    /// Unpublishes a registration: new requests on it are refused, peers'
    /// rkeys are revoked (its remote-access MRs are deregistered). Local
    /// requests already in flight keep their local-access MRs until they
    /// drain.
    pub fn retire(&self, registration: RegistrationId) -> Result<(), UnregisterError> {
        let mut st = self.lock();
        let remote = st.engine.retire_registration(registration)?;
        let len = remote.first().map_or(0, |mr| mr.len() as u64);
        let mut failures = Vec::new();
        let mut closed = 0;
        for mr in remote {
            match mr.close() {
                Ok(()) => closed += 1,
                Err(u) => failures.push(u),
            }
        }
        st.engine.retired_closed(registration, closed);
        if failures.is_empty() {
            return Ok(());
        }
        let retained = orbitte_proto::state::retained(failures.len(), len);
        let u = self.unquiesced_from(
            format!("retire of registration {}", registration.0),
            failures,
            retained,
        );
        self.record_unquiesced(&mut st, &u);
        Err(UnregisterError::Unquiesced(Box::new(u)))
    }

    /// Deregisters every copy and forgets the range. Refused while requests
    /// on it are undrained. A failed native deregistration yields
    /// `Unquiesced`: the copy, its memory and its charge stay retained and
    /// the engine is fenced.
    pub fn unregister(&self, registration: RegistrationId) -> Result<(), UnregisterError> {
        if let Some(result) = self.unregister_cuda(registration) {
            return result;
        }
        let mut st = self.lock();
        let entry = st.engine.take_registration(registration)?;
        let len = entry.memory.len() as u64;
        let failures = close_copies(entry.copies);
        let retained = st.engine.retain(failures.len(), len);
        if failures.is_empty() {
            tracing::debug!(id = registration.0, "registration removed");
            return Ok(());
        }
        let u = self.unquiesced_from(
            format!("unregister of registration {}", registration.0),
            failures,
            retained,
        );
        self.record_unquiesced(&mut st, &u);
        Err(UnregisterError::Unquiesced(Box::new(u)))
    }

    /// The segment descriptors of every published, remotely accessible
    /// range, as the wire's `segment-publication` frame.
    pub fn segment_publication(&self) -> wire::SegmentPublication {
        let st = self.lock();
        let nics = st.nic_info();
        let mut ranges: Vec<_> = st
            .engine
            .tables()
            .regs
            .iter()
            .filter_map(|(id, e)| e.descriptor(RegistrationId(*id), &nics))
            .chain(st.staged.regs.iter().filter_map(|(id, e)| {
                let p = e.published.as_ref()?;
                let host = &self.shared.sessions.host_id;
                Some(crate::session::publications::descriptor(
                    wire::RangeId(*id),
                    p,
                    host,
                    Vec::new(),
                ))
            }))
            .collect();
        ranges.sort_by_key(|r| r.range_id.0);
        wire::SegmentPublication {
            epoch: self.shared.epoch,
            ranges,
        }
    }
}
