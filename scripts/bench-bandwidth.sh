#!/usr/bin/env bash
# bandwidth ADD, CHECK and DEL (ingress + egress shaped), ours vs upstream (/usr/lib/cni), one
# interleaved run. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
bin=$(scripts/build-release.sh)
CNI_TEST_BIN_DIR="$bin" "$bin/cnibench" bandwidth --iterations "${ITERATIONS:-300}" "$@"
