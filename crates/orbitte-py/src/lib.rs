//! `orbitte._orbitte`: the native module of the `orbitte` Python package.
//!
//! The Python package (`python/orbitte`) is the public surface; this module
//! is a thin layer over the engine that speaks plain values (ints, strings,
//! tuples) so that both Python APIs, `orbitte.Engine` and the
//! Mooncake-compatible `orbitte.mooncake.TransferEngine`, share one native
//! path:
//!
//! - [`engine::NativeEngine`]: one OrbitTE engine that serves its
//!   registrations (tcp, and local to same-host peers) and opens peers;
//!   memory is named by address on both sides, as Mooncake's callers do;
//! - [`node::Node`]: the state behind it: peers by session id, local
//!   ranges, the synchronous transfer;
//! - [`memory`]: local registrations by address (caller memory kept alive
//!   by a Python reference, or memfd memory the engine allocates);
//! - [`remote`]: a peer's published ranges by the owner's address;
//! - [`directory`]: how a session id becomes an address (p2p or etcd);
//! - [`outcome::PyOutcome`]: the request's outcome as a Python object;
//! - [`errors`]: the exception classes under `orbitte.Error`.
//!
//! Every call that can block (connect, wait, drain, a synchronous
//! transfer) releases the GIL.

mod directory;
mod doctor;
mod engine;
mod errors;
mod memory;
mod node;
mod outcome;
mod remote;

use pyo3::prelude::*;

/// The native module `orbitte._orbitte`.
#[pymodule]
fn _orbitte(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::NativeEngine>()?;
    m.add_class::<memory::Allocation>()?;
    m.add_class::<outcome::PyOutcome>()?;
    m.add_function(wrap_pyfunction!(doctor::capabilities, m)?)?;
    m.add("PROTOCOL_VERSION", orbitte::wire::PROTOCOL_VERSION)?;
    errors::register(m)?;
    Ok(())
}
