#!/usr/bin/env bash
# Install the system packages the tests, demo and benchmarks use, on Debian 12.
# Idempotent: does nothing (and needs no network) when everything is already there.
#   nftables                    nft: portmap, bridge ipMasq/macspoofchk
#   iproute2                    ip/tc for tests and the demo
#   containernetworking-plugins upstream Go plugins in /usr/lib/cni: interop tests, benchmarks
#   socat, conntrack, iputils-ping, procps, curl: traffic in end-to-end tests
#   podman, containerd, runc, busybox-static, util-linux: real-client tests
#     (tests/e2e/clients.rs, and tests/e2e/cri.rs through containerd's CRI plugin;
#     docs/real-clients.md); podman/containerd start no service here
#   iptables                    upstream portmap (iptables backend) in the portmap benchmark;
#                               iptables-nft-restore/-save for kube-proxy's rules (tests/e2e/kubeproxy.rs,
#                               the kube-proxy-loaded benchmark)
#   firewalld, dbus             tests/e2e/firewall_firewalld.rs: firewalld on a private bus in a scratch
#                               namespace (installed with services kept from starting: policy-rc.d)
#   strace                      scripts/bench.sh: where the time beyond the kernel floor goes
#   systemd                     systemd-analyze verify and systemctl --root of the resync unit
#                               (tests/e2e/resync.rs; nothing is started)
#   python3                     scripts/upstream-tests.sh: reads ginkgo's JSON reports
#   lintian, qemu-user-static   release checks (scripts/check-release.sh, scripts/test-arm64.sh):
#                               asked for with --only, so the release scripts install no more
# Usage: scripts/install-deps.sh [PACKAGE...]   the list above plus these
#        scripts/install-deps.sh --only PACKAGE...
set -euo pipefail

packages=(nftables iproute2 containernetworking-plugins socat conntrack iputils-ping procps kmod curl
    podman containerd runc busybox-static util-linux iptables strace systemd dbus firewalld python3)
if [ "${1:-}" = --only ]; then
    shift
    packages=()
fi
missing=()
for p in "${packages[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Nothing installed here may start a service on the machine (firewalld would take over its
    # firewall): Debian's maintainer scripts ask policy-rc.d first.
    own_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        own_policy=1
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
# br_netfilter backs the opt-in bridge-nf-call-iptables sysctl; load it when available.
modprobe br_netfilter 2>/dev/null || true
