#!/usr/bin/env python3
"""Regenerate nft-golden.txt: the nf_tables messages `nft` sends for each command below, captured
with `strace -e write=<fd>` in a scratch network namespace (run as root:
`unshare -n python3 capture-nft.py > nft-golden.txt`). Batch begin/end and GET requests are
left out; each line is `<name> <hex of one message>` (a command may send several messages)."""
import re, struct, subprocess, sys, tempfile

SETS = """table inet cni_nft_test {
    map hp4 { type inet_proto . inet_service : ipv4_addr . inet_service; }
    map hip6 { type ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service; }
    map owner { type ipv6_addr . inet_proto . inet_service : ipv6_addr; }
    map claims { type ipv6_addr . inet_proto . inet_service . ipv6_addr : ipv6_addr . inet_service; }
    set masq4 { type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval; }
    set masq6 { type ipv6_addr . ipv6_addr . inet_proto . inet_service; flags interval; }
    map gates { type nf_proto : verdict; }
    set iv { type ipv4_addr; flags interval; }
    chain gate4 { }
    chain gate6 { }
}
"""
T = "inet cni_nft_test"
MASQ = "inet cni_plugins_masquerade"
CASES = [
    ("gates", SETS, f"add element {T} gates {{ ipv4 : jump gate4, ipv6 : jump gate6 }}"),
    ("owner", SETS, f'add element {T} owner {{ ::ffff:0.0.0.0 . tcp . 8080 comment "n,c,eth0" : 1234::1 }}'),
    ("owner-create", SETS, f'create element {T} owner {{ ::ffff:0.0.0.0 . tcp . 8080 : 1234::1 }}'),
    ("claims", SETS, f'add element {T} claims {{ ::ffff:0.0.0.0 . tcp . 8080 . 1234::1 comment "n,c,eth0" : ::ffff:10.0.0.5 . 80 }}'),
    ("hp4", SETS, f'add element {T} hp4 {{ tcp . 8080 comment "n,c,eth0" : 10.0.0.5 . 80 }}'),
    ("hip6", SETS, f'add element {T} hip6 {{ fd00::1 . udp . 53 comment "n,c,eth0" : fd00::5 . 5353 }}'),
    ("masq4-prefix", SETS, f'add element {T} masq4 {{ 10.0.0.0/24 . 10.0.0.5 . tcp . 80 comment "n,c,eth0" }}'),
    ("masq4-addr", SETS, f'add element {T} masq4 {{ 127.0.0.1 . 10.0.0.5 . tcp . 80 comment "n,c,eth0" }}'),
    ("masq6-all", SETS, f'add element {T} masq6 {{ ::/0 . fd00::5 . sctp . 80 comment "n,c,eth0" }}'),
    ("interval", SETS, f'add element {T} iv {{ 10.0.0.0/24 comment "x" }}'),
    ("del-owner", SETS + f"add element {T} owner {{ ::ffff:0.0.0.0 . tcp . 8080 : 1234::1 }}\n",
     f"delete element {T} owner {{ ::ffff:0.0.0.0 . tcp . 8080 }}"),
    ("del-masq4", SETS + f"add element {T} masq4 {{ 10.0.0.0/24 . 10.0.0.5 . tcp . 80 }}\n",
     f"delete element {T} masq4 {{ 10.0.0.0/24 . 10.0.0.5 . tcp . 80 }}"),
    ("masq-table", "", f'add table {MASQ} {{ comment "Masquerading for plugins from github.com/containernetworking/plugins" ; }}'),
    ("masq-chain", f"add table {MASQ}\n",
     f'add chain {MASQ} masq_checks {{ comment "Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet" ; }}'),
    ("masq-hook", f"add table {MASQ}\n", f"add chain {MASQ} postrouting {{ type nat hook postrouting priority srcnat ; }}"),
    ("flush", f"add table {MASQ}\nadd chain {MASQ} postrouting\n", f"flush chain {MASQ} postrouting"),
    ("mcast4", f"add table {MASQ}\nadd chain {MASQ} postrouting\n", f"add rule {MASQ} postrouting ip daddr 224.0.0.0/4 return"),
    ("mcast6", f"add table {MASQ}\nadd chain {MASQ} postrouting\n", f"add rule {MASQ} postrouting ip6 daddr ff00::/8 return"),
    ("goto", f"add table {MASQ}\nadd chain {MASQ} postrouting\nadd chain {MASQ} masq_checks\n",
     f"add rule {MASQ} postrouting goto masq_checks"),
    ("masq4", f"add table {MASQ}\nadd chain {MASQ} masq_checks\n",
     f'add rule {MASQ} masq_checks ip saddr 10.1.0.5 ip daddr != 10.1.0.0/24 masquerade comment "abc, net: x"'),
    ("masq4-12", f"add table {MASQ}\nadd chain {MASQ} masq_checks\n",
     f'add rule {MASQ} masq_checks ip saddr 10.1.0.5 ip daddr != 10.16.0.0/12 masquerade comment "c12"'),
    ("masq6", f"add table {MASQ}\nadd chain {MASQ} masq_checks\n",
     f'add rule {MASQ} masq_checks ip6 saddr fd00:1::5 ip6 daddr != fd00:1::/64 masquerade comment "c6"'),
    ("masq6-57", f"add table {MASQ}\nadd chain {MASQ} masq_checks\n",
     f'add rule {MASQ} masq_checks ip6 saddr fd00:1::5 ip6 daddr != fd00:1::/57 masquerade comment "c57"'),
    ("masq4-0", f"add table {MASQ}\nadd chain {MASQ} masq_checks\n",
     f'add rule {MASQ} masq_checks ip saddr 10.1.0.5 ip daddr != 0.0.0.0/0 masquerade comment "c0"'),
    ("masq-nonlocal", f"add table {MASQ}\nadd chain {MASQ} masq_checks\n",
     f'add rule {MASQ} masq_checks ip saddr 10.244.3.7 ip daddr != 10.0.0.0/8 ip daddr != 192.168.0.0/16 fib daddr type != local masquerade comment "nm"'),
    ("br-table", "", "add table bridge nat"),
    ("br-base", "add table bridge nat\n",
     "add chain bridge nat PREROUTING { type filter hook prerouting priority -300 ; policy accept ; }"),
    ("br-chain", "add table bridge nat\n", "add chain bridge nat cni-br-iface-c0ffee-eth0"),
    ("br-jump", "add table bridge nat\nadd chain bridge nat PREROUTING\nadd chain bridge nat cni-br-iface-c0ffee-eth0\n",
     'add rule bridge nat PREROUTING iifname "veth1234abcd" jump cni-br-iface-c0ffee-eth0 comment "macspoofchk-c0ffee-eth0"'),
    ("br-mac", "add table bridge nat\nadd chain bridge nat m\n",
     'add rule bridge nat m ether saddr 0a:58:0a:01:00:05 return comment "macspoofchk-c0ffee-eth0"'),
    ("br-drop", "add table bridge nat\nadd chain bridge nat m\n", 'add rule bridge nat m drop comment "macspoofchk-c0ffee-eth0"'),
]

