//! Destroy-once ownership and the registry of retained (leaked on purpose)
//! native objects.
//!
//! Every handle's inner value holds a [`Node`]: the backend object plus a
//! keep-alive box with its parents (and, for memory regions, the buffer).
//! The node destroys the backend object exactly once, on `close` or on
//! drop. If the destroy fails, the backend object *and* the keep-alive move
//! into a process-wide registry and are never freed: the NIC may still
//! reference the memory, so releasing it would be unsound. [`retained`]
//! lists them for diagnostics.

use std::any::Any;
use std::sync::Mutex;

use crate::backend::Destroy;
use crate::error::{CleanupEvidence, NativeError, ObjectKind, Unquiesced, UnquiescedCause};
use crate::types::DeviceIdentity;

/// A native object this process keeps alive because its destroy failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetainedObject {
    /// Kind of object.
    pub object: ObjectKind,
    /// Which one.
    pub label: String,
    /// Its device.
    pub device: DeviceIdentity,
    /// The destroy failure.
    pub error: NativeError,
    /// Registered bytes kept alive (memory regions; 0 otherwise).
    pub bytes: usize,
}

struct Entry {
    info: RetainedObject,
    _keep: Box<dyn Any + Send + Sync>,
}

static RETAINED: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Every object retained so far because a native destroy failed
/// (on `close` or on drop), oldest first.
pub fn retained() -> Vec<RetainedObject> {
    let list = RETAINED.lock().unwrap_or_else(|e| e.into_inner());
    list.iter().map(|e| e.info.clone()).collect()
}

/// Destroy-once owner of one backend object and its keep-alives.
pub(crate) struct Node<O: ?Sized + Destroy> {
    /// `None` once destroyed (or retained).
    ops: Option<Box<O>>,
    /// Parents (and buffer) that must outlive `ops`; moved into the
    /// registry if the destroy fails.
    keep: Option<Box<dyn Any + Send + Sync>>,
    pub(crate) object: ObjectKind,
    pub(crate) label: String,
    pub(crate) device: DeviceIdentity,
    /// Registered bytes this object pins (memory regions).
    pub(crate) bytes: usize,
}

impl<O: ?Sized + Destroy> std::fmt::Debug for Node<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("object", &self.object)
            .field("label", &self.label)
            .field("device", &self.device.name)
            .field("live", &self.ops.is_some())
            .finish()
    }
}

impl<O: ?Sized + Destroy> Node<O> {
    pub(crate) fn new(
        ops: Box<O>,
        keep: Box<dyn Any + Send + Sync>,
        object: ObjectKind,
        label: String,
        device: DeviceIdentity,
    ) -> Self {
        Self {
            ops: Some(ops),
            keep: Some(keep),
            object,
            label,
            device,
            bytes: 0,
        }
    }

    /// The backend object. `None` only while being destroyed, which cannot
    /// overlap a borrow of the node; callers map it to a typed error anyway.
    pub(crate) fn ops(&self) -> Option<&O> {
        self.ops.as_deref()
    }

    /// Destroys now; on failure retains everything and returns the error.
    pub(crate) fn close(&mut self) -> Result<(), Unquiesced> {
        let Some(ops) = self.ops.take() else {
            return Ok(());
        };
        let step = format!("destroy {} {}", self.object, self.label);
        match ops.destroy() {
            Ok(()) => {
                tracing::debug!(object = %self.object, label = %self.label, device = %self.device.name, "destroyed");
                drop(ops);
                Ok(())
            }
            Err(error) => {
                let info = RetainedObject {
                    object: self.object,
                    label: self.label.clone(),
                    device: self.device.clone(),
                    error,
                    bytes: self.bytes,
                };
                tracing::error!(object = %self.object, label = %self.label, device = %self.device.name, %error,
                    "native destroy failed; object, parents and memory retained");
                let keep: Box<dyn Any + Send + Sync> = Box::new((ops, self.keep.take()));
                RETAINED
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Entry { info, _keep: keep });
                Err(Unquiesced {
                    object: self.object,
                    label: self.label.clone(),
                    device: self.device.clone(),
                    cause: UnquiescedCause::Native(error),
                    cleanup: CleanupEvidence {
                        tried: vec![step],
                        retained: true,
                        retained_bytes: self.bytes,
                    },
                })
            }
        }
    }

    /// The error for closing a handle others still hold.
    pub(crate) fn in_use(&self, holders: usize) -> Unquiesced {
        Unquiesced {
            object: self.object,
            label: self.label.clone(),
            device: self.device.clone(),
            cause: UnquiescedCause::InUse { holders },
            cleanup: CleanupEvidence {
                tried: vec![format!("release handle of {} {}", self.object, self.label)],
                retained: false,
                retained_bytes: 0,
            },
        }
    }
}

impl<O: ?Sized + Destroy> Drop for Node<O> {
    fn drop(&mut self) {
        // Errors are logged and the object retained inside `close`; drop
        // never panics and never pretends the destroy succeeded.
        let _ = self.close();
    }
}
