#!/usr/bin/env bash
# host-local ADD and DEL with 0, 1 000, 10 000 and 30 000 existing reservations, ours vs
# upstream (/usr/lib/cni/host-local), in one interleaved run. Needs root.
#   scripts/bench-host-local.sh
#   SIZES="0 1000" ITERATIONS=50 scripts/bench-host-local.sh
# Each binary gets its own copy of the same pre-filled store (upstream's format, written
# directly); the first, untimed call of ours builds its index from the files, as it does once
# after a switch from upstream.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
bin=$(scripts/build-release.sh)
HOST_LOCAL_SIZES=${SIZES:-"0 1000 10000 30000"} CNI_TEST_BIN_DIR="$bin" \
    "$bin/cnibench" host-local --iterations "${ITERATIONS:-30}" "$@"
