//! The sans-IO state's refusals of registration calls. The engine's
//! public errors (`RegisterError`, `UnregisterError`) carry them with the
//! same variants and words, next to the driver's own causes (native
//! failures, unquiesced cleanups).

use std::sync::Arc;

use crate::RegistrationId;

/// Why the state refused to admit a registration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterRefusal {
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
    /// The engine is fenced.
    #[error("engine is fenced, registration refused: {reason}")]
    Fenced {
        /// Why.
        reason: Arc<str>,
    },
}

/// Why the state refused to take or retire a registration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnregisterRefusal {
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
}
