//! Discovery errors: which file, what was expected.

use std::io;
use std::path::{Path, PathBuf};

/// A problem reading one sysfs or /dev entry during discovery.
///
/// Discovery never stops at one of these: a device whose essential files
/// are broken becomes an inert slot carrying the error, a broken port or GID
/// entry is recorded on that port, and a broken GPU entry is recorded in
/// [`Topology::problems`](crate::Topology::problems). Cloneable (the I/O
/// error is kept as its kind and text) so topologies stay plain data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum DiscoveryError {
    /// A file or directory could not be read.
    #[error("cannot read {path}: {message}; check that it exists and is readable")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error kind.
        #[serde(rename = "error_kind", serialize_with = "kind_name")]
        kind: io::ErrorKind,
        /// The I/O error text.
        message: String,
    },
    /// A file was read but its content is not what sysfs writes there.
    #[error("{path}: expected {expected}, found {found:?}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What the file should contain.
        expected: &'static str,
        /// What it contains (trimmed, cut to 80 characters).
        found: String,
    },
}

impl DiscoveryError {
    pub(crate) fn io(path: &Path, err: &io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            kind: err.kind(),
            message: err.to_string(),
        }
    }

    pub(crate) fn malformed(path: &Path, expected: &'static str, found: &str) -> Self {
        let mut found = found.trim().to_owned();
        if found.len() > 80 {
            let mut cut = 80;
            while !found.is_char_boundary(cut) {
                cut -= 1;
            }
            found.truncate(cut);
        }
        Self::Malformed {
            path: path.to_owned(),
            expected,
            found,
        }
    }

    /// The file or directory the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Io { path, .. } | Self::Malformed { path, .. } => path,
        }
    }
}

fn kind_name<S: serde::Serializer>(kind: &io::ErrorKind, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(kind)
}
