#!/usr/bin/env bash
# Install the plugins into a CNI bin directory, /opt/cni/bin by default (cnitool is a user
# tool, not a plugin: copy it from the build directory to your PATH if you want it).
#   scripts/install.sh [--force] [DIR]
# Refuses to replace existing files (e.g. the upstream Go plugins) unless --force is given;
# with --force each replaced file is kept as <name>.orig once, so the switch can be undone.
# Files are installed atomically (copy to a temporary name, then rename), so a runtime that
# execs a plugin during the install sees either the old or the new binary, never a torn one.
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
dest=/opt/cni/bin
for a in "$@"; do
    case "$a" in
    --force) force=1 ;;
    -h | --help)
        sed -n '2,/^set -/p' "$0" | grep '^#'
        exit 0
        ;;
    -*)
        echo "unknown option $a" >&2
        exit 2
        ;;
    *) dest=$a ;;
    esac
done

bin=$(scripts/build-release.sh)
names=(loopback bridge host-local portmap bandwidth)
present=()
for n in "${names[@]}"; do
    [ -x "$bin/$n" ] && present+=("$n")
done

mkdir -p "$dest"
clash=()
for n in "${present[@]}"; do
    [ -e "$dest/$n" ] && clash+=("$n")
done
if ((${#clash[@]})) && ((!force)); then
    echo "refusing to overwrite in $dest: ${clash[*]} (use --force; originals are kept as <name>.orig)" >&2
    exit 1
fi
for n in "${present[@]}"; do
    if [ -e "$dest/$n" ] && [ ! -e "$dest/$n.orig" ]; then
        cp -p "$dest/$n" "$dest/$n.orig"
    fi
    install -m 0755 "$bin/$n" "$dest/.$n.new"
    mv -f "$dest/.$n.new" "$dest/$n"
    echo "installed $dest/$n"
done
