#!/usr/bin/env python3
"""Regenerate nft-golden.txt: the nf_tables messages `nft` 1.0.6 sends for each declaration of
portmap's table (plugins/portmap/src/wire), captured with `strace -e write=<fd>` in a scratch
network namespace by cni-common's capture script. Run as root:
`unshare -n python3 capture-nft.py > nft-golden.txt`. Each line is `<name> <hex of one message>`."""
import importlib.util, pathlib

_here = pathlib.Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "capture_nft", _here / "../../../cni-common/src/netlink/nft/testdata/capture-nft.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)

T = "inet cni_portmap"
# Every set of the table, in the order the unit test expects nft's cache to number them
# (rules naming an existing set carry its cache index as NFTA_LOOKUP_SET_ID).
SETS = [
    ("map", "hp4", "inet_proto . inet_service : ipv4_addr . inet_service"),
    ("map", "hip4", "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service"),
    ("map", "hp6", "inet_proto . inet_service : ipv6_addr . inet_service"),
    ("map", "hip6", "ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service"),
    ("map", "owner", "ipv6_addr . inet_proto . inet_service : ipv6_addr"),
    ("map", "claims", "ipv6_addr . inet_proto . inet_service . ipv6_addr : ipv6_addr . inet_service"),
    ("map", "netns", "ipv6_addr : ipv6_addr"),
    ("map", "gates", "nf_proto : verdict"),
    ("set", "net4_24", "ipv4_addr . ipv4_addr . inet_proto . inet_service"),
    ("set", "net4_32", "ipv4_addr . ipv4_addr . inet_proto . inet_service"),
    ("set", "net4_0", "ipv4_addr . inet_proto . inet_service"),
    ("set", "net6_64", "ipv6_addr . ipv6_addr . inet_proto . inet_service"),
    ("set", "net6_128", "ipv6_addr . ipv6_addr . inet_proto . inet_service"),
    ("set", "net6_0", "ipv6_addr . inet_proto . inet_service"),
]
CHAINS = ["prerouting", "output", "masquerading", "masquerade4", "masquerade6", "hostports4",
          "hostports6", "gate4", "gate6"]
