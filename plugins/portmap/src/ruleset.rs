//! The nftables layout of portmap and the scripts that change it.
//!
//! One table, `inet cni_portmap`, whose rules never change with the number of mappings:
//!
//! ```text
//! prerouting  (nat, dstnat)   fib daddr type local meta nfproto vmap @gates
//! output      (nat, -100)     fib daddr type local meta nfproto vmap @gates
//! gates       nf_proto : verdict      ipv4 : jump gate4[_<fp>], ipv6 : jump gate6[_<fp>]
//! gate4[_fp]  [conditionsV4] jump hostports4          (the chain name fingerprints them)
//! hostports4  dnat ip to ip daddr . meta l4proto . th dport map @hip4
//!             dnat ip to meta l4proto . th dport map @hp4
//! hostports6  (the same for ip6, @hip6 / @hp6)
//! masquerading (nat, srcnat)  ct status dnat ip saddr . ip daddr . meta l4proto . th dport @masq4 masquerade
//!                             (the same for ip6 and @masq6)
//! ```
//!
//! Every mapping is a few elements, each carrying its owner in the element comment
//! (`<network>,<container id>,<ifname>`, see [`Owner`]):
//! - `owner` (`host address . proto . host port : owner hash`): the claim on the host port.
//!   Adding an element whose key exists with *other* data fails in the kernel (EEXIST), so a
//!   claim by another attachment makes the whole transaction fail atomically, while a repeated
//!   ADD of the same attachment is a no-op. This is what makes conflict detection safe against
//!   concurrent ADDs without a lock.
//! - `hp4`/`hip4`/`hp6`/`hip6`: the DNAT target for wildcard or host-IP-specific mappings.
//! - `masq4`/`masq6` (interval, concatenated): `source range . container IP . proto . container
//!   port` for which a DNATed connection is masqueraded: the container's subnet (hairpin and
//!   other containers on the same bridge), `127.0.0.1` (localhost, with `route_localnet`), or
//!   everything (`masqAll`).
//!
//! The gate element works like an owner claim for the table-wide conditions: the fast ADD
//! path re-adds `gates { ipv4 : jump gate4_<fp> }`, which fails when the installed conditions
//! differ (or the table does not exist yet), sending the ADD to the slow path that (re)builds
//! the static part.

use crate::config::{Conf, Fam, HostIp, Proto};
use cni_common::nft::quote;
use cni_common::{CniError, Result};
use ipnet::IpNet;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const FAMILY: &str = "inet";
pub const TABLE: &str = "cni_portmap";

/// Every set and map of the table that holds per-attachment elements.
pub const ELEMENT_SETS: [&str; 7] = ["owner", "hp4", "hip4", "hp6", "hip6", "masq4", "masq6"];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    h.finalize().into()
}

/// An identifier shortened to fit the 128-byte element comment: kept when short, else `=` and
/// a hash prefix. Network names and container ids are validated by the skeleton
/// (`[A-Za-z0-9][A-Za-z0-9_.-]*`), so they never contain `,`.
fn short(kind: &str, s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_string()
    } else {
        format!("={}", &hex(&sha(&[kind, s]))[..24])
    }
}

/// The network part of an owner tag, `<net>,`: GC selects this network's elements with it.
pub fn net_prefix(net: &str) -> String {
    format!("{},", short("net", net, 40))
}

/// Who an element belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `<network>,<container id>,<ifname>`, only characters that [`quote`] leaves alone.
    pub tag: String,
    /// The 128-bit claim value stored in the `owner` map.
    pub hash: Ipv6Addr,
}

impl Owner {
    pub fn new(net: &str, id: &str, ifname: &str) -> Owner {
        // ifnames may hold any byte but '/', ':' and whitespace: escape everything unusual.
        let mut ifn = String::new();
        for b in ifname.bytes() {
            if b.is_ascii_alphanumeric() || b"_.-".contains(&b) {
                ifn.push(b as char);
            } else {
                let _ = write!(ifn, "+{b:02X}");
            }
        }
        let tag = format!("{}{},{}", net_prefix(net), short("id", id, 64), short("if", &ifn, 15));
        let d = sha(&["owner", net, id, ifname]);
        let mut h = [0u8; 16];
        h.copy_from_slice(&d[..16]);
        Owner { tag, hash: Ipv6Addr::from(h) }
    }
}

