//! Memory: register the caller's host memory or memory the engine
//! allocates, deregister it, and the public data a peer checks a remote
//! range with.

use std::ffi::c_void;
use std::ptr::NonNull;

use orbitte::{Access, HostMemory, RemoteRange, UnregisterError};

use crate::args::{self, copy_out, put};
use orbitte_cuda::{CudaBuffer, PointerError};

use crate::handle::{
    self, Engine, Kept, LocalReg, PeerEntry, lock, orbitte_engine, orbitte_peer, orbitte_reg,
};
use crate::status::{
    Failure, ORBITTE_ERR_BACKEND, ORBITTE_ERR_INVALID_PARAM, ORBITTE_ERR_MISMATCH,
    ORBITTE_ERR_NOT_ALLOWED, ORBITTE_ERR_NOT_FOUND, ORBITTE_ERR_NOT_SUPPORTED,
    ORBITTE_ERR_REMOTE_DISCONNECT, ORBITTE_OK, c_name, guard,
};

/// Registration flag: publish the memory to peers, who may READ and WRITE
/// it; without it the memory is local-only (a source or sink of this
/// engine's transfers).
pub const ORBITTE_REG_REMOTE: u32 = 1;

/// Public data: this tag, then the address and the length (little-endian
/// u64 each), then the kind of memory (`KIND_HOST`, `KIND_DEVICE`).
const PUBLIC_TAG: &[u8; 4] = b"OTR2";
const PUBLIC_LEN: usize = 21;
const KIND_HOST: u8 = 0;
const KIND_DEVICE: u8 = 1;

fn access(flags: u32) -> Result<Access, Failure> {
    match flags {
        0 => Ok(Access::LocalOnly),
        ORBITTE_REG_REMOTE => Ok(Access::REMOTE_READ_WRITE),
        other => Err(Failure::invalid(format!(
            "unknown flags {other:#x}: pass 0 (local-only) or {}",
            c_name!(ORBITTE_REG_REMOTE)
        ))),
    }
}

/// Whether `start..end` lies in mappings of this process that are
/// readable and writable (`/proc/self/maps`); the error says where not.
fn mapped_read_write(start: u64, end: u64) -> Result<(), String> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let mut spans: Vec<(u64, u64, bool)> = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(span), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = span.split_once('-') else {
            continue;
        };
        if let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) {
            spans.push((lo, hi, perms.as_bytes().starts_with(b"rw")));
        }
    }
    spans.sort_unstable();
    let mut at = start;
    for (lo, hi, rw) in spans.into_iter().filter(|s| s.1 > start) {
        if lo > at {
            break;
        }
        if !rw {
            return Err(format!("{at:#x} is mapped without read-write access"));
        }
        at = hi;
        if at >= end {
            return Ok(());
        }
    }
    Err(format!("{at:#x} is not mapped"))
}

/// Records a registration of `memory` (first byte at `start`) made by
/// `register`; refused if it overlaps one.
fn insert(e: &Engine, start: u64, memory: Kept, access: Access) -> Result<orbitte_reg, Failure> {
    let len = match &memory {
        Kept::Host(m) => m.len(),
        Kept::Device(b) => b.len(),
    } as u64;
    let mut regs = lock(&e.regs);
    if let Some((other, other_len)) = regs.overlapping(start, len) {
        return Err(Failure::invalid(format!(
            "{start:#x}+{len} overlaps the registration {other:#x}+{other_len}: deregister it first or register disjoint memory"
        )));
    }
    let registered = match &memory {
        Kept::Host(m) => e.engine.register(m.clone(), access),
        Kept::Device(b) => e.engine.register(b.clone(), access),
    };
    let reg = registered.map_err(|err| {
        Failure::new(
            ORBITTE_ERR_BACKEND,
            format!("cannot register {start:#x}+{len}: {err}"),
        )
    })?;
    let handle = e.mint();
    regs.by_handle.insert(handle, start);
    regs.by_start.insert(
        start,
        LocalReg {
            id: reg.id,
            len,
            memory,
        },
    );
    Ok(handle)
}

