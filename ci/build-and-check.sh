#!/usr/bin/env bash
# Runs `cargo xtask build-and-check` in the canonical image (ci/Dockerfile):
# Ubuntu 24.04, GCC/G++, Clang/libclang 18, CMake, pkg-config, libibverbs-dev.
#
#   ci/build-and-check.sh [build-and-check args...]
#
# CONTAINER=podman uses podman instead of docker. Inside the image (or on a
# machine set up the same way) it runs the task directly.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${ORBITTE_CI_IMAGE:-}" ]; then
  exec cargo xtask build-and-check "$@"
fi

engine="${CONTAINER:-docker}"
if ! command -v "$engine" >/dev/null 2>&1; then
  echo "ci/build-and-check.sh: $engine not found; install Docker (docker.io) or set CONTAINER=podman" >&2
  echo "  (the libclang 18 cell alone needs no container: cargo xtask build-and-check --venv DIR," >&2
  echo "  with DIR a venv holding PyPI's libclang==18.1.1 and ziglang==0.13.0; docs/building.md)" >&2
  exit 1
fi

image=orbitte-ci:ubuntu-24.04-gcc-clang18
"$engine" build --tag "$image" --file ci/Dockerfile ci
# The checkout is mounted read-write (cargo fmt --check and bindgen --check
# only read it); the image's build goes to its own target directory so it
# never mixes with the host's.
exec "$engine" run --rm \
  --volume "$PWD":/src \
  --env CARGO_TARGET_DIR=/src/target/ci-ubuntu-24.04 \
  --env CI="${CI:-}" \
  "$image" \
  cargo xtask build-and-check "$@"
