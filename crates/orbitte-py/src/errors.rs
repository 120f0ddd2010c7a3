//! The exception classes: every error the package raises is an
//! `orbitte.Error`, grouped by the operation that failed.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    orbitte,
    Error,
    PyException,
    "Base class of every OrbitTE error."
);
create_exception!(
    orbitte,
    ConfigError,
    Error,
    "A setting was refused (source id, address, protocol, device filter)."
);
create_exception!(
    orbitte,
    RegisterError,
    Error,
    "Memory could not be registered (bad pointer or length, overlap, no usable NIC, budget)."
);
create_exception!(
    orbitte,
    UnregisterError,
    Error,
    "A registration could not be removed (unknown, or requests on it are undrained)."
);
create_exception!(
    orbitte,
    ConnectError,
    Error,
    "A peer could not be opened (unreachable, refused, stale epoch, no path)."
);
create_exception!(
    orbitte,
    SubmitError,
    Error,
    "A batch was refused before anything was posted (unregistered memory, past the end, unknown peer or range)."
);
create_exception!(
    orbitte,
    PeerRestartedError,
    SubmitError,
    "The peer restarted since its handle was made (same address, a new epoch): \
     `handle_epoch` and `current_epoch` name both; connect again and use the new Peer."
);
create_exception!(
    orbitte,
    TransferError,
    Error,
    "A request ended without every byte done; `outcomes` holds each request's Outcome."
);
create_exception!(
    orbitte,
    WaitTimeout,
    Error,
    "No outcome within the wait timeout (the request goes on; wait again or cancel)."
);
create_exception!(
    orbitte,
    DrainTimeout,
    Error,
    "The request's local bytes are still in use by the transport after the timeout."
);

/// A `PeerRestartedError` naming the epoch of the handle and the epoch
/// the peer runs now (`handle_epoch`, `current_epoch`).
pub(crate) fn peer_restarted(py: Python<'_>, message: String, handle: u64, current: u64) -> PyErr {
    let err = PeerRestartedError::new_err(message);
    let v = err.value(py);
    let _ = v.setattr("handle_epoch", handle);
    let _ = v.setattr("current_epoch", current);
    err
}

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("RegisterError", py.get_type::<RegisterError>())?;
    m.add("UnregisterError", py.get_type::<UnregisterError>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("SubmitError", py.get_type::<SubmitError>())?;
    m.add("PeerRestartedError", py.get_type::<PeerRestartedError>())?;
    m.add("TransferError", py.get_type::<TransferError>())?;
    m.add("WaitTimeout", py.get_type::<WaitTimeout>())?;
    m.add("DrainTimeout", py.get_type::<DrainTimeout>())?;
    Ok(())
}
