//! Compiles the C++ shim against NIXL's headers, from the folder
//! `NIXL_INCLUDE_DIR` names (relative: from the workspace root). Without
//! it the library is built without NIXL's entry point, and one warning
//! says so.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(orbitte_nixl_plugin)");
    println!("cargo:rerun-if-env-changed=NIXL_INCLUDE_DIR");
    println!("cargo:rerun-if-changed=shim");
    println!("cargo:rerun-if-changed=../orbitte-capi/include/orbitte.h");
    let Some(dir) = env::var_os("NIXL_INCLUDE_DIR").filter(|d| !d.is_empty()) else {
        println!(
            "cargo:warning=NIXL_INCLUDE_DIR is not set, so libplugin_OrbitTE.so has no NIXL entry point \
             (NIXL will not load it): set it to the folder holding NIXL's backend/backend_engine.h"
        );
        return;
    };
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    let dir = root.join(PathBuf::from(dir));
    if dir.to_str().is_none() {
        panic!(
            "NIXL_INCLUDE_DIR={}: use a path that is UTF-8",
            dir.display()
        );
    }
    let engine_h = dir.join("backend/backend_engine.h");
    if !engine_h.is_file() {
        panic!(
            "NIXL_INCLUDE_DIR={}: {} does not exist; point it at NIXL's include folder \
             (the one holding nixl.h and backend/), absolute or relative to the workspace root",
            dir.display(),
            engine_h.display()
        );
    }
    let version = env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    println!("cargo:rerun-if-env-changed=ORBITTE_NIXL_LIBSTDCXX");
    let libstdcxx = env::var_os("ORBITTE_NIXL_LIBSTDCXX").filter(|p| !p.is_empty());
    let mut build = cc::Build::new();
    if let Some(lib) = &libstdcxx {
        // A linker that takes `-lstdc++` for its own C++ library (zig's is
        // libc++, whose ABI is not NIXL's) gets libstdc++ by its path, and
        // the shim stays within the libstdc++ symbols manylinux_2_28 has.
        build
            .cpp_link_stdlib(None)
            .define("SHIM_OLD_LIBSTDCXX", None);
        println!("cargo:rustc-link-arg={}", PathBuf::from(lib).display());
    }
    build
        .cpp(true)
        .std("c++20")
        .file(manifest.join("shim/orbitte_nixl.cpp"))
        .include(manifest.join("shim/include"))
        // NIXL's headers are third party: their warnings are not ours.
        .flag("-isystem")
        .flag(dir.to_str().expect("NIXL_INCLUDE_DIR is UTF-8"))
        .include(manifest.join("../orbitte-capi/include"))
        .define("PLUGIN_VERSION", format!("\"{version}\"").as_str())
        .flag("-fvisibility=hidden")
        .warnings(true)
        .compile("orbitte_nixl_shim");
    println!("cargo:rustc-cfg=orbitte_nixl_plugin");
}
