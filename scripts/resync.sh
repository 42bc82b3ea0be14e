#!/usr/bin/env bash
# Rebuild the host state our plugins own for every running attachment, after the firewall was
# reloaded: Debian's /etc/nftables.conf starts with `flush ruleset`, so `systemctl reload
# nftables` (or any `nft flush ruleset`) deletes the pods' masquerading and host ports, and no
# runtime notices. Needs root; runs in the network namespace it is started in (the node's).
#   scripts/resync.sh [--dry-run] [--cache-dir DIR]... [--cni-bin-dir DIR]
# For every attachment in libcni's cache (--cache-dir, default /var/lib/cni: what containerd,
# CRI-O, Podman and cnitool write) whose network namespace still exists: bridge's ipMasq and
# macspoofchk rules, portmap's host ports and its table (the localnet guard included), and
# bandwidth's buckets, ifb and redirect are checked the way each plugin's CHECK checks them and
# rebuilt where something is missing. Attachments whose pod is gone and plugins that are not
# ours (or not installed as our build in --cni-bin-dir, default /opt/cni/bin) are skipped, with a
# line saying so. Idempotent; --dry-run prints what it would rebuild and changes nothing.
# Exit status:
#    0  everything was intact, or nothing of ours to rebuild (nothing was changed)
#   10  something was rebuilt (--dry-run: would be); each line says what
#    1  some attachment could not be judged or rebuilt (the others were); lines say why
#    2  refused before looking (bad usage, not root, another resync held the lock 60 s)
# The work is done by `cni-migrate resync` (tools/migrate; found as scripts/migrate.sh finds
# it: in --cni-bin-dir, /opt/cni/bin, CNI_MIGRATE=<path>, else the release build of this
# checkout), which scripts/install.sh installs next to the plugins, together with the systemd
# unit that runs it whenever nftables.service starts, restarts or reloads
# (scripts/systemd/cni-resync.service). docs/node-operations.md has the details.
set -euo pipefail

case "${1:-}" in
-h | --help)
    sed -n '2,/^set -/p' "$0" | grep '^#'
    exit 0
    ;;
esac
exec "$(dirname "$0")/migrate.sh" resync "$@"
