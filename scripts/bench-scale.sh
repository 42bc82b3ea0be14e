#!/usr/bin/env bash
# portmap at scale: N containers (default 1000) with one host port each on one bridge, full
# chain (bridge + host-local, then portmap), ours vs upstream (/usr/lib/cni, iptables), the
# portmap ADD timed at the 1st, middle and last containers. One interleaved run. Needs root.
# Usage: scripts/bench-scale.sh [--containers N]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
bin=$(scripts/build-release.sh)
CNI_TEST_BIN_DIR="$bin" "$bin/cnibench" portmap-scale "$@"
