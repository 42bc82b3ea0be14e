#!/usr/bin/env bash
# bridge + host-local ADD and DEL, ours vs upstream (/usr/lib/cni), one interleaved run. Needs
# root. Upstream's ipMasq uses iptables (Debian's 1.1.1), so iptables is installed for it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh iptables
bin=$(scripts/build-release.sh)
CNI_TEST_BIN_DIR="$bin" "$bin/cnibench" bridge --iterations "${ITERATIONS:-200}" "$@"