/// Registers `len` bytes of the caller's host memory at `addr` (NIXL's
/// `registerMem`); `flags`: 0 (local-only) or `ORBITTE_REG_REMOTE`. The
/// range must be mapped readable and writable, and must not overlap a
/// registration. On success `*out` is the registration.
///
/// The memory stays the caller's: keep it mapped until it is deregistered.
/// Every copy the engine makes of it goes through the kernel, so memory
/// unmapped while registered fails a transfer, never the process. Memory
/// from `orbitte_alloc` is faster, and same-host peers map it directly
/// (the local path).
///
/// # Safety
/// `addr..addr+len` stays mapped and is not freed while registered;
/// `out` points at a writable `orbitte_reg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_register(
    engine: *const orbitte_engine,
    addr: *mut c_void,
    len: usize,
    flags: u32,
    out: *mut orbitte_reg,
) -> i32 {
    guard("orbitte_register", || {
        let e = handle::engine(engine)?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let access = access(flags)?;
        let ptr = NonNull::new(addr.cast::<u8>()).ok_or_else(|| Failure::null("addr"))?;
        if len == 0 {
            return Err(Failure::invalid("`len` is 0: register at least one byte"));
        }
        let start = ptr.as_ptr() as u64;
        let end = start.checked_add(len as u64).ok_or_else(|| {
            Failure::invalid(format!("{start:#x}+{len} wraps around the address space"))
        })?;
        mapped_read_write(start, end).map_err(|why| {
            Failure::invalid(format!(
                "{start:#x}+{len} is not memory of this process one can read and write ({why}): pass a live, writable buffer"
            ))
        })?;
        // SAFETY: the range was just found mapped readable and writable in
        // this process, and the caller promises it stays mapped and is not
        // freed while registered (the function's contract); no Rust
        // reference into it is made: HostMemory copies caller memory only
        // through the kernel, which turns a range unmapped anyway into a
        // failed transfer.
        let memory = unsafe { HostMemory::from_raw_parts(ptr, len, Box::new(())) }
            .map_err(|err| Failure::invalid(format!("cannot wrap {start:#x}+{len}: {err}")))?;
        let h = insert(&e, start, Kept::Host(memory), access)?;
        // SAFETY: `out` is writable (the caller's contract; null checked).
        unsafe { put(out, h, "out") }?;
        Ok(ORBITTE_OK)
    })
}

/// The CUDA devices this process can register memory of, or why none.
fn cuda_devices() -> Result<usize, Failure> {
    let not_here = |why: String| {
        Failure::new(
            ORBITTE_ERR_NOT_SUPPORTED,
            format!("CUDA device memory cannot be registered here: {why}"),
        )
    };
    let info = orbitte_cuda::driver().map_err(|e| not_here(e.to_string()))?;
    if info.device_count == 0 {
        return Err(not_here(format!(
            "{} reports no device ({})",
            info.library,
            info.no_device.clone().unwrap_or_default()
        )));
    }
    Ok(info.device_count)
}

/// Writes to `*count` how many CUDA devices the driver reports: memory
/// of them can be registered with `orbitte_register_device`. Without the
/// CUDA driver (libcuda) or a device it returns
/// `ORBITTE_ERR_NOT_SUPPORTED`, with the reason in `orbitte_last_error`.
///
/// # Safety
/// `count` points at a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_cuda_devices(count: *mut usize) -> i32 {
    guard("orbitte_cuda_devices", || {
        if count.is_null() {
            return Err(Failure::null("count"));
        }
        let n = cuda_devices()?;
        // SAFETY: `count` is writable (the caller's contract; null checked).
        unsafe { put(count, n, "count") }?;
        Ok(ORBITTE_OK)
    })
}

/// Registers `len` bytes of CUDA device memory at the device address
/// `addr` (NIXL's `registerMem` of VRAM), served on the cuda-staging
/// path: the engine copies between it and host memory with the CUDA
/// driver, never by GPUDirect. `flags` as for `orbitte_register`. The
/// driver must say the range lies in one live allocation; without the
/// driver or a device the call returns `ORBITTE_ERR_NOT_SUPPORTED`.
///
/// # Safety
/// The allocation stays live until the memory is deregistered; `out`
/// points at a writable `orbitte_reg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_register_device(
    engine: *const orbitte_engine,
    addr: u64,
    len: usize,
    flags: u32,
    out: *mut orbitte_reg,
) -> i32 {
    guard("orbitte_register_device", || {
        let e = handle::engine(engine)?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let access = access(flags)?;
        cuda_devices()?;
        // SAFETY: `from_raw_parts` first asks the driver that
        // `addr..addr+len` is device memory inside one live allocation, so
        // a wrong address is an error here; the caller promises the
        // allocation outlives the registration (the function's contract).
        // Only the driver's copies touch it, never a host pointer, so
        // memory freed early fails those copies instead of this process.
        let buffer = unsafe { CudaBuffer::from_raw_parts(addr, len, Box::new(())) }.map_err(
            |err| {
                let code = match err {
                    PointerError::Device(_) => ORBITTE_ERR_NOT_SUPPORTED,
                    _ => ORBITTE_ERR_INVALID_PARAM,
                };
                Failure::new(
                    code,
                    format!(
                        "{addr:#x}+{len} cannot be registered as CUDA device memory: {err}; pass the address and size of live device memory (cuMemAlloc, a CUDA tensor's data_ptr())"
                    ),
                )
            },
        )?;
        let h = insert(&e, addr, Kept::Device(buffer), access)?;
        // SAFETY: `out` is writable (the caller's contract; null checked).
        unsafe { put(out, h, "out") }?;
        Ok(ORBITTE_OK)
    })
}

