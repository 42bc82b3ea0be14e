#!/usr/bin/env bash
# The main job, end to end on this machine, touching nothing outside scratch namespaces:
# build the suite, install it into a scratch CNI_PATH, attach a scratch container namespace
# through a conflist with our cnitool, show the result, detach and clean up.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/demo.sh needs root (it creates network namespaces)" >&2
    exit 1
fi
scripts/install-deps.sh

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

work=$(mktemp -d /tmp/cni-demo.XXXXXX)
host=cni-demo-host-$$
ctr=cni-demo-ctr-$$
cleanup() {
    ip netns del "$ctr" 2>/dev/null || true
    ip netns del "$host" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

say "build (static release binaries)"
bin=$(scripts/build-release.sh)

say "install into a scratch CNI_PATH: $work/bin"
scripts/install.sh "$work/bin" >/dev/null
ls -l "$work/bin"

say "scratch namespaces: host=$host container=$ctr"
ip netns add "$host"
ip netns add "$ctr"

mkdir -p "$work/net.d"
cat >"$work/net.d/99-loopback.conflist" <<'CONF'
{ "cniVersion": "1.1.0", "name": "demo-loopback", "plugins": [ { "type": "loopback" } ] }
CONF
cat "$work/net.d/99-loopback.conflist"

cnitool() {
    ip netns exec "$host" env CNI_PATH="$work/bin" NETCONFPATH="$work/net.d" \
        CNI_CACHE_DIR="$work/cache" "$bin/cnitool" "$@"
}

say "cnitool add demo-loopback /run/netns/$ctr"
cnitool add demo-loopback "/run/netns/$ctr"
ip -n "$ctr" -br addr show dev lo

say "cnitool check"
cnitool check demo-loopback "/run/netns/$ctr" && echo "CHECK ok"

say "cnitool del"
cnitool del demo-loopback "/run/netns/$ctr"
ip -n "$ctr" -br link show dev lo

say "done: everything is cleaned up on exit"
