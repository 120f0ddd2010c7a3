//! Checks shared by the hardware tests (tests/gpu.rs, on a real GPU) and
//! the stub-driver tests (tests/stub_driver.rs, on the fake device of
//! tests/stub/libcuda_stub.c). Each takes the device to run on.
// Each test binary uses a subset of these helpers.
#![allow(dead_code)]

use std::sync::Arc;

use orbitte_cuda::{
    AllocError, CopyError, CopyStream, CudaBuffer, CudaDevice, DeviceError, MemoryKind,
    PinnedBuffer, PointerError, StagingFailure, StagingPipeline, devices,
};
use orbitte_memory::DmaBuffer;

/// Set to 1 on a machine with an NVIDIA GPU: a skip becomes a failure.
pub(crate) const REQUIRE_GPU: &str = "ORBITTE_REQUIRE_GPU";

/// Device 0, or `None` after printing why the test is skipped. With
/// `ORBITTE_REQUIRE_GPU=1` a missing device fails the test instead.
pub(crate) fn gpu_or_skip(test: &str) -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var(REQUIRE_GPU).as_deref() == Ok("1") => {
            panic!("{test}: {REQUIRE_GPU}=1 but the GPU is unusable: {e}")
        }
        Err(e) => {
            println!("skipped: {} ({test})", e.reason());
            None
        }
    }
}

/// A recognizable byte pattern.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

pub(crate) fn discovery_reports_the_device(dev: &CudaDevice) {
    let list = devices().unwrap();
    let info = list
        .iter()
        .find(|d| d.index == dev.index())
        .expect("device listed");
    assert!(!info.name.is_empty());
    let pci = &info.pci_bus_id;
    assert_eq!(pci.len(), 12, "{pci}");
    assert_eq!(pci, &pci.to_ascii_lowercase());
    assert_eq!(&pci[4..5], ":", "{pci}");
    assert!(info.total_memory > 0);
    assert_eq!(dev.info().unwrap(), *info);
    let count = list.len();
    assert_eq!(
        CudaDevice::open(count).unwrap_err(),
        DeviceError::NoSuchDevice {
            index: count,
            count
        }
    );
}

pub(crate) fn oversized_allocation_names_the_numbers(dev: &CudaDevice) {
    let mem = dev.memory_info().unwrap();
    let requested = usize::try_from(mem.total).unwrap() + 1;
    match CudaBuffer::alloc(dev, requested) {
        Err(AllocError::InsufficientMemory {
            index,
            name,
            requested: r,
            free,
            total,
        }) => {
            assert_eq!(index, dev.index());
            assert_eq!(name, dev.info().unwrap().name);
            assert_eq!(r, requested);
            assert_eq!(total, mem.total);
            assert!(free <= total);
        }
        other => panic!("expected InsufficientMemory, got {other:?}"),
    }
    assert!(matches!(
        CudaBuffer::alloc(dev, 0),
        Err(AllocError::ZeroLength)
    ));
}

pub(crate) fn foreign_pointers_are_checked(dev: &CudaDevice) {
    let buf = CudaBuffer::alloc(dev, 1 << 20).unwrap();
    let base = buf.device_ptr();
    let info = CudaBuffer::inspect(base + 100).unwrap();
    assert_eq!(info.kind, MemoryKind::Device);
    assert_eq!(info.device, Some(dev.index()));
    assert_eq!(info.allocation_base, base);
    assert!(info.allocation_size >= 1 << 20);
    // The same answer from a thread with no CUDA context current.
    let elsewhere = std::thread::spawn(move || CudaBuffer::inspect(base + 100))
        .join()
        .unwrap();
    assert_eq!(elsewhere.unwrap(), info);

    // SAFETY: the keepalive holds the owning Arc, so the memory outlives the borrow.
    let inner =
        unsafe { CudaBuffer::from_raw_parts(base + 4096, 4096, Box::new(buf.clone())) }.unwrap();
    assert!(!inner.is_owned());
    assert_eq!(inner.len(), 4096);
    assert_eq!(inner.device().index(), dev.index());

    // SAFETY: as above; the call must fail anyway.
    let past = unsafe { CudaBuffer::from_raw_parts(base, 4 << 20, Box::new(buf.clone())) };
    match past {
        Err(PointerError::OutsideAllocation {
            ptr,
            len,
            base: b,
            size,
        }) => {
            assert_eq!((ptr, len, b), (base, 4 << 20, base));
            assert_eq!(size, info.allocation_size);
        }
        other => panic!("expected OutsideAllocation, got {other:?}"),
    }

    let pinned = PinnedBuffer::alloc(dev, 4096).unwrap();
    // SAFETY: must fail: pinned host memory is not device memory.
    let host = unsafe {
        CudaBuffer::from_raw_parts(pinned.as_ptr() as u64, 4096, Box::new(pinned.clone()))
    };
    assert_eq!(
        host.unwrap_err(),
        PointerError::NotDeviceMemory {
            ptr: pinned.as_ptr() as u64,
            kind: MemoryKind::Host
        }
    );

    let plain = vec![0u8; 4096];
    // SAFETY: must fail: ordinary host memory is not device memory.
    let plain_err =
        unsafe { CudaBuffer::from_raw_parts(plain.as_ptr() as u64, 4096, Box::new(())) };
    assert_eq!(
        plain_err.unwrap_err(),
        PointerError::NotDeviceMemory {
            ptr: plain.as_ptr() as u64,
            kind: MemoryKind::Unknown
        }
    );
}

