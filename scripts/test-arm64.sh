#!/usr/bin/env bash
# The arm64 release binaries, cross-built on x86_64, run under qemu's user-mode emulation
# (Debian's qemu-user-static; scripts/release.sh builds the tarball first). No binfmt_misc
# registration: every binary is run through a wrapper script that execs qemu-aarch64-static, so
# nothing on the machine changes. Needs root (the end-to-end suites make network namespaces).
#   scripts/test-arm64.sh [TARBALL]   default dist/cni-rs-linux-arm64-v<version>.tgz
#
# What runs:
#   * every binary of the tarball: each plugin's VERSION answer and about banner (version and the
#     commit its README names; identical to the amd64 build's when that tarball is beside it),
#     cnitool's and cni-migrate's usage;
#   * end-to-end suites with CNI_TEST_BIN_DIR pointing at the wrappers: loopback, host_local,
#     versions and cnitool_loopback whole (ADD/CHECK/DEL/GC/STATUS of loopback and host-local in
#     scratch namespaces, every spec version), and the bridge tests that use only links,
#     addresses and routes (ARM64_BRIDGE_TESTS below: bridge + host-local ADD/CHECK/DEL of every
#     version and family, pings between two containers, L2, DNS, port flags, bad input), but
#     host-local's four tests that need netns cookies (ARM64_NO_COOKIE_TESTS below, named when run).
# What cannot run under qemu-user (the kernel is the same x86_64 one; the limits are qemu's
# translation of netlink, linux-user/syscall.c): NETLINK_NETFILTER sockets are refused
# (EPROTONOSUPPORT), so nothing that uses nf_tables or conntrack — portmap, bridge's ipMasq and
# macspoofchk, GC and teardown that read the firewall — and NETLINK_ROUTE is translated for
# links, addresses and routes only, so tc (bandwidth: "list qdiscs: Not supported") fails. The
# bridge_ipam tests that read host-local's build identity from the binary file see the wrapper
# script instead. Those are covered by the amd64 run of the same code.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --only qemu-user-static
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
# The banner's version word: upstream's release ours matches, ours as build metadata
# (cni-common skel::BANNER_VERSION, which Nomad's fingerprint compares as upstream's).
upstream=$(sed -n 's/^pub const UPSTREAM_RELEASE: &str = "\(.*\)";$/\1/p' cni-common/src/skel.rs)
[ -n "$upstream" ] || { echo "$0: no UPSTREAM_RELEASE in cni-common/src/skel.rs" >&2; exit 1; }
tgz=${1:-dist/cni-rs-linux-arm64-v$version.tgz}
[ -f "$tgz" ] || {
    echo "test-arm64: $tgz is missing: build it with scripts/release.sh" >&2
    exit 1
}
qemu=$(command -v qemu-aarch64-static)
scratch=$(mktemp -d /tmp/cni-rs-arm64.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/arm64" "$scratch/bin"
tar -C "$scratch/arm64" -xzf "$tgz"
amd64=${tgz/-arm64-/-amd64-}
if [ "$amd64" != "$tgz" ] && [ -f "$amd64" ] && [ "$(uname -m)" = x86_64 ]; then
    mkdir "$scratch/amd64"
    tar -C "$scratch/amd64" -xzf "$amd64"
fi
fail() {
    echo "test-arm64: $*" >&2
    exit 1
}

plugins=(bandwidth bridge firewall host-local loopback portmap ptp tuning)
for b in "${plugins[@]}" cnitool cni-migrate; do
    printf '#!/bin/sh\nexec %s %s "$@"\n' "$qemu" "$scratch/arm64/$b" >"$scratch/bin/$b"
    chmod 0755 "$scratch/bin/$b"
done
commit=$(sed -n 's/^Built from commit \([0-9a-f]\{40\}\).*/\1/p' "$scratch/arm64/README.md")
[ -n "$commit" ] || fail "the tarball's README.md names no commit"
for p in "${plugins[@]}"; do
    ver=$(CNI_COMMAND=VERSION "$scratch/bin/$p" </dev/null)
    banner=$("$scratch/bin/$p" 2>&1 </dev/null)
    [[ "$ver" == '{"cniVersion":"1.1.0","supportedVersions":['*'"1.1.0"]}' ]] || fail "$p VERSION: $ver"
    [[ "$banner" == "CNI $p plugin v$upstream+cni-rs.$version (${commit:0:12}"*$'\n'"CNI protocol versions supported: "* ]] ||
        fail "$p banner: $banner"
    if [ -d "$scratch/amd64" ]; then
        [ "$ver" = "$(CNI_COMMAND=VERSION "$scratch/amd64/$p" </dev/null)" ] || fail "$p: VERSION differs from amd64's"
        [ "$banner" = "$("$scratch/amd64/$p" 2>&1 </dev/null)" ] || fail "$p: banner differs from amd64's"
    fi
    echo "arm64 $p: $(head -1 <<<"$banner"); VERSION $ver"
done
usage=$("$scratch/bin/cnitool" 2>&1 </dev/null || true)
[[ "$usage" == *"cnitool add    <net> <netns>"* ]] || fail "cnitool usage: $usage"
usage=$("$scratch/bin/cni-migrate" 2>&1 </dev/null || true)
[[ "$usage" == *"usage: cni-migrate to-upstream|from-upstream"* ]] || fail "cni-migrate usage: $usage"
echo "arm64 cnitool, cni-migrate: usage printed"

# The bridge tests that need nothing but links, addresses and routes.
ARM64_BRIDGE_TESTS=(
    add_check_del_every_version_and_family
    adopts_an_existing_bridge
    bad_input_is_refused_before_anything_changes
    creates_bridge_with_pinned_mac_and_accept_ra_off
    del_removes_the_interface_before_returning_and_can_defer_the_kernel_wait
    dns_from_ipam_resolv_conf_and_the_dns_override
    force_address_semantics
    l2_attachment_check_del_and_disabled_interface
    promisc_hairpin_and_port_isolation
    status_forwards_to_ipam
    two_containers_ping_each_other_and_the_gateway_dual_stack
)
# host-local's tests that need the netns cookie (SO_NETNS_COOKIE), which qemu-user's
# getsockopt does not translate: the binary reads 0 there, as on a kernel before 5.14, and then
# tells namespaces apart by nsfs inode only, so a dead pod whose inode a live one reused counts
# as live (the safe side): these tests assert the cookie and the reclaim it makes possible.
ARM64_NO_COOKIE_TESTS=(
    add_records_the_namespace_beside_each_reservation
    churn_with_random_namespace_deletion_never_gives_one_address_to_two_live_namespaces
    a_later_namespace_with_the_dead_ones_inode_number_does_not_keep_it_alive
    status_counts_a_provably_dead_reservation_as_room
)
for t in "${ARM64_NO_COOKIE_TESTS[@]}"; do
    echo "test-arm64: not run under qemu (no netns cookie there; run by the amd64 suite): host_local::$t"
done
export CNI_TEST_BIN_DIR=$scratch/bin
suites=(--test loopback --test host_local --test versions --test cnitool_loopback)
if cargo nextest --version >/dev/null 2>&1; then
    skip=$(printf 'test(=%s) | ' "${ARM64_NO_COOKIE_TESTS[@]}")
    cargo nextest run -p cni-tests "${suites[@]}" --no-fail-fast -E "not (${skip% | })"
    filter=$(printf 'test(=%s) | ' "${ARM64_BRIDGE_TESTS[@]}")
    cargo nextest run -p cni-tests --test bridge --no-fail-fast -E "${filter% | }"
else
    cargo test -p cni-tests "${suites[@]}" --no-fail-fast -- $(printf -- '--skip %s ' "${ARM64_NO_COOKIE_TESTS[@]}")
    cargo test -p cni-tests --test bridge --no-fail-fast -- --exact "${ARM64_BRIDGE_TESTS[@]}"
fi
echo "test-arm64: the arm64 binaries passed under $("$qemu" --version | head -1)" >&2
