#!/usr/bin/env bash
# Fuzz the parsers (config + whole skeleton, results of every version, CNI_ARGS, host-local's
# store files and index header) and the plugins' entry points (`entry`: environment and stdin
# of bridge, host-local, portmap and bandwidth, run jailed in namespaces of its own: needs
# root) with cargo fuzz
# (libFuzzer, nightly toolchain) for a bounded time each, starting from the seed corpus in
# fuzz/corpus. A crash fails the script and leaves the reproducer in fuzz/artifacts/.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 20; CI uses the default)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${FUZZ_SECONDS:-20}}

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "scripts/fuzz.sh: no nightly toolchain (cargo fuzz needs it): rustup toolchain install nightly" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi
cd fuzz
cargo +nightly fuzz build -O
if [ "$(id -u)" != 0 ]; then
    echo "scripts/fuzz.sh: the entry target jails itself in namespaces of its own: run as root" >&2
    exit 1
fi
for t in config result cni_args host_local_store entry; do
    # the work corpus beside the artifacts: the entry target hides the machine's /tmp
    work=$(mktemp -d -p "$PWD" work.XXXXXX)
    cp -r "corpus/$t/." "$work/"
    echo "fuzzing $t for ${secs}s" >&2
    cargo +nightly fuzz run -O "$t" "$work" -- -max_total_time="$secs" -print_final_stats=1 2>&1 |
        grep -E "^Done|stat::number_of_executed_units|ERROR|panicked" || true
    # libFuzzer exits non-zero on a crash; re-run the check on the status above
    if [ -n "$(ls -A artifacts/$t 2>/dev/null)" ]; then
        echo "fuzz target $t found a crash: see fuzz/artifacts/$t" >&2
        exit 1
    fi
    rm -rf "$work"
done
