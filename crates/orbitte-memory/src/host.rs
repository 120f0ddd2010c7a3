//! The host memory type and its errors.

use std::any::Any;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::vm_copy::{self, Stop};
use crate::{DmaBuffer, dma};

/// Why a host memory operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// A zero-length range was asked for.
    #[error("zero-length memory range: ask for at least one byte")]
    ZeroLength,
    /// The operating system refused to create or map the memory.
    #[error("{op} failed for {len} bytes: {source}; check free memory and `ulimit -l`/`ulimit -v`")]
    Os {
        /// The call that failed (`memfd_create`, `ftruncate`, `mmap`).
        op: &'static str,
        /// Bytes asked for.
        len: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An access reached outside the range.
    #[error("access at offset {offset} of {len} bytes is outside the {size}-byte range")]
    OutOfBounds {
        /// First byte of the access.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// Size of the range.
        size: usize,
    },
    /// A peer's fd can still be shrunk: mapping it would let the peer make
    /// our accesses fault (SIGBUS) by truncating the file.
    #[error(
        "shared memory fd is not sealed against shrinking (F_SEAL_SHRINK); the peer must create it with HostMemory::alloc"
    )]
    NotSealed,
    /// A write to a range mapped read-only.
    #[error("range is mapped read-only; the peer published it without remote write access")]
    ReadOnly,
    /// Caller-owned memory ([`HostMemory::from_raw_parts`]) was unmapped
    /// or write-protected while wrapped: the copy stopped at a page the
    /// process can no longer access, with no signal raised.
    #[error(
        "caller memory {addr:#x}+{len} is no longer mapped read-write in this process: keep registered memory mapped until it is unregistered and its requests are drained"
    )]
    Unmapped {
        /// First byte of the access.
        addr: usize,
        /// Length of the access.
        len: usize,
    },
    /// The kernel refused to copy caller-owned memory for a reason other
    /// than a missing page.
    #[error(
        "copying caller memory with process_vm_writev failed: {source}; a seccomp profile must allow process_vm_readv/process_vm_writev"
    )]
    KernelCopy {
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

enum Backing {
    /// Our own memfd mapping.
    Memfd { fd: OwnedFd, map_len: usize },
    /// A peer's memfd mapped here.
    Mapped {
        _fd: OwnedFd,
        map_len: usize,
        writable: bool,
    },
    /// Another [`DmaBuffer`]'s memory, which its contract keeps mapped;
    /// `keepalive` owns it.
    Buffer {
        _keepalive: Box<dyn Any + Send + Sync>,
    },
    /// Memory a caller named by address ([`HostMemory::from_raw_parts`]):
    /// it may be unmapped or write-protected under us, so every copy of
    /// ours goes through the kernel (`vm_copy`, `recvmsg`, `sendmsg`),
    /// which reports that as an error instead of raising a signal.
    Caller {
        _keepalive: Box<dyn Any + Send + Sync>,
    },
    /// Memory a caller named by address whose keepalive keeps it mapped
    /// ([`HostMemory::from_kept_parts`]: a buffer export, which cannot be
    /// freed or resized while held): copied with `memcpy`.
    Kept {
        _keepalive: Box<dyn Any + Send + Sync>,
    },
}

/// A range of host memory that NICs may register and peers may access.
///
/// Invariant: `len > 0`; `ptr..ptr+len` is mapped and valid for the life of
/// the value, except for caller-owned memory, whose range is only promised
/// to stay mapped while a memory region uses the pointer (see
/// [`HostMemory::from_raw_parts`]): this type's own copies of it never
/// assume it is mapped.
pub struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: HostMemory owns (or keeps alive) a plain memory mapping; it hands
// out no references into it and all access goes through raw copies, so it
// may be moved to and shared between threads.
unsafe impl Send for HostMemory {}
// SAFETY: see `Send` above; `&HostMemory` only allows raw, bounds-checked
// copies, which are sound under concurrent DMA by design (module docs).
unsafe impl Sync for HostMemory {}

// SAFETY: the mapping lives as long as the value (type invariant; for
// caller-owned memory, from_raw_parts' contract makes the caller keep it
// mapped while an agent uses this pointer) and no Rust references into it
// are handed out.
unsafe impl DmaBuffer for HostMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn is_writable(&self) -> bool {
        Self::is_writable(self)
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

fn os_err(op: &'static str, len: usize) -> MemoryError {
    MemoryError::Os {
        op,
        len,
        source: std::io::Error::last_os_error(),
    }
}

fn map(
    fd: BorrowedFd<'_>,
    len: usize,
    writable: bool,
) -> Result<(NonNull<u8>, usize), MemoryError> {
    let page = page_size();
    let map_len = len.checked_add(page - 1).ok_or(MemoryError::OutOfBounds {
        offset: 0,
        len,
        size: usize::MAX,
    })? / page
        * page;
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh mapping at an address of the kernel's choice; it
    // aliases no Rust object. The fd is valid for the call.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap", len));
    }
    let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| os_err("mmap", len))?;
    Ok((ptr, map_len))
}

