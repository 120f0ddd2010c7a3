//! The driver paths, exercised without a GPU: each test builds the stub
//! driver of orbitte-cuda's `testing` module (testing/stub_libcuda.c) with
//! `cc`, then re-runs this test binary as a child process with the stub
//! first on LD_LIBRARY_PATH (the loader reads it only at process start) and
//! one `#[ignore]`d `child_*` entry selected. The child asserts; the parent
//! checks it ran exactly one test and passed, so a panic anywhere in the
//! child fails the parent.
//!
//! Without `cc` the tests print `skipped: ...`, except under CI=true, where
//! `cc` is installed and its absence is a failure.

mod common;
// orbitte-cuda's `testing` module, the same file the engine's tests use
// through feature `testing`: a crate cannot turn on its own feature for its
// integration tests without depending on itself.
#[allow(unreachable_pub)]
#[path = "../src/testing.rs"]
mod testing;

use orbitte_cuda::driver::DriverError;
use orbitte_cuda::{
    AllocError, Check, CopyError, CudaBuffer, CudaDevice, DeviceError, PointerError,
    StagingFailure, StagingPipeline, devices, driver, probe,
};
use testing::{StubHarness, StubKind};

/// Children of this binary are selected by `ORBITTE_STUB_CHILD`.
const STUB: StubHarness = StubHarness::new("ORBITTE_STUB_CHILD", "stub_driver");

// ---- parents -------------------------------------------------------------

#[test]
fn no_device_from_cuinit_is_a_typed_error() {
    if let Some(out) = STUB.run_child("child_no_device", "no-device", StubKind::Complete, &[]) {
        assert!(out.contains("no CUDA device"), "{out}");
    }
}

#[test]
fn zero_devices_is_a_typed_error() {
    STUB.run_child(
        "child_zero_devices",
        "zero-devices",
        StubKind::Complete,
        &[],
    );
}

#[test]
fn a_driver_missing_a_symbol_is_a_typed_error() {
    STUB.run_child(
        "child_missing_symbol",
        "fake-gpu",
        StubKind::WithoutHtoD,
        &[],
    );
}

#[test]
fn staging_runs_on_the_fake_device() {
    STUB.run_child("child_fake_gpu", "fake-gpu", StubKind::Complete, &[]);
}

/// The same checks with copies that also start on their own, 200 µs after
/// they were issued, so they overlap the handlers' work.
#[test]
fn staging_runs_on_the_fake_device_with_overlapping_copies() {
    STUB.run_child(
        "child_fake_gpu",
        "fake-gpu",
        StubKind::Complete,
        &[("ORBITTE_STUB_COPY_DELAY_US", "200")],
    );
}

/// The stub makes copies visible only after a wait, so a pipeline that
/// leaves out the wait on each chunk's copy fails the byte checks, in both
/// directions.
#[cfg(feature = "testing")]
#[test]
fn a_missing_chunk_wait_fails_the_byte_checks() {
    STUB.run_child(
        "child_missing_chunk_wait",
        "fake-gpu",
        StubKind::Complete,
        &[],
    );
}

#[test]
fn a_failed_drain_makes_the_pipeline_unquiesced() {
    STUB.run_child(
        "child_sync_fault",
        "fake-gpu",
        StubKind::Complete,
        &[("ORBITTE_STUB_FAIL_SYNC_AFTER", "3")],
    );
}

// ---- children --------------------------------------------------------------