/// A human-readable holder description from an element comment.
pub fn describe_holder(comment: Option<&str>) -> String {
    match comment.map(|c| c.splitn(3, ',').collect::<Vec<_>>()) {
        Some(p) if p.len() == 3 => {
            format!("network {:?}, container {:?}, interface {:?}", p[0], p[1], p[2])
        }
        Some(p) => format!("an element with comment {:?}", p.join(",")),
        None => "an element without owner comment (not created by this plugin?)".into(),
    }
}

/// One mapping for one address family, resolved against the container's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub fam: Fam,
    pub proto: Proto,
    pub host_port: u16,
    /// None: every local address of the family.
    pub host_ip: Option<IpAddr>,
    /// The container address with its subnet's prefix length.
    pub ctr: IpNet,
    pub ctr_port: u16,
}

/// Expand the mappings for the container's addresses. A hostIP of the other family is
/// skipped for that family, like upstream.
pub fn entries(conf: &Conf, v4: Option<IpNet>, v6: Option<IpNet>) -> Result<Vec<Entry>> {
    let mut out: Vec<Entry> = Vec::new();
    for m in &conf.mappings {
        for (fam, ctr) in [(Fam::V4, v4), (Fam::V6, v6)] {
            let Some(ctr) = ctr else { continue };
            let host_ip = match m.host_ip {
                HostIp::Any => None,
                HostIp::AnyOf(f) if f == fam => None,
                HostIp::AnyOf(_) => continue,
                HostIp::Addr(ip) if Fam::of(&ip) == fam => Some(ip),
                HostIp::Addr(_) => continue,
            };
            let e = Entry {
                fam,
                proto: m.proto,
                host_port: m.host_port,
                host_ip,
                ctr,
                ctr_port: m.container_port,
            };
            if out.contains(&e) {
                continue;
            }
            if let Some(o) = out.iter().find(|o| {
                o.fam == e.fam && o.proto == e.proto && o.host_port == e.host_port && o.host_ip == e.host_ip
            }) {
                return Err(CniError::config(format!(
                    "runtimeConfig.portMappings maps host port {}/{} twice (to container ports {} and {}), \
                     once with hostIP \"\" and once with an unspecified hostIP of the same family",
                    e.proto.as_str(),
                    e.host_port,
                    o.ctr_port,
                    e.ctr_port
                )));
            }
            out.push(e);
        }
    }
    Ok(out)
}

/// An element of one of our sets or maps, in nft's own notation (which is also how we
/// render listed elements, so the two compare as strings).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Elem {
    pub set: String,
    pub key: String,
    pub data: Option<String>,
}

impl Elem {
    fn new(set: &str, key: String, data: Option<String>) -> Elem {
        Elem { set: set.into(), key, data }
    }
}

fn owner_addr(e: &Entry) -> Ipv6Addr {
    match (e.host_ip, e.fam) {
        (Some(IpAddr::V4(a)), _) => a.to_ipv6_mapped(),
        (Some(IpAddr::V6(a)), _) => a,
        (None, Fam::V4) => Ipv4Addr::UNSPECIFIED.to_ipv6_mapped(),
        (None, Fam::V6) => Ipv6Addr::UNSPECIFIED,
    }
}

/// A prefix as nft prints it: a full-length prefix is a plain address.
fn prefix(net: IpNet) -> String {
    let net = net.trunc();
    if net.prefix_len() == net.max_prefix_len() {
        net.addr().to_string()
    } else {
        net.to_string()
    }
}

