//! The end of one request, as a Python object.

use orbitte::{DrainStatus, NotificationStatus, Op, Outcome, RemoteEffect, Status};
use pyo3::prelude::*;

/// How one request ended: status, completed prefix, failure, remote effect
/// of a WRITE and drain status (docs/contract.md). Read-only.
#[pyclass(module = "orbitte._orbitte", name = "Outcome", frozen, get_all)]
#[derive(Debug, Clone)]
pub(crate) struct PyOutcome {
    /// The request id.
    request: u64,
    /// The caller's label.
    label: u64,
    /// "read" or "write".
    op: &'static str,
    /// Requested bytes.
    length: u64,
    /// "complete", "failed", "timed_out" or "cancelled".
    status: &'static str,
    /// Leading bytes known done.
    completed_prefix: u64,
    /// Leading slices known done, of `slices`.
    completed_slices: u32,
    slices: u32,
    /// The first failure in words, or None.
    failure: Option<String>,
    /// Failed slice index, its request-relative offset, path and NIC ID.
    failure_slice: Option<u32>,
    failure_offset: Option<u64>,
    failure_path: Option<&'static str>,
    failure_nic: Option<u32>,
    /// Destination bytes beyond the prefix that may have changed: (start, end).
    uncertain: (u64, u64),
    /// "none", "possible" or "complete".
    remote_effect: &'static str,
    /// For "possible": the request-relative bytes that may have been written.
    remote_effect_bytes: Option<(u64, u64)>,
    /// "drained" or "pending" when the outcome was made.
    drain: &'static str,
    /// Slices still outstanding then.
    drain_pending_slices: u32,
    /// Whether the batch's notification went out: "not_requested",
    /// "sent" (the target queued it), "not_sent", "refused" (the target
    /// holds as many unread notifications from this engine as it keeps;
    /// its application must read them) or "unconfirmed" (the connection
    /// broke before the target answered); `notification_why` says why.
    pub(crate) notification: &'static str,
    pub(crate) notification_why: Option<String>,
}

impl From<&Outcome> for PyOutcome {
    fn from(o: &Outcome) -> Self {
        let f = o.failure.as_ref();
        let (remote_effect, remote_effect_bytes) = match &o.remote_effect {
            RemoteEffect::None => ("none", None),
            RemoteEffect::Possible { bytes } => ("possible", Some((bytes.start, bytes.end))),
            RemoteEffect::Complete => ("complete", None),
        };
        let (drain, drain_pending_slices) = match o.drain {
            DrainStatus::Drained => ("drained", 0),
            DrainStatus::Pending { slices } => ("pending", slices),
        };
        let (notification, notification_why) = match &o.notification {
            NotificationStatus::NotRequested => ("not_requested", None),
            NotificationStatus::Sent => ("sent", None),
            NotificationStatus::NotSent { why } => ("not_sent", Some(why.to_string())),
            NotificationStatus::Refused { why } => ("refused", Some(why.to_string())),
            NotificationStatus::Unconfirmed { why } => ("unconfirmed", Some(why.to_string())),
        };
        Self {
            notification,
            notification_why,
            request: o.request.0,
            label: o.label,
            op: match o.op {
                Op::Read => "read",
                Op::Write => "write",
            },
            length: o.len,
            status: match o.status {
                Status::Complete => "complete",
                Status::Failed => "failed",
                Status::TimedOut => "timed_out",
                Status::Cancelled => "cancelled",
            },
            completed_prefix: o.completed_prefix,
            completed_slices: o.completed_slices,
            slices: o.slices,
            failure: f.map(ToString::to_string),
            failure_slice: f.map(|f| f.slice),
            failure_offset: f.map(|f| f.offset),
            failure_path: f.map(|f| f.path.name()),
            failure_nic: f.and_then(|f| f.nic).map(|n| n.0),
            uncertain: (o.uncertain.start, o.uncertain.end),
            remote_effect,
            remote_effect_bytes,
            drain,
            drain_pending_slices,
        }
    }
}

impl PyOutcome {
    pub(crate) fn is_complete(&self) -> bool {
        self.status == "complete"
    }

    pub(crate) fn summary(&self) -> String {
        let mut s = format!(
            "{} of {} bytes: {}, completed prefix {}, remote effect {}, drain {}",
            self.op,
            self.length,
            self.status,
            self.completed_prefix,
            self.remote_effect,
            self.drain
        );
        if let Some(f) = &self.failure {
            s.push_str(&format!(", failure: {f}"));
        }
        s
    }
}

#[pymethods]
impl PyOutcome {
    /// Whether every byte arrived.
    #[getter]
    fn ok(&self) -> bool {
        self.is_complete()
    }

    /// The outcome as a dict (for logs and JSON).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("request", self.request)?;
        d.set_item("label", self.label)?;
        d.set_item("op", self.op)?;
        d.set_item("length", self.length)?;
        d.set_item("status", self.status)?;
        d.set_item("completed_prefix", self.completed_prefix)?;
        d.set_item("completed_slices", self.completed_slices)?;
        d.set_item("slices", self.slices)?;
        d.set_item("failure", self.failure.clone())?;
        d.set_item("failure_slice", self.failure_slice)?;
        d.set_item("failure_offset", self.failure_offset)?;
        d.set_item("failure_path", self.failure_path)?;
        d.set_item("failure_nic", self.failure_nic)?;
        d.set_item("uncertain", self.uncertain)?;
        d.set_item("remote_effect", self.remote_effect)?;
        d.set_item("remote_effect_bytes", self.remote_effect_bytes)?;
        d.set_item("drain", self.drain)?;
        d.set_item("drain_pending_slices", self.drain_pending_slices)?;
        d.set_item("notification", self.notification)?;
        d.set_item("notification_why", self.notification_why.clone())?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("<Outcome request={} {}>", self.request, self.summary())
    }
}
