//! `orbitte._orbitte`: the native module of the `orbitte` Python package.
//!
//! The Python package (`python/orbitte`) is the public surface; this module
//! carries both of its APIs over one engine core:
//!
//! - [`engine::NativeEngine`], behind `orbitte.Engine`: the engine's own
//!   handles as Python classes ([`handles`]: `Registration`, `Peer`,
//!   `RemoteRange`, `Request`, `Handle`, `Notification`, over their Rust
//!   types), submitted as Rust's `TransferEngine::submit` does;
//! - [`mooncake::MooncakeEngine`], behind
//!   `orbitte.mooncake.TransferEngine`: memory named by address on both
//!   sides, sessions cached by id, Mooncake's error codes;
//! - [`node`]: what both share: building the engine, opening peers
//!   ([`directory`]: p2p or etcd), registrations by address ([`memory`]),
//!   the wait for a batch's outcomes and drain;
//! - [`nixl`]: the native side of `orbitte.nixl` (NIXL's agent API):
//!   descriptor lists resolved once and transfers by index built and
//!   submitted in one call;
//! - [`outcome::PyOutcome`]: the request's outcome as a Python object;
//! - [`errors`]: the exception classes under `orbitte.Error`.
//!
//! Every call that can block (connect, wait, drain, a synchronous
//! transfer) releases the GIL.

mod directory;
mod doctor;
mod engine;
mod errors;
mod gpu;
mod handles;
mod memory;
mod mooncake;
mod nixl;
mod node;
mod outcome;

use pyo3::prelude::*;

/// The native module `orbitte._orbitte`.
#[pymodule]
fn _orbitte(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::NativeEngine>()?;
    m.add_class::<mooncake::MooncakeEngine>()?;
    m.add_class::<handles::Registration>()?;
    m.add_class::<handles::Peer>()?;
    m.add_class::<handles::RemoteRange>()?;
    m.add_class::<handles::Request>()?;
    m.add_class::<handles::Handle>()?;
    m.add_class::<handles::Notification>()?;
    m.add_class::<memory::Allocation>()?;
    m.add_class::<outcome::PyOutcome>()?;
    m.add_function(wrap_pyfunction!(doctor::capabilities, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add("PROTOCOL_VERSION", orbitte_wire::PROTOCOL_VERSION)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    nixl::register(m)?;
    Ok(())
}

/// Runs the `orbitte` command with `argv` (the first is the program's
/// name), with the GIL released, and returns its exit status: the wheel's
/// `orbitte` script.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| orbitte_cli::run_command(argv))
}