/// Whether an entry is one of the DNAT map elements.
pub fn dnat_set(e: &Entry) -> &'static str {
    match (e.fam, e.host_ip.is_some()) {
        (Fam::V4, false) => "hp4",
        (Fam::V4, true) => "hip4",
        (Fam::V6, false) => "hp6",
        (Fam::V6, true) => "hip6",
    }
}

/// The elements of one attachment, owner claims first.
pub fn elements(conf: &Conf, entries: &[Entry], owner: &Owner) -> Vec<Elem> {
    let mut out: Vec<Elem> = Vec::new();
    let mut push = |e: Elem| {
        if !out.contains(&e) {
            out.push(e);
        }
    };
    for e in entries {
        let p = e.proto.as_str();
        push(Elem::new(
            "owner",
            format!("{} . {p} . {}", owner_addr(e), e.host_port),
            Some(owner.hash.to_string()),
        ));
    }
    for e in entries {
        let p = e.proto.as_str();
        let key = match e.host_ip {
            None => format!("{p} . {}", e.host_port),
            Some(ip) => format!("{ip} . {p} . {}", e.host_port),
        };
        push(Elem::new(dnat_set(e), key, Some(format!("{} . {}", e.ctr.addr(), e.ctr_port))));
    }
    for e in entries {
        let (set, all) = match e.fam {
            Fam::V4 => ("masq4", "0.0.0.0/0"),
            Fam::V6 => ("masq6", "::/0"),
        };
        let tail = format!("{} . {} . {}", e.ctr.addr(), e.proto.as_str(), e.ctr_port);
        if conf.masq_all {
            push(Elem::new(set, format!("{all} . {tail}"), None));
        } else if conf.snat {
            push(Elem::new(set, format!("{} . {tail}", prefix(e.ctr)), None));
            if e.fam == Fam::V4 {
                push(Elem::new(set, format!("127.0.0.1 . {tail}"), None));
            }
        }
    }
    out
}

/// Names of the gate chains for the configured conditions.
pub fn gate_names(conf: &Conf) -> (String, String) {
    let name = |fam: &str, conds: &[String]| {
        if conds.is_empty() {
            format!("gate{fam}")
        } else {
            let parts: Vec<&str> = conds.iter().map(String::as_str).collect();
            format!("gate{fam}_{}", &hex(&sha(&parts))[..12])
        }
    };
    (name("4", &conf.conditions_v4), name("6", &conf.conditions_v6))
}

fn t() -> String {
    format!("{FAMILY} {TABLE}")
}

fn gates_element(conf: &Conf) -> String {
    let (g4, g6) = gate_names(conf);
    format!("add element {} gates {{ ipv4 : jump {g4}, ipv6 : jump {g6} }}\n", t())
}

fn add_line(e: &Elem, tag: &str) -> String {
    match &e.data {
        Some(d) => format!("add element {} {} {{ {} comment {} : {d} }}\n", t(), e.set, e.key, quote(tag)),
        None => format!("add element {} {} {{ {} comment {} }}\n", t(), e.set, e.key, quote(tag)),
    }
}

fn delete_line(set: &str, key: &str) -> String {
    format!("delete element {} {set} {{ {key} }}\n", t())
}

