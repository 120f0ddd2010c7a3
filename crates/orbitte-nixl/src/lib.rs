//! OrbitTE as a NIXL backend: `libplugin_OrbitTE.so`, which NIXL's agent
//! loads from `NIXL_PLUGIN_DIR` and offers as the backend "OrbitTE".
//!
//! The backend engine is a C++ class (`shim/orbitte_nixl.cpp`) deriving
//! NIXL's `nixlBackendEngine`; each of its calls is one call of the C API
//! (orbitte-capi), linked in. This crate exports NIXL's two entry points.
//! Built without `NIXL_INCLUDE_DIR`, the library has none (docs/nixl-plugin.md).
#![allow(non_snake_case)]

// The C API the shim calls: linked into the plugin.
pub use orbitte_capi;

#[cfg(orbitte_nixl_plugin)]
mod plugin {
    use std::ffi::c_void;

    unsafe extern "C" {
        /// The shim's `nixlBackendPlugin` (a static object, never freed).
        fn orbitte_nixl_shim_init() -> *mut c_void;
    }

    /// NIXL's entry point: the plugin's `nixlBackendPlugin`.
    #[unsafe(no_mangle)]
    pub(crate) extern "C" fn nixl_plugin_init() -> *mut c_void {
        // SAFETY: the shim's function takes nothing and returns a pointer
        // to a static object; it throws nothing (built from constants).
        unsafe { orbitte_nixl_shim_init() }
    }

    /// NIXL's exit point: the plugin holds nothing beyond its engines,
    /// which NIXL destroys first.
    #[unsafe(no_mangle)]
    pub(crate) extern "C" fn nixl_plugin_fini() {}
}
