//! Local registrations by address.
//!
//! Each registration is kept by its first byte's address, so one that
//! overlaps another is refused and one can be removed by its address; the
//! Mooncake adapter, whose callers name local memory by a plain pointer,
//! resolves a request's local pointer to (registration, offset) here.
//!
//! Two kinds of memory come in:
//! - caller memory by (address, length) with a Python object that keeps it
//!   alive (the buffer exporter, a tensor, or `None` for plain ints, whose
//!   lifetime is the caller's promise, as with Mooncake). The range must be
//!   mapped readable and writable in this process (checked against
//!   `/proc/self/maps` before the memory is wrapped), so a wrong pointer is
//!   an error at registration. If the caller unmaps it (or write-protects
//!   it) while registered anyway, every copy of it goes through the kernel
//!   (`HostMemory::from_raw_parts`), so the transfer fails with an outcome
//!   that names the range, and the process gets no signal;
//! - [`Allocation`]: memfd memory the engine allocates, which same-host
//!   peers can map (the local path);
//! - CUDA device memory ([`crate::gpu`]), registered on the cuda-staging
//!   path: kept here by its device address like host memory, so a
//!   Mooncake request's local pointer resolves the same way.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;

use orbitte::{HostMemory, RegistrationId};
use orbitte_cuda::CudaBuffer;
use pyo3::prelude::*;

/// Host memory the engine allocated (memfd-backed, page-aligned, zeroed):
/// the one kind of memory a same-host peer can map, so registering it
/// enables the local path.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct Allocation {
    pub(crate) memory: Arc<HostMemory>,
}

#[pymethods]
impl Allocation {
    #[new]
    fn new(length: usize) -> PyResult<Self> {
        let memory = HostMemory::alloc(length)
            .map_err(|e| crate::errors::RegisterError::new_err(format!("allocation: {e}")))?;
        Ok(Self { memory })
    }

    /// Address of the first byte (in this process).
    #[getter]
    fn address(&self) -> u64 {
        self.memory.as_ptr() as u64
    }

    /// Length in bytes.
    #[getter]
    fn length(&self) -> usize {
        self.memory.len()
    }

    /// Copies `data` into the allocation at `offset` (bounds-checked).
    fn write(&self, offset: usize, data: Vec<u8>) -> PyResult<()> {
        self.memory
            .write_at(offset, &data)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }

    /// Copies `length` bytes at `offset` out of the allocation (bounds-checked).
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        length: usize,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let v = self
            .memory
            .to_vec(offset, length)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        Ok(pyo3::types::PyBytes::new(py, &v))
    }

    fn __len__(&self) -> usize {
        self.memory.len()
    }
}

/// The memory of one local registration.
#[derive(Debug, Clone)]
pub(crate) enum RangeMemory {
    /// Host memory: the caller's copies (`read_local`, `write_local`) go
    /// through it.
    Host(Arc<HostMemory>),
    /// CUDA device memory on the cuda-staging path (no host copy reaches
    /// it: the driver's copies do).
    Device(Arc<CudaBuffer>),
}

/// One local registration.
#[derive(Debug, Clone)]
pub(crate) struct LocalRange {
    pub(crate) id: RegistrationId,
    pub(crate) len: u64,
    /// Keeps the memory (and the Python object behind it) alive for as
    /// long as the range is registered, whatever the engine holds.
    pub(crate) memory: RangeMemory,
}

/// Why a local address does not resolve.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LocalMiss {
    /// No registration contains the first byte.
    #[error(
        "local address {addr:#x} is not inside a registered range: register the memory first (register_memory / Engine.register)"
    )]
    Unregistered { addr: u64 },
    /// The access runs past the registration's end.
    #[error(
        "local access {addr:#x}+{len} runs past the end of the registered range {start:#x}+{range_len}: register the whole buffer or shorten the request"
    )]
    PastEnd {
        addr: u64,
        len: u64,
        start: u64,
        range_len: u64,
    },
}

/// The registrations, by first address. Invariant: no two overlap.
#[derive(Debug, Default)]
pub(crate) struct LocalTable {
    by_start: BTreeMap<u64, LocalRange>,
}

impl LocalTable {
    /// The registration containing `addr..addr+len`, and the offset in it.
    pub(crate) fn resolve(&self, addr: u64, len: u64) -> Result<(&LocalRange, u64), LocalMiss> {
        let Some((start, r)) = self.by_start.range(..=addr).next_back() else {
            return Err(LocalMiss::Unregistered { addr });
        };
        let off = addr - start;
        if off >= r.len {
            return Err(LocalMiss::Unregistered { addr });
        }
        if len > r.len - off {
            return Err(LocalMiss::PastEnd {
                addr,
                len,
                start: *start,
                range_len: r.len,
            });
        }
        Ok((r, off))
    }

    /// The registration starting at `start`, if any.
    pub(crate) fn starting_at(&self, start: u64) -> Option<&LocalRange> {
        self.by_start.get(&start)
    }

    /// The first registration overlapping `start..start+len`, if any.
    pub(crate) fn overlapping(&self, start: u64, len: u64) -> Option<(u64, u64)> {
        let end = start.saturating_add(len);
        self.by_start
            .range(..end)
            .next_back()
            .filter(|(s, r)| s.saturating_add(r.len) > start)
            .map(|(s, r)| (*s, r.len))
    }