/// Allocates `len` bytes of zeroed, page-aligned host memory and registers
/// it (`flags` as for `orbitte_register`). `*addr` is its first byte,
/// `*out` the registration. The memory is the engine's: same-host peers
/// map it (the local path), and it is freed once deregistered (or with
/// the engine) and no transfer uses it.
///
/// # Safety
/// `addr` points at a writable pointer, `out` at a writable `orbitte_reg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_alloc(
    engine: *const orbitte_engine,
    len: usize,
    flags: u32,
    addr: *mut *mut c_void,
    out: *mut orbitte_reg,
) -> i32 {
    guard("orbitte_alloc", || {
        let e = handle::engine(engine)?;
        if addr.is_null() || out.is_null() {
            return Err(Failure::null(if addr.is_null() { "addr" } else { "out" }));
        }
        let access = access(flags)?;
        let memory = HostMemory::alloc(len)
            .map_err(|err| Failure::invalid(format!("cannot allocate {len} bytes: {err}")))?;
        let ptr = memory.as_ptr();
        let h = insert(&e, ptr as u64, Kept::Host(memory), access)?;
        // SAFETY: both are writable (the caller's contract; null checked).
        unsafe {
            put(addr, ptr.cast::<c_void>(), "addr")?;
            put(out, h, "out")?;
        }
        Ok(ORBITTE_OK)
    })
}

/// Deregisters (NIXL's `deregisterMem`). Refused with
/// `ORBITTE_ERR_NOT_ALLOWED` while transfers still use the memory: check
/// or release them first.
///
/// # Safety
/// None beyond passing values this API returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_deregister(
    engine: *const orbitte_engine,
    reg: orbitte_reg,
) -> i32 {
    guard("orbitte_deregister", || {
        let e = handle::engine(engine)?;
        let mut regs = lock(&e.regs);
        let start = *regs
            .by_handle
            .get(&reg)
            .ok_or_else(|| Failure::bad_handle("registration", reg))?;
        let id = regs.by_start[&start].id;
        e.engine.unregister(id).map_err(|err| {
            let code = match err {
                UnregisterError::Undrained { .. } => ORBITTE_ERR_NOT_ALLOWED,
                _ => ORBITTE_ERR_BACKEND,
            };
            Failure::new(code, format!("cannot deregister {start:#x}: {err}"))
        })?;
        regs.by_handle.remove(&reg);
        regs.by_start.remove(&start);
        Ok(ORBITTE_OK)
    })
}

/// Writes the public data of a registration (NIXL's `getPublicData`):
/// the bytes a peer passes to `orbitte_load_remote` to check it can reach
/// the memory. Buffer rules as for `orbitte_conn_info`.
///
/// # Safety
/// `len` points at a writable `size_t`; a non-null `buf` at `cap`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_public_data(
    engine: *const orbitte_engine,
    reg: orbitte_reg,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> i32 {
    guard("orbitte_public_data", || {
        let e = handle::engine(engine)?;
        let (start, reg_len, kind) = {
            let regs = lock(&e.regs);
            let start = *regs
                .by_handle
                .get(&reg)
                .ok_or_else(|| Failure::bad_handle("registration", reg))?;
            let r = &regs.by_start[&start];
            let kind = match r.memory {
                Kept::Host(_) => KIND_HOST,
                Kept::Device(_) => KIND_DEVICE,
            };
            (start, r.len, kind)
        };
        let mut data = Vec::with_capacity(PUBLIC_LEN);
        data.extend_from_slice(PUBLIC_TAG);
        data.extend_from_slice(&start.to_le_bytes());
        data.extend_from_slice(&reg_len.to_le_bytes());
        data.push(kind);
        // SAFETY: the caller's contract for `buf`, `cap` and `len`.
        unsafe { copy_out(&data, false, buf, cap, len, "the public data") }?;
        Ok(ORBITTE_OK)
    })
}

/// The ranges `peer` publishes now (its incarnation connected to).
pub(crate) fn published(e: &Engine, peer: &PeerEntry) -> Result<Vec<RemoteRange>, Failure> {
    e.engine
        .peers()
        .into_iter()
        .find(|p| p.id == peer.id)
        .filter(|p| p.epoch == peer.epoch)
        .map(|p| p.ranges)
        .ok_or_else(|| {
            Failure::new(
                ORBITTE_ERR_REMOTE_DISCONNECT,
                format!(
                    "{:?} (epoch {}) is no longer connected, or restarted: take its connection info again and connect",
                    peer.source_id, peer.epoch
                ),
            )
        })
}

