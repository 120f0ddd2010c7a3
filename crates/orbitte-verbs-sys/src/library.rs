//! `libibverbs.so.1` opened at run time, and the table of its exported
//! functions.

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::bindings::*;
use crate::declarations;
use crate::error::LoadError;
use crate::inline::{verbs_context_has, verbs_get_ctx};

/// The soname [`Verbs::load`] opens (`libibverbs1` on Debian and Ubuntu,
/// `libibverbs` on Fedora/RHEL, both from rdma-core).
pub const LIBRARY_NAME: &str = "libibverbs.so.1";

/// Declares [`Verbs`] with one field per exported function, loads them, and
/// makes the compiler check every field's type against bindgen's
/// declaration of the same symbol (a type mismatch does not compile).
macro_rules! verbs_table {
    (
        required {
            $( $(#[$rmeta:meta])* $rname:ident: fn($($rarg:ty),* $(,)?) $(-> $rret:ty)?; )*
        }
        optional {
            $( $(#[$ometa:meta])* $oname:ident: fn($($oarg:ty),* $(,)?) $(-> $oret:ty)?; )*
        }
    ) => {
        /// `libibverbs.so.1`, opened at run time, with its exported
        /// functions.
        ///
        /// Fields are the C functions, named and typed as in
        /// `<infiniband/verbs.h>` (rdma-core 44.0): calling one is `unsafe`
        /// and follows the C contract. Functions of the `IBVERBS_1.0`/`1.1`
        /// ABI, which every rdma-core release exports, are plain fields;
        /// later ones are `Option`s (the symbol version in their docs),
        /// `None` when the installed library predates them. The pointers
        /// stay valid as long as this value lives (it owns the library
        /// handle), so keep it in an `Arc` and hand it to whatever holds
        /// verbs objects.
        ///
        /// The `static inline` verbs are [`crate::ibv_post_send`] and its
        /// siblings; the inline wrappers C puts over exported symbols are
        /// methods ([`Verbs::query_port`], [`Verbs::reg_mr`],
        /// [`Verbs::query_gid_ex`]).
        pub struct Verbs {
            $( $(#[$rmeta])* pub $rname: unsafe extern "C" fn($($rarg),*) $(-> $rret)?, )*
            $( $(#[$ometa])* pub $oname: Option<unsafe extern "C" fn($($oarg),*) $(-> $oret)?>, )*
            /// What was opened.
            path: PathBuf,
            /// Invariant: every function pointer above points into this
            /// library, which stays open as long as `self`.
            _library: Library,
        }

        // The table's signatures are bindgen's declarations of the same
        // symbols (coercing a declaration to the field's type compiles only
        // if they agree). Nothing is called or linked.
        const _: () = {
            $( let _: unsafe extern "C" fn($($rarg),*) $(-> $rret)? = declarations::$rname; )*
            $( let _: unsafe extern "C" fn($($oarg),*) $(-> $oret)? = declarations::$oname; )*
        };

        impl Verbs {
            fn from_library(library: Library, path: PathBuf) -> Result<Self, LoadError> {
                $(
                    // SAFETY: the field's type is the C declaration of this
                    // symbol (checked against bindgen's above).
                    let $rname = unsafe { symbol(&library, stringify!($rname)) }.map_err(
                        |source| LoadError::MissingSymbol {
                            library: path.clone(),
                            symbol: stringify!($rname),
                            source,
                        },
                    )?;
                )*
                $(
                    // SAFETY: as above.
                    let $oname = unsafe { symbol(&library, stringify!($oname)) }.ok();
                )*
                Ok(Self { $($rname,)* $($oname,)* path, _library: library })
            }

            /// The optional functions this library lacks (empty on
            /// rdma-core 44).
            pub fn missing_optional(&self) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $( if self.$oname.is_none() { missing.push(stringify!($oname)); } )*
                missing
            }
        }
    };
}

verbs_table! {
    required {
        /// `ibv_get_device_list`; prefer [`Verbs::devices`].
        ibv_get_device_list: fn(*mut c_int) -> *mut *mut ibv_device;
        /// `ibv_free_device_list`.
        ibv_free_device_list: fn(*mut *mut ibv_device);
        /// `ibv_get_device_name`.
        ibv_get_device_name: fn(*mut ibv_device) -> *const c_char;
        /// `ibv_get_device_guid` (network byte order).
        ibv_get_device_guid: fn(*mut ibv_device) -> __be64;
        /// `ibv_open_device`.
        ibv_open_device: fn(*mut ibv_device) -> *mut ibv_context;
        /// `ibv_close_device`.
        ibv_close_device: fn(*mut ibv_context) -> c_int;
        /// `ibv_query_device`.
        ibv_query_device: fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
        /// The exported `ibv_query_port`, which fills only the legacy
        /// prefix of `ibv_port_attr`; use [`Verbs::query_port`], which is
        /// what C's `ibv_query_port` macro expands to.
        ibv_query_port: fn(*mut ibv_context, u8, *mut _compat_ibv_port_attr) -> c_int;
        /// `ibv_query_gid`.
        ibv_query_gid: fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
        /// `ibv_query_pkey`.
        ibv_query_pkey: fn(*mut ibv_context, u8, c_int, *mut __be16) -> c_int;
        /// `ibv_get_async_event` (blocks unless the context's async fd is
        /// non-blocking).
        ibv_get_async_event: fn(*mut ibv_context, *mut ibv_async_event) -> c_int;
        /// `ibv_ack_async_event`.
        ibv_ack_async_event: fn(*mut ibv_async_event);
        /// `ibv_alloc_pd`.
        ibv_alloc_pd: fn(*mut ibv_context) -> *mut ibv_pd;
        /// `ibv_dealloc_pd`.
        ibv_dealloc_pd: fn(*mut ibv_pd) -> c_int;
        /// The exported `ibv_reg_mr` (no optional access flags); use
        /// [`Verbs::reg_mr`], which is what C's `ibv_reg_mr` macro does.
        ibv_reg_mr: fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
        /// `ibv_dereg_mr`.
        ibv_dereg_mr: fn(*mut ibv_mr) -> c_int;
        /// `ibv_create_comp_channel`.
        ibv_create_comp_channel: fn(*mut ibv_context) -> *mut ibv_comp_channel;
        /// `ibv_destroy_comp_channel`.
        ibv_destroy_comp_channel: fn(*mut ibv_comp_channel) -> c_int;
        /// `ibv_create_cq`.
        ibv_create_cq: fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int)
            -> *mut ibv_cq;
        /// `ibv_destroy_cq`.
        ibv_destroy_cq: fn(*mut ibv_cq) -> c_int;
        /// `ibv_get_cq_event`.
        ibv_get_cq_event: fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
        /// `ibv_ack_cq_events`.
        ibv_ack_cq_events: fn(*mut ibv_cq, c_uint);
        /// `ibv_create_qp`.
        ibv_create_qp: fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
        /// `ibv_modify_qp`.
        ibv_modify_qp: fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
        /// `ibv_query_qp`.
        ibv_query_qp: fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
        /// `ibv_destroy_qp`.
        ibv_destroy_qp: fn(*mut ibv_qp) -> c_int;
        /// `ibv_create_ah`.
        ibv_create_ah: fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah;
        /// `ibv_destroy_ah`.
        ibv_destroy_ah: fn(*mut ibv_ah) -> c_int;
        /// `ibv_fork_init`.
        ibv_fork_init: fn() -> c_int;
        /// `ibv_wc_status_str`; prefer [`Verbs::wc_status_str`].
        ibv_wc_status_str: fn(ibv_wc_status) -> *const c_char;
        /// `ibv_port_state_str`.
        ibv_port_state_str: fn(ibv_port_state) -> *const c_char;
        /// `ibv_event_type_str`.
        ibv_event_type_str: fn(ibv_event_type) -> *const c_char;
        /// `ibv_node_type_str`.
        ibv_node_type_str: fn(ibv_node_type) -> *const c_char;
    }
    optional {
        /// `ibv_get_device_index` (`IBVERBS_1.9`).
        ibv_get_device_index: fn(*mut ibv_device) -> c_int;
        /// `ibv_reg_mr_iova2` (`IBVERBS_1.8`); used by [`Verbs::reg_mr`] for
        /// optional access flags.
        ibv_reg_mr_iova2: fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr;
        /// `ibv_reg_dmabuf_mr` (`IBVERBS_1.12`).
        ibv_reg_dmabuf_mr: fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
        /// `_ibv_query_gid_ex` (`IBVERBS_1.11`); use [`Verbs::query_gid_ex`].
        _ibv_query_gid_ex: fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize)
            -> c_int;
        /// `_ibv_query_gid_table` (`IBVERBS_1.11`).
        _ibv_query_gid_table: fn(*mut ibv_context, *mut ibv_gid_entry, usize, u32, usize)
            -> isize;
        /// `ibv_is_fork_initialized` (`IBVERBS_1.13`).
        ibv_is_fork_initialized: fn() -> ibv_fork_status;
    }
}

// `Verbs` is shared between threads (an `Arc` held by every verbs object):
// function pointers and the library handle are both `Send + Sync`.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Verbs>();
};

/// Looks up `name` in `library` as a `T`. `dlsym` returns the symbol's
/// default version, which for the symbols libibverbs versions twice
/// (`ibv_query_port`, `ibv_reg_mr`, ...) is the `IBVERBS_1.1` ABI that
/// verbs.h declares.
///
/// # Safety
///
/// `T` must be the function pointer type of the symbol's C declaration.
unsafe fn symbol<T: Copy>(library: &Library, name: &str) -> Result<T, libloading::Error> {
    // SAFETY: the caller guarantees `T` matches the symbol; the pointer is
    // copied out and used only while `library` stays open (`Verbs` owns it).
    unsafe { library.get::<T>(name.as_bytes()).map(|s| *s) }
}

impl Verbs {
    /// Opens [`LIBRARY_NAME`] through the dynamic loader's search path.
    ///
    /// # Errors
    ///
    /// [`LoadError::LibraryNotFound`] when libibverbs is not installed;
    /// [`LoadError::MissingSymbol`] when the library is too old.
    pub fn load() -> Result<Self, LoadError> {
        Self::load_from(LIBRARY_NAME)
    }

    /// Opens libibverbs from `path` (a soname or a file path).
    ///
    /// # Errors
    ///
    /// As [`Verbs::load`].
    pub fn load_from(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        let path = path.as_ref().to_path_buf();
        // SAFETY: loading libibverbs runs its ELF constructors, which only
        // set up its own state (rdma-core's libibverbs does no unsound work
        // on load); the path is what the caller asked for.
        let library = unsafe { Library::new(&path) }.map_err(|source| {
            tracing::debug!(library = %path.display(), error = %source, "libibverbs not loaded");
            LoadError::LibraryNotFound {
                library: path.clone(),
                source,
            }
        })?;
        let verbs = Self::from_library(library, path)?;
        tracing::debug!(
            library = %verbs.path.display(),
            missing_optional = ?verbs.missing_optional(),
            "libibverbs loaded"
        );
        Ok(verbs)
    }

    /// The name or path the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `ibv_query_port` as C's macro does it: the provider's extended
    /// `query_port` with the full `ibv_port_attr` size when the context has
    /// one, otherwise the exported function on a zeroed `attr`.
    ///
    /// Returns 0 or an errno value.
    ///
    /// # Safety
    ///
    /// `context` must be a live context opened by this library, and `attr`
    /// valid for writing one `ibv_port_attr`.
    pub unsafe fn query_port(
        &self,
        context: *mut ibv_context,
        port_num: u8,
        attr: *mut ibv_port_attr,
    ) -> c_int {
        let offset = core::mem::offset_of!(verbs_context, query_port);
        // SAFETY: the caller guarantees `context` is live.
        let vctx = unsafe { verbs_get_ctx(context) };
        // SAFETY: `vctx` is null or the extended context of a live context;
        // the field is read only when `sz` says the provider allocated it.
        let op = unsafe {
            if verbs_context_has(vctx, offset) {
                (*vctx).query_port
            } else {
                None
            }
        };
        match op {
            // SAFETY: the provider's op, called as C's inline does, on the
            // caller's valid pointers.
            Some(query_port) => unsafe {
                query_port(context, port_num, attr, size_of::<ibv_port_attr>())
            },
            // SAFETY: as C's fallback: zero the whole struct, then let the
            // legacy entry point fill its prefix.
            None => unsafe {
                attr.write_bytes(0, 1);
                (self.ibv_query_port)(context, port_num, attr.cast())
            },
        }
    }

    /// `ibv_reg_mr` as C's macro does it: the exported `ibv_reg_mr` unless
    /// `access` has `IBV_ACCESS_OPTIONAL_RANGE` bits, then
    /// `ibv_reg_mr_iova2` with `iova = addr`.
    ///
    /// Returns the MR or NULL with `errno` set (`EOPNOTSUPP` when optional
    /// flags are asked of a library without `ibv_reg_mr_iova2`).
    ///
    /// # Safety
    ///
    /// `pd` must be a live protection domain from this library, and
    /// `addr..addr + length` memory that stays mapped until the MR is
    /// deregistered.
    pub unsafe fn reg_mr(
        &self,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_uint,
    ) -> *mut ibv_mr {
        if access & IBV_ACCESS_OPTIONAL_RANGE == 0 {
            // SAFETY: the caller's guarantees are the C function's contract.
            return unsafe { (self.ibv_reg_mr)(pd, addr, length, access as c_int) };
        }
        match self.ibv_reg_mr_iova2 {
            // SAFETY: as above; C passes the address as the iova.
            Some(reg) => unsafe { reg(pd, addr, length, addr as u64, access) },
            None => {
                set_errno(libc::EOPNOTSUPP);
                core::ptr::null_mut()
            }
        }
    }

    /// `ibv_query_gid_ex`: one GID table entry with its type and netdev.
    ///
    /// Returns 0 or an errno value (`EOPNOTSUPP` when the library predates
    /// `_ibv_query_gid_ex`).
    ///
    /// # Safety
    ///
    /// `context` must be a live context from this library, and `entry`
    /// valid for writing one `ibv_gid_entry`.
    pub unsafe fn query_gid_ex(
        &self,
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
    ) -> c_int {
        match self._ibv_query_gid_ex {
            // SAFETY: the caller's guarantees are the C contract; the size
            // argument is what C's inline passes.
            Some(query) => unsafe {
                query(
                    context,
                    port_num,
                    gid_index,
                    entry,
                    flags,
                    size_of::<ibv_gid_entry>(),
                )
            },
            None => libc::EOPNOTSUPP,
        }
    }

    /// `ibv_wc_status_str`: the text of a completion status (`"unknown"`
    /// for values the library does not know).
    pub fn wc_status_str(&self, status: ibv_wc_status) -> String {
        // SAFETY: the function accepts any value and returns a static
        // NUL-terminated string.
        let text = unsafe { (self.ibv_wc_status_str)(status) };
        // SAFETY: `text` is null or a static C string from the library.
        unsafe { c_string(text) }.unwrap_or_else(|| format!("status {status}"))
    }
}

/// Copies a C string into a `String` (lossily), or `None` for NULL.
///
/// # Safety
///
/// `text` must be NULL or point to a NUL-terminated string valid for the
/// call.
pub(crate) unsafe fn c_string(text: *const c_char) -> Option<String> {
    if text.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a non-null `text` is NUL-terminated.
    Some(
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Sets this thread's `errno`, as a C function returning NULL would.
fn set_errno(value: c_int) {
    #[cfg(target_os = "linux")]
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe {
        *libc::__errno_location() = value;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = value;
}

impl core::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Verbs")
            .field("path", &self.path)
            .field("missing_optional", &self.missing_optional())
            .finish_non_exhaustive()
    }
}
