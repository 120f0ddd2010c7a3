//! The RDMA device list.

use core::ffi::c_int;
use core::ptr::NonNull;

use crate::bindings::ibv_device;
use crate::error::DeviceListError;
use crate::library::{Verbs, c_string};

/// The list `ibv_get_device_list` returned; freed on drop.
///
/// The device pointers are valid while the list lives; a device opened
/// with `ibv_open_device` stays valid after the list is freed (libibverbs
/// keeps opened devices referenced).
pub struct DeviceList<'v> {
    verbs: &'v Verbs,
    /// Invariant: a list from `verbs.ibv_get_device_list`, not yet freed,
    /// holding `len` non-null device pointers followed by NULL.
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl Verbs {
    /// Lists the RDMA devices (`ibv_get_device_list`).
    ///
    /// # Errors
    ///
    /// [`DeviceListError::ListFailed`] with `errno` when libibverbs cannot
    /// list devices (`ENOSYS`: the kernel has no RDMA support);
    /// [`DeviceListError::NoDevices`] when the list is empty.
    pub fn devices(&self) -> Result<DeviceList<'_>, DeviceListError> {
        let mut count: c_int = 0;
        // SAFETY: `count` is valid for a write; the function has no other
        // precondition.
        let raw = unsafe { (self.ibv_get_device_list)(&mut count) };
        let Some(list) = NonNull::new(raw) else {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            tracing::debug!(errno, "ibv_get_device_list failed");
            return Err(DeviceListError::ListFailed { errno });
        };
        let list = DeviceList {
            verbs: self,
            list,
            len: usize::try_from(count).unwrap_or(0),
        };
        if list.len == 0 {
            // Dropping `list` frees it.
            return Err(DeviceListError::NoDevices);
        }
        tracing::debug!(devices = list.len, "RDMA devices listed");
        Ok(list)
    }
}

impl DeviceList<'_> {
    /// The number of devices (never zero).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an empty list is [`DeviceListError::NoDevices`].
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device pointers, in libibverbs' order.
    pub fn as_slice(&self) -> &[*mut ibv_device] {
        // SAFETY: by the field's invariant the list holds `len` pointers and
        // is not freed before `self` drops.
        unsafe { core::slice::from_raw_parts(self.list.as_ptr(), self.len) }
    }

    /// The kernel name of device `index` (`mlx5_0`, `rxe0`), or `None`
    /// past the end.
    pub fn name(&self, index: usize) -> Option<String> {
        let device = *self.as_slice().get(index)?;
        // SAFETY: `device` is a live entry of this list.
        let name = unsafe { (self.verbs.ibv_get_device_name)(device) };
        // SAFETY: the name is NULL or a NUL-terminated string owned by the
        // device, which outlives this call.
        unsafe { c_string(name) }
    }

    /// The node GUID of device `index` in host byte order, or `None` past
    /// the end.
    pub fn guid(&self, index: usize) -> Option<u64> {
        let device = *self.as_slice().get(index)?;
        // SAFETY: `device` is a live entry of this list.
        let guid = unsafe { (self.verbs.ibv_get_device_guid)(device) };
        Some(u64::from_be(guid))
    }

    /// Every device's name (`"?"` where libibverbs gives none).
    pub fn names(&self) -> Vec<String> {
        (0..self.len)
            .map(|i| self.name(i).unwrap_or_else(|| "?".into()))
            .collect()
    }
}

impl Drop for DeviceList<'_> {
    fn drop(&mut self) {
        // SAFETY: the list came from this library's `ibv_get_device_list`
        // and is freed exactly once, here.
        unsafe { (self.verbs.ibv_free_device_list)(self.list.as_ptr()) }
    }
}

impl core::fmt::Debug for DeviceList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceList")
            .field("names", &self.names())
            .finish()
    }
}