/// The table, its sets and chains and the static rules, rebuilt idempotently (flush + add),
/// plus the gate chains for `conf`'s conditions. `old_gates`: gate chains to remove.
pub fn setup_script(conf: &Conf, old_gates: &[String]) -> String {
    let (g4, g6) = gate_names(conf);
    let tn = t();
    let mut s = format!(
        "table {tn} {{\n\
         \tmap hp4 {{ type inet_proto . inet_service : ipv4_addr . inet_service; }}\n\
         \tmap hip4 {{ type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }}\n\
         \tmap hp6 {{ type inet_proto . inet_service : ipv6_addr . inet_service; }}\n\
         \tmap hip6 {{ type ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service; }}\n\
         \tmap owner {{ type ipv6_addr . inet_proto . inet_service : ipv6_addr; }}\n\
         \tset masq4 {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval; }}\n\
         \tset masq6 {{ type ipv6_addr . ipv6_addr . inet_proto . inet_service; flags interval; }}\n\
         \tmap gates {{ type nf_proto : verdict; }}\n\
         \tchain prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}\n\
         \tchain output {{ type nat hook output priority -100; policy accept; }}\n\
         \tchain masquerading {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         \tchain hostports4 {{ }}\n\
         \tchain hostports6 {{ }}\n\
         \tchain {g4} {{ }}\n\
         \tchain {g6} {{ }}\n\
         }}\n"
    );
    for c in ["prerouting", "output", "hostports4", "hostports6", "masquerading", &g4, &g6] {
        let _ = writeln!(s, "flush chain {tn} {c}");
    }
    for c in ["prerouting", "output"] {
        let _ = writeln!(s, "add rule {tn} {c} fib daddr type local meta nfproto vmap @gates");
    }
    let _ = writeln!(s, "add rule {tn} hostports4 dnat ip to ip daddr . meta l4proto . th dport map @hip4");
    let _ = writeln!(s, "add rule {tn} hostports4 dnat ip to meta l4proto . th dport map @hp4");
    let _ = writeln!(s, "add rule {tn} hostports6 dnat ip6 to ip6 daddr . meta l4proto . th dport map @hip6");
    let _ = writeln!(s, "add rule {tn} hostports6 dnat ip6 to meta l4proto . th dport map @hp6");
    let _ = writeln!(
        s,
        "add rule {tn} masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @masq4 masquerade"
    );
    let _ = writeln!(
        s,
        "add rule {tn} masquerading ct status dnat ip6 saddr . ip6 daddr . meta l4proto . th dport @masq6 masquerade"
    );
    let c4 = conf.conditions_v4.join(" ");
    let c6 = conf.conditions_v6.join(" ");
    let _ = writeln!(s, "add rule {tn} {g4} meta nfproto ipv4 {c4} jump hostports4");
    let _ = writeln!(s, "add rule {tn} {g6} meta nfproto ipv6 {c6} jump hostports6");
    let _ = writeln!(s, "flush map {tn} gates");
    s.push_str(&gates_element(conf));
    for g in old_gates {
        if *g != g4 && *g != g6 {
            let _ = writeln!(s, "delete chain {tn} {g}");
        }
    }
    s
}

/// A scratch table exercising the conditions alone (for `nft -c`), to tell a condition nft
/// rejects from other failures.
pub fn conditions_probe_script(conf: &Conf) -> String {
    format!(
        "table inet cni_portmap_probe {{\n\tchain c {{ }}\n}}\n\
         add rule inet cni_portmap_probe c meta nfproto ipv4 {} accept\n\
         add rule inet cni_portmap_probe c meta nfproto ipv6 {} accept\n",
        conf.conditions_v4.join(" "),
        conf.conditions_v6.join(" ")
    )
}

/// The fast ADD path: only element additions (cheap, no rule flushes). Fails when the table
/// is not set up for these conditions, or when a claim belongs to someone else, or when this
/// attachment's old elements differ.
pub fn fast_add_script(conf: &Conf, elems: &[Elem], owner: &Owner) -> String {
    let mut s = gates_element(conf);
    for e in elems {
        s.push_str(&add_line(e, &owner.tag));
    }
    s
}

/// The fast DEL path: every owner claim is first re-asserted (a no-op when it is ours, a
/// failure when it belongs to someone else), then everything is deleted. Fails (and changes
/// nothing) when any element is missing or not ours.
pub fn guarded_delete_script(elems: &[Elem], owner: &Owner) -> String {
    let mut s = String::new();
    for e in elems.iter().filter(|e| e.set == "owner") {
        s.push_str(&add_line(e, &owner.tag));
    }
    for e in elems {
        s.push_str(&delete_line(&e.set, &e.key));
    }
    s
}

/// Additions of `elems` not yet present, and deletions of `stale` listed elements.
pub fn change_script(add: &[&Elem], delete: &[&Listed], tag: &str) -> String {
    let mut s = String::new();
    for l in delete {
        s.push_str(&delete_line(&l.set, &l.key));
    }
    for e in add {
        s.push_str(&add_line(e, tag));
    }
    s
}

