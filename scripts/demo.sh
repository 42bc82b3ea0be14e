#!/usr/bin/env bash
# Demo: two "pods" on a kubenet-style cbr0 bridge, wired up by the whole chain (bridge +
# host-local, portmap, bandwidth, plus the loopback list) through our cnitool; a ping from one
# pod to the other, a TCP connection from an "outside" machine through a hostPort, the shaping
# in place, CHECK, DEL. Everything happens in scratch network namespaces and a
# scratch directory: the machine's own interfaces, routes, firewall and /var/lib/cni are not
# touched, and everything is removed at the end, also when a step fails. Needs root.
#
#   scripts/demo.sh            # build, run, clean up
#   KEEP=1 scripts/demo.sh     # stop before cleaning up (press Enter to finish)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }

if [ "$(id -u)" != 0 ]; then
    echo "scripts/demo.sh needs root (it creates network namespaces)" >&2
    exit 1
fi

step "Build the plugins and cnitool (static release binaries)"
scripts/install-deps.sh
bin=$(scripts/build-release.sh)
echo "built into $bin"

# Scratch state. The names carry our pid so two demos never collide.
work=$(mktemp -d /tmp/cni-demo.XXXXXX)
host=cni-demo-host-$$
pod_a=cni-demo-a-$$
pod_b=cni-demo-b-$$
outside=cni-demo-out-$$
export CNI_PATH=$work/bin NETCONFPATH=$work/net.d CNI_CACHE_DIR=$work/cache

# cnitool, run inside the scratch "host" namespace, as a runtime would run it on a node.
cnitool() { ip netns exec "$host" "$work/bin/cnitool" "$@"; }

cleanup() {
    set +e
    step "Clean up"
    for pod in "$pod_a" "$pod_b"; do
        if [ -e "/run/netns/$pod" ]; then
            cnitool del kubenet "/run/netns/$pod" 2>/dev/null
            cnitool del kubenet-loopback "/run/netns/$pod" 2>/dev/null
        fi
    done
    [ -n "${server:-}" ] && kill "$server" 2>/dev/null
    for ns in "$pod_a" "$pod_b" "$outside" "$host"; do
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$work"
    echo "removed the namespaces $host $pod_a $pod_b $outside and $work"
}
trap cleanup EXIT

step "Install the plugins into a scratch CNI_PATH ($CNI_PATH)"
mkdir -p "$CNI_PATH" "$NETCONFPATH" "$CNI_CACHE_DIR"
for p in bridge host-local loopback portmap bandwidth firewall ptp tuning cnitool; do
    if [ -x "$bin/$p" ]; then
        cp "$bin/$p" "$CNI_PATH/"
    fi
done
ls "$CNI_PATH"

step "Write the network configuration (conf-examples/10-kubenet.conflist, pod CIDR 10.244.3.0/24)"
# The example with two local changes: a scratch dataDir, and IPv4 only to keep the output short.
cat >"$NETCONFPATH/10-kubenet.conflist" <<EOF
{
  "cniVersion": "1.1.0",
  "name": "kubenet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cbr0",
      "isGateway": true,
      "hairpinMode": true,
      "autoMtu": true,
      "ipMasq": true,
      "nonMasqueradeCIDRs": ["10.244.0.0/16"],
      "ipam": {
        "type": "host-local",
        "dataDir": "$work/ipam",
        "ranges": [[{ "subnet": "10.244.3.0/24" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true }, "snat": true },
    { "type": "bandwidth", "capabilities": { "bandwidth": true } }
  ]
}
EOF
cp conf-examples/99-loopback.conflist "$NETCONFPATH/"
cat "$NETCONFPATH/10-kubenet.conflist"

step "Create a scratch host namespace, two pod namespaces and an outside machine"
run ip netns add "$host"
ip netns exec "$host" ip link set lo up
run ip netns add "$pod_a"
run ip netns add "$pod_b"
run ip netns add "$outside"
# The outside machine reaches the host over a link of its own: 192.168.100.2 -> .1
ip link add demo-up netns "$host" type veth peer name eth0 netns "$outside"
ip -n "$host" addr add 192.168.100.1/24 dev demo-up
ip -n "$host" link set demo-up up
ip -n "$outside" addr add 192.168.100.2/24 dev eth0
ip -n "$outside" link set eth0 up
ip -n "$outside" link set lo up

# What a kubelet passes for pod a: hostPort 8080 -> 80 and the bandwidth annotations.
caps_a='{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}],
 "bandwidth":{"ingressRate":10000000,"ingressBurst":1000000,"egressRate":10000000,"egressBurst":1000000}}'

declare -A pod_ip
for pod in "$pod_a" "$pod_b"; do
    step "ADD: attach $pod to the network (cnitool add kubenet /run/netns/$pod)"
    cnitool add kubenet-loopback "/run/netns/$pod" >/dev/null
    caps=""
    if [ "$pod" = "$pod_a" ]; then
        caps=$caps_a
        echo "CAP_ARGS=$caps"
    fi
    result=$(CAP_ARGS=$caps cnitool add kubenet "/run/netns/$pod")
    echo "$result"
    pod_ip[$pod]=$(echo "$result" | grep -o '"address": "[0-9.]*' | head -1 | cut -d'"' -f4)
done

step "What the host namespace looks like now"
run ip -netns "$host" -br addr show
run ip -netns "$host" -br link show master cbr0
run ip netns exec "$host" nft list table inet cni_plugins_masquerade
run ip netns exec "$host" nft list table inet cni_portmap
run ip netns exec "$host" tc qdisc show

step "Inside pod $pod_a"
run ip -netns "$pod_a" -br addr show
run ip -netns "$pod_a" route show

step "Ping across the bridge: $pod_a -> $pod_b (${pod_ip[$pod_b]}) and to the gateway"
run ip netns exec "$pod_a" ping -c 3 -W 2 "${pod_ip[$pod_b]}"
run ip netns exec "$pod_b" ping -c 1 -W 2 10.244.3.1

step "hostPort: the outside machine connects to 192.168.100.1:8080, DNATed to $pod_a:80"
ip netns exec "$pod_a" socat TCP-LISTEN:80,fork,reuseaddr SYSTEM:'echo hello from pod a' &
server=$!
# wait until the server listens (bounded poll, no fixed sleep)
for _ in $(seq 100); do
    ip netns exec "$pod_a" ss -ltn 'sport = :80' | grep -q LISTEN && break
    sleep 0.05
done
run ip netns exec "$outside" socat -T 5 - TCP:192.168.100.1:8080 </dev/null
kill "$server" 2>/dev/null
server=""

step "CHECK: the plugins verify the state they created"
CAP_ARGS=$caps_a run cnitool check kubenet "/run/netns/$pod_a" && echo "CHECK passed"

step "DEL: detach both pods"
for pod in "$pod_a" "$pod_b"; do
    caps=""
    [ "$pod" = "$pod_a" ] && caps=$caps_a
    CAP_ARGS=$caps run cnitool del kubenet "/run/netns/$pod"
    cnitool del kubenet-loopback "/run/netns/$pod"
done
run ip -netns "$pod_a" -br link show
run ip -netns "$host" -br link show
echo "host-local reservations left: $(find "$work/ipam" -type f -name '10.*' | wc -l)"
run ip netns exec "$host" nft list map inet cni_portmap hp4

if [ -n "${KEEP:-}" ]; then
    read -r -p "KEEP is set: press Enter to clean up " _
fi
