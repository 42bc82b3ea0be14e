#!/usr/bin/env bash
# Build static, size-tuned release binaries of every plugin and tool, and print the directory
# that holds them. Static binaries start faster (no dynamic loader work: a large share of a
# one-shot plugin's run time) and run on any Linux host of the same architecture.
#
# The preferred target is musl: measured here, a plugin starts in about half the time of a
# static glibc build and its peak RSS is ~30% lower (glibc's static start-up and larger code
# pages). When the musl target is not installed and `rustup target add` cannot fetch it, the
# build falls back to glibc with +crt-static and says so on stderr.
# CNI_RELEASE_TARGET=<triple> chooses the target explicitly, e.g. aarch64-unknown-linux-musl
# (cross-built here; no fallback then).
#
# musl targets link with rust-lld, which ships with the Rust toolchain: no C toolchain or cross
# linker is needed, and the binaries depend only on the toolchain, the sources and Cargo.lock.
# They are reproducible: paths of this machine are remapped (--remap-path-prefix) and, on a
# clean checkout, host-local's build identity (plugins/host-local/build.rs) is derived from the
# commit, the target, the toolchain and RUSTFLAGS instead of drawn at random. scripts/release.sh
# builds through this script and proves it with a second build in another directory (--verify).
# CNI_RELEASE_COMMIT=<full sha> names the commit when the sources are an export without .git
# (release.sh --verify); the caller vouches that they are that commit, unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=$(uname -m)
target=${CNI_RELEASE_TARGET:-}
if [ -z "$target" ]; then
    musl="$arch-unknown-linux-musl"
    if rustup target list --installed 2>/dev/null | grep -qx "$musl" ||
        timeout 120 rustup target add "$musl" >&2; then
        target=$musl
    else
        target=$(rustc -vV | sed -n 's/^host: //p')
        echo "build-release: the $musl target is not available; building static glibc binaries ($target)" >&2
    fi
elif [ "$target" != "$(rustc -vV | sed -n 's/^host: //p')" ] &&
    ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    timeout 300 rustup target add "$target" >&2 || {
        echo "build-release: cannot install the $target target (rustup target add $target)" >&2
        exit 1
    }
fi
case $target in
*-linux-musl*)
    # CARGO_TARGET_<TRIPLE>_LINKER: only this target's final links, not build scripts
    export "CARGO_TARGET_$(echo "$target" | tr 'a-z.-' 'A-Z__')_LINKER=rust-lld"
    ;;
esac

# The commit, shown in every plugin's about banner (CNI_COMMAND unset).
dirty=0
if [ -n "${CNI_RELEASE_COMMIT:-}" ]; then
    commit=$CNI_RELEASE_COMMIT
else
    commit=$(git rev-parse HEAD 2>/dev/null || true)
    if [ -n "$commit" ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        dirty=1
    fi
fi
if [ -z "${CNI_BUILD_COMMIT:-}" ]; then
    CNI_BUILD_COMMIT=${commit:0:12}
    CNI_BUILD_COMMIT=${CNI_BUILD_COMMIT:-unknown}
    ((dirty)) && CNI_BUILD_COMMIT="$CNI_BUILD_COMMIT-dirty"
fi
export CNI_BUILD_COMMIT
user_flags=${RUSTFLAGS:-}
if [ -z "${CNI_BUILD_ID:-}" ] && [ -n "$commit" ] && ((!dirty)); then
    # the same for every build of this commit for this target with this toolchain and flags
    CNI_BUILD_ID=$(printf '%s\n' "$commit" "$target" "$(rustc -vV)" "$user_flags" | sha256sum | cut -c1-32)
    export CNI_BUILD_ID
fi

# No path of this machine in the binaries (panic locations name source files): the workspace,
# cargo's home (registry sources) and the toolchain.
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
[ "${target_dir#/}" != "$target_dir" ] || target_dir=$PWD/$target_dir
cargo_home=${CARGO_HOME:-$HOME/.cargo}
# (the last matching prefix wins: the target directory may lie inside the workspace)
remap="--remap-path-prefix=$PWD=/build/cni-rs --remap-path-prefix=$target_dir=/build/target"
remap="$remap --remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$(rustc --print sysroot)=/rustc/sysroot"
# An explicit --target keeps the flags off build scripts and proc macros (host artifacts).
RUSTFLAGS="$user_flags -C target-feature=+crt-static $remap" \
    cargo build --locked --release --workspace --bins --target "$target" >&2
echo "$target_dir/$target/release"
