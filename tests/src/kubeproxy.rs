//! What kube-proxy in iptables mode (nf_tables backend: `iptables-nft`) installs on a node, for
//! a given number of ClusterIP services, loaded into a scratch host namespace with one
//! `iptables-nft-restore`: for the kube-proxy-loaded benchmark and its functional test.
//!
//! The shape follows kube-proxy's iptables proxier (`pkg/proxy/iptables/proxier.go`): the
//! `nat` base chains jump to `KUBE-SERVICES` (PREROUTING, OUTPUT) and `KUBE-POSTROUTING`;
//! `KUBE-MARK-MASQ` sets mark 0x4000 and `KUBE-POSTROUTING` masquerades marked packets; per
//! service port one `KUBE-SERVICES` rule to its `KUBE-SVC-…` chain, which marks traffic from
//! outside the cluster CIDR for masquerading and picks an endpoint chain with `statistic`
//! (`--probability 1/(n-i)`, the last one unconditional); per endpoint a `KUBE-SEP-…` chain
//! marking hairpin traffic and DNATing to the endpoint; `KUBE-SERVICES` ends with the
//! `addrtype LOCAL` jump to `KUBE-NODEPORTS`. The `filter` table gets kube-proxy's forward,
//! firewall and service chains with their jumps. With two endpoints per service that is 8
//! `nat` rules per service: 5 000 services ≈ 40 000 rules.

use crate::Netns;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::Stdio;

/// Endpoints per service.
pub const ENDPOINTS: usize = 2;

/// The cluster (pod) CIDR kube-proxy is told about (`--cluster-cidr`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// A 16-character chain suffix, like kube-proxy's base32 hash of the service port name.
fn chain_hash(kind: &str, name: &str) -> String {
    // FNV-1a, 64 bits, then 16 characters of base32 (kube-proxy: sha256, base32, first 16).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in kind.bytes().chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut s = String::with_capacity(16);
    let mut x = u128::from(h) | (u128::from(h.rotate_left(17)) << 64);
    for _ in 0..16 {
        s.push(ALPHABET[(x & 31) as usize] as char);
        x >>= 5;
    }
    s
}

/// The `iptables-nft-restore` input for `services` ClusterIP services (TCP port 80, two
/// endpoints each on port 8080), cluster IPs from 10.96.0.0/12, endpoints from
/// [`CLUSTER_CIDR`].
pub fn restore_input(services: usize) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    let n = |s: &mut String, line: std::fmt::Arguments<'_>| {
        s.write_fmt(line).unwrap();
        s.push('\n');
    };
    for i in 0..services {
        let name = format!("ns{}/svc-{i}:http", i % 50);
        let cluster_ip = format!("10.{}.{}.{}", 96 + (i >> 16), (i >> 8) & 255, i & 255);
        let svc = format!("KUBE-SVC-{}", chain_hash("svc", &name));
        n(&mut chains, format_args!(":{svc} - [0:0]"));
        n(
            &mut rules,
            format_args!(
                "-A KUBE-SERVICES -d {cluster_ip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport 80 -j {svc}"
            ),
        );
        n(
            &mut rules,
            format_args!(
                "-A {svc} ! -s {CLUSTER_CIDR} -d {cluster_ip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ"
            ),
        );
        for e in 0..ENDPOINTS {
            let k = i * ENDPOINTS + e + 2;
            let ep = format!("10.244.{}.{}", (k >> 8) & 255, k & 255);
            let sep = format!("KUBE-SEP-{}", chain_hash("sep", &format!("{name}{ep}")));
            n(&mut chains, format_args!(":{sep} - [0:0]"));
            let prob = if e + 1 < ENDPOINTS {
                format!(" -m statistic --mode random --probability {:.11}", 1.0 / (ENDPOINTS - e) as f64)
            } else {
                String::new()
            };
            n(
                &mut rules,
                format_args!("-A {svc} -m comment --comment \"{name} -> {ep}:8080\"{prob} -j {sep}"),
            );
            n(&mut rules, format_args!("-A {sep} -s {ep}/32 -m comment --comment {name} -j KUBE-MARK-MASQ"));
            n(
                &mut rules,
                format_args!(
                    "-A {sep} -p tcp -m comment --comment {name} -m tcp -j DNAT --to-destination {ep}:8080"
                ),
            );
        }
    }
    let mut s = String::new();
    s.push_str(
        "*nat\n\
         :PREROUTING ACCEPT [0:0]\n\
         :INPUT ACCEPT [0:0]\n\
         :OUTPUT ACCEPT [0:0]\n\
         :POSTROUTING ACCEPT [0:0]\n\
         :KUBE-SERVICES - [0:0]\n\
         :KUBE-NODEPORTS - [0:0]\n\
         :KUBE-POSTROUTING - [0:0]\n\
         :KUBE-MARK-MASQ - [0:0]\n",
    );
    s.push_str(&chains);
    s.push_str(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n",
    );
    s.push_str(&rules);
    s.push_str(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
         COMMIT\n\
         *filter\n\
         :INPUT ACCEPT [0:0]\n\
         :FORWARD ACCEPT [0:0]\n\
         :OUTPUT ACCEPT [0:0]\n\
         :KUBE-EXTERNAL-SERVICES - [0:0]\n\
         :KUBE-FORWARD - [0:0]\n\
         :KUBE-NODEPORTS - [0:0]\n\
         :KUBE-PROXY-FIREWALL - [0:0]\n\
         :KUBE-SERVICES - [0:0]\n\
         -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS\n\
         -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         COMMIT\n",
    );
    s
}

/// Load `services` services into `host` with one `iptables-nft-restore`. Fails the caller
/// loudly when `iptables-nft-restore` is missing (scripts/install-deps.sh installs iptables).
pub fn load(host: &Netns, services: usize) {
    let input = restore_input(services);
    let mut child = host
        .command("iptables-nft-restore")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run iptables-nft-restore (scripts/install-deps.sh installs iptables)");
    child.stdin.take().unwrap().write_all(input.as_bytes()).expect("write the rules");
    let out = child.wait_with_output().expect("iptables-nft-restore");
    assert!(
        out.status.success(),
        "iptables-nft-restore of {services} services failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `iptables-nft-save` of `host` without counters and comment lines: to prove that something
/// left kube-proxy's rules untouched.
pub fn save(host: &Netns) -> String {
    let out = host.run("iptables-nft-save", &[]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| if l.starts_with(':') { l.split(" [").next().unwrap_or(l) } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many rules of `table` `iptables-nft-save` lists in `host`.
pub fn rule_count(host: &Netns, table: &str) -> usize {
    let out = host.run("iptables-nft-save", &["-t", table]);
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("-A ")).count()
}