// ---- reading the table back ----

/// An element as listed by `nft -j list table`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub set: String,
    pub key: String,
    pub data: Option<String>,
    pub comment: Option<String>,
}

impl Listed {
    pub fn elem(&self) -> Elem {
        Elem { set: self.set.clone(), key: self.key.clone(), data: self.data.clone() }
    }
}

/// The parts of the table we reason about.
#[derive(Debug, Default)]
pub struct Listing {
    pub elems: Vec<Listed>,
    pub chains: Vec<String>,
    /// (chain, rule JSON text)
    pub rules: Vec<(String, String)>,
    /// gates map: (nfproto, verdict text)
    pub gates: Vec<(String, String)>,
}

/// Render an nft JSON value the way nft's text syntax writes it.
pub fn render(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Object(o) => {
            if let Some(Value::Array(parts)) = o.get("concat") {
                return parts.iter().map(render).collect::<Vec<_>>().join(" . ");
            }
            if let Some(p) = o.get("prefix") {
                return format!("{}/{}", render(&p["addr"]), render(&p["len"]));
            }
            if let Some(Value::Array(r)) = o.get("range") {
                return r.iter().map(render).collect::<Vec<_>>().join("-");
            }
            if let Some(e) = o.get("elem") {
                return render(&e["val"]);
            }
            for verdict in ["jump", "goto"] {
                if let Some(j) = o.get(verdict) {
                    return format!("{verdict} {}", render(&j["target"]));
                }
            }
            v.to_string()
        }
        other => other.to_string(),
    }
}

fn elem_comment(v: &Value) -> Option<String> {
    v.get("elem").and_then(|e| e.get("comment")).and_then(Value::as_str).map(str::to_string)
}

pub fn parse_listing(list: &[Value]) -> Listing {
    let mut l = Listing::default();
    for o in list {
        if let Some(c) = o.get("chain") {
            if let Some(n) = c.get("name").and_then(Value::as_str) {
                l.chains.push(n.to_string());
            }
            continue;
        }
        if let Some(r) = o.get("rule") {
            let chain = r.get("chain").and_then(Value::as_str).unwrap_or_default().to_string();
            l.rules.push((chain, r.get("expr").map(Value::to_string).unwrap_or_default()));
            continue;
        }
        let (set, is_map) = match (o.get("set"), o.get("map")) {
            (Some(s), _) => (s, false),
            (_, Some(m)) => (m, true),
            _ => continue,
        };
        let name = set.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let Some(Value::Array(items)) = set.get("elem") else { continue };
        for it in items {
            if name == "gates" {
                if let Value::Array(kv) = it {
                    if kv.len() == 2 {
                        l.gates.push((render(&kv[0]), render(&kv[1])));
                    }
                }
                continue;
            }
            let (k, d) = match (is_map, it) {
                (true, Value::Array(kv)) if kv.len() == 2 => (&kv[0], Some(&kv[1])),
                _ => (it, None),
            };
            l.elems.push(Listed {
                set: name.clone(),
                key: render(k),
                data: d.map(render),
                comment: elem_comment(k),
            });
        }
    }
    l
}

impl Listing {
    pub fn find(&self, set: &str, key: &str) -> Option<&Listed> {
        self.elems.iter().find(|x| x.set == set && x.key == key)
    }

