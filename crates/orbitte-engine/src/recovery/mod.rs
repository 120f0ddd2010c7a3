//! Rail recovery: an rdma rail whose queue pair went to the error state
//! (an error completion, a fatal event, a flush) or whose port went down
//! is re-established in the background, as a new RC queue pair on the same
//! NIC pair at the same peer epoch, over the peer's rdma control session.
//!
//! ```text
//! side that opened the peer                       the other side
//!   rail seen down; attempt n due
//!   new QP (INIT) on the rail's NIC
//!   -------- connect-request (one rail) ---------->  finds the rail on that
//!                                                    NIC pair; new QP: INIT,
//!                                                    RTR, RTS; old one
//!   <------- connect-accept (one endpoint) --------  destroyed
//!   new QP: RTR, RTS; old one destroyed
//!   rail up again (same rail id)
//! ```
//!
//! The decisions (when to try, backoff, cooldown) are the sans-IO
//! [`Recoveries`] state; this module feeds it the core's view of the rails
//! and installs a re-established queue pair in the driver's state. The
//! driver (`engine::recovery`) runs one thread per engine with NIC
//! contexts, which does the verbs calls and the control-session exchange
//! without holding the engine lock across the network.
//!
//! Requests that failed on the rail keep their outcome: nothing is
//! replayed. While the rail is down, new requests stripe over the peer's
//! other rails; once it is up, new slices use it again. A queue pair is
//! replaced only when the core holds no work on it (the old one's flushed
//! completions arrived); until then the attempt waits, uncounted.

mod state;

pub(crate) use state::{AfterFailure, Recoveries};
pub use state::{RecoveryPolicy, RecoveryState};

use std::time::Instant;

use orbitte_verbs::QueuePair;
use orbitte_verbs::qp_state::Rts;

use crate::engine::{Owner, State};
use crate::transport::rdma::RailQp;
use crate::transport::{PeerId, RailId};

/// Feeds the core's view of every tracked rail to the recovery state.
pub(crate) fn observe(st: &mut State, now: Instant) {
    for rail in st.recovery.rails() {
        if st.engine.core().rail_is_closed(rail) {
            st.recovery.untrack(rail);
            continue;
        }
        let up = st.engine.core().rail_is_up(rail);
        if st.recovery.observe(rail, up, now) {
            tracing::info!(rail = rail.0, "rail recovered: its port is active again");
        }
    }
}

/// Installs `qp` as the rail's queue pair: the old one is destroyed (a
/// failed destroy is `Unquiesced` and the rail stays down), the rail's
/// notification slots are prepared on the new one, and the core takes the
/// rail back. The core must hold no work on the rail.
pub(crate) fn install_qp(
    st: &mut State,
    rail: RailId,
    mut qp: QueuePair<Rts>,
    now: Instant,
) -> Result<(), String> {
    if st.engine.core().rail_is_closed(rail) {
        return Err("the rail was closed meanwhile".into());
    }
    if st.engine.core().rail_in_flight(rail) > 0 {
        return Err("the old queue pair still holds work".into());
    }
    let Some((nic, old_qpn)) = st.rdma.rail(rail).map(|r| (r.nic, r.qpn())) else {
        return Err("not an rdma rail".into());
    };
    if let Err(u) = st.rdma.destroy(rail) {
        st.record_rail_unquiesced(format!("replacing the queue pair of rail {}", rail.0), *u);
        return Err("destroying the old queue pair failed (unquiesced)".into());
    }
    if let Some(q) = old_qpn {
        st.qpn_rail.remove(&(nic, q));
    }
    let pd = st.nic(nic).map(|n| n.pd.clone());
    let notify = match pd.map(|pd| crate::transport::rdma::slots::RailNotify::prepare(&pd, &mut qp))
    {
        Some(Ok(n)) => Some(n),
        Some(Err(e)) => {
            tracing::warn!(nic, error = %e, "rail carries no notifications");
            None
        }
        None => None,
    };
    let qpn = qp.qp_num();
    if let Some(mut r) = st.rdma.rail_mut(rail) {
        r.qp = RailQp::Rts(qp);
        r.failed = false;
        r.notify = notify;
    }
    st.qpn_rail.insert((nic, qpn), rail);
    st.engine.restore_rail(rail);
    st.pump(now);
    Ok(())
}

impl State {
    /// The prepared context of NIC ID `nic`.
    pub(crate) fn nic(&self, nic: u32) -> Option<&crate::nic::NicCtx> {
        self.init.as_ref()?.nics.iter().find(|n| n.id.0 == nic)
    }

    /// The rdma rails of `peer`.
    pub(crate) fn rdma_rails_of(&self, peer: PeerId) -> Vec<RailId> {
        self.engine
            .tables()
            .peers
            .get(&peer.0)
            .map(|p| {
                p.rails
                    .iter()
                    .copied()
                    .filter(|r| matches!(self.owner.get(r.0 as usize), Some(Owner::Rdma)))
                    .collect()
            })
            .unwrap_or_default()
    }
}
