//! What the engine reports about itself: topology, charges, fence,
//! outstanding slices.

use super::TransferEngine;
use crate::error::Unquiesced;
use crate::nic::{ContextStatus, EngineTopology};
use crate::registration::Charges;

impl TransferEngine {
    /// What was discovered and what was initialized so far.
    pub fn topology(&self) -> EngineTopology {
        let st = self.lock();
        let listed = st.listed.iter().map(|d| d.identity.name.clone()).collect();
        match &st.init {
            None => EngineTopology {
                listed,
                initialized: false,
                topology: None,
                selection: None,
                selection_error: st
                    .listing_error
                    .clone()
                    .map(crate::NicsUnavailable::Listing),
                contexts: Vec::new(),
            },
            Some(init) => EngineTopology {
                listed,
                initialized: true,
                topology: Some(init.topology.clone()),
                selection: init.selection.clone(),
                selection_error: init
                    .selection_error
                    .clone()
                    .map(crate::NicsUnavailable::Selection),
                contexts: init
                    .nics
                    .iter()
                    .map(|n| ContextStatus {
                        nic: n.id,
                        device: n.identity.name.clone(),
                        driver: n.driver.clone(),
                        port: n.port,
                        gid_index: n.gid_index,
                        port_active: n.port_active(),
                    })
                    .collect(),
            },
        }
    }

    /// Budget charges in use (MRs, bytes), retained copies included.
    pub fn charges(&self) -> Charges {
        self.lock().engine.in_use()
    }

    /// Why the engine admits nothing new, if it is fenced.
    pub fn fenced(&self) -> Option<String> {
        self.lock().engine.fenced().map(|r| r.to_string())
    }

    /// Every `Unquiesced` so far (the evidence is kept).
    pub fn unquiesced(&self) -> Vec<Unquiesced> {
        self.lock().engine.unquiesced().to_vec()
    }

    /// Slices posted and not yet drained, over all requests.
    pub fn outstanding_slices(&self) -> u64 {
        self.lock().engine.core().outstanding_slices()
    }
}
