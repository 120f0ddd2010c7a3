//! Errors of loading libibverbs and listing devices. Each message names
//! what failed and what to do about it.

use std::path::PathBuf;

/// Loading `libibverbs.so.1` failed ([`crate::Verbs::load`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The dynamic loader could not open the library: it is not installed
    /// (or not on the loader's search path).
    #[error(
        "libibverbs not found ({library}: {source}); install libibverbs1 and ibverbs-providers \
         (rdma-core)"
    )]
    LibraryNotFound {
        /// The name or path that was opened.
        library: PathBuf,
        /// The loader's error.
        #[source]
        source: libloading::Error,
    },
    /// The library opened but lacks a function of the `IBVERBS_1.1` ABI
    /// that every rdma-core release exports: it is not libibverbs.
    #[error(
        "{library} lacks `{symbol}` ({source}), so it is not libibverbs; install libibverbs1 \
         (rdma-core) and load libibverbs.so.1"
    )]
    MissingSymbol {
        /// The library that was opened.
        library: PathBuf,
        /// The missing function.
        symbol: &'static str,
        /// The loader's error.
        #[source]
        source: libloading::Error,
    },
}

/// Listing RDMA devices failed ([`crate::Verbs::devices`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceListError {
    /// `ibv_get_device_list` returned NULL. `errno` says why; `ENOSYS` (38
    /// on Linux) means the kernel has no RDMA support at all.
    #[error("ibv_get_device_list failed: {}", describe_errno(*errno))]
    ListFailed {
        /// The `errno` left by `ibv_get_device_list`.
        errno: i32,
    },
    /// The list was empty: RDMA is available but no device is visible.
    #[error(
        "no RDMA devices found; check that the NIC's provider is installed (ibverbs-providers), \
         that its driver and ib_uverbs are loaded (or add a soft-RoCE device with `rdma link add \
         rxe0 type rxe netdev IFACE`), and that /dev/infiniband/uverbs* is readable and writable"
    )]
    NoDevices,
}

impl DeviceListError {
    /// Whether the failure means the kernel has no RDMA support (`ENOSYS`),
    /// as on a machine or container without the RDMA subsystem.
    pub fn kernel_lacks_rdma(&self) -> bool {
        matches!(self, Self::ListFailed { errno } if *errno == libc::ENOSYS)
    }
}

fn describe_errno(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno);
    match errno {
        libc::ENOSYS => format!(
            "errno {errno} (ENOSYS, {text}): the kernel has no RDMA support (no \
             /sys/class/infiniband_verbs); run on a kernel with RDMA enabled and load ib_uverbs \
             plus the NIC's driver (or rdma_rxe for soft-RoCE)"
        ),
        libc::EPERM | libc::EACCES => format!(
            "errno {errno} ({text}): permission denied reading the RDMA devices; check access to \
             /sys/class/infiniband_verbs and /dev/infiniband"
        ),
        libc::ENOMEM => format!("errno {errno} ({text}): out of memory listing RDMA devices"),
        _ => format!(
            "errno {errno} ({text}); check that ib_uverbs is loaded and \
             /sys/class/infiniband_verbs is readable"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enosys_names_the_missing_kernel_support() {
        let e = DeviceListError::ListFailed {
            errno: libc::ENOSYS,
        };
        assert!(e.kernel_lacks_rdma());
        let text = e.to_string();
        assert!(text.contains("errno 38 (ENOSYS"), "{text}");
        assert!(text.contains("no RDMA support"), "{text}");
    }

    #[test]
    fn the_three_failures_read_differently() {
        let other = DeviceListError::ListFailed {
            errno: libc::EACCES,
        };
        assert!(!other.kernel_lacks_rdma());
        assert!(other.to_string().contains("permission denied"));
        assert!(!DeviceListError::NoDevices.kernel_lacks_rdma());
        assert!(
            DeviceListError::NoDevices
                .to_string()
                .starts_with("no RDMA devices found")
        );
    }
}
