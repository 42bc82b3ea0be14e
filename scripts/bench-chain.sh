#!/usr/bin/env bash
# The kubenet-style chain (bridge + host-local, portmap, bandwidth), ADD and DEL, ours vs
# upstream, one interleaved run, with each plugin's peak RSS. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
bin=$(scripts/build-release.sh)
CNI_TEST_BIN_DIR="$bin" "$bin/cnibench" chain --iterations "${ITERATIONS:-200}" "$@"
