//! Error pieces shared by every operation: a failed driver call and an
//! out-of-range access.

use cudarc::driver::sys::CUresult;

/// A CUDA driver call that returned an error status.
///
/// The status is named from the binding's enum, never through
/// `cuGetErrorString`, so formatting an error cannot itself need the driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} returned {name} ({code})")]
pub struct CuError {
    /// The driver function, e.g. `cuMemAlloc_v2`.
    pub call: &'static str,
    /// The numeric `CUresult`.
    pub code: u32,
    /// The `CUresult` name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
    pub name: String,
}

impl CuError {
    pub(crate) fn new(call: &'static str, status: CUresult) -> Self {
        Self {
            call,
            code: status as u32,
            name: format!("{status:?}"),
        }
    }

    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn is_out_of_memory(&self) -> bool {
        self.code == CUresult::CUDA_ERROR_OUT_OF_MEMORY as u32
    }

    /// `CUDA_ERROR_NO_DEVICE`.
    pub fn is_no_device(&self) -> bool {
        self.code == CUresult::CUDA_ERROR_NO_DEVICE as u32
    }
}

/// Turns a raw status into a result, naming the call.
pub(crate) fn check(call: &'static str, status: CUresult) -> Result<(), CuError> {
    if status == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CuError::new(call, status))
    }
}

/// Converts cudarc's error for a call made through its safe layer.
pub(crate) fn from_driver(call: &'static str, err: cudarc::driver::DriverError) -> CuError {
    CuError::new(call, err.0)
}

/// An access reached outside a buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("access at offset {offset} of {len} bytes is outside the {size}-byte {what}")]
pub struct RangeError {
    /// Which buffer: "device buffer", "pinned buffer".
    pub what: &'static str,
    /// First byte of the access.
    pub offset: usize,
    /// Length of the access.
    pub len: usize,
    /// Size of the buffer.
    pub size: usize,
}

/// Checks that `offset..offset+len` lies inside `size` bytes.
pub(crate) fn check_range(
    what: &'static str,
    offset: usize,
    len: usize,
    size: usize,
) -> Result<(), RangeError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(RangeError {
            what,
            offset,
            len,
            size,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_call_and_status_without_the_driver() {
        let e = CuError::new("cuInit", CUresult::CUDA_ERROR_NO_DEVICE);
        assert_eq!(e.to_string(), "cuInit returned CUDA_ERROR_NO_DEVICE (100)");
        assert!(e.is_no_device());
        assert!(!e.is_out_of_memory());
        assert!(check("cuInit", CUresult::CUDA_SUCCESS).is_ok());
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range("pinned buffer", 0, 10, 10).is_ok());
        assert!(check_range("pinned buffer", 10, 0, 10).is_ok());
        assert_eq!(
            check_range("pinned buffer", 5, 6, 10),
            Err(RangeError {
                what: "pinned buffer",
                offset: 5,
                len: 6,
                size: 10
            })
        );
        assert!(check_range("pinned buffer", usize::MAX, 2, 10).is_err());
    }
}
