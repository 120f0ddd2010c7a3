//! The provider trait: how the engine finds and opens devices without
//! knowing whether they are real NICs or the simulated fabric.

use std::fmt;

use crate::context::Context;
use crate::error::{DeviceListError, OpenError};
use crate::types::{DeviceInfo, ProviderKind};

/// A source of RDMA devices: [`crate::native::NativeProvider`] or
/// [`crate::sim::SimProvider`].
///
/// Object safe: the engine holds an `Arc<dyn Provider>`. Everything after
/// `open` goes through the returned [`Context`] and its children, which
/// are the same types for every provider.
pub trait Provider: Send + Sync + fmt::Debug {
    /// Which implementation this is.
    fn kind(&self) -> ProviderKind;

    /// Lists the devices, with the diagnostics available without opening
    /// them (driver, uverbs node and this process's access to it).
    fn devices(&self) -> Result<Vec<DeviceInfo>, DeviceListError>;

    /// Opens a device by name.
    fn open(&self, device: &str) -> Result<Context, OpenError>;
}