/// The ranges `peer` publishes, sorted by address, holding every
/// `(address, length)` of `wanted` if the peer published them: when the
/// ranges known here miss one, the session is opened again once (which
/// brings what the peer registered since it opened) and they are read
/// again.
pub(crate) fn ranges_for(
    e: &Engine,
    handle: orbitte_peer,
    wanted: impl Iterator<Item = (u64, u64)> + Clone,
) -> Result<Vec<RemoteRange>, Failure> {
    let sorted = |mut v: Vec<RemoteRange>| {
        v.sort_unstable_by_key(|r| r.address);
        v
    };
    let ranges = sorted(published(e, &e.peer(handle)?)?);
    if wanted
        .clone()
        .all(|(a, l)| holding(&ranges, a, l).is_some())
    {
        return Ok(ranges);
    }
    let p = crate::engine::reopen(e, handle)?;
    Ok(sorted(published(e, &p)?))
}

/// The range of `sorted` (by address) holding `addr..addr+len`.
pub(crate) fn holding(sorted: &[RemoteRange], addr: u64, len: u64) -> Option<RemoteRange> {
    let at = sorted.partition_point(|r| r.address <= addr);
    at.checked_sub(1)
        .map(|k| sorted[k])
        .filter(|r| r.contains(addr, len))
}

/// The address, length and kind of memory in public data as
/// `orbitte_public_data` wrote it.
fn parse_public(data: &[u8]) -> Result<(u64, u64, u8), Failure> {
    if data.len() != PUBLIC_LEN || &data[..4] != PUBLIC_TAG {
        return Err(Failure::new(
            ORBITTE_ERR_MISMATCH,
            "the public data is not this API's: pass the bytes orbitte_public_data wrote on the peer",
        ));
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&data[at..at + 8]);
        u64::from_le_bytes(w)
    };
    Ok((word(4), word(12), data[20]))
}

/// Forgets memory of `peer` that `orbitte_load_remote` loaded (NIXL's
/// `unloadMD`): same-host copies no longer reach it, and transfers
/// prepared over it take the engine's paths from their next post.
///
/// # Safety
/// `data` points at `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_unload_remote(
    engine: *const orbitte_engine,
    peer: orbitte_peer,
    data: *const u8,
    len: usize,
) -> i32 {
    guard("orbitte_unload_remote", || {
        let e = handle::engine(engine)?;
        // SAFETY: the caller's contract for `data` and `len`.
        let data = unsafe { args::bytes(data, len, "data") }?;
        let (addr, range_len, _) = parse_public(data)?;
        if let Some(ranges) = lock(&e.loaded).get_mut(&peer) {
            ranges.retain(|&r| r != (addr, range_len));
        }
        e.unloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(ORBITTE_OK)
    })
}

/// Whether host memory `addr..addr+len` of `peer` lies in a range whose
/// public data was loaded (`orbitte_load_remote`).
pub(crate) fn loaded_host(e: &Engine, peer: orbitte_peer, addr: u64, len: u64) -> bool {
    lock(&e.loaded).get(&peer).is_some_and(|v| {
        v.iter()
            .any(|&(a, l)| addr >= a && addr.checked_add(len).is_some_and(|end| end <= a + l))
    })
}

/// Checks that `peer` published the memory whose public data
/// (`orbitte_public_data` on the peer) is the `len` bytes at `data`
/// (NIXL's `loadRemoteMD`): `ORBITTE_OK`, or `ORBITTE_ERR_NOT_FOUND`.
/// Memory the peer registered after the connection is found: the session
/// is then opened again once, which brings it (and replaces the rails to
/// the peer: load what a transfer needs before posting it).
///
/// # Safety
/// `data` points at `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_load_remote(
    engine: *const orbitte_engine,
    peer: orbitte_peer,
    data: *const u8,
    len: usize,
) -> i32 {
    guard("orbitte_load_remote", || {
        let e = handle::engine(engine)?;
        let p = e.peer(peer)?;
        // SAFETY: the caller's contract for `data` and `len`.
        let data = unsafe { args::bytes(data, len, "data") }?;
        let (addr, range_len, kind) = parse_public(data)?;
        let ranges = ranges_for(&e, peer, std::iter::once((addr, range_len)))?;
        if holding(&ranges, addr, range_len).is_none() {
            return Err(Failure::new(
                ORBITTE_ERR_NOT_FOUND,
                format!(
                    "{:?} publishes no range holding {addr:#x}+{range_len}: register it there with {}",
                    p.source_id,
                    c_name!(ORBITTE_REG_REMOTE)
                ),
            ));
        }
        if kind == KIND_HOST {
            let mut loaded = lock(&e.loaded);
            let ranges = loaded.entry(peer).or_default();
            if !ranges.contains(&(addr, range_len)) {
                ranges.push((addr, range_len));
            }
        }
        Ok(ORBITTE_OK)
    })
}