pub(crate) fn copies_round_trip_and_check_bounds(dev: &CudaDevice) {
    let len = 300_000;
    let data = pattern(len, 7);
    let buf = CudaBuffer::alloc(dev, len).unwrap();
    let host = PinnedBuffer::alloc(dev, len).unwrap();
    assert_eq!(DmaBuffer::len(&*host), len);
    assert_eq!(DmaBuffer::as_ptr(&*host), host.as_ptr());
    let stream = CopyStream::new(dev).unwrap();
    host.write_at(0, &data).unwrap();
    stream.upload(&host, 0, &buf, 0, len).unwrap();
    buf.fill(1000, 10, 0xAB).unwrap();
    host.fill(0, len, 0).unwrap();
    stream.download(&buf, 0, &host, 0, len).unwrap();
    let back = host.to_vec(0, len).unwrap();
    assert_eq!(&back[..1000], &data[..1000]);
    assert_eq!(&back[1000..1010], &[0xAB; 10]);
    assert_eq!(&back[1010..], &data[1010..]);
    assert!(stream.is_idle().unwrap());

    match stream.download(&buf, len - 10, &host, 0, 11) {
        Err(CopyError::OutOfBounds(e)) => {
            assert_eq!(
                (e.what, e.offset, e.len, e.size),
                ("device buffer", len - 10, 11, len)
            );
        }
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
    assert!(matches!(
        stream.upload(&host, 1, &buf, 0, len),
        Err(CopyError::OutOfBounds(e)) if e.what == "pinned buffer"
    ));
}

/// Uploads and downloads a range whose offset and length are not chunk
/// multiples, checking chunk order, offsets and the bytes.
pub(crate) fn pipeline_round_trips_odd_ranges(dev: &CudaDevice) {
    let chunk = 64 << 10;
    let total = 2 << 20;
    let (offset, len) = (777, (1 << 20) + 12_345);
    let buf = CudaBuffer::alloc(dev, total).unwrap();
    buf.fill(0, total, 0x5A).unwrap();
    let mut pipe = StagingPipeline::new(dev, chunk).unwrap();
    assert_eq!(pipe.chunk_size(), chunk);
    let data = pattern(len, 3);

    let mut seen = Vec::new();
    let up = pipe
        .upload(&buf, offset, len, |c| {
            seen.push((c.index(), c.offset(), c.device_offset(), c.len()));
            c.write_from(&data[c.offset()..c.offset() + c.len()])
        })
        .unwrap();
    let chunks = len.div_ceil(chunk);
    assert_eq!((up.bytes, up.chunks), (len, chunks));
    assert_eq!(seen.len(), chunks);
    for (k, &(index, off, dev_off, n)) in seen.iter().enumerate() {
        assert_eq!((index, off, dev_off), (k, k * chunk, offset + k * chunk));
        assert_eq!(n, chunk.min(len - k * chunk));
    }

    let mut back = vec![0u8; total];
    let down = pipe
        .download(&buf, 0, total, |c| {
            c.read_into(&mut back[c.offset()..c.offset() + c.len()])
        })
        .unwrap();
    assert_eq!(down.chunks, total.div_ceil(chunk));
    assert!(back[..offset].iter().all(|&b| b == 0x5A));
    assert_eq!(&back[offset..offset + len], &data[..]);
    assert!(back[offset + len..].iter().all(|&b| b == 0x5A));

    let empty = pipe.download(&buf, total, 0, |_| -> Result<(), std::io::Error> {
        panic!("no chunk for an empty range")
    });
    assert_eq!(empty.unwrap().chunks, 0);
    let oob = pipe.download(&buf, 1, total, |_| Ok::<(), std::io::Error>(()));
    let err = oob.unwrap_err();
    assert!(
        matches!(err.failure, StagingFailure::Copy(CopyError::OutOfBounds(_))),
        "{err}"
    );
    assert_eq!((err.completed, err.drained), (0, true));
    assert!(pipe.is_drained().unwrap());
    assert!(!pipe.is_unquiesced());
    let bounce = pipe.bounce_buffers();
    assert_eq!(bounce[0].len(), chunk);
    assert_ne!(bounce[0].as_ptr(), bounce[1].as_ptr());
}

#[derive(Debug, thiserror::Error)]
#[error("handler refused chunk {0}")]
pub(crate) struct Refused(pub(crate) usize);

/// A handler error stops the operation with the exact completed prefix,
/// drained, and the pipeline stays usable.
pub(crate) fn handler_errors_report_the_completed_prefix(dev: &CudaDevice) {
    let chunk = 4096;
    let len = 10 * chunk + 100;
    let buf = CudaBuffer::alloc(dev, len).unwrap();
    let data = pattern(len, 9);
    let mut pipe = StagingPipeline::new(dev, chunk).unwrap();
    pipe.upload(&buf, 0, len, |c| {
        c.write_from(&data[c.offset()..c.offset() + c.len()])
    })
    .unwrap();

    let err = pipe
        .download(&buf, 0, len, |c| {
            if c.index() == 2 {
                Err(Refused(2))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
    assert_eq!(
        (err.direction, err.completed, err.drained),
        ("download", 2 * chunk, true)
    );
    match err.failure {
        StagingFailure::Handler {
            offset,
            source: Refused(2),
        } => assert_eq!(offset, 2 * chunk),
        other => panic!("unexpected failure {other:?}"),
    }

    // Upload: chunks 0..3 were filled and issued before the handler fails
    // on chunk 3; once drained they have all landed.
    let zeros = vec![0u8; len];
    let err = pipe
        .upload(&buf, 0, len, |c| {
            if c.index() == 3 {
                return Err(Refused(3));
            }
            c.write_from(&zeros[..c.len()])
                .map_err(|_| Refused(c.index()))
        })
        .unwrap_err();
    assert_eq!(
        (err.direction, err.completed, err.drained),
        ("upload", 3 * chunk, true)
    );
    let mut back = vec![1u8; len];
    pipe.download(&buf, 0, len, |c| {
        c.read_into(&mut back[c.offset()..c.offset() + c.len()])
    })
    .unwrap();
    assert!(back[..3 * chunk].iter().all(|&b| b == 0));
    assert_eq!(&back[3 * chunk..], &data[3 * chunk..]);
    assert!(!pipe.is_unquiesced());
    assert!(pipe.is_drained().unwrap());
}

/// A panicking handler unwinds through the pipeline, which drains on the
/// way out and stays usable.
pub(crate) fn handler_panics_drain_and_leave_the_pipeline_usable(dev: &CudaDevice) {
    let buf = CudaBuffer::alloc(dev, 64 << 10).unwrap();
    let mut pipe = StagingPipeline::new(dev, 4096).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = pipe.download(&buf, 0, 64 << 10, |c| -> Result<(), Refused> {
            assert!(c.index() < 3, "deliberate panic in the handler");
            Ok(())
        });
    }));
    assert!(caught.is_err());
    assert!(pipe.is_drained().unwrap());
    let ok = pipe
        .download(&buf, 0, 64 << 10, |_| Ok::<(), Refused>(()))
        .unwrap();
    assert_eq!(ok.chunks, 16);
}

pub(crate) fn probe_passes_every_staging_check(dev: &CudaDevice) {
    let rows = orbitte_cuda::probe_device(dev.index());
    let s = &rows[0];
    assert_eq!(s.path, "cuda-staging");
    for c in [&s.build, &s.discovery, &s.completion, &s.drain] {
        assert!(c.is_pass(), "{c}");
    }
}

/// Many (chunk size, offset, length) combinations, chosen by a fixed-seed
/// generator: every byte lands where it should, nothing outside the range
/// changes, and the chunk count is exact.
pub(crate) fn pipeline_handles_many_geometries(dev: &CudaDevice) {
    let total = 256 << 10;
    let buf = CudaBuffer::alloc(dev, total).unwrap();
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    for case in 0..40u8 {
        let chunk = 1 + next(40 << 10);
        let offset = next(total);
        let len = next(total - offset + 1);
        let background = pattern(total, case);
        let data = pattern(len, case.wrapping_add(101));
        let mut pipe = StagingPipeline::new(dev, chunk).unwrap();
        pipe.upload(&buf, 0, total, |c| {
            c.write_from(&background[c.offset()..][..c.len()])
        })
        .unwrap();
        let up = pipe
            .upload(&buf, offset, len, |c| {
                c.write_from(&data[c.offset()..][..c.len()])
            })
            .unwrap();
        assert_eq!(
            up.chunks,
            len.div_ceil(chunk),
            "case {case}: chunk {chunk} len {len}"
        );
        let mut back = vec![0u8; total];
        pipe.download(&buf, 0, total, |c| {
            c.read_into(&mut back[c.offset()..][..c.len()])
        })
        .unwrap();
        let ctx = format!("case {case}: chunk {chunk}, offset {offset}, len {len}");
        assert_eq!(&back[..offset], &background[..offset], "{ctx}");
        assert_eq!(&back[offset..offset + len], &data[..], "{ctx}");
        assert_eq!(&back[offset + len..], &background[offset + len..], "{ctx}");
    }
}

/// Reads `len` device bytes at `offset` with one synchronized copy (not
/// through a pipeline).
pub(crate) fn device_bytes(dev: &CudaDevice, buf: &Arc<CudaBuffer>, len: usize) -> Vec<u8> {
    let stream = CopyStream::new(dev).unwrap();
    let host = PinnedBuffer::alloc(dev, len).unwrap();
    stream.download(buf, 0, &host, 0, len).unwrap();
    let mut out = vec![0; len];
    host.read_at(0, &mut out).unwrap();
    out
}

/// An upload through `pipe` of several chunks lands every byte in device
/// memory by the time it returns (read back with a synchronized copy).
pub(crate) fn uploaded_bytes_land(dev: &CudaDevice, pipe: &mut StagingPipeline) {
    let len = 5 * pipe.chunk_size() + 17;
    let buf = CudaBuffer::alloc(dev, len).unwrap();
    buf.fill(0, len, 0xEE).unwrap();
    let data = pattern(len, 21);
    pipe.upload(&buf, 0, len, |c| {
        c.write_from(&data[c.offset()..c.offset() + c.len()])
    })
    .unwrap();
    assert!(
        device_bytes(dev, &buf, len) == data,
        "the uploaded bytes did not all land"
    );
}

/// A download through `pipe` of several chunks hands each chunk on with
/// the device's bytes in it (written with a synchronized copy).
pub(crate) fn downloaded_bytes_arrive(dev: &CudaDevice, pipe: &mut StagingPipeline) {
    let len = 5 * pipe.chunk_size() + 17;
    let buf = CudaBuffer::alloc(dev, len).unwrap();
    let data = pattern(len, 22);
    let host = PinnedBuffer::alloc(dev, len).unwrap();
    host.write_at(0, &data).unwrap();
    CopyStream::new(dev)
        .unwrap()
        .upload(&host, 0, &buf, 0, len)
        .unwrap();
    for b in pipe.bounce_buffers() {
        b.fill(0, b.len(), 0xEE).unwrap();
    }
    let mut seen = vec![0; len];
    pipe.download(&buf, 0, len, |c| {
        c.read_into(&mut seen[c.offset()..c.offset() + c.len()])
    })
    .unwrap();
    assert!(
        seen == data,
        "a chunk was handed on before its bytes arrived"
    );
}