    /// Elements owned by `owner` (by comment, or by claim value for the owner map).
    pub fn owned_by<'a>(&'a self, owner: &'a Owner) -> impl Iterator<Item = &'a Listed> + 'a {
        let hash = owner.hash.to_string();
        self.elems.iter().filter(move |x| {
            x.comment.as_deref() == Some(owner.tag.as_str())
                || (x.set == "owner" && x.data.as_deref() == Some(&hash))
        })
    }

    pub fn gate_chains(&self) -> Vec<String> {
        self.chains.iter().filter(|c| c.starts_with("gate4") || c.starts_with("gate6")).cloned().collect()
    }

    fn rule_has(&self, chain: &str, needle: &str) -> bool {
        self.rules.iter().any(|(c, r)| c == chain && r.contains(needle))
    }

    /// Whether the static part matches what `conf` needs; the first problem otherwise.
    pub fn static_problem(&self, conf: &Conf) -> Option<String> {
        let (g4, g6) = gate_names(conf);
        let checks: [(&str, &str); 8] = [
            ("prerouting", "\"@gates\""),
            ("output", "\"@gates\""),
            ("hostports4", "\"@hp4\""),
            ("hostports4", "\"@hip4\""),
            ("hostports6", "\"@hp6\""),
            ("hostports6", "\"@hip6\""),
            ("masquerading", "\"@masq4\""),
            ("masquerading", "\"@masq6\""),
        ];
        for (chain, needle) in checks {
            if !self.rule_has(chain, needle) {
                return Some(format!("chain {chain} lacks its rule using {}", needle.trim_matches('"')));
            }
        }
        for (fam, g, hp) in [("ipv4", &g4, "hostports4"), ("ipv6", &g6, "hostports6")] {
            if !self.gates.iter().any(|(k, v)| k == fam && *v == format!("jump {g}")) {
                return Some(format!("gates map does not send {fam} to chain {g} (conditions changed?)"));
            }
            if !self.rule_has(g, &format!("\"{hp}\"")) {
                return Some(format!("chain {g} lacks its jump to {hp}"));
            }
        }
        None
    }

    /// Every per-attachment element, for GC.
    pub fn all_elements(&self) -> impl Iterator<Item = &Listed> {
        self.elems.iter().filter(|x| ELEMENT_SETS.contains(&x.set.as_str()))
    }
}

