//! Host memory that RDMA NICs can register and same-host peers can share.
//!
//! [`HostMemory`] is the one type through which OrbitTE touches the bytes of
//! a registered range. It is always held in an [`Arc`]: memory regions,
//! in-flight requests and publications each keep a clone, so the bytes stay
//! mapped while any of them is alive (the buffer-ownership rule of the
//! transfer contract).
//!
//! Three kinds of backing:
//! - [`HostMemory::alloc`]: page-aligned, zeroed, `memfd`-backed shared
//!   mapping. The fd lets the local path hand the range to a peer process on
//!   the same host, so bytes move without crossing a socket.
//! - [`HostMemory::from_raw_parts`]: memory the caller already owns (not
//!   shareable by fd; the local path falls back, and says so). The caller
//!   may unmap it by mistake while it is wrapped, so every copy of it goes
//!   through the kernel (`process_vm_writev`, `recvmsg`, `sendmsg`), which
//!   turns a missing page into [`MemoryError::Unmapped`], never a signal.
//! - [`HostMemory::map_shared`]: a peer's memfd mapped into this process.
//!
//! # Concurrency
//! Registered memory can be changed at any time by a NIC or a peer process:
//! that is the point of one-sided transfers. The copy methods use raw,
//! bounds-checked copies and never hand out `&[u8]`/`&mut [u8]` references
//! into the range, so no Rust reference ever aliases bytes that DMA may
//! change. Readers see whatever bytes are there when they copy; ordering is
//! established by the transfer engine's completions, not by this type.
#![warn(missing_docs)]

pub mod dma;
mod host;
mod socket;
mod vm_copy;

pub use host::{GATHER_PIECES, HostMemory, MemoryError, SendPiece};
pub use socket::{notsent_lowat, set_notsent_lowat, set_recv_lowat};

/// Memory a NIC (or a GPU copy engine) may read and write by address.
///
/// # Safety
/// Implementors promise that `as_ptr()..as_ptr() + len()` is one mapping
/// that stays valid, at the same address, for as long as the value lives,
/// that it may be read through the pointer at any time, and — when
/// [`is_writable`](Self::is_writable) returns true — written through it by
/// other agents (DMA, other processes) at any time without breaking the
/// implementor's own invariants (so it must not hand out Rust references
/// into it).
pub unsafe trait DmaBuffer: Send + Sync + std::fmt::Debug {
    /// First byte of the range.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes (never zero).
    fn len(&self) -> usize;
    /// Whether the range may be written through the pointer. False for a
    /// read-only mapping: registering it with write access is refused
    /// (writing it would fault).
    fn is_writable(&self) -> bool {
        true
    }
    /// Always false: zero-length buffers cannot be created.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[doc(no_inline)]
pub use std::sync::Arc;
