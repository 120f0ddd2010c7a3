//! The native provider: libibverbs, loaded at run time through
//! `orbitte-verbs-sys`.
//!
//! Nothing links libibverbs: a machine without it gets
//! [`DeviceListError::Unavailable`]; one whose kernel has no RDMA gets
//! [`DeviceListError::Native`] with ENOSYS. Every failure is typed.
//!
//! One module per verbs object (`context`, `pd`, `mr`, `cq`, `qp`): raw
//! libibverbs pointers behind the backend traits. The handle layer
//! guarantees each is destroyed once, after its children, and never used
//! after a successful destroy.

mod context;
mod cq;
mod mr;
mod os;
mod pd;
mod qp;
mod sysfs;

use std::sync::{Arc, OnceLock};

use orbitte_verbs_sys::{self as sys, Verbs};

use crate::context::Context;
use crate::error::{DeviceListError, NativeError, OpenError};
use crate::provider::Provider;
use crate::types::{DeviceIdentity, DeviceInfo, ProviderKind};

/// libibverbs devices. Loads the library on first use and keeps it loaded
/// while any object of it lives.
#[derive(Debug, Default)]
pub struct NativeProvider {
    verbs: OnceLock<Result<Arc<Verbs>, String>>,
}

impl NativeProvider {
    /// A provider that loads libibverbs on first use.
    pub fn new() -> Self {
        Self {
            verbs: OnceLock::new(),
        }
    }

    /// The loaded library, or why it is unavailable.
    fn verbs(&self) -> Result<&Arc<Verbs>, DeviceListError> {
        self.verbs
            .get_or_init(|| Verbs::load().map(Arc::new).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|reason| DeviceListError::Unavailable {
                reason: reason.clone(),
            })
    }

    fn list<'v>(verbs: &'v Verbs) -> Result<Option<sys::DeviceList<'v>>, DeviceListError> {
        match verbs.devices() {
            Ok(list) => Ok(Some(list)),
            Err(sys::DeviceListError::NoDevices) => Ok(None),
            Err(sys::DeviceListError::ListFailed { errno }) => Err(DeviceListError::Native(
                NativeError::new("ibv_get_device_list", errno),
            )),
            Err(other) => Err(DeviceListError::Unavailable {
                reason: other.to_string(),
            }),
        }
    }
}

/// Reads the fixed-size C string fields of an `ibv_device`.
fn c_field(field: &[core::ffi::c_char]) -> String {
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn device_info(list: &sys::DeviceList<'_>, index: usize) -> Option<DeviceInfo> {
    let dev = *list.as_slice().get(index)?;
    let name = list.name(index)?;
    let guid = list.guid(index).unwrap_or(0);
    // SAFETY: `dev` is a live entry of `list`; only plain char arrays of
    // the public `struct ibv_device` are read.
    let (dev_name, ibdev_path) =
        unsafe { (c_field(&(*dev).dev_name), c_field(&(*dev).ibdev_path)) };
    Some(DeviceInfo {
        identity: DeviceIdentity {
            provider: ProviderKind::Native,
            name: name.clone(),
            guid,
        },
        driver: sysfs::driver(&name),
        uverbs: Some(sysfs::uverbs_node(&dev_name)),
        sysfs_path: (!ibdev_path.is_empty()).then_some(ibdev_path),
    })
}

impl Provider for NativeProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Native
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>, DeviceListError> {
        let verbs = self.verbs()?;
        let Some(list) = Self::list(verbs)? else {
            return Ok(Vec::new());
        };
        Ok((0..list.len())
            .filter_map(|i| device_info(&list, i))
            .collect())
    }

    fn open(&self, device: &str) -> Result<Context, OpenError> {
        let verbs = self.verbs()?;
        let list = Self::list(verbs)?;
        let names = list.as_ref().map(|l| l.names()).unwrap_or_default();
        let Some((list, index)) =
            list.and_then(|l| names.iter().position(|n| n == device).map(|i| (l, i)))
        else {
            return Err(OpenError::NoSuchDevice {
                name: device.to_owned(),
                available: names,
            });
        };
        let Some(info) = device_info(&list, index) else {
            return Err(OpenError::NoSuchDevice {
                name: device.to_owned(),
                available: names,
            });
        };
        let dev = list.as_slice()[index];
        let ops = context::NativeContext::open(verbs.clone(), dev, info.identity.clone()).map_err(
            |source| OpenError::Native {
                device: info.identity.clone(),
                source,
            },
        )?;
        // The opened context keeps its device referenced; the list may go.
        drop(list);
        Ok(Context::from_backend(Box::new(ops), info))
    }
}
