//! Where the workspace is.

use std::path::{Path, PathBuf};

/// The workspace root (the parent of this crate's manifest directory).
pub(crate) fn root() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    dir.parent().unwrap_or(dir).to_path_buf()
}
