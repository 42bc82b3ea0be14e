#!/usr/bin/env bash
# The whole test suite, as CI runs it, on a fresh Debian 12 machine with only the Rust
# toolchain: system packages, formatting, lints, a build of every binary, then every test
# (unit, kernel tests in scratch network namespaces, end-to-end). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh needs root (network namespaces, nftables, tc)" >&2
    exit 1
fi

scripts/install-deps.sh
# Today's upstream (containernetworking/plugins, pinned) built from its Go module into
# target/peers/: the first peer of the side-by-side tests; Debian's 1.1.1 is the second. And
# today's callers, pinned: containerd 2.x, crictl/critest, a kubelet (tests/e2e/cri.rs). Every
# group is built here, before the tests: one that cannot be built stops the run with one line.
scripts/install-peers.sh

# Tests skipped because this kernel lacks a feature (cni_tests::skip_unless) are recorded here
# and listed at the end, pass or fail: nextest hides the output of passing tests. Features these
# machines have (docs/testing.md, "Skips are visible") are required: their tests fail rather than skip.
export CNI_TEST_SKIP_LOG="$PWD/target/cni-test-skips.log"
export CNI_TEST_REQUIRE="${CNI_TEST_REQUIRE-iptables-legacy,br_netfilter}"
mkdir -p target
: >"$CNI_TEST_SKIP_LOG"
report_skips() {
    if [ -s "$CNI_TEST_SKIP_LOG" ]; then
        echo "== skipped for a missing kernel feature ($(sort -u "$CNI_TEST_SKIP_LOG" | wc -l)):"
        sort -u "$CNI_TEST_SKIP_LOG" | sed 's/^/   /'
    else
        echo "== no test skipped for a missing kernel feature"
    fi
}
trap report_skips EXIT

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --bins
if [ -x scripts/build-upstream-cnitool.sh ]; then
    scripts/build-upstream-cnitool.sh
fi

# The release binaries users install (static musl, LTO, panic=abort: scripts/build-release.sh).
rel=$(scripts/build-release.sh)

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast "$@"
    # bridge's suite once more with its IPAM delegate exec'd (by default bridge runs our
    # host-local in-process: plugins/bridge/README.md, "IPAM in-process").
    CNI_IPAM_EXEC=1 cargo nextest run -p cni-tests --test bridge --no-fail-fast
    # the end-to-end suites once more against the release binaries
    CNI_TEST_BIN_DIR=$rel cargo nextest run -p cni-tests --no-fail-fast
else
    cargo test --workspace --no-fail-fast "$@"
    CNI_IPAM_EXEC=1 cargo test -p cni-tests --test bridge --no-fail-fast
    CNI_TEST_BIN_DIR=$rel cargo test -p cni-tests --no-fail-fast
fi

# Upstream's own tests: the binary-exec parts of containernetworking/plugins v1.10.0's suites
# against our binaries and against v1.10's, compared case by case (scripts/upstream-tests.known
# lists the differences, docs/switching.md says why).
scripts/upstream-tests.sh

# The release artifacts (both architectures, checked: scripts/check-release.sh), and the arm64
# binaries under qemu (docs/packaging.md, docs/testing.md). The x86_64 build is the one above.
scripts/release.sh
# The ecosystem's default conflists (conf-examples/) on the release tarball alone, extracted
# into a scratch bin dir (tests/e2e/conflists.rs: #[ignore]d in the passes above, which run
# before the tarball exists).
tarball="$PWD/dist/cni-rs-linux-amd64-v$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml).tgz"
if cargo nextest --version >/dev/null 2>&1; then
    CNI_TEST_RELEASE_TARBALL=$tarball cargo nextest run -p cni-tests --test conflists --run-ignored ignored-only --no-fail-fast
else
    CNI_TEST_RELEASE_TARBALL=$tarball cargo test -p cni-tests --test conflists --no-fail-fast -- --ignored
fi
scripts/test-arm64.sh

# A fixed sample of the mutation tests (docs/testing.md, "Mutation testing"; the whole set is
# scripts/mutants.sh). In place: it mutates the tree, restores it and reuses target/ as built.
scripts/mutants.sh --sample

# Bounded fuzzing of the parsers (config/skeleton, results, CNI_ARGS).
scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
