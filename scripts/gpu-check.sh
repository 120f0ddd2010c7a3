#!/usr/bin/env bash
# GPU check for orbitte-cuda (issue 8), for a machine with an NVIDIA GPU and
# driver. Usage, from anywhere in the repository:
#
#   scripts/gpu-check.sh
#
# 1. `cargo test -p orbitte-cuda` with ORBITTE_REQUIRE_GPU=1, which turns every
#    "skipped: no CUDA driver/device" into a failure, so the hardware tests
#    (tests/gpu.rs) must really run on device 0.
# 2. The staging benchmark (benches/staging.rs): 64 MiB through the staging
#    pipeline at 1, 4 and 16 MiB chunks, next to the raw pinned cuMemcpy
#    D2H/H2D baseline measured in the same run, in GB/s.
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

echo "== gpu-check passed in ${SECONDS}s"
