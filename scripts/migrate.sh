#!/usr/bin/env bash
# Move the host state of running attachments between this suite's nftables layout and the
# iptables form of upstream's plugins 1.1.1 (Debian's containernetworking-plugins), in the
# network namespace this runs in (the node's, normally). Needs root. Idempotent, safe with pods
# running: the new form is installed and verified before the old one is removed.
#   scripts/migrate.sh to-upstream   [--dry-run] [--cache-dir DIR]... [--data-dir DIR]... [--backend iptables|nftables]
#       after `scripts/install.sh --restore`: our masquerade rules and host ports become
#       upstream's iptables chains, so upstream's CHECK and DEL of every pod work; our tables go.
#       With --backend nftables (upstream v1.6+ configured with ipMasqBackend/backend
#       "nftables"; an attachment's cached configuration saying so has the same effect): host
#       ports become upstream's cni_hostport rules, and the masquerade rules stay (the table
#       inet cni_plugins_masquerade is upstream's own form).
#   scripts/migrate.sh from-upstream [--dry-run] [--cache-dir DIR]... [--data-dir DIR]... [--cni-bin-dir DIR]
#       after `scripts/install.sh --force`: upstream's iptables chains become our nftables
#       state (optional: our DEL, CHECK and GC handle upstream's form anyway).
# --cache-dir: libcni's cache (default /var/lib/cni); --data-dir: host-local's stores (default
# /var/lib/cni/networks); --cni-bin-dir: where our plugins are (default /opt/cni/bin).
#   scripts/migrate.sh resync [--dry-run] [--cache-dir DIR]... [--cni-bin-dir DIR]
#       rebuild the host state our plugins own for every running attachment, after the
#       firewall was reloaded: Debian's /etc/nftables.conf starts with `flush ruleset`, so
#       `systemctl reload nftables` (or any `nft flush ruleset`) deletes the pods' masquerading
#       and host ports, and no runtime notices. For every attachment in libcni's cache whose
#       network namespace still exists: bridge's ipMasq and macspoofchk rules, portmap's host
#       ports and its table (the localnet guard included), and bandwidth's buckets, ifb and
#       redirect are checked the way each plugin's CHECK checks them and rebuilt where something
#       is missing. Attachments whose pod is gone and plugins that are not ours (or not
#       installed as our build in --cni-bin-dir) are skipped, with a line saying so.
#       Idempotent; --dry-run prints what it would rebuild and changes nothing. Exit status:
#       0 everything intact or nothing of ours to rebuild; 10 something was rebuilt (--dry-run:
#       would be); 1 some attachment could not be judged or rebuilt (the others were); 2
#       refused before looking (bad usage, not root, another resync held the lock 60 s).
#       The systemd unit scripts/systemd/cni-resync.service, which scripts/install.sh installs,
#       runs it whenever nftables.service starts, restarts or reloads (docs/node-operations.md).
# The work is done by cni-migrate (tools/migrate), which scripts/install.sh installs next to
# the plugins; CNI_MIGRATE=<path> picks another one. docs/switching.md has the details.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

cmd=${1:-}
case "$cmd" in
to-upstream | from-upstream | resync) ;;
-h | --help | "")
    sed -n '2,/^set -/p' "$0" | grep '^#'
    exit 0
    ;;
*)
    echo "unknown command ${1}: use to-upstream, from-upstream or resync" >&2
    exit 2
    ;;
esac
if [ "$(id -u)" != 0 ]; then
    echo "scripts/migrate.sh needs root (it reads and changes the firewall); nothing was changed" >&2
    exit 2
fi
have_iptables=0
[ "$cmd" = resync ] && have_iptables=1 # resync touches only our own state
# upstream's nftables backend (v1.6+) needs no iptables; cni-migrate refuses if an attachment's
# cached configuration still asks for the iptables form
prev=
for a in "$@"; do
    [ "$prev" = --backend ] && [ "$a" = nftables ] && have_iptables=1
    prev=$a
done
for c in "$(command -v iptables 2>/dev/null || true)" /usr/sbin/iptables /sbin/iptables; do
    if [ -n "$c" ] && [ -f "$c" ] && [ -x "$c" ]; then
        have_iptables=1
        break
    fi
done
if ((!have_iptables)); then
    echo "iptables is not installed on this node: upstream's plugins need it (their bridge ipMasq and" >&2
    echo "portmap run iptables), so there is no upstream form to read or write. Install the iptables" >&2
    echo "package first. Nothing was changed." >&2
    exit 2
fi

bin_dir=/opt/cni/bin
prev=
for a in "$@"; do
    [ "$prev" = --cni-bin-dir ] && bin_dir=$a
    prev=$a
done

tool=${CNI_MIGRATE:-}
if [ -z "$tool" ]; then
    for c in "$bin_dir/cni-migrate" /opt/cni/bin/cni-migrate; do
        if [ -x "$c" ]; then
            tool=$c
            break
        fi
    done
fi
if [ -z "$tool" ]; then
    # not installed: use (or make) the release build of this checkout
    tool=$("$here/scripts/build-release.sh")/cni-migrate
fi
if [ "$cmd" = resync ]; then
    # judge the plugins a runtime runs, not those next to a build of cni-migrate
    exec "$tool" "$@" --cni-bin-dir "$bin_dir"
fi
exec "$tool" "$@"
