#!/usr/bin/env bash
# Build static (+crt-static), size-tuned release binaries of every plugin and tool, and print
# the directory that holds them. Static binaries start faster (no dynamic loader work: a large
# share of a one-shot plugin's run time) and run on any Linux host of the same architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
triple=$(rustc -vV | sed -n 's/^host: //p')
# Shown in every plugin's about banner (CNI_COMMAND unset).
CNI_BUILD_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    CNI_BUILD_COMMIT="$CNI_BUILD_COMMIT-dirty"
fi
export CNI_BUILD_COMMIT
# An explicit --target keeps the flag off build scripts and proc macros (host artifacts).
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --release --workspace --bins --target "$triple" >&2
echo "$PWD/target/$triple/release"