impl HostMemory {
    /// Allocates `len` zeroed bytes, page-aligned, backed by a memfd so the
    /// range can be shared with a same-host peer.
    pub fn alloc(len: usize) -> Result<Arc<Self>, MemoryError> {
        if len == 0 {
            return Err(MemoryError::ZeroLength);
        }
        // SAFETY: the name is a NUL-terminated C string literal.
        let raw = unsafe {
            libc::memfd_create(
                c"orbitte-host".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(os_err("memfd_create", len));
        }
        // SAFETY: memfd_create returned a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len).map_err(|_| MemoryError::OutOfBounds {
            offset: 0,
            len,
            size: i64::MAX as usize,
        })?;
        // SAFETY: ftruncate on an fd we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(os_err("ftruncate", len));
        }
        // Seal the size, so a peer holding the fd (the local path) can
        // neither shrink the file under our mapping nor grow it.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        // SAFETY: fcntl on an fd we own, with integer arguments only.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os_err("fcntl(F_ADD_SEALS)", len));
        }
        let (ptr, map_len) = map(fd.as_fd(), len, true)?;
        Ok(Arc::new(Self {
            ptr,
            len,
            backing: Backing::Memfd { fd, map_len },
        }))
    }

    /// Maps `len` bytes of a peer's shared memory fd (the local path).
    ///
    /// The fd must refer to a memfd of at least `len` bytes sealed against
    /// shrinking (as [`alloc`](Self::alloc) makes them): otherwise the peer
    /// could truncate it and make our accesses fault. Both are checked
    /// (`fstat`, `F_GET_SEALS`) and refused with a typed error.
    pub fn map_shared(fd: OwnedFd, len: usize, writable: bool) -> Result<Arc<Self>, MemoryError> {
        if len == 0 {
            return Err(MemoryError::ZeroLength);
        }
        let file_len = std::fs::File::from(fd.try_clone().map_err(|source| MemoryError::Os {
            op: "dup",
            len,
            source,
        })?)
        .metadata()
        .map_err(|source| MemoryError::Os {
            op: "fstat",
            len,
            source,
        })?
        .len();
        // SAFETY: fcntl(F_GET_SEALS) on a valid fd, no pointers involved.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(MemoryError::NotSealed);
        }
        if (file_len as u128) < len as u128 {
            return Err(MemoryError::OutOfBounds {
                offset: 0,
                len,
                size: file_len as usize,
            });
        }
        let (ptr, map_len) = map(fd.as_fd(), len, writable)?;
        Ok(Arc::new(Self {
            ptr,
            len,
            backing: Backing::Mapped {
                _fd: fd,
                map_len,
                writable,
            },
        }))
    }

    /// Wraps another [`DmaBuffer`] (e.g. orbitte-cuda's pinned bounce
    /// buffers) so it can be registered and copied like any host range. It
    /// cannot be shared by fd. Sound without `unsafe` at the call site,
    /// because `DmaBuffer`'s own contract promises exactly what
    /// [`from_raw_parts`](Self::from_raw_parts) requires; the buffer is kept
    /// alive by the returned value.
    pub fn from_dma_buffer(buffer: Arc<dyn DmaBuffer>) -> Result<Arc<Self>, MemoryError> {
        if !buffer.is_writable() {
            return Err(MemoryError::ReadOnly);
        }
        let len = buffer.len();
        if len == 0 {
            return Err(MemoryError::ZeroLength);
        }
        let ptr = NonNull::new(buffer.as_ptr()).ok_or(MemoryError::ZeroLength)?;
        // DmaBuffer promises one mapping of `len` bytes at `ptr`, valid at
        // the same address while the value lives, writable by other agents,
        // with no Rust references handed out: the type invariant holds, and
        // the Arc moved into `keepalive` keeps the buffer alive as long as
        // the HostMemory.
        Ok(Arc::new(Self {
            ptr,
            len,
            backing: Backing::Buffer {
                _keepalive: Box::new(buffer),
            },
        }))
    }

    /// Wraps memory the caller already owns and names by address. It
    /// cannot be shared by fd.
    ///
    /// Every copy this type makes into or out of it goes through the kernel
    /// (`process_vm_writev(2)` on this process, `recvmsg(2)`, `sendmsg(2)`),
    /// so memory unmapped or write-protected while wrapped makes those copies
    /// fail with [`MemoryError::Unmapped`] instead of raising `SIGSEGV`. The
    /// cost is the kernel's page pinning on each copy: ranges that stay
    /// mapped by construction ([`alloc`](Self::alloc),
    /// [`from_dma_buffer`](Self::from_dma_buffer)) are copied with `memcpy`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must not move and must not be accessed through Rust
    /// references while the returned value (or any clone of the `Arc`,
    /// memory region or request holding it) is alive. It must stay mapped
    /// read-write while an agent other than this type's copy methods uses
    /// the pointer through [`DmaBuffer::as_ptr`] (a memory region made from
    /// it: a NIC pins the pages when the region is made, so a later unmapping
    /// does not fault this process, but the simulated provider copies through
    /// the pointer). A range unmapped and then mapped again by something else
    /// is written like any memory: the kernel cannot tell.
    pub unsafe fn from_raw_parts(
        ptr: NonNull<u8>,
        len: usize,
        keepalive: Box<dyn Any + Send + Sync>,
    ) -> Result<Arc<Self>, MemoryError> {
        Self::caller(ptr, len, keepalive, false)
    }

    /// Wraps memory the caller owns and names by address, which `keepalive`
    /// keeps mapped for as long as it is held (a Python buffer export: the
    /// exporter cannot free, resize or unmap its buffer while an export is
    /// held). Copies of it use `memcpy`, as for [`alloc`](Self::alloc)ated
    /// memory; use [`from_raw_parts`](Self::from_raw_parts) when nothing
    /// keeps the range mapped.
    ///
    /// # Safety
    /// As [`from_raw_parts`](Self::from_raw_parts), and moreover
    /// `ptr..ptr+len` stays mapped readable and writable for as long as
    /// `keepalive` is alive (which this value holds until it is dropped).
    pub unsafe fn from_kept_parts(
        ptr: NonNull<u8>,
        len: usize,
        keepalive: Box<dyn Any + Send + Sync>,
    ) -> Result<Arc<Self>, MemoryError> {
        Self::caller(ptr, len, keepalive, true)
    }

    /// Caller memory `ptr..ptr+len`, kept mapped by `keepalive` when
    /// `kept` (the constructors' contracts apply).
    fn caller(
        ptr: NonNull<u8>,
        len: usize,
        keepalive: Box<dyn Any + Send + Sync>,
        kept: bool,
    ) -> Result<Arc<Self>, MemoryError> {
        if len == 0 {
            return Err(MemoryError::ZeroLength);
        }
        let backing = if kept {
            Backing::Kept {
                _keepalive: keepalive,
            }
        } else {
            Backing::Caller {
                _keepalive: keepalive,
            }
        };
        Ok(Arc::new(Self { ptr, len, backing }))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (zero-length memory cannot be created).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// First byte of the range, for NIC registration.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The memfd behind an [`alloc`](Self::alloc)ated range, for handing the
    /// range to a same-host peer; `None` for other backings.
    pub fn memfd(&self) -> Option<BorrowedFd<'_>> {
        match &self.backing {
            Backing::Memfd { fd, .. } => Some(fd.as_fd()),
            _ => None,
        }
    }

    /// Whether a same-host peer can map this range (see [`memfd`](Self::memfd)).
    pub fn is_shareable(&self) -> bool {
        self.memfd().is_some()
    }

    /// Whether writes are allowed (false for a peer range mapped read-only).
    pub fn is_writable(&self) -> bool {
        !matches!(
            self.backing,
            Backing::Mapped {
                writable: false,
                ..
            }
        )
    }

    /// Checks that `offset..offset+len` lies inside the range.
    pub fn check(&self, offset: usize, len: usize) -> Result<(), MemoryError> {
        dma::check(self, offset, len)
    }

    /// Whether the range was named by a caller ([`from_raw_parts`]): it
    /// may be unmapped under us, so copies go through the kernel.
    ///
    /// [`from_raw_parts`]: Self::from_raw_parts
    fn is_caller_owned(&self) -> bool {
        matches!(self.backing, Backing::Caller { .. })
    }

    /// Address of byte `offset`, as an integer-derived pointer the kernel
    /// copies through (no dereference here: `wrapping_add` stays valid for
    /// a range that is no longer mapped).
    fn at(&self, offset: usize) -> *mut u8 {
        self.ptr.as_ptr().wrapping_add(offset)
    }

    /// The error of a kernel copy of this range's `offset..offset+len`.
    fn stopped(&self, offset: usize, len: usize, stop: Stop) -> MemoryError {
        match stop {
            Stop::Fault => MemoryError::Unmapped {
                addr: self.at(offset) as usize,
                len,
            },
            Stop::Os(source) => MemoryError::KernelCopy { source },
        }
    }

    /// Copies bytes out of the range. Caller-owned memory that is no
    /// longer mapped is [`MemoryError::Unmapped`].
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        if !self.is_caller_owned() {
            return dma::read_at(self, offset, dst);
        }
        self.check(offset, dst.len())?;
        // SAFETY: `dst` is uniquely borrowed, so no other reference aliases
        // it; it is a Rust buffer, so it does not overlap the wrapped range
        // (no Rust reference into that exists: from_raw_parts' contract).
        unsafe { vm_copy::copy(dst.as_mut_ptr(), self.at(offset), dst.len()) }
            .map_err(|s| self.stopped(offset, dst.len(), s))
    }

    /// Copies bytes into the range. Caller-owned memory that is no longer
    /// mapped, or no longer writable, is [`MemoryError::Unmapped`].
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        if !self.is_caller_owned() {
            return dma::write_at(self, offset, src);
        }
        self.check(offset, src.len())?;
        // SAFETY: no Rust reference aliases the wrapped range
        // (from_raw_parts' contract), so none aliases what the kernel
        // writes; `src` is a Rust slice, so the two do not overlap.
        unsafe { vm_copy::copy(self.at(offset), src.as_ptr(), src.len()) }
            .map_err(|s| self.stopped(offset, src.len(), s))
    }

    /// Sets `len` bytes at `offset` to `byte` (errors as for
    /// [`write_at`](Self::write_at)).
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), MemoryError> {
        if !self.is_caller_owned() {
            return dma::fill(self, offset, len, byte);
        }
        self.check(offset, len)?;
        // SAFETY: no Rust reference aliases the wrapped range
        // (from_raw_parts' contract).
        unsafe { vm_copy::fill(self.at(offset), len, byte) }
            .map_err(|s| self.stopped(offset, len, s))
    }

    /// Copies `len` bytes from `src` at `src_offset` into `self` at
    /// `offset` (the local path's one-sided copy). `src` may be `self`.
    /// When either side is caller-owned memory that is no longer mapped
    /// (or, for `self`, no longer writable), the copy stops with
    /// [`MemoryError::Unmapped`] naming that side's range.
    pub fn copy_from(
        &self,
        offset: usize,
        src: &Self,
        src_offset: usize,
        len: usize,
    ) -> Result<(), MemoryError> {
        self.check(offset, len)?;
        src.check(src_offset, len)?;
        if !self.is_writable() {
            return Err(MemoryError::ReadOnly);
        }
        let (dst_at, src_at) = (self.at(offset) as usize, src.at(src_offset) as usize);
        match (self.is_caller_owned(), src.is_caller_owned()) {
            (false, false) => {
                // SAFETY: both ranges bounds-checked and mapped while their
                // values live (type invariant); `copy` tolerates overlap
                // (e.g. the same memfd mapped twice, or `src` being `self`).
                unsafe { std::ptr::copy(src.at(src_offset), self.at(offset), len) };
                Ok(())
            }
            (true, true) => self.copy_through(offset, (src, src_offset), len),
            _ if dst_at < src_at.saturating_add(len) && src_at < dst_at.saturating_add(len) => {
                self.copy_through(offset, (src, src_offset), len)
            }
            (dst_caller, _) => {
                // SAFETY: no Rust reference aliases either range (type
                // invariant, from_raw_parts' contract); they do not overlap
                // (the arm above takes ranges that do); the one that is caller-owned
                // need not be mapped, and the other is (type invariant).
                let copied = unsafe { vm_copy::copy(self.at(offset), src.at(src_offset), len) };
                copied.map_err(|s| {
                    if dst_caller {
                        self.stopped(offset, len, s)
                    } else {
                        src.stopped(src_offset, len, s)
                    }
                })
            }
        }
    }

    /// [`copy_from`](Self::copy_from) through a bounce buffer, a piece at
    /// a time: for ranges that overlap or are both caller-owned (a fault
    /// is then known to be in the side being copied).
    fn copy_through(
        &self,
        offset: usize,
        (src, src_offset): (&Self, usize),
        len: usize,
    ) -> Result<(), MemoryError> {
        const PIECE: usize = 1 << 20;
        let mut bounce = vec![0u8; len.min(PIECE)];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(PIECE);
            // Overlapping ranges with the destination after the source are
            // copied from the end, as `memmove` does.
            let at = if self.at(offset) as usize > src.at(src_offset) as usize {
                len - done - n
            } else {
                done
            };
            src.read_at(src_offset + at, &mut bounce[..n])?;
            self.write_at(offset + at, &bounce[..n])?;
            done += n;
        }
        Ok(())
    }

    /// Receives up to `len` bytes from the connected socket `socket`
    /// straight into the range at `offset`: one `recv(2)`, the kernel's one
    /// copy from the socket into the mapping, no page-cache detour and no
    /// intermediate buffer. Returns how many bytes arrived (`Ok(0)`: the
    /// peer closed its sending side). With `dont_wait`, it returns
    /// `WouldBlock` at once instead of waiting for bytes; otherwise the
    /// socket's receive timeout applies (`WouldBlock` when it passes).
    ///
    /// A range outside the memory or a read-only mapping is refused before
    /// any system call (`InvalidInput`/`PermissionDenied`, with the
    /// [`MemoryError`] as the source).
    pub fn recv_from(
        &self,
        socket: BorrowedFd<'_>,
        offset: usize,
        len: usize,
        dont_wait: bool,
    ) -> std::io::Result<usize> {
        self.recv_from_then(socket, offset, len, &mut [], dont_wait)
    }

    /// As [`recv_from`](Self::recv_from), and what follows those `len`
    /// bytes in the stream goes on into `tail` (up to its length), with
    /// one `recvmsg(2)` of two pieces: a payload and the start of the next
    /// frame in one system call. Returns how many bytes arrived in all;
    /// the first `len` went to the range, any beyond into `tail`.
    pub fn recv_from_then(
        &self,
        socket: BorrowedFd<'_>,
        offset: usize,
        len: usize,
        tail: &mut [u8],
        dont_wait: bool,
    ) -> std::io::Result<usize> {
        self.check(offset, len)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        if !self.is_writable() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                MemoryError::ReadOnly,
            ));
        }
        let mut iov = [
            libc::iovec {
                iov_base: self.at(offset).cast(),
                iov_len: len,
            },
            libc::iovec {
                iov_base: tail.as_mut_ptr().cast(),
                iov_len: tail.len(),
            },
        ];
        // SAFETY: an all-zero msghdr is a valid empty message.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = if tail.is_empty() { 1 } else { 2 };
        let flags = if dont_wait { libc::MSG_DONTWAIT } else { 0 };
        // SAFETY: the iovecs name `offset..offset + len` of the range
        // (inside it, checked above; writable, checked above; mapped while
        // `self` lives, type invariant, or for caller-owned memory maybe
        // not) and `tail` (a live, uniquely borrowed slice). The kernel
        // writes into them with its user-copy routine, which reports a
        // missing or read-only page as EFAULT instead of raising a signal;
        // no Rust reference into the range exists (type invariant), so the
        // write aliases none. `msg` and `iov` outlive
        // the call; the fd is valid for the call (`BorrowedFd`); a
        // non-socket fd fails with ENOTSOCK.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, flags) };
        if n < 0 {
            return Err(self.socket_error(offset, len));
        }
        Ok(n as usize)
    }

    /// Sends up to `len` bytes of the range at `offset` on the connected
    /// socket `socket`, after `head` (a frame header that goes first),
    /// with one `sendmsg(2)` of two pieces: the kernel copies the bytes
    /// straight out of the mapping. Returns how many bytes went out, `head`
    /// included: the caller sends the rest of `head` and of the range
    /// with further calls. `more` sets `MSG_MORE` (more data follows at
    /// once: the kernel may hold a partial packet back). `SIGPIPE` is never
    /// raised (`MSG_NOSIGNAL`); the socket's send timeout applies
    /// (`WouldBlock` when it passes).
    ///
    /// A range outside the memory is refused before any system call
    /// (`InvalidInput`, with the [`MemoryError`] as the source).
    pub fn send_to(
        &self,
        socket: BorrowedFd<'_>,
        head: &[u8],
        offset: usize,
        len: usize,
        more: bool,
    ) -> std::io::Result<usize> {
        self.check(offset, len)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let mut iov = [
            libc::iovec {
                iov_base: head.as_ptr().cast_mut().cast(),
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: self.at(offset).cast(),
                iov_len: len,
            },
        ];
        let skip = usize::from(head.is_empty());
        // SAFETY: an all-zero msghdr is a valid empty message.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov[skip..].as_mut_ptr();
        msg.msg_iovlen = (2 - skip) as _;
        let mut flags = libc::MSG_NOSIGNAL;
        if more {
            flags |= libc::MSG_MORE;
        }
        // SAFETY: the iovecs name `head` (a live slice) and
        // `offset..offset + len` of the range (bounds checked above; mapped
        // while `self` lives, or for caller-owned memory maybe not); the
        // kernel only reads them, with its user-copy routine (a missing page
        // is EFAULT, never a signal). `msg` and `iov` outlive
        // the call; the fd is valid for the call (`BorrowedFd`).
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, flags) };
        if n < 0 {
            return Err(self.socket_error(offset, len));
        }
        Ok(n as usize)
    }

    /// Sends, with one `sendmsg(2)`, `pieces` in order as far as the
    /// socket takes them: frame bytes and ranges of host memory (the
    /// kernel copies them straight out of each mapping), so that several
    /// answers, each a header and its payload, go out in one call. At most
    /// [`GATHER_PIECES`] pieces go in a call (the rest is the next call's).
    /// Returns how many bytes went out; `SIGPIPE` is never raised
    /// (`MSG_NOSIGNAL`), and `dont_wait` sets `MSG_DONTWAIT`.
    ///
    /// A range outside its memory is refused before any system call
    /// (`InvalidInput`, with the [`MemoryError`] as the source); `EFAULT`
    /// on caller-owned memory is `InvalidInput` naming the first
    /// caller-owned range.
    pub fn send_gathered(
        socket: BorrowedFd<'_>,
        pieces: &[SendPiece<'_>],
        dont_wait: bool,
    ) -> std::io::Result<usize> {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; GATHER_PIECES];
        let mut used = 0;
        for piece in pieces.iter().take(GATHER_PIECES) {
            let (base, len) = match *piece {
                SendPiece::Bytes(b) => (b.as_ptr().cast_mut(), b.len()),
                SendPiece::Range(m, offset, len) => {
                    m.check(offset, len)
                        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
                    (m.at(offset), len)
                }
            };
            if len > 0 {
                iov[used] = libc::iovec {
                    iov_base: base.cast(),
                    iov_len: len,
                };
                used += 1;
            }
        }
        if used == 0 {
            return Ok(0);
        }
        // SAFETY: an all-zero msghdr is a valid empty message.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = used as _;
        let mut flags = libc::MSG_NOSIGNAL;
        if dont_wait {
            flags |= libc::MSG_DONTWAIT;
        }
        // SAFETY: each iovec names a live slice (`Bytes`) or `offset..offset
        // + len` of a range (bounds checked above; mapped while the
        // borrowed memory lives, or for caller-owned memory maybe not); the
        // kernel only reads them, with its user-copy routine (a missing
        // page is EFAULT, never a signal). `msg` and `iov` outlive the
        // call; the fd is valid for the call (`BorrowedFd`).
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, flags) };
        if n < 0 {
            let owned = pieces.iter().find_map(|p| match *p {
                SendPiece::Range(m, offset, len) if m.is_caller_owned() => Some((m, offset, len)),
                _ => None,
            });
            return Err(match owned {
                Some((m, offset, len)) => m.socket_error(offset, len),
                None => std::io::Error::last_os_error(),
            });
        }
        Ok(n as usize)
    }

    /// The error of a failed `recvmsg`/`sendmsg` on `offset..offset+len`:
    /// `EFAULT` on caller-owned memory (unmapped, or not writable for a
    /// receive) is `InvalidInput` with [`MemoryError::Unmapped`] as the
    /// source; anything else is the OS error.
    fn socket_error(&self, offset: usize, len: usize) -> std::io::Error {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EFAULT) && self.is_caller_owned() {
            return std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                self.stopped(offset, len, Stop::Fault),
            );
        }
        e
    }

    /// Copies `len` bytes starting at `offset` into a new vector.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, MemoryError> {
        let mut v = vec![0; len];
        self.read_at(offset, &mut v)?;
        Ok(v)
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        let map_len = match &self.backing {
            Backing::Memfd { map_len, .. } | Backing::Mapped { map_len, .. } => *map_len,
            Backing::Buffer { .. } | Backing::Caller { .. } | Backing::Kept { .. } => return,
        };
        // SAFETY: we created this mapping with this length and nothing
        // refers to it any more (we are being dropped, and every holder of
        // the pointer holds an Arc to us).
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), map_len) };
        if rc != 0 {
            // Never panic in Drop; leaking the mapping is the safe outcome.
            eprintln!(
                "orbitte-memory: munmap of {map_len} bytes failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.backing {
            Backing::Memfd { .. } => "memfd",
            Backing::Mapped { writable: true, .. } => "peer-mapped",
            Backing::Mapped {
                writable: false, ..
            } => "peer-mapped-readonly",
            Backing::Buffer { .. } => "dma-buffer",
            Backing::Caller { .. } => "caller-owned",
            Backing::Kept { .. } => "caller-kept",
        };
        f.debug_struct("HostMemory")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("backing", &kind)
            .finish()
    }
}

