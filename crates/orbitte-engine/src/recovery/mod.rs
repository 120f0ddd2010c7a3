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
//! [`Recoveries`] state, held here. The driver (`engine::recovery`) feeds
//! it the core's view of the rails and runs one thread per engine with NIC
//! contexts, which does the verbs calls and the control-session exchange
//! without holding the engine lock across the network, then installs the
//! new queue pair.
//!
//! Requests that failed on the rail keep their outcome: nothing is
//! replayed. While the rail is down, new requests stripe over the peer's
//! other rails; once it is up, new slices use it again. A queue pair is
//! replaced only when the core holds no work on it (the old one's flushed
//! completions arrived); until then the attempt waits, uncounted.

mod state;

pub(crate) use state::{AfterFailure, Recoveries};
pub use state::{RecoveryPolicy, RecoveryState};