def nft_file(text):
    f = tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False)
    f.write(text + "\n")
    f.close()
    return f.name

def capture(cases):
    """Print `<name> <hex>` for every message nft sends for each (name, setup, command): new and
    deleted tables, chains, rules, sets and elements (a plugin's own captures may reuse this)."""
    for name, setup, cmd in cases:
        subprocess.run(["nft", "flush", "ruleset"], check=True)
        if setup:
            subprocess.run(["nft", "-f", nft_file(setup)], check=True)
        p = subprocess.run(["strace", "-e", "trace=sendmsg", "-e", "write=3", "nft", "-f", nft_file(cmd)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{name}: nft failed: {p.stderr[-1000:]}")
        data = bytearray()
        for line in p.stderr.splitlines():
            m = re.match(r"^ \| [0-9a-f]{5}  ((?:[0-9a-f]{2} {1,2})+)", line)
            if m:
                data += bytes.fromhex(m.group(1).replace(" ", ""))
        off = 0
        while off + 16 <= len(data):
            ln, ty = struct.unpack_from("=IH", data, off)
            # NEWTABLE, DELTABLE, NEWCHAIN, DELCHAIN, NEWRULE, DELRULE, NEWSET, DELSET, NEWSETELEM, DELSETELEM
            if ty >> 8 == 10 and (ty & 0xff) in (0, 2, 3, 5, 6, 8, 9, 11, 12, 14):
                print(name, data[off:off + ln].hex())
            off += (ln + 3) & ~3

if __name__ == "__main__":
    capture(CASES)
