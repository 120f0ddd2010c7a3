//! Caller-owned memory ([`HostMemory::from_raw_parts`]) that the caller
//! unmaps or write-protects while it is wrapped: every copy fails with
//! [`MemoryError::Unmapped`] naming the range, and none raises a signal
//! (a `SIGSEGV` would end this test binary).

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use orbitte_memory::{HostMemory, MemoryError};

const PAGE: usize = 4096;

/// Held by every test while it maps and unmaps: a hole one test leaves must
/// not be filled by another test's mapping (the kernel would then copy into
/// that one, and the test would prove nothing).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An anonymous read-write mapping of `pages` pages that the test unmaps or
/// protects by hand (the wrapped memory does not own it).
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(pages: usize) -> Self {
        let len = pages * PAGE;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's
        // choice; it aliases nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        Self {
            ptr: NonNull::new(p.cast()).unwrap(),
            len,
        }
    }

    /// Wraps the whole mapping as caller-owned memory.
    fn wrap(&self) -> Arc<HostMemory> {
        // SAFETY: the mapping is only touched through the returned value's
        // copy methods (never through Rust references), and no memory region
        // is made from it; unmapping it later is what the test is about.
        unsafe { HostMemory::from_raw_parts(self.ptr, self.len, Box::new(())) }.unwrap()
    }

    fn addr(&self, page: usize) -> usize {
        self.ptr.as_ptr() as usize + page * PAGE
    }

    /// Takes `count` pages from `page` on away from the caller: their
    /// contents are discarded and any access faults, as after `munmap`.
    /// The range stays reserved (a fresh `PROT_NONE` mapping over it)
    /// rather than unmapped, because a hole in the address space can be
    /// filled at any moment by another thread's `mmap` (a malloc arena, a
    /// thread stack), and a copy would then reach that memory: the
    /// engine's copies see the same fault either way.
    fn unmap(&self, page: usize, count: usize) {
        // SAFETY: the pages belong to this test's mapping; the wrapped
        // memory does not assume they stay accessible, and MAP_FIXED
        // replaces only them.
        let p = unsafe {
            libc::mmap(
                self.addr(page) as *mut libc::c_void,
                count * PAGE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_eq!(
            p as usize,
            self.addr(page),
            "{}",
            std::io::Error::last_os_error()
        );
    }

    /// Makes `count` pages from `page` on read-only.
    fn protect(&self, page: usize, count: usize) {
        // SAFETY: as for `unmap`: the pages are the test's own.
        let rc = unsafe {
            libc::mprotect(
                self.addr(page) as *mut libc::c_void,
                count * PAGE,
                libc::PROT_READ,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the test's own mapping; pages already unmapped are simply
        // skipped by munmap.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn assert_unmapped(r: Result<(), MemoryError>, addr: usize, len: usize) {
    match r {
        Err(MemoryError::Unmapped { addr: a, len: l }) => {
            assert_eq!((a, l), (addr, len));
            let msg = MemoryError::Unmapped { addr, len }.to_string();
            assert!(msg.contains(&format!("{addr:#x}+{len}")), "{msg}");
            assert!(msg.contains("no longer mapped"), "{msg}");
        }
        other => panic!("expected Unmapped for {addr:#x}+{len}, got {other:?}"),
    }
}

#[test]
fn copies_of_mapped_caller_memory_work() {
    let _serial = serial();
    let map = Mapping::new(3);
    let m = map.wrap();
    m.fill(0, 3 * PAGE, 0x5a).unwrap();
    m.write_at(PAGE - 2, b"edge").unwrap();
    assert_eq!(m.to_vec(PAGE - 3, 6).unwrap(), b"\x5aedge\x5a");
    let other = HostMemory::alloc(3 * PAGE).unwrap();
    other.copy_from(0, &m, 0, 3 * PAGE).unwrap();
    assert_eq!(other.to_vec(PAGE - 2, 4).unwrap(), b"edge");
    other.write_at(0, b"back").unwrap();
    m.copy_from(10, &other, 0, 4).unwrap();
    assert_eq!(m.to_vec(10, 4).unwrap(), b"back");
}

#[test]
fn every_copy_of_an_unmapped_range_fails_with_its_address() {
    let _serial = serial();
    let map = Mapping::new(4);
    let m = map.wrap();
    let peer = HostMemory::alloc(4 * PAGE).unwrap();
    map.unmap(0, 4);
    let at = map.addr(1) + 5;
    assert_unmapped(m.read_at(PAGE + 5, &mut [0; 100]), at, 100);
    assert_unmapped(m.write_at(PAGE + 5, &[1; 100]), at, 100);
    assert_unmapped(m.fill(PAGE + 5, 100, 7), at, 100);
    // The local path's copies: a READ into it, a WRITE out of it.
    assert_unmapped(m.copy_from(PAGE + 5, &peer, 0, 100), at, 100);
    assert_unmapped(peer.copy_from(0, &m, PAGE + 5, 100), at, 100);
    assert!(matches!(m.to_vec(0, 1), Err(MemoryError::Unmapped { .. })));
    // Bounds are still checked first.
    assert!(matches!(
        m.read_at(4 * PAGE, &mut [0]),
        Err(MemoryError::OutOfBounds { .. })
    ));
}

#[test]
fn a_copy_stops_at_the_first_missing_page() {
    let _serial = serial();
    let map = Mapping::new(3);
    let m = map.wrap();
    map.unmap(1, 1);
    let src = vec![9u8; 3 * PAGE];
    assert_unmapped(m.write_at(0, &src), map.addr(0), 3 * PAGE);
    // The pages before the hole were written; the one after it was not
    // reached.
    assert_eq!(m.to_vec(0, PAGE).unwrap(), vec![9; PAGE]);
    assert_eq!(m.to_vec(2 * PAGE, PAGE).unwrap(), vec![0; PAGE]);
    assert_unmapped(m.fill(PAGE - 1, 2, 1), map.addr(0) + PAGE - 1, 2);
}

#[test]
fn write_protected_caller_memory_refuses_writes_and_allows_reads() {
    let _serial = serial();
    let map = Mapping::new(2);
    let m = map.wrap();
    m.write_at(0, b"kept").unwrap();
    map.protect(0, 2);
    assert_unmapped(m.write_at(0, b"lost"), map.addr(0), 4);
    assert_unmapped(m.fill(PAGE, 8, 0), map.addr(1), 8);
    let peer = HostMemory::alloc(PAGE).unwrap();
    assert_unmapped(m.copy_from(0, &peer, 0, 4), map.addr(0), 4);
    assert_eq!(m.to_vec(0, 4).unwrap(), b"kept");
    peer.copy_from(0, &m, 0, 4).unwrap();
    assert_eq!(peer.to_vec(0, 4).unwrap(), b"kept");
}

#[test]
fn fills_larger_than_one_kernel_call_reach_every_byte() {
    let _serial = serial();
    let pages = (3 << 20) / PAGE + 1;
    let map = Mapping::new(pages);
    let m = map.wrap();
    m.fill(1, pages * PAGE - 2, 0xc3).unwrap();
    let all = m.to_vec(0, pages * PAGE).unwrap();
    assert_eq!(all[0], 0);
    assert_eq!(all[pages * PAGE - 1], 0);
    assert!(all[1..pages * PAGE - 1].iter().all(|&b| b == 0xc3));
}

#[test]
fn overlapping_copies_within_caller_memory_move_like_memmove() {
    let _serial = serial();
    let map = Mapping::new(4);
    let m = map.wrap();
    let pattern: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8).collect();
    m.write_at(0, &pattern).unwrap();
    m.copy_from(100, &m, 0, 3 * PAGE).unwrap();
    assert_eq!(m.to_vec(100, 3 * PAGE).unwrap(), pattern);
    m.copy_from(0, &m, 100, 3 * PAGE).unwrap();
    assert_eq!(m.to_vec(0, 3 * PAGE).unwrap(), pattern);
    // Two caller ranges: the fault names the side that is gone.
    let other_map = Mapping::new(1);
    let other = other_map.wrap();
    other.copy_from(0, &m, 0, PAGE).unwrap();
    assert_eq!(other.to_vec(0, PAGE).unwrap(), pattern[..PAGE]);
    other_map.unmap(0, 1);
    assert_unmapped(m.copy_from(0, &other, 0, 10), other_map.addr(0), 10);
    assert_unmapped(other.copy_from(0, &m, 0, 10), other_map.addr(0), 10);
}

#[test]
fn socket_copies_of_an_unmapped_range_fail_with_its_address() {
    let _serial = serial();
    use std::io::Write;
    let map = Mapping::new(2);
    let m = map.wrap();
    let (mut a, b) = UnixStream::pair().unwrap();
    map.unmap(0, 2);
    a.write_all(b"payload").unwrap();
    let e = m.recv_from(b.as_fd(), 10, 7, false).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    let inner = e.get_ref().and_then(|s| s.downcast_ref::<MemoryError>());
    assert!(
        matches!(inner, Some(MemoryError::Unmapped { addr, len: 7 }) if *addr == map.addr(0) + 10),
        "{e}"
    );
    let e = m.send_to(a.as_fd(), &[], PAGE, 7, false).unwrap_err();
    let inner = e.get_ref().and_then(|s| s.downcast_ref::<MemoryError>());
    assert!(
        matches!(inner, Some(MemoryError::Unmapped { addr, len: 7 }) if *addr == map.addr(1)),
        "{e}"
    );
    // The refused receive left the bytes in the socket.
    let mut got = [0u8; 7];
    std::io::Read::read_exact(&mut &b, &mut got).unwrap();
    assert_eq!(&got, b"payload");
}

#[test]
fn memory_its_keepalive_keeps_mapped_is_copied_like_allocated_memory() {
    let _g = serial();
    // The keepalive owns the bytes: they stay mapped while it is held.
    let owner = vec![7u8; 3 * PAGE].into_boxed_slice();
    let ptr = NonNull::new(owner.as_ptr().cast_mut()).unwrap();
    // SAFETY: the boxed slice is moved into the keepalive, so its heap
    // bytes stay put and mapped for as long as the HostMemory lives; no
    // Rust reference into them is used afterwards.
    let kept = unsafe { HostMemory::from_kept_parts(ptr, 3 * PAGE, Box::new(owner)) }.unwrap();
    assert!(format!("{kept:?}").contains("caller-kept"), "{kept:?}");
    kept.write_at(PAGE, &[1, 2, 3]).unwrap();
    assert_eq!(kept.to_vec(PAGE - 1, 5).unwrap(), vec![7, 1, 2, 3, 7]);
    let other = HostMemory::alloc(PAGE).unwrap();
    other.copy_from(0, &kept, PAGE, 3).unwrap();
    assert_eq!(other.to_vec(0, 3).unwrap(), vec![1, 2, 3]);
    assert!(matches!(
        kept.write_at(3 * PAGE - 1, &[0, 0]),
        Err(MemoryError::OutOfBounds { .. })
    ));
}