/// Host ports (protocol, port, family) of UDP DNAT elements, to flush conntrack for.
pub fn udp_ports_of(listed: &[&Listed]) -> HashSet<(Fam, u16)> {
    let mut out = HashSet::new();
    for l in listed {
        let fam = match l.set.as_str() {
            "hp4" | "hip4" => Fam::V4,
            "hp6" | "hip6" => Fam::V6,
            _ => continue,
        };
        let parts: Vec<&str> = l.key.split(" . ").collect();
        if parts.len() >= 2 && parts[parts.len() - 2] == "udp" {
            if let Ok(p) = parts[parts.len() - 1].parse() {
                out.insert((fam, p));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Mapping, RawConf};
    use serde_json::json;

    fn conf(mappings: Vec<Mapping>) -> Conf {
        let mut c = Conf::from_raw(RawConf::default()).unwrap();
        c.mappings = mappings;
        c
    }

    fn m(host: u16, ctr: u16, proto: Proto, host_ip: HostIp) -> Mapping {
        Mapping { host_port: host, container_port: ctr, proto, host_ip }
    }

    #[test]
    fn owner_tags_fit_and_escape() {
        let o = Owner::new("kubenet", "abc-123", "eth0");
        assert_eq!(o.tag, "kubenet,abc-123,eth0");
        assert_eq!(quote(&o.tag), format!("\"{}\"", o.tag));
        let long = Owner::new(&"n".repeat(200), &"c".repeat(300), "e\u{e9}th,x");
        assert!(long.tag.len() <= 128, "{}", long.tag);
        assert_eq!(quote(&long.tag), format!("\"{}\"", long.tag), "nothing for quote() to escape");
        assert!(long.tag.starts_with(&net_prefix(&"n".repeat(200))));
        assert_ne!(Owner::new("n", "a", "eth0").hash, Owner::new("n", "a", "eth1").hash);
        assert_ne!(Owner::new("n", "a", "eth0").hash, Owner::new("m", "a", "eth0").hash);
        assert_eq!(describe_holder(Some("n,c1,eth0")), "network \"n\", container \"c1\", interface \"eth0\"");
    }

    #[test]
    fn elements_for_dual_stack_with_host_ips() {
        let c = conf(vec![
            m(8080, 80, Proto::Tcp, HostIp::Any),
            m(53, 53, Proto::Udp, HostIp::Addr("192.0.2.1".parse().unwrap())),
            m(9000, 90, Proto::Tcp, HostIp::AnyOf(Fam::V6)),
        ]);
        let v4: IpNet = "10.0.0.5/24".parse().unwrap();
        let v6: IpNet = "fd00::5/64".parse().unwrap();
        let en = entries(&c, Some(v4), Some(v6)).unwrap();
        assert_eq!(en.len(), 4, "{en:?}");
        let o = Owner::new("n", "c", "eth0");
        let el = elements(&c, &en, &o);
        let keys: Vec<String> = el
            .iter()
            .map(|e| {
                format!(
                    "{} {}{}",
                    e.set,
                    e.key,
                    e.data.as_ref().map(|d| format!(" : {d}")).unwrap_or_default()
                )
            })
            .collect();
        let h = o.hash.to_string();
        assert_eq!(
            keys,
            vec![
                format!("owner ::ffff:0.0.0.0 . tcp . 8080 : {h}"),
                format!("owner :: . tcp . 8080 : {h}"),
                format!("owner ::ffff:192.0.2.1 . udp . 53 : {h}"),
                format!("owner :: . tcp . 9000 : {h}"),
                "hp4 tcp . 8080 : 10.0.0.5 . 80".to_string(),
                "hp6 tcp . 8080 : fd00::5 . 80".to_string(),
                "hip4 192.0.2.1 . udp . 53 : 10.0.0.5 . 53".to_string(),
                "hp6 tcp . 9000 : fd00::5 . 90".to_string(),
                "masq4 10.0.0.0/24 . 10.0.0.5 . tcp . 80".to_string(),
                "masq4 127.0.0.1 . 10.0.0.5 . tcp . 80".to_string(),
                "masq6 fd00::/64 . fd00::5 . tcp . 80".to_string(),
                "masq4 10.0.0.0/24 . 10.0.0.5 . udp . 53".to_string(),
                "masq4 127.0.0.1 . 10.0.0.5 . udp . 53".to_string(),
                "masq6 fd00::/64 . fd00::5 . tcp . 90".to_string(),
            ]
        );
        // the v4 host IP is skipped for a v6-only container
        assert_eq!(entries(&c, None, Some(v6)).unwrap().len(), 2);
    }

    #[test]
    fn masq_all_and_no_snat() {
        let mut c = conf(vec![m(80, 80, Proto::Tcp, HostIp::Any)]);
        let v4: IpNet = "10.0.0.5/32".parse().unwrap();
        let o = Owner::new("n", "c", "eth0");
        c.masq_all = true;
        let en = entries(&c, Some(v4), None).unwrap();
        let el = elements(&c, &en, &o);
        assert_eq!(el.last().unwrap().key, "0.0.0.0/0 . 10.0.0.5 . tcp . 80");
        c.masq_all = false;
        assert_eq!(elements(&c, &en, &o).iter().filter(|e| e.set == "masq4").count(), 2);
        assert_eq!(
            elements(&c, &en, &o)[2].key,
            "10.0.0.5 . 10.0.0.5 . tcp . 80",
            "a /32 is a plain address"
        );
        c.snat = false;
        assert!(elements(&c, &en, &o).iter().all(|e| e.set != "masq4"));
    }

    #[test]
    fn conflicting_entries_within_one_request() {
        let c = conf(vec![m(80, 80, Proto::Tcp, HostIp::Any), m(80, 81, Proto::Tcp, HostIp::AnyOf(Fam::V4))]);
        let e = entries(&c, Some("10.0.0.5/24".parse().unwrap()), None).unwrap_err();
        assert_eq!(e.code, 7);
    }

    #[test]
    fn scripts_are_element_only_on_the_fast_path() {
        let c = conf(vec![m(80, 8080, Proto::Tcp, HostIp::Any)]);
        let o = Owner::new("n", "c", "eth0");
        let en = entries(&c, Some("10.0.0.5/24".parse().unwrap()), None).unwrap();
        let el = elements(&c, &en, &o);
        let s = fast_add_script(&c, &el, &o);
        assert!(s.lines().all(|l| l.starts_with("add element inet cni_portmap ")), "{s}");
        assert!(s.contains("gates { ipv4 : jump gate4, ipv6 : jump gate6 }"));
        assert!(s.contains("hp4 { tcp . 80 comment \"n,c,eth0\" : 10.0.0.5 . 8080 }"), "{s}");
        let d = guarded_delete_script(&el, &o);
        assert!(d.lines().next().unwrap().starts_with("add element inet cni_portmap owner"));
        assert_eq!(d.lines().filter(|l| l.starts_with("delete element")).count(), el.len());
    }

    #[test]
    fn setup_script_carries_conditions_in_a_fingerprinted_gate() {
        let mut c = conf(vec![]);
        c.conditions_v4 = vec!["ip".into(), "daddr".into(), "!=".into(), "192.0.2.9".into()];
        let (g4, g6) = gate_names(&c);
        assert!(g4.starts_with("gate4_") && g4.len() == 18);
        assert_eq!(g6, "gate6");
        let s = setup_script(&c, &["gate4".into(), g4.clone()]);
        assert!(s.contains(&format!(
            "add rule inet cni_portmap {g4} meta nfproto ipv4 ip daddr != 192.0.2.9 jump hostports4"
        )));
        assert!(s.contains("delete chain inet cni_portmap gate4\n"));
        assert!(!s.contains(&format!("delete chain inet cni_portmap {g4}\n")));
    }

    #[test]
    fn listing_is_rendered_like_our_elements() {
        let doc = json!([
            {"map": {"name": "hp4", "elem": [[{"elem": {"val": {"concat": ["tcp", 8080]}, "comment": "n,c1,eth0"}}, {"concat": ["10.0.0.3", 80]}]]}},
            {"map": {"name": "owner", "elem": [[{"elem": {"val": {"concat": ["::ffff:0.0.0.0", "tcp", 8080]}, "comment": "n,c1,eth0"}}, "1234::1"]]}},
            {"set": {"name": "masq4", "elem": [{"elem": {"val": {"concat": [{"prefix": {"addr": "10.0.0.0", "len": 24}}, "10.0.0.3", "tcp", 80]}, "comment": "n,c1,eth0"}},
                                               {"concat": ["127.0.0.1", "10.0.0.3", "tcp", 80]}]}},
            {"map": {"name": "gates", "elem": [["ipv4", {"jump": {"target": "gate4"}}]]}},
            {"chain": {"name": "gate4"}},
            {"rule": {"chain": "gate4", "expr": [{"jump": {"target": "hostports4"}}]}}
        ]);
        let l = parse_listing(doc.as_array().unwrap());
        assert_eq!(l.elems.len(), 4);
        assert_eq!(l.find("hp4", "tcp . 8080").unwrap().data.as_deref(), Some("10.0.0.3 . 80"));
        assert_eq!(
            l.find("owner", "::ffff:0.0.0.0 . tcp . 8080").unwrap().comment.as_deref(),
            Some("n,c1,eth0")
        );
        assert!(l.find("masq4", "10.0.0.0/24 . 10.0.0.3 . tcp . 80").is_some());
        assert_eq!(l.find("masq4", "127.0.0.1 . 10.0.0.3 . tcp . 80").unwrap().comment, None);
        assert_eq!(l.gates, vec![("ipv4".to_string(), "jump gate4".to_string())]);
        assert_eq!(l.gate_chains(), vec!["gate4".to_string()]);
        let udp =
            [&Listed { set: "hip6".into(), key: "fd00::1 . udp . 53".into(), data: None, comment: None }];
        assert_eq!(udp_ports_of(&udp), HashSet::from([(Fam::V6, 53)]));
    }
}
