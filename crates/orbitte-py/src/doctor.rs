//! The capability matrix as data.

use orbitte::{Check, EngineBuilder};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

fn check<'py>(py: Python<'py>, c: &Check) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match c {
        Check::Pass => d.set_item("status", "pass")?,
        Check::Fail { reason, fix } => {
            d.set_item("status", "fail")?;
            d.set_item("reason", reason)?;
            d.set_item("fix", fix)?;
        }
        Check::Skipped { why } => {
            d.set_item("status", "skipped")?;
            d.set_item("why", why)?;
        }
        Check::NotImplemented => d.set_item("status", "not_implemented")?,
    }
    Ok(d)
}

/// Evaluates every path (build, discovery, completion, drain) on a scratch
/// engine, as `orbitte doctor` does, and returns one dict per path:
/// `{"path", "works", "build", "discovery", "completion", "drain",
/// "notes"}`, each check a dict with `status` ("pass", "fail", "skipped",
/// "not_implemented") and `reason`/`fix` or `why`: the keys of a row of
/// `orbitte doctor --json`'s `paths`.
#[pyfunction]
pub(crate) fn capabilities(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let matrix = py
        .detach(|| {
            EngineBuilder::new("orbitte-py-doctor")
                .build()
                .map(|e| e.capabilities())
        })
        .map_err(|e| crate::errors::ConfigError::new_err(e.to_string()))?;
    let rows = PyList::empty(py);
    for r in &matrix.rows {
        let d = PyDict::new(py);
        d.set_item("path", r.path.name())?;
        let works = [&r.build, &r.discovery, &r.completion, &r.drain]
            .iter()
            .all(|c| matches!(c, Check::Pass));
        d.set_item("works", works)?;
        d.set_item("build", check(py, &r.build)?)?;
        d.set_item("discovery", check(py, &r.discovery)?)?;
        d.set_item("completion", check(py, &r.completion)?)?;
        d.set_item("drain", check(py, &r.drain)?)?;
        d.set_item("notes", r.notes.clone())?;
        rows.append(d)?;
    }
    Ok(rows)
}
