//! [`EngineState`]'s fields and its constructor; the rules that work on
//! it are in the sibling files, one job each.

use super::{Ledger, Notifications, Outcomes, Tables};
use crate::RailId;
use crate::core::{Core, CoreConfig};
use crate::registration::{Budgets, Charges, Resources};

/// The tables, the ledger and the core, with the rules of admission.
/// See the module docs for how a driver calls it.
#[derive(Debug)]
pub struct EngineState<R: Resources> {
    /// The transfer core.
    pub(crate) core: Core,
    /// The registration and peer tables.
    pub(crate) tables: Tables<R>,
    /// Invariant: `ledger.in_use` is the sum of the registrations'
    /// charges plus what cleanup failures retain.
    pub(crate) ledger: Ledger,
    /// The next registration id (ids are never reused).
    pub(crate) next_reg: u64,
    /// The next peer id (ids are never reused).
    pub(crate) next_peer: u32,
    /// Rotates each request's first rail among its allowed rails.
    pub(crate) rotor: usize,
    /// Outcomes made and not taken yet.
    pub(crate) outcomes: Outcomes,
    /// Notifying batches whose outcomes are held until they resolve.
    pub(crate) notifications: Notifications,
    /// Every `Unquiesced` so far; each one fenced admission.
    pub(crate) unquiesced: Vec<R::Unquiesced>,
    /// Closed rails whose queue pair the driver destroys once their work
    /// in flight drained.
    pub(crate) reap: Vec<RailId>,
}

impl<R: Resources> EngineState<R> {
    /// An empty state: no registrations, peers or rails.
    pub fn new(core: CoreConfig, budgets: Budgets) -> Self {
        Self {
            core: Core::new(core),
            tables: Tables::default(),
            ledger: Ledger {
                budgets,
                in_use: Charges::default(),
            },
            next_reg: 1,
            next_peer: 1,
            rotor: 0,
            outcomes: Outcomes::default(),
            notifications: Notifications::default(),
            unquiesced: Vec::new(),
            reap: Vec::new(),
        }
    }
}
