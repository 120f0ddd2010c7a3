//! The version of the `--json` documents.

/// The version of the `--json` documents of doctor, topology and bench
/// (docs/json.md): raised when a field changes meaning or disappears.
pub(crate) const SCHEMA_VERSION: u32 = 1;