fn assert_no_device(expected_reason: &str) {
    let info = driver().expect("the stub loads");
    assert!(info.library.starts_with("libcuda.so"), "{info:?}");
    assert_eq!(info.version, Some((12, 8)));
    assert_eq!(info.device_count, 0);
    assert!(
        info.no_device
            .as_deref()
            .unwrap_or("")
            .contains(expected_reason),
        "{info:?}"
    );

    let e = devices().unwrap_err();
    assert!(matches!(e, DeviceError::NoDevice { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("no CUDA device: libcuda.so"),
        "{e}"
    );
    println!("{e}");
    assert!(matches!(
        CudaDevice::open(0),
        Err(DeviceError::NoDevice { .. })
    ));
    assert!(matches!(
        CudaBuffer::alloc_on(0, 4096),
        Err(AllocError::Device(DeviceError::NoDevice { .. }))
    ));
    assert!(matches!(
        CudaBuffer::inspect(0x1000),
        Err(PointerError::Device(DeviceError::NoDevice { .. }))
    ));
    let rows = probe();
    match &rows[0].discovery {
        Check::Skipped { why } => assert!(why.starts_with("no CUDA device ("), "{why}"),
        other => panic!("discovery should be skipped: {other}"),
    }
    assert!(matches!(rows[1].completion, Check::NotImplemented { .. }));
}

#[test]
#[ignore = "child process entry, run by no_device_from_cuinit_is_a_typed_error"]
fn child_no_device() {
    if STUB.is_child("child_no_device") {
        assert_no_device("CUDA_ERROR_NO_DEVICE");
    }
}

#[test]
#[ignore = "child process entry, run by zero_devices_is_a_typed_error"]
fn child_zero_devices() {
    if STUB.is_child("child_zero_devices") {
        assert_no_device("cuDeviceGetCount reported 0");
    }
}

#[test]
#[ignore = "child process entry, run by a_driver_missing_a_symbol_is_a_typed_error"]
fn child_missing_symbol() {
    if !STUB.is_child("child_missing_symbol") {
        return;
    }
    match driver() {
        Err(DriverError::MissingSymbol { library, symbol }) => {
            assert!(library.starts_with("libcuda.so"));
            assert_eq!(symbol, "cuMemcpyHtoDAsync_v2");
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
    assert!(matches!(
        devices(),
        Err(DeviceError::Driver(DriverError::MissingSymbol { .. }))
    ));
    match &probe()[0].discovery {
        Check::Fail { reason, fix } => {
            assert!(reason.contains("cuMemcpyHtoDAsync_v2"), "{reason}");
            assert!(fix.contains("nvidia-smi"), "{fix}");
        }
        other => panic!("discovery should fail: {other}"),
    }
}

#[test]
#[ignore = "child process entry, run by staging_runs_on_the_fake_device"]
fn child_fake_gpu() {
    if !STUB.is_child("child_fake_gpu") {
        return;
    }
    let dev = CudaDevice::open(0).unwrap();
    let info = dev.info().unwrap();
    assert_eq!(info.name, "OrbitTE stub GPU");
    assert_eq!(info.pci_bus_id, "0000:3b:00.0");
    assert_eq!(info.compute_capability, (9, 0));
    common::discovery_reports_the_device(&dev);
    common::oversized_allocation_names_the_numbers(&dev);
    common::foreign_pointers_are_checked(&dev);
    common::copies_round_trip_and_check_bounds(&dev);
    common::pipeline_round_trips_odd_ranges(&dev);
    common::pipeline_handles_many_geometries(&dev);
    common::handler_errors_report_the_completed_prefix(&dev);
    common::handler_panics_drain_and_leave_the_pipeline_usable(&dev);
    common::probe_passes_every_staging_check(&dev);
    let mut pipe = StagingPipeline::new(&dev, 4096).unwrap();
    common::uploaded_bytes_land(&dev, &mut pipe);
    common::downloaded_bytes_arrive(&dev, &mut pipe);
}

#[cfg(feature = "testing")]
#[test]
#[ignore = "child process entry, run by a_missing_chunk_wait_fails_the_byte_checks"]
fn child_missing_chunk_wait() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    if !STUB.is_child("child_missing_chunk_wait") {
        return;
    }
    let dev = CudaDevice::open(0).unwrap();
    let mut pipe = StagingPipeline::new(&dev, 4096).unwrap();
    common::uploaded_bytes_land(&dev, &mut pipe);
    common::downloaded_bytes_arrive(&dev, &mut pipe);
    pipe.omit_chunk_waits(true);
    let up = catch_unwind(AssertUnwindSafe(|| {
        common::uploaded_bytes_land(&dev, &mut pipe)
    }));
    assert!(
        up.is_err(),
        "an upload without chunk waits passed the check"
    );
    let down = catch_unwind(AssertUnwindSafe(|| {
        common::downloaded_bytes_arrive(&dev, &mut pipe)
    }));
    assert!(
        down.is_err(),
        "a download without chunk waits passed the check"
    );
    // The final drain still ran: nothing is left in flight.
    assert!(pipe.is_drained().unwrap());
    assert!(!pipe.is_unquiesced());
}

#[test]
#[ignore = "child process entry, run by a_failed_drain_makes_the_pipeline_unquiesced"]
fn child_sync_fault() {
    if !STUB.is_child("child_sync_fault") {
        return;
    }
    // The stub fails every cuStreamSynchronize after the third.
    let dev = CudaDevice::open(0).unwrap();
    let chunk = 4096;
    let buf = CudaBuffer::alloc(&dev, 4 * chunk).unwrap();
    let mut pipe = StagingPipeline::new(&dev, chunk).unwrap();
    let err = pipe
        .upload(&buf, 0, 4 * chunk, |_| Ok::<(), std::io::Error>(()))
        .unwrap_err();
    // Chunks 0..3 were confirmed by the three good waits; chunk 3's wait failed.
    assert_eq!((err.completed, err.drained), (3 * chunk, false));
    assert!(
        matches!(
            err.failure,
            StagingFailure::Copy(CopyError::NotDrained { index: 0, .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("NOT drained"), "{err}");
    assert!(pipe.is_unquiesced());
    let again = pipe
        .download(&buf, 0, chunk, |_| Ok::<(), std::io::Error>(()))
        .unwrap_err();
    assert!(
        matches!(again.failure, StagingFailure::Unquiesced(_)),
        "{again}"
    );
    assert!(!again.drained);
    println!("{again}");

    // A single synchronized copy whose wait fails reports NotDrained (and
    // retains both buffers rather than freeing memory DMA may still reach).
    let stream = orbitte_cuda::CopyStream::new(&dev).unwrap();
    let pinned = orbitte_cuda::PinnedBuffer::alloc(&dev, chunk).unwrap();
    match stream.download(&buf, 0, &pinned, 0, chunk) {
        Err(CopyError::NotDrained { index: 0, source }) => {
            assert_eq!(source.name, "CUDA_ERROR_ILLEGAL_ADDRESS");
        }
        other => panic!("expected NotDrained, got {other:?}"),
    }
}
