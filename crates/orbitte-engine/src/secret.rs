//! The cluster secret's file and environment variable, and what an open
//! listener exposes.
//!
//! Every API takes the same setting: a file of at least 16 random bytes
//! (`head -c 32 /dev/urandom > FILE`), named in code
//! ([`EngineBuilder::cluster_secret_file`](crate::EngineBuilder::cluster_secret_file)),
//! in `orbitte serve`'s config (`engine.cluster_secret_file`), as a Python
//! keyword (`cluster_secret_file=`), or for every engine of a process by
//! the environment variable [`SECRET_FILE_ENV`], which an engine built
//! without a secret of its own reads.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use orbitte_wire::auth::{AuthError, ClusterSecret, ListenerToken};

/// The environment variable naming the cluster secret's file.
pub const SECRET_FILE_ENV: &str = "ORBITTE_SECRET_FILE";

/// Why the cluster secret's file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// The file could not be read.
    #[error(
        "cannot read the cluster secret file {path} ({from}): {source}; point it at a readable file of at least 16 random bytes"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// Where it was named (a setting or the environment variable).
        from: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no usable secret.
    #[error(
        "the cluster secret file {path} ({from}): {source}; write at least 16 random bytes (head -c 32 /dev/urandom > FILE)"
    )]
    Secret {
        /// The file.
        path: PathBuf,
        /// Where it was named.
        from: &'static str,
        /// Why the bytes are refused.
        #[source]
        source: AuthError,
    },
}

/// Reads the cluster secret from `path`; `from` says where the path was
/// named, for the error.
pub fn read_secret_file(path: &Path, from: &'static str) -> Result<ClusterSecret, SecretFileError> {
    let bytes = std::fs::read(path).map_err(|source| SecretFileError::Read {
        path: path.to_owned(),
        from,
        source,
    })?;
    ClusterSecret::new(bytes).map_err(|source| SecretFileError::Secret {
        path: path.to_owned(),
        from,
        source,
    })
}

/// The secret of the file [`SECRET_FILE_ENV`] names, if it is set (and
/// not empty).
pub fn secret_from_env() -> Result<Option<ClusterSecret>, SecretFileError> {
    match std::env::var_os(SECRET_FILE_ENV) {
        Some(p) if !p.is_empty() => {
            read_secret_file(Path::new(&p), "environment variable ORBITTE_SECRET_FILE").map(Some)
        }
        _ => Ok(None),
    }
}

/// What a listener on `at` that admits every peer (no cluster secret, no
/// access token) exposes, or `None` when only this host reaches it.
pub fn open_listener_warning(at: SocketAddr) -> Option<String> {
    if at.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "this engine listens on {at} with no cluster secret: any host that reaches it can read and write \
         every published range, send notifications under any name and fence peers out; \
         set ORBITTE_SECRET_FILE (or cluster_secret_file) to a file of 32 random bytes on every engine, \
         or listen on 127.0.0.1"
    ))
}

/// A fresh random [`ListenerToken`] (from the kernel's random source).
pub fn new_listener_token() -> std::io::Result<ListenerToken> {
    crate::session::random_bytes().map(ListenerToken)
}
