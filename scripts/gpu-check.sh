#!/usr/bin/env bash
# GPU check for orbitte-cuda and the engine's cuda-staging path (issue 8), for
# a machine with an NVIDIA GPU and driver. Usage, from anywhere in the
# repository:
#
#   scripts/gpu-check.sh
#
# 1. `cargo test -p orbitte-cuda` with ORBITTE_REQUIRE_GPU=1, which turns every
#    "skipped: no CUDA driver/device" into a failure, so the hardware tests
#    (tests/gpu.rs) must really run on device 0.
# 2. The staging benchmark (benches/staging.rs): 64 MiB through the staging
#    pipeline at 1, 4 and 16 MiB chunks, next to the raw pinned cuMemcpy
#    D2H/H2D baseline measured in the same run, in GB/s.
# 3. The engine's cuda-staging tests (crates/orbitte-engine/tests/staging.rs),
#    release build, GPU mandatory: the stub-driver children plus a staged
#    WRITE and READ GPU -> remote -> GPU between two engines on device 0.
# 4. The engine staging benchmark (examples/staging_bench.rs): 64 MiB staged
#    WRITE and READ THROUGH THE ENGINE (sim fabric rails, in-process memcpy
#    network) at 1, 4 and 16 MiB chunks, next to raw pinned cuMemcpy D2H/H2D
#    and an engine host-to-host reference, all in the same run, in GB/s.
#
# The whole check must fit in 5 minutes (builds included); each step gets what
# is left of that budget and the script fails when it runs out.
set -euo pipefail
cd "$(dirname "$0")/.."

budget=300
deadline=$((SECONDS + budget))
left() {
    local s=$((deadline - SECONDS))
    if ((s < 1)); then
        echo "gpu-check: the ${budget}s budget is spent" >&2
        exit 1
    fi
    echo "$s"
}

echo "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv || true
else
    echo "nvidia-smi not found (the tests will say whether libcuda.so.1 loads)"
fi

export ORBITTE_REQUIRE_GPU=1

echo "== cargo test -p orbitte-cuda (GPU tests mandatory)"
timeout "$(left)" cargo test -p orbitte-cuda

echo "== staging benchmark (64 MiB; raw pinned copy is the baseline)"
timeout "$(left)" cargo bench -p orbitte-cuda --bench staging

echo "== cargo test --release -p orbitte-engine --test staging (GPU round trip through the engine)"
timeout "$(left)" cargo test --release -p orbitte-engine --test staging

echo "== engine staging benchmark (64 MiB through the engine; raw pinned copy is the baseline)"
timeout "$(left)" cargo run --release -p orbitte-engine --example staging_bench -- 64 5

echo "== gpu-check passed in ${SECONDS}s"
