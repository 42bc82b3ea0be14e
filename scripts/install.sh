#!/usr/bin/env bash
# Install the plugins into a CNI bin directory, /opt/cni/bin by default (cnitool is a user
# tool, not a plugin: copy it from the build directory to your PATH if you want it), and
# cni-migrate next to them (scripts/migrate.sh runs it; no runtime ever
# does), and the systemd unit that runs `cni-migrate resync` after nftables.service starts or
# reloads (cni-resync.service; docs/node-operations.md).
#   scripts/install.sh [--force] [--from BUILD_DIR] [--unit-dir UNIT_DIR] [DIR]
#   scripts/install.sh --restore [--unit-dir UNIT_DIR] [DIR]
# Refuses to replace existing files (e.g. the upstream Go plugins) unless --force is given;
# with --force each replaced file is kept as <name>.orig once, so the switch can be undone.
# --from takes the binaries from BUILD_DIR instead of building them (scripts/build-release.sh).
# The unit goes to UNIT_DIR (default /etc/systemd/system, when that exists; given explicitly it
# is created) with DIR in its command lines; it is not enabled: enable it with
#   systemctl daemon-reload && systemctl enable --now cni-resync.service
# --restore puts every <name>.orig back (our binary is dropped), removes the unit (disabled
# first where systemd runs: it would rebuild our tables after to-upstream removed them), then
# tells you to run `scripts/migrate.sh to-upstream` so upstream's plugins find their own form of
# the running pods (docs/switching.md). cni-migrate stays for that.
# Files are installed atomically (copy to a temporary name, then rename), so a runtime that
# execs a plugin during the install sees either the old or the new binary, never a torn one.
# Every temporary file is created exclusively by mktemp (O_EXCL, a random name) and renamed
# with mv -T: nothing planted in the directory (a link at a predictable name) is written
# through or followed.
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
# directories given relative to where the script was started
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac }

force=0
restore=0
dest=/opt/cni/bin
from=
unit_dir=
while (($#)); do
    case "$1" in
    --force) force=1 ;;
    --restore) restore=1 ;;
    --from | --unit-dir)
        if (($# < 2)); then
            echo "$1 needs a directory" >&2
            exit 2
        fi
        if [ "$1" = --from ]; then from=$(absolute "$2"); else unit_dir=$(absolute "$2"); fi
        shift
        ;;
    -h | --help)
        sed -n '2,/^set -/p' "$0" | grep '^#'
        exit 0
        ;;
    -*)
        echo "unknown option $1" >&2
        exit 2
        ;;
    *) dest=$(absolute "$1") ;;
    esac
    shift
done

unit=cni-resync.service
# systemctl only for the machine's own unit directory, and only where systemd runs
if [ -z "$unit_dir" ]; then
    unit_dir=/etc/systemd/system
    [ -d "$unit_dir" ] || unit_dir=
    systemd_here=0
    [ -n "$unit_dir" ] && [ -d /run/systemd/system ] && systemd_here=1
else
    systemd_here=0
fi

# Remove the unit and the links `systemctl enable` made for it.
remove_unit() {
    [ -n "$unit_dir" ] && [ -e "$unit_dir/$unit" ] || return 1
    if ((systemd_here)); then
        systemctl disable --now "$unit" >/dev/null 2>&1 || true
    fi
    find "$unit_dir" -maxdepth 2 -path "$unit_dir/*.wants/$unit" -type l -delete
    rm -f "$unit_dir/$unit"
    if ((systemd_here)); then
        systemctl daemon-reload || true
    fi
    echo "removed $unit_dir/$unit"
}

names=(loopback bridge host-local portmap bandwidth firewall ptp tuning)

# put SRC DEST MODE: copy SRC to DEST atomically, through a temporary file this call created
# exclusively beside DEST; MODE "keep" keeps SRC's mode and times (cp -p), else chmod MODE.
put() {
    local src=$1 dst=$2 mode=$3 tmp
    tmp=$(mktemp "$(dirname "$dst")/.$(basename "$dst").XXXXXXXX")
    if [ "$mode" = keep ]; then
        cp -p -- "$src" "$tmp" || { rm -f -- "$tmp"; return 1; }
    else
        { cp -- "$src" "$tmp" && chmod "$mode" "$tmp"; } || { rm -f -- "$tmp"; return 1; }
    fi
    mv -f -T -- "$tmp" "$dst" || { rm -f -- "$tmp"; return 1; }
}

if ((restore)); then
    restored=()
    for n in "${names[@]}"; do
        if [ -e "$dest/$n.orig" ]; then
            # atomic: a runtime exec'ing the plugin meanwhile gets one binary or the other
            put "$dest/$n.orig" "$dest/$n" keep
            rm -f "$dest/$n.orig"
            restored+=("$n")
            echo "restored $dest/$n"
        elif [ -e "$dest/$n" ]; then
            echo "kept $dest/$n (no $n.orig to put back)"
        fi
    done
    unit_removed=0
    remove_unit && unit_removed=1
    if ((${#restored[@]} == 0 && !unit_removed)); then
        echo "nothing to restore in $dest (no <name>.orig files)" >&2
        exit 1
    fi
    cat <<MSG

The original plugins are back. Pods created or adopted while ours were installed still have
their masquerading and host ports in our nftables tables, which the restored plugins do not
know. Now run, as root, on this node:

    scripts/migrate.sh to-upstream --cni-bin-dir $dest

(add --backend nftables when the restored plugins are v1.6+ configured with ipMasqBackend /
backend "nftables"). It rewrites them into the restored plugins' form (so their CHECK and DEL
of those pods work) and then removes our tables. See docs/switching.md.
MSG
    exit 0
fi

if [ -n "$from" ]; then
    bin=$(cd "$from" && pwd)
else
    bin=$(scripts/build-release.sh)
fi
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
    if [ -e "$dest/$n" ] && [ ! -e "$dest/$n.orig" ] && [ ! -L "$dest/$n.orig" ]; then
        put "$dest/$n" "$dest/$n.orig" keep
    fi
    put "$bin/$n" "$dest/$n" 0755
    echo "installed $dest/$n"
done
if [ -x "$bin/cni-migrate" ]; then
    put "$bin/cni-migrate" "$dest/cni-migrate" 0755
    echo "installed $dest/cni-migrate (run by scripts/migrate.sh and the resync unit, never by a runtime)"
fi

# The resync unit, with this bin directory in its command lines (systemd wants an absolute
# path without specifiers or quoting: anything else is refused and the unit left out).
if [ -n "$unit_dir" ] && [ -x "$dest/cni-migrate" ]; then
    abs=$(cd "$dest" && pwd)
    if [[ ! "$abs" =~ ^/[A-Za-z0-9/._+-]*$ ]]; then
        echo "not installing $unit: $abs has characters a systemd command line would need quoted" >&2
    else
        mkdir -p "$unit_dir"
        rendered=$(mktemp)
        trap 'rm -f -- "$rendered"' EXIT
        sed "s|@BIN_DIR@|$abs|g" scripts/systemd/$unit >"$rendered"
        put "$rendered" "$unit_dir/$unit" 0644
        echo "installed $unit_dir/$unit (runs cni-migrate resync after nftables.service starts or reloads)"
        if ((systemd_here)); then
            systemctl daemon-reload || true
        fi
        if [ ! -L "$unit_dir/nftables.service.wants/$unit" ]; then
            echo "  not enabled; to enable: systemctl daemon-reload && systemctl enable --now $unit"
        fi
    fi
fi