FULL = "table %s {\n%s\n%s\n}\n" % (
    T,
    "\n".join(f"    {k} {n} {{ type {t}; }}" for k, n, t in SETS),
    "\n".join(f"    chain {c} {{ }}" for c in CHAINS),
)
# the table as the previous layout left it (plugins/portmap/README.md, "Upgrading")
LEGACY = f"""table {T} {{
    set masq4 {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval; }}
    set masq6 {{ type ipv6_addr . ipv6_addr . inet_proto . inet_service; flags interval; }}
}}
"""
H = "1234::1"
CASES = [("pm-table", "", f"add table {T}")]
CASES += [(f"pm-set-{n}", f"add table {T}\n", f"add {k} {T} {n} {{ type {t}; }}") for k, n, t in SETS]
CASES += [
    ("pm-prerouting", f"add table {T}\n", f"add chain {T} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}"),
    ("pm-output", f"add table {T}\n", f"add chain {T} output {{ type nat hook output priority -100; policy accept; }}"),
    ("pm-masquerading", f"add table {T}\n", f"add chain {T} masquerading {{ type nat hook postrouting priority srcnat; policy accept; }}"),
    ("pm-chain", f"add table {T}\n", f"add chain {T} hostports4"),
    ("pm-rule-gates", FULL, f"add rule {T} prerouting fib daddr type local meta nfproto vmap @gates"),
    ("pm-rule-hip4", FULL, f"add rule {T} hostports4 dnat ip to ip daddr . meta l4proto . th dport map @hip4"),
    ("pm-rule-hp4", FULL, f"add rule {T} hostports4 dnat ip to meta l4proto . th dport map @hp4"),
    ("pm-rule-hip6", FULL, f"add rule {T} hostports6 dnat ip6 to ip6 daddr . meta l4proto . th dport map @hip6"),
    ("pm-rule-hp6", FULL, f"add rule {T} hostports6 dnat ip6 to meta l4proto . th dport map @hp6"),
    ("pm-rule-gate4", FULL, f"add rule {T} gate4 meta nfproto ipv4 jump hostports4"),
    ("pm-rule-gate6", FULL, f"add rule {T} gate6 meta nfproto ipv6 jump hostports6"),
    ("pm-rule-masq4", FULL, f"add rule {T} masquerading ct status dnat meta nfproto ipv4 jump masquerade4"),
    ("pm-rule-masq6", FULL, f"add rule {T} masquerading ct status dnat meta nfproto ipv6 jump masquerade6"),
    ("pm-rule-net4_24", FULL, f"add rule {T} masquerade4 ip saddr & 255.255.255.0 . ip daddr . meta l4proto . th dport @net4_24 masquerade"),
    ("pm-rule-net4_32", FULL, f"add rule {T} masquerade4 ip saddr . ip daddr . meta l4proto . th dport @net4_32 masquerade"),
    ("pm-rule-net4_0", FULL, f"add rule {T} masquerade4 ip daddr . meta l4proto . th dport @net4_0 masquerade"),
    ("pm-rule-net6_64", FULL, f"add rule {T} masquerade6 ip6 saddr & ffff:ffff:ffff:ffff:: . ip6 daddr . meta l4proto . th dport @net6_64 masquerade"),
    ("pm-rule-net6_128", FULL, f"add rule {T} masquerade6 ip6 saddr . ip6 daddr . meta l4proto . th dport @net6_128 masquerade"),
    ("pm-rule-net6_0", FULL, f"add rule {T} masquerade6 ip6 daddr . meta l4proto . th dport @net6_0 masquerade"),
    ("pm-flush-gates", FULL, f"flush map {T} gates"),
    ("pm-gates", FULL, f"add element {T} gates {{ ipv4 : jump gate4, ipv6 : jump gate6 }}"),
    ("pm-delete-legacy", LEGACY, f"delete set {T} masq4"),
    # elements
    ("pm-elem-net4", FULL, f'add element {T} net4_24 {{ 10.0.0.0 . 10.0.0.5 . tcp . 80 comment "n,c,eth0" }}'),
    ("pm-elem-net6", FULL, f'add element {T} net6_64 {{ fd00:: . fd00::5 . udp . 53 comment "n,c,eth0" }}'),
    ("pm-elem-netns", FULL, f'add element {T} netns {{ {H} comment "/run/netns/cni-1" : ::f000:1:0:0:2a }}'),
    ("pm-elem-owner", FULL, f'add element {T} owner {{ ::ffff:0.0.0.0 . tcp . 8080 comment "n,c,eth0" : {H} }}'),
    ("pm-elem-claims", FULL, f'add element {T} claims {{ ::ffff:0.0.0.0 . tcp . 8080 . {H} comment "n,c,eth0" : ::ffff:10.0.0.5 . 80 }}'),
    ("pm-elem-hp4", FULL, f'add element {T} hp4 {{ tcp . 8080 comment "n,c,eth0" : 10.0.0.5 . 80 }}'),
    ("pm-elem-hip6", FULL, f'add element {T} hip6 {{ fd00::1 . udp . 53 comment "n,c,eth0" : fd00::5 . 5353 }}'),
    ("pm-elem-net4_0", FULL, f'add element {T} net4_0 {{ 10.0.0.5 . tcp . 80 comment "n,c,eth0" }}'),
    ("pm-del-net4", FULL + f"add element {T} net4_24 {{ 10.0.0.0 . 10.0.0.5 . tcp . 80 }}\n",
     f"delete element {T} net4_24 {{ 10.0.0.0 . 10.0.0.5 . tcp . 80 }}"),
    ("pm-del-netns", FULL + f"add element {T} netns {{ {H} : ::1 }}\n", f"delete element {T} netns {{ {H} }}"),
]

_common.capture(CASES)
