//! Finding and initializing the CUDA driver library at run time.
//!
//! cudarc (with `dynamic-loading`) opens `libcuda` on the first driver call
//! and resolves each function lazily, on its first call, with `dlsym`; it
//! panics when the library or a symbol is missing. So before cudarc is
//! asked for anything, [`driver`] opens the library itself, with cudarc's own
//! list of candidate names, checks that every symbol this crate can call is
//! exported ([`REQUIRED_DRIVER_SYMBOLS`]), and only then calls `cuInit`.
//! The outcome is computed once per process and cached.

use std::ffi::c_int;
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::error::{CuError, check};

/// Every driver function this crate (or the part of cudarc it uses) may
/// call. All of them must be exported before any is called, so a stub or a
/// foreign `libcuda` yields [`DriverError::MissingSymbol`] instead of a
/// panic in the middle of an operation.
pub const REQUIRED_DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDeviceGetPCIBusId",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemsetD8_v2",
    "cuPointerGetAttribute",
    "cuMemGetAddressRange_v2",
];

/// The short reason used when there is no driver library at all.
pub const NO_DRIVER: &str = "no CUDA driver (libcuda.so.1 not found)";

/// Why the CUDA driver cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// No candidate name of the driver library could be loaded.
    #[error(
        "{NO_DRIVER}: install the NVIDIA driver, or add the directory holding libcuda.so.1 to \
         LD_LIBRARY_PATH"
    )]
    NotFound {
        /// The names that were tried, in order.
        tried: Vec<String>,
    },
    /// The library loaded but lacks a function this crate calls.
    #[error(
        "CUDA driver {library} does not export {symbol}: it is not a usable NVIDIA driver; \
         install a current NVIDIA driver"
    )]
    MissingSymbol {
        /// The library name that was loaded.
        library: String,
        /// The first missing symbol.
        symbol: &'static str,
    },
    /// `cuInit` failed for a reason other than "no device".
    #[error("CUDA driver {library} failed to initialize: {source}; check `nvidia-smi` and `dmesg`")]
    Init {
        /// The library name that was loaded.
        library: String,
        /// The failed call.
        #[source]
        source: CuError,
    },
    /// cudarc panicked inside a driver call (a defect: the symbol check
    /// should have caught it).
    #[error(
        "the CUDA binding panicked during {call}: {message}; report this with the driver version"
    )]
    BindingPanicked {
        /// The call being made.
        call: &'static str,
        /// The panic message.
        message: String,
    },
}

impl DriverError {
    /// The reason without the fix, e.g. for a `skipped: ...` line.
    pub fn reason(&self) -> String {
        match self {
            Self::NotFound { .. } => NO_DRIVER.to_owned(),
            Self::MissingSymbol { library, symbol } => {
                format!("CUDA driver {library} does not export {symbol}")
            }
            Self::Init { library, source } => format!("CUDA driver {library}: {source}"),
            Self::BindingPanicked { call, .. } => {
                format!("the CUDA binding panicked during {call}")
            }
        }
    }
}

/// What was found when the driver was loaded and initialized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    /// The library name that loaded (e.g. `libcuda.so.1`).
    pub library: String,
    /// `cuDriverGetVersion`, as (major, minor); `None` if the call failed.
    pub version: Option<(u32, u32)>,
    /// Devices the driver reports (0 when `cuInit` said there are none).
    pub device_count: usize,
    /// Why there is no device, when `device_count` is 0: the status of
    /// `cuInit` (`CUDA_ERROR_NO_DEVICE`) or "cuDeviceGetCount reported 0".
    pub no_device: Option<String>,
}

/// Loads and initializes the driver once; later calls return the same
/// outcome. Never panics, whatever library is found.
pub fn driver() -> Result<&'static DriverInfo, DriverError> {
    static DRIVER: OnceLock<Result<DriverInfo, DriverError>> = OnceLock::new();
    DRIVER.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Runs a cudarc call, turning a panic inside the binding into an error.
pub(crate) fn guarded<T>(call: &'static str, f: impl FnOnce() -> T) -> Result<T, DriverError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let message = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "unknown panic".to_owned());
        DriverError::BindingPanicked { call, message }
    })
}

