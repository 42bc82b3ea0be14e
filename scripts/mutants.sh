#!/usr/bin/env bash
# Mutation testing (cargo-mutants) of the modules where the logic lives and that unit tests
# cover without a kernel: which mutants, and why the others are left out, is in
# .cargo/mutants.toml. Every mutant is built and the unit tests of its package run against it;
# a mutant no test fails is MISSED. Missed mutants are triaged: a test that catches them, or an
# entry in the reviewed list of equivalent mutants (.cargo/mutants.toml, exclude_re).
#
#   scripts/mutants.sh                the whole set (docs/testing.md gives the measured time)
#   scripts/mutants.sh --sample       a fixed 1/MUTANTS_SHARDS of it (default 1/60), what
#                                     scripts/test.sh runs: one job, in place (it mutates the
#                                     work tree and restores it; reuses target/ as built)
#   scripts/mutants.sh --in-diff REF  only mutants in lines changed since git REF (e.g. main)
#   scripts/mutants.sh [...] -- ARGS  extra cargo-mutants arguments (e.g. one file: -- --re '^plugins/bridge/src/config\.rs';
#                                     --file does not narrow the set: .cargo/mutants.toml's examine_globs win)
#
# Two groups, run one after the other: cni-common (its unit tests of `spec` and `netlink::tc`,
# the result goldens and the skeleton tests; not its kernel tests) and the plugins (their unit
# tests). Output: target/mutants/<group>/mutants.out, for --sample target/mutants/sample/<group>/
# mutants.out (missed.txt, caught.txt, logs). The last line is `N caught, M missed, K unviable` over both groups (a timeout counts as caught: the
# tests noticed); the exit status is non-zero when a mutant was missed. MUTANTS_JOBS builds in
# parallel (default 2). cargo-mutants and cargo-nextest are installed from crates.io when
# missing. The whole run starts by copying target/ into its build directories: a cargo build in
# this tree during those first minutes makes the copy fail (the script says so and exits 1).
set -euo pipefail
cd "$(dirname "$0")/.."

MUTANTS_VERSION=27.1.0
mode=all
ref=
extra=()
while (($#)); do
    case $1 in
        --sample) mode=sample ;;
        --in-diff)
            mode=diff
            ref=${2:?--in-diff needs a git revision}
            shift
            ;;
        --) shift; extra=("$@"); break ;;
        *) echo "scripts/mutants.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
    esac
    shift
done

if ! cargo mutants --version 2>/dev/null | grep -q "$MUTANTS_VERSION"; then
    cargo install --locked --version "$MUTANTS_VERSION" cargo-mutants
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest
fi

common=(--colors never)
case $mode in
    sample) common+=(--in-place --shard "0/${MUTANTS_SHARDS:-60}" --sharding round-robin) ;;
    *) common+=(--jobs "${MUTANTS_JOBS:-2}" --copy-target true) ;;
esac
case $mode in
    diff)
        diff=$(mktemp)
        trap 'rm -f "$diff"' EXIT
        git diff "$ref" -- '*.rs' >"$diff"
        common+=(--in-diff "$diff")
        ;;
esac

out=target/mutants
# The sample has its own output: a whole run going on at the same time keeps its logs.
[ "$mode" = sample ] && out=target/mutants/sample
start=$SECONDS
status=0
run_group() { # name, then cargo-mutants arguments
    local name=$1
    shift
    rm -rf "$out/$name"
    mkdir -p "$out/$name"
    echo "== mutants: $name" >&2
    # 0: all caught; 2: some missed; 3: some timed out; anything else: the run itself failed
    # (e.g. the unmutated tree does not pass its tests).
    local rc=0
    cargo mutants "${common[@]}" --output "$out/$name" "$@" ${extra[@]+"${extra[@]}"} || rc=$?
    case $rc in
        0 | 2 | 3) ;;
        *)
            echo "scripts/mutants.sh: cargo mutants failed for $name (exit $rc): $out/$name/mutants.out" >&2
            status=1
            ;;
    esac
}

run_group cni-common --package cni-common \
    --cargo-test-arg=--lib --cargo-test-arg=--test=result_golden --cargo-test-arg=--test=skel \
    --cargo-test-arg=-E --cargo-test-arg='test(/^spec::/) | test(/^netlink::tc::tests::/) | binary(result_golden) | binary(skel)'
run_group plugins --package bridge --package bandwidth --package host-local --package portmap \
    --package ptp --package firewall --package tuning

count() { cat "$out"/*/mutants.out/"$1" 2>/dev/null | grep -c . || true; }
caught=$(count caught.txt)
missed=$(count missed.txt)
unviable=$(count unviable.txt)
timeouts=$(count timeout.txt)
if ((missed)); then
    echo "missed mutants (add a test that catches each, or a reviewed entry in .cargo/mutants.toml):"
    cat "$out"/*/mutants.out/missed.txt | sed 's/^/   /'
    status=1
fi
echo "mutation testing took $((SECONDS - start)) s; $timeouts timeouts (counted as caught)"
echo "$((caught + timeouts)) caught, $missed missed, $unviable unviable"
exit $status