    pub(crate) fn insert(&mut self, start: u64, r: LocalRange) {
        self.by_start.insert(start, r);
    }

    pub(crate) fn remove(&mut self, start: u64) -> Option<LocalRange> {
        self.by_start.remove(&start)
    }

    /// Every registration: (start, length).
    pub(crate) fn ranges(&self) -> Vec<(u64, u64)> {
        self.by_start.iter().map(|(s, r)| (*s, r.len)).collect()
    }
}

/// Why an address and a length cannot name a range of memory at all.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RangeError {
    #[error("address 0 (NULL) cannot be registered")]
    Null,
    #[error("length 0 cannot be registered: give the buffer's size in bytes")]
    ZeroLength,
    #[error("{addr:#x}+{len} wraps around the address space")]
    Overflow { addr: u64, len: u64 },
}

/// `addr..addr+len` as a non-null address and a length of this process's
/// address space, or why it is none.
pub(crate) fn checked_range(addr: u64, len: u64) -> Result<(NonNull<u8>, usize), RangeError> {
    if addr == 0 {
        return Err(RangeError::Null);
    }
    if len == 0 {
        return Err(RangeError::ZeroLength);
    }
    addr.checked_add(len)
        .ok_or(RangeError::Overflow { addr, len })?;
    let (Ok(ptr), Ok(n)) = (usize::try_from(addr), usize::try_from(len)) else {
        return Err(RangeError::Overflow { addr, len });
    };
    let ptr =
        NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(ptr)).ok_or(RangeError::Null)?;
    Ok((ptr, n))
}

/// Why caller memory cannot be wrapped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RawMemoryError {
    #[error(transparent)]
    Range(#[from] RangeError),
    #[error(
        "{addr:#x}+{len} is not mapped readable and writable in this process ({why}): pass the address and size of a live, writable buffer"
    )]
    NotMapped { addr: u64, len: u64, why: String },
}

/// Wraps caller memory after checking that every byte of it is mapped
/// readable and writable here. `keepalive` (a Python reference to the
/// owner) lives as long as the returned memory. `kept`: the keepalive is a
/// buffer export (or a DLPack capsule) that keeps the range mapped, so it
/// is copied with `memcpy`; otherwise (a plain address) every copy goes
/// through the kernel, which turns an unmapped range into an error.
pub(crate) fn wrap_raw(
    addr: u64,
    len: u64,
    keepalive: Py<PyAny>,
    kept: bool,
) -> Result<Arc<HostMemory>, RawMemoryError> {
    let (ptr, n) = checked_range(addr, len)?;
    mapped_rw(addr, addr + len).map_err(|why| RawMemoryError::NotMapped { addr, len, why })?;
    // SAFETY: `addr..addr+len` was just checked to lie in mappings that are
    // readable and writable in this process (/proc/self/maps), and it does
    // not move: when the memory came through the buffer protocol,
    // `keepalive` is the exporter object, which pins the buffer (a bytearray
    // cannot be resized while exported) and keeps it alive for as long as
    // the HostMemory and every request holding it; a plain int is the
    // caller's promise, as with Mooncake's register_memory. If the caller
    // unmaps it anyway, HostMemory's copies (all this engine makes outside a
    // NIC, which pins the pages of its memory regions) fail with
    // MemoryError::Unmapped instead of faulting. No Rust reference into the
    // range is made: HostMemory only does raw, bounds-checked copies.
    // With `kept`, moreover, the keepalive is the buffer export (or the
    // DLPack capsule, which owns the producer's reference to its storage)
    // that Python's `register` made: while it is held the exporter can
    // neither free nor resize nor close the buffer, so the range stays
    // mapped as from_kept_parts requires.
    let memory = unsafe {
        if kept {
            HostMemory::from_kept_parts(ptr, n, Box::new(keepalive))
        } else {
            HostMemory::from_raw_parts(ptr, n, Box::new(keepalive))
        }
    };
    memory.map_err(|e| RawMemoryError::NotMapped {
        addr,
        len,
        why: e.to_string(),
    })
}

/// Checks that `start..end` is covered by contiguous readable and writable
/// mappings of this process.
fn mapped_rw(start: u64, end: u64) -> Result<(), String> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let mut covered = start;
    let mut regions: Vec<(u64, u64, bool)> = maps
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (lo, hi) = f.next()?.split_once('-')?;
            let perms = f.next()?;
            let lo = u64::from_str_radix(lo, 16).ok()?;
            let hi = u64::from_str_radix(hi, 16).ok()?;
            Some((lo, hi, perms.starts_with("rw")))
        })
        .collect();
    regions.sort_unstable();
    for (lo, hi, rw) in regions {
        if hi <= covered {
            continue;
        }
        if lo > covered {
            break;
        }
        if !rw {
            return Err(format!(
                "{covered:#x} is in a mapping without read-write access"
            ));
        }
        covered = hi;
        if covered >= end {
            return Ok(());
        }
    }
    Err(format!("{covered:#x} is not mapped"))
}
