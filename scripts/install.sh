#!/usr/bin/env bash
# Install the plugins into a CNI bin directory, /opt/cni/bin by default (cnitool is a user
# tool, not a plugin: copy it from the build directory to your PATH if you want it), and
# cni-migrate next to them (scripts/migrate.sh runs it; no runtime ever does).
#   scripts/install.sh [--force] [--from BUILD_DIR] [DIR]
#   scripts/install.sh --restore [DIR]
# Refuses to replace existing files (e.g. the upstream Go plugins) unless --force is given;
# with --force each replaced file is kept as <name>.orig once, so the switch can be undone.
# --restore puts every <name>.orig back (our binary is dropped), then tells you to run
# `scripts/migrate.sh to-upstream` so upstream's plugins find their own form of the running
# pods (docs/switching.md). cni-migrate stays for that.
# --from takes the binaries from BUILD_DIR (e.g. what scripts/build-release.sh printed on a build
# machine) instead of building them here.
# Files are installed atomically (copy to a temporary name, then rename), so a runtime that
# execs a plugin during the install sees either the old or the new binary, never a torn one.
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
restore=0
from=
dest=/opt/cni/bin
while (($#)); do
    a=$1
    shift
    case "$a" in
    --force) force=1 ;;
    --restore) restore=1 ;;
    --from)
        from=${1:?--from needs a directory}
        shift
        ;;
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

names=(loopback bridge host-local portmap bandwidth)

if ((restore)); then
    restored=()
    for n in "${names[@]}"; do
        if [ -e "$dest/$n.orig" ]; then
            # atomic: a runtime exec'ing the plugin meanwhile gets one binary or the other
            cp -p "$dest/$n.orig" "$dest/.$n.new"
            mv -f "$dest/.$n.new" "$dest/$n"
            rm -f "$dest/$n.orig"
            restored+=("$n")
            echo "restored $dest/$n"
        elif [ -e "$dest/$n" ]; then
            echo "kept $dest/$n (no $n.orig to put back)"
        fi
    done
    if ((${#restored[@]} == 0)); then
        echo "nothing to restore in $dest (no <name>.orig files)" >&2
        exit 1
    fi
    cat <<MSG

The original plugins are back. Pods created or adopted while ours were installed still have
their masquerading and host ports in our nftables tables, which the restored plugins do not
know. Now run, as root, on this node:

    scripts/migrate.sh to-upstream --cni-bin-dir $dest

It rewrites them into the restored plugins' iptables form (so their CHECK and DEL of those pods
work) and then removes our tables. See docs/switching.md.
MSG
    exit 0
fi

if [ -n "$from" ]; then
    bin=$from
    [ -d "$bin" ] || {
        echo "--from $bin: not a directory" >&2
        exit 2
    }
else
    bin=$(scripts/build-release.sh)
fi
present=()
for n in "${names[@]}"; do
    [ -x "$bin/$n" ] && present+=("$n")
done

if ((${#present[@]} == 0)); then
    echo "no plugin binaries in $bin" >&2
    exit 1
fi
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
if [ -x "$bin/cni-migrate" ]; then
    install -m 0755 "$bin/cni-migrate" "$dest/.cni-migrate.new"
    mv -f "$dest/.cni-migrate.new" "$dest/cni-migrate"
    echo "installed $dest/cni-migrate (run by scripts/migrate.sh, never by a runtime)"
fi
