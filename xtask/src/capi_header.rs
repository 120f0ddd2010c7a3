//! `cargo xtask capi-header [--check]`: regenerate orbitte-capi's
//! committed C header, `crates/orbitte-capi/include/orbitte.h`, from the
//! crate's Rust source with cbindgen (its settings:
//! `crates/orbitte-capi/cbindgen.toml`).
//!
//! cbindgen parses the source: it needs no compiler, no C toolchain and no
//! build of the crate, so the output depends on the source alone. With
//! `--check` nothing is written, and a header that differs from what the
//! source gives is a failure naming the first difference. It also runs as
//! a test, so `cargo test --workspace` catches a header left behind.

use std::path::Path;

/// The crate the header is generated from.
const CAPI_CRATE: &str = "crates/orbitte-capi";

/// The header, relative to the workspace root.
const HEADER: &str = "crates/orbitte-capi/include/orbitte.h";

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let check = crate::bindgen::check_flag(args, "capi-header")?;
    let root = crate::workspace::root();
    let text = generate(&root)?;
    let path = root.join(HEADER);
    if check {
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != text {
            return Err(format!(
                "{HEADER} is stale ({}): run `cargo xtask capi-header` and commit the result",
                crate::bindgen::diff_summary(&committed, &text)
            ));
        }
        println!("capi-header: {HEADER} matches the source");
    } else {
        std::fs::write(&path, &text).map_err(|e| format!("cannot write {HEADER}: {e}"))?;
        println!("capi-header: wrote {HEADER}");
    }
    Ok(())
}

/// The header the crate's source gives.
pub(crate) fn generate(root: &Path) -> Result<String, String> {
    let dir = root.join(CAPI_CRATE);
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .map_err(|e| format!("{CAPI_CRATE}/cbindgen.toml: {e}"))?;
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .map_err(|e| format!("cbindgen cannot read {CAPI_CRATE}: {e}"))?;
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).map_err(|e| format!("cbindgen wrote text that is not UTF-8: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_c_header_matches_the_source() {
        let root = crate::workspace::root();
        let text = generate(&root).expect("cbindgen reads orbitte-capi");
        let committed = std::fs::read_to_string(root.join(HEADER)).unwrap_or_default();
        assert!(
            committed == text,
            "{HEADER} is stale ({}): run `cargo xtask capi-header` and commit the result",
            crate::bindgen::diff_summary(&committed, &text)
        );
    }
}
