#!/usr/bin/env bash
# Build the release binaries of an earlier commit of this repository, for the benchmarks'
# baseline mode (scripts/bench.sh with BASELINE_REF=<ref>), and print the directory holding
# them. The commit is checked out into a scratch git worktree (the current one is not
# touched) and built there with its own target directory, kept under target/baseline/ so that
# a second run for the same commit builds nothing.
#   scripts/build-baseline.sh <git ref>
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: scripts/build-baseline.sh <git ref>}
rev=$(git rev-parse --verify "$ref^{commit}")
root=$PWD/target/baseline
out=$root/$rev
if [ -x "$out/bridge" ] && [ -x "$out/portmap" ]; then
    echo "$out"
    exit 0
fi
src=$root/src-$rev
mkdir -p "$root"
git worktree remove --force "$src" >/dev/null 2>&1 || rm -rf "$src"
git worktree prune
git worktree add --detach "$src" "$rev" >&2
cleanup() { git worktree remove --force "$src" >/dev/null 2>&1 || true; }
trap cleanup EXIT
export CARGO_TARGET_DIR=$root/target
if [ -x "$src/scripts/build-release.sh" ]; then
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
for p in loopback bridge host-local portmap bandwidth; do
    cp "$bin/$p" "$out.tmp/$p"
done
rm -rf "$out"
mv "$out.tmp" "$out"
echo "baseline $ref ($rev) built into $out" >&2
echo "$out"