/// Most pieces [`HostMemory::send_gathered`] sends in one call.
pub const GATHER_PIECES: usize = 64;

/// One piece of a [`HostMemory::send_gathered`] call.
#[derive(Debug, Clone, Copy)]
pub enum SendPiece<'a> {
    /// Bytes of the caller's (a frame header).
    Bytes(&'a [u8]),
    /// `len` bytes of host memory at `offset`.
    Range(&'a HostMemory, usize, usize),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn alloc_is_zeroed_aligned_and_bounds_checked() {
        let m = HostMemory::alloc(10_000).unwrap();
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.as_ptr() as usize % page_size(), 0);
        assert_eq!(m.to_vec(0, 10_000).unwrap(), vec![0; 10_000]);
        m.write_at(9_998, &[1, 2]).unwrap();
        assert_eq!(m.to_vec(9_998, 2).unwrap(), vec![1, 2]);
        assert!(matches!(
            m.write_at(9_999, &[1, 2]),
            Err(MemoryError::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.read_at(usize::MAX, &mut [0]),
            Err(MemoryError::OutOfBounds { .. })
        ));
        assert!(matches!(HostMemory::alloc(0), Err(MemoryError::ZeroLength)));
    }

    #[test]
    fn shared_mapping_sees_the_same_bytes() {
        let m = HostMemory::alloc(4096).unwrap();
        let fd = m.memfd().unwrap().try_clone_to_owned().unwrap();
        let peer = HostMemory::map_shared(fd, 4096, true).unwrap();
        peer.write_at(100, b"hello").unwrap();
        assert_eq!(m.to_vec(100, 5).unwrap(), b"hello");
        m.copy_from(0, &peer, 100, 5).unwrap();
        assert_eq!(peer.to_vec(0, 5).unwrap(), b"hello");
    }

    #[test]
    fn allocated_memfd_cannot_be_resized_by_a_peer() {
        let m = HostMemory::alloc(4096).unwrap();
        let file = std::fs::File::from(m.memfd().unwrap().try_clone_to_owned().unwrap());
        assert!(file.set_len(0).is_err(), "shrink must be sealed");
        assert!(file.set_len(8192).is_err(), "grow must be sealed");
        assert_eq!(m.to_vec(4095, 1).unwrap(), vec![0]);
    }

    #[test]
    fn unsealed_fds_are_refused() {
        let f = tempfile_fd(4096);
        assert!(matches!(
            HostMemory::map_shared(f, 4096, true),
            Err(MemoryError::NotSealed)
        ));
    }

    fn tempfile_fd(len: u64) -> OwnedFd {
        // SAFETY: NUL-terminated literal; the returned fd is checked.
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: memfd_create returned a fresh fd we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone().unwrap())
            .set_len(len)
            .unwrap();
        fd
    }

    #[test]
    fn read_only_mapping_refuses_writes() {
        let m = HostMemory::alloc(4096).unwrap();
        let fd = m.memfd().unwrap().try_clone_to_owned().unwrap();
        let peer = HostMemory::map_shared(fd, 4096, false).unwrap();
        assert!(matches!(peer.write_at(0, b"x"), Err(MemoryError::ReadOnly)));
        assert!(!peer.is_writable());
        assert!(!DmaBuffer::is_writable(&*peer));
        assert!(DmaBuffer::is_writable(&*m));
    }

    #[test]
    fn mapping_more_than_the_file_is_refused() {
        let m = HostMemory::alloc(4096).unwrap();
        let fd = m.memfd().unwrap().as_fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            HostMemory::map_shared(fd, 8192, true),
            Err(MemoryError::OutOfBounds { size: 4096, .. })
        ));
    }

    #[test]
    fn raw_parts_keep_the_owner_alive() {
        let mut v = vec![7u8; 64].into_boxed_slice();
        let ptr = NonNull::new(v.as_mut_ptr()).unwrap();
        // SAFETY: the boxed slice is moved into keepalive and not touched
        // through references afterwards.
        let m = unsafe { HostMemory::from_raw_parts(ptr, 64, Box::new(v)) }.unwrap();
        assert!(!m.is_shareable());
        assert_eq!(m.to_vec(0, 3).unwrap(), vec![7, 7, 7]);
    }

    #[test]
    fn dma_buffers_wrap_without_copying() {
        let inner = HostMemory::alloc(4096).unwrap();
        inner.write_at(10, b"abc").unwrap();
        let outer = HostMemory::from_dma_buffer(inner.clone()).unwrap();
        assert_eq!(outer.as_ptr(), inner.as_ptr());
        assert_eq!(outer.to_vec(10, 3).unwrap(), b"abc");
        assert!(!outer.is_shareable());
        let ro = HostMemory::map_shared(
            inner.memfd().unwrap().try_clone_to_owned().unwrap(),
            4096,
            false,
        )
        .unwrap();
        assert!(matches!(
            HostMemory::from_dma_buffer(ro),
            Err(MemoryError::ReadOnly)
        ));
    }

    fn read_only_view(m: &HostMemory) -> Arc<HostMemory> {
        let fd = m.memfd().unwrap().try_clone_to_owned().unwrap();
        HostMemory::map_shared(fd, m.len(), false).unwrap()
    }

    /// Reads exactly `n` bytes from `s`.
    fn read_n(s: &mut std::os::unix::net::UnixStream, n: usize) -> Vec<u8> {
        let mut got = vec![0u8; n];
        std::io::Read::read_exact(s, &mut got).unwrap();
        got
    }

    fn socket_pair() -> (
        std::os::unix::net::UnixStream,
        std::os::unix::net::UnixStream,
    ) {
        std::os::unix::net::UnixStream::pair().unwrap()
    }

    #[test]
    fn recv_from_writes_the_socket_bytes_into_the_range() {
        use std::io::Write;
        let (mut a, b) = socket_pair();
        let m = HostMemory::alloc(8192).unwrap();
        a.write_all(b"hello world").unwrap();
        let mut got = 0;
        while got < 11 {
            let n = m.recv_from(b.as_fd(), 4090 + got, 11 - got, false).unwrap();
            assert!(n > 0);
            got += n;
        }
        assert_eq!(m.to_vec(4090, 11).unwrap(), b"hello world");
        assert_eq!(m.to_vec(4089, 1).unwrap(), vec![0]);
        assert_eq!(m.to_vec(4101, 1).unwrap(), vec![0]);
        // Nothing waiting: dont_wait returns at once.
        let e = m.recv_from(b.as_fd(), 0, 10, true).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        drop(a);
        assert_eq!(m.recv_from(b.as_fd(), 0, 10, false).unwrap(), 0);
    }

    #[test]
    fn recv_from_refuses_outside_the_range_and_read_only_memory() {
        use std::io::Write;
        let (mut a, b) = socket_pair();
        a.write_all(b"xyz").unwrap();
        let m = HostMemory::alloc(4096).unwrap();
        let e = m.recv_from(b.as_fd(), 4095, 2, false).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(matches!(
            e.get_ref().and_then(|s| s.downcast_ref::<MemoryError>()),
            Some(MemoryError::OutOfBounds { .. })
        ));
        let e = m.recv_from(b.as_fd(), usize::MAX, 2, false).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        let ro = read_only_view(&m);
        let e = ro.recv_from(b.as_fd(), 0, 3, false).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        // The refused calls consumed nothing.
        assert_eq!(m.recv_from(b.as_fd(), 0, 3, false).unwrap(), 3);
        assert_eq!(m.to_vec(0, 3).unwrap(), b"xyz");
    }

    #[test]
    fn recv_from_then_fills_the_range_first_and_the_tail_after_it() {
        use std::io::Write;
        let (mut a, b) = socket_pair();
        let m = HostMemory::alloc(4096).unwrap();
        a.write_all(b"payloadNEXT").unwrap();
        let mut tail = [0u8; 8];
        let mut got = 0;
        while got < 11 {
            let (range, t) = (7usize.saturating_sub(got), got.saturating_sub(7));
            let n = m
                .recv_from_then(b.as_fd(), 100 + 7 - range, range, &mut tail[t..], false)
                .unwrap();
            assert!(n > 0);
            got += n;
        }
        assert_eq!(m.to_vec(100, 7).unwrap(), b"payload");
        assert_eq!(m.to_vec(107, 1).unwrap(), vec![0]);
        assert_eq!(&tail[..4], b"NEXT");
        assert_eq!(&tail[4..], &[0; 4]);
        // Refused before any system call, as recv_from.
        let e = m
            .recv_from_then(b.as_fd(), 4095, 2, &mut tail, false)
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        let e = read_only_view(&m)
            .recv_from_then(b.as_fd(), 0, 2, &mut tail, true)
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        let e = m
            .recv_from_then(b.as_fd(), 0, 2, &mut tail, true)
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    }

    #[test]
    fn send_to_sends_the_head_then_the_range() {
        let (a, mut b) = socket_pair();
        let m = HostMemory::alloc(4096).unwrap();
        m.write_at(100, b"payload").unwrap();
        let n = m.send_to(a.as_fd(), b"HEAD", 100, 7, true).unwrap();
        assert_eq!(n, 11);
        assert_eq!(read_n(&mut b, 11), b"HEADpayload");
        assert_eq!(m.send_to(a.as_fd(), &[], 100, 3, false).unwrap(), 3);
        assert_eq!(read_n(&mut b, 3), b"pay");
        let e = m.send_to(a.as_fd(), b"H", 4000, 97, false).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        // A read-only mapping can be sent from.
        let ro = read_only_view(&m);
        assert_eq!(ro.send_to(a.as_fd(), &[], 100, 7, false).unwrap(), 7);
        assert_eq!(read_n(&mut b, 7), b"payload");
    }

    #[test]
    fn send_gathered_sends_every_piece_in_order_and_refuses_a_bad_range_first() {
        let (a, mut b) = socket_pair();
        let m = HostMemory::alloc(4096).unwrap();
        let n = HostMemory::alloc(4096).unwrap();
        m.write_at(10, b"one").unwrap();
        n.write_at(20, b"two").unwrap();
        let pieces = [
            SendPiece::Bytes(b"H1"),
            SendPiece::Range(&m, 10, 3),
            SendPiece::Bytes(b""),
            SendPiece::Bytes(b"H2"),
            SendPiece::Range(&n, 20, 3),
        ];
        assert_eq!(
            HostMemory::send_gathered(a.as_fd(), &pieces, true).unwrap(),
            10
        );
        assert_eq!(read_n(&mut b, 10), b"H1oneH2two");
        // A range past the memory's end: nothing is sent at all.
        let bad = [SendPiece::Bytes(b"H3"), SendPiece::Range(&m, 4090, 7)];
        let e = HostMemory::send_gathered(a.as_fd(), &bad, true).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(
            HostMemory::send_gathered(a.as_fd(), &[SendPiece::Bytes(b"!")], true).unwrap(),
            1
        );
        assert_eq!(read_n(&mut b, 1), b"!");
        // No more than GATHER_PIECES pieces go in one call.
        let many = [SendPiece::Bytes(b"x"); GATHER_PIECES + 5];
        assert_eq!(
            HostMemory::send_gathered(a.as_fd(), &many, true).unwrap(),
            GATHER_PIECES
        );
    }

    #[test]
    fn send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<HostMemory>();
        assert_send_sync::<Arc<dyn DmaBuffer>>();
    }
}
