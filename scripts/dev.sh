#!/usr/bin/env bash
# The one entry point for developers and CI: every job on this repository is a verb here.
# (What ships to nodes is not: scripts/install.sh, scripts/migrate.sh and the systemd unit in
# scripts/systemd/ are run by operators on nodes.) The other files in scripts/ are this
# script's workers; each keeps its own usage comment at its top.
#
#   scripts/dev.sh demo                  the main job: two pods on a bridge through the whole
#                                        chain, in scratch namespaces (root)
#   scripts/dev.sh test [ARGS]           the whole suite, exactly as CI runs it (root; ARGS go to
#                                        the first test pass)
#   scripts/dev.sh lint                  cargo fmt --check and clippy -D warnings
#   scripts/dev.sh unit [CRATE…]         unit tests, no root: every crate but the e2e harness,
#                                        or the crates named (bridge, portmap, cni-common, …)
#   scripts/dev.sh e2e FILE [FILTER]     one end-to-end file of tests/e2e (builds the binaries
#                                        first), e.g. `e2e bridge dual_stack` (root)
#   scripts/dev.sh structure             the house's own rules: no import cycle among a crate's
#                                        files, crates depend only downward, cni-common names no
#                                        plugin
#   scripts/dev.sh upstream-tests        v1.10's own test suites against ours and against v1.10
#   scripts/dev.sh bench [VERB|--reduced|--quick]   benchmarks (BASELINE_REF=<ref>: against an
#                                        earlier commit of ours, in the same run)
#   scripts/dev.sh mutants [--sample|--in-diff REF] [-- ARGS]   mutation tests
#   scripts/dev.sh fuzz [SECONDS]        bounded fuzzing of parsers and entry points
#   scripts/dev.sh release [--verify]    the release tarballs and .debs in dist/, checked
#   scripts/dev.sh arm64 [TARBALL]       the arm64 release binaries under qemu
#   scripts/dev.sh peers [GROUP…]        build the pinned Go peers and callers into target/peers
#   scripts/dev.sh deps [PACKAGE…]       the Debian packages the tests use
#   scripts/dev.sh baseline REF          release binaries of an earlier commit (prints the dir)
#   scripts/dev.sh help                  this text
#
# docs/development.md says where each kind of change goes and how these fit together.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }

# cargo nextest when installed (scripts/mutants.sh installs it), else cargo test
run_tests() { # cargo-test-style selection arguments, then `--` and test-binary arguments
    local sel=() rest=()
    while (($#)) && [ "$1" != -- ]; do sel+=("$1"); shift; done
    (($#)) && shift && rest=("$@")
    if cargo nextest --version >/dev/null 2>&1; then
        cargo nextest run "${sel[@]}" --no-fail-fast ${rest[@]+"${rest[@]}"}
    else
        if ((${#rest[@]})); then
            cargo test "${sel[@]}" --no-fail-fast -- "${rest[@]}"
        else
            cargo test "${sel[@]}" --no-fail-fast
        fi
    fi
}

verb=${1:-help}
(($#)) && shift
case $verb in
demo) exec scripts/demo.sh "$@" ;;
test) exec scripts/test.sh "$@" ;;
lint)
    cargo fmt --all --check
    exec cargo clippy --workspace --all-targets -- -D warnings
    ;;
unit)
    if (($#)); then
        sel=()
        for c in "$@"; do sel+=(-p "$c"); done
        exec cargo test "${sel[@]}" --lib --bins
    fi
    exec cargo test --workspace --exclude cni-tests --lib --bins
    ;;
e2e)
    file=${1:?usage: scripts/dev.sh e2e FILE [FILTER] (a name from tests/Cargo.toml, e.g. bridge)}
    shift
    # the harness refuses a binary older than its sources
    cargo build --workspace --bins
    run_tests -p cni-tests --test "$file" -- "$@"
    ;;
structure)
    cargo test -p cni-tests --test structure
    exec cargo test -p cni-common --test names_no_plugin
    ;;
upstream-tests) exec scripts/upstream-tests.sh "$@" ;;
bench) exec scripts/bench.sh "$@" ;;
mutants) exec scripts/mutants.sh "$@" ;;
fuzz) exec scripts/fuzz.sh "$@" ;;
release) exec scripts/release.sh "$@" ;;
arm64) exec scripts/test-arm64.sh "$@" ;;
peers) exec scripts/install-peers.sh "$@" ;;
deps) exec scripts/install-deps.sh "$@" ;;
baseline) exec scripts/build-baseline.sh "$@" ;;
help | -h | --help) usage ;;
*)
    echo "scripts/dev.sh: unknown verb '$verb'" >&2
    usage >&2
    exit 2
    ;;
esac
