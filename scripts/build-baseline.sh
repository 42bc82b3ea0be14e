#!/usr/bin/env bash
# Build the release binaries of an earlier commit of this repository, for the benchmarks'
# baseline mode (scripts/bench.sh with BASELINE_REF=<ref>), and print the directory holding
# them. The commit is checked out into a scratch git worktree (the current one is not
# touched) and built there with its own target directory, kept under target/baseline/ so that
# a second run for the same commit builds nothing.
#   scripts/build-baseline.sh <git ref>
#   BASELINE_PROFILE=dev scripts/build-baseline.sh <git ref> <plugin>…
#       a quick unoptimised build of those plugins only (tests that need an earlier build's
#       behaviour, not its speed: tests/e2e/portmap.rs upgrades the released layout)
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: scripts/build-baseline.sh <git ref> [plugin…]}
shift
rev=$(git rev-parse --verify "$ref^{commit}") || {
    echo "build-baseline: commit $ref is not in this checkout (a shallow clone? fetch its history)" >&2
    exit 1
}
root=$PWD/target/baseline
profile=${BASELINE_PROFILE:-release}
plugins=${*:-loopback bridge host-local portmap bandwidth}
out=$root/$rev
[ "$profile" = dev ] && out=$root/$rev-dev
is_ready() {
    for p in $plugins; do [ -x "$out/$p" ] || return 1; done
}
if is_ready; then
    echo "$out"
    exit 0
fi
# One build at a time: tests of two suites may ask for the same baseline at the same moment
# (nextest runs them in parallel), and both would check out and build into the same places.
mkdir -p "$root"
exec 9>"$root/.lock"
flock -w 1800 9 || {
    echo "build-baseline: another build of a baseline held $root/.lock for 30 minutes" >&2
    exit 1
}
if is_ready; then # built by whoever held the lock
    echo "$out"
    exit 0
fi
src=$root/src-$rev
git worktree remove --force "$src" >/dev/null 2>&1 || rm -rf "$src"
git worktree prune
git worktree add --detach "$src" "$rev" >&2
cleanup() { git worktree remove --force "$src" >/dev/null 2>&1 || true; }
trap cleanup EXIT
export CARGO_TARGET_DIR=$root/target
if [ "$profile" = dev ]; then
    (cd "$src" && for p in $plugins; do cargo build -p "$p" --bins >&2; done)
    bin=$CARGO_TARGET_DIR/debug
elif [ -x "$src/scripts/build-release.sh" ]; then
    # it prints <its checkout>/target/<triple>/release; the build went to CARGO_TARGET_DIR
    triple=$(basename "$(dirname "$("$src/scripts/build-release.sh")")")
    bin=$CARGO_TARGET_DIR/$triple/release
else
    # commits older than scripts/build-release.sh: the same static build by hand
    target=$(rustc -vV | sed -n 's/^host: //p')
    (cd "$src" && RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
        cargo build --release --workspace --bins --target "$target" >&2)
    bin=$CARGO_TARGET_DIR/$target/release
fi
mkdir -p "$out.tmp"
for p in $plugins; do
    cp "$bin/$p" "$out.tmp/$p"
done
rm -rf "$out"
mv "$out.tmp" "$out"
echo "baseline $ref ($rev) built into $out" >&2
echo "$out"
