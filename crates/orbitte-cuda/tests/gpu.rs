//! Hardware tests: run on device 0 where an NVIDIA GPU and driver exist,
//! print `skipped: ...` and pass where they do not, and fail instead of
//! skipping when `ORBITTE_REQUIRE_GPU=1` (scripts/gpu-check.sh sets it).

mod common;

use common::gpu_or_skip;

#[test]
fn discovery_reports_names_and_pci_bus_ids() {
    let Some(dev) = gpu_or_skip("discovery_reports_names_and_pci_bus_ids") else {
        return;
    };
    common::discovery_reports_the_device(&dev);
}

#[test]
fn oversized_allocation_names_the_device_and_numbers() {
    let Some(dev) = gpu_or_skip("oversized_allocation_names_the_device_and_numbers") else {
        return;
    };
    common::oversized_allocation_names_the_numbers(&dev);
}

#[test]
fn foreign_pointers_are_checked_by_the_driver() {
    let Some(dev) = gpu_or_skip("foreign_pointers_are_checked_by_the_driver") else {
        return;
    };
    common::foreign_pointers_are_checked(&dev);
}

#[test]
fn synchronized_copies_round_trip() {
    let Some(dev) = gpu_or_skip("synchronized_copies_round_trip") else {
        return;
    };
    common::copies_round_trip_and_check_bounds(&dev);
}

#[test]
fn pipeline_round_trips_odd_ranges() {
    let Some(dev) = gpu_or_skip("pipeline_round_trips_odd_ranges") else {
        return;
    };
    common::pipeline_round_trips_odd_ranges(&dev);
}

#[test]
fn pipeline_handles_many_geometries() {
    let Some(dev) = gpu_or_skip("pipeline_handles_many_geometries") else {
        return;
    };
    common::pipeline_handles_many_geometries(&dev);
}

#[test]
fn handler_errors_report_the_completed_prefix() {
    let Some(dev) = gpu_or_skip("handler_errors_report_the_completed_prefix") else {
        return;
    };
    common::handler_errors_report_the_completed_prefix(&dev);
}

#[test]
fn handler_panics_drain_the_pipeline() {
    let Some(dev) = gpu_or_skip("handler_panics_drain_the_pipeline") else {
        return;
    };
    common::handler_panics_drain_and_leave_the_pipeline_usable(&dev);
}

#[test]
fn probe_passes_every_staging_check() {
    let Some(dev) = gpu_or_skip("probe_passes_every_staging_check") else {
        return;
    };
    common::probe_passes_every_staging_check(&dev);
}