fn load() -> Result<DriverInfo, DriverError> {
    let tried = cudarc::get_lib_name_candidates("cuda");
    let mut found = None;
    for name in &tried {
        // SAFETY: opening the NVIDIA driver library runs its initializers,
        // which is how it is meant to be used (cudarc opens the same names in
        // the same order); nothing else is called here.
        if let Ok(lib) = unsafe { libloading::Library::new(name) } {
            found = Some((name.clone(), lib));
            break;
        }
    }
    let Some((library, lib)) = found else {
        tracing::debug!(?tried, "no CUDA driver library");
        return Err(DriverError::NotFound { tried });
    };
    for &symbol in REQUIRED_DRIVER_SYMBOLS {
        // SAFETY: only looks the address up; the symbol is never called
        // through this handle, so its type does not matter.
        let present = unsafe { lib.get::<unsafe extern "C" fn()>(symbol.as_bytes()) }.is_ok();
        if !present {
            return Err(DriverError::MissingSymbol { library, symbol });
        }
    }
    // Keep our handle open for the life of the process: the library stays
    // mapped at the address cudarc resolves against.
    std::mem::forget(lib);

    // SAFETY: cudarc's own presence check; it only tries to open libraries.
    let present = guarded("is_culib_present", || unsafe { sys::is_culib_present() })?;
    if !present {
        return Err(DriverError::NotFound { tried });
    }

    let mut raw_version: c_int = 0;
    // SAFETY: the out-pointer is a live local; cuDriverGetVersion may be
    // called before cuInit and the symbol was checked above.
    let version_status = guarded("cuDriverGetVersion", || unsafe {
        sys::cuDriverGetVersion(&mut raw_version)
    })?;
    let version = check("cuDriverGetVersion", version_status)
        .ok()
        .and_then(|()| u32::try_from(raw_version).ok())
        .map(|v| (v / 1000, (v % 1000) / 10));

    // SAFETY: cuInit takes flags only (0 is the one valid value).
    let init = guarded("cuInit", || unsafe { sys::cuInit(0) })?;
    if let Err(source) = check("cuInit", init) {
        if source.is_no_device() {
            tracing::info!(%library, "CUDA driver reports no device");
            return Ok(DriverInfo {
                library,
                version,
                device_count: 0,
                no_device: Some(source.to_string()),
            });
        }
        return Err(DriverError::Init { library, source });
    }

    let mut count: c_int = 0;
    // SAFETY: the out-pointer is a live local; the driver is initialized.
    let status = guarded("cuDeviceGetCount", || unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    check("cuDeviceGetCount", status).map_err(|source| DriverError::Init {
        library: library.clone(),
        source,
    })?;
    let device_count = usize::try_from(count).unwrap_or(0);
    let no_device = (device_count == 0).then(|| "cuDeviceGetCount reported 0 devices".to_owned());
    tracing::info!(%library, ?version, device_count, "CUDA driver initialized");
    Ok(DriverInfo {
        library,
        version,
        device_count,
        no_device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_reads_as_the_seed_says_and_names_the_fix() {
        let e = DriverError::NotFound {
            tried: vec!["libcuda.so.1".into()],
        };
        assert_eq!(e.reason(), "no CUDA driver (libcuda.so.1 not found)");
        let text = e.to_string();
        assert!(
            text.starts_with("no CUDA driver (libcuda.so.1 not found): "),
            "{text}"
        );
        assert!(text.contains("LD_LIBRARY_PATH"), "{text}");
    }

    #[test]
    fn driver_outcome_is_stable_and_never_panics() {
        let first = driver().cloned();
        let second = driver().cloned();
        assert_eq!(first, second);
        match first {
            Ok(info) => assert_eq!(info.no_device.is_some(), info.device_count == 0),
            Err(e) => println!("skipped: {}", e.reason()),
        }
    }

    #[test]
    fn required_symbols_are_unique() {
        let mut v = REQUIRED_DRIVER_SYMBOLS.to_vec();
        v.sort_unstable();
        v.dedup();
        assert_eq!(v.len(), REQUIRED_DRIVER_SYMBOLS.len());
    }
}
