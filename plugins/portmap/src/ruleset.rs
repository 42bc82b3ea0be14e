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
//!   Several attachments of one container may claim a host port (one container on several
//!   networks): see [`plan`].
//! - `claims` (`owner key . attachment hash : target`): one per claimant of a host port.
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
use cni_common::netlink::nft::{NftRule, Verdict};
use cni_common::nft_cli::quote;
use cni_common::{CniError, Result};
use ipnet::IpNet;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const FAMILY: &str = "inet";
pub const TABLE: &str = "cni_portmap";

/// Every set and map of the table that holds per-attachment elements.
pub const ELEMENT_SETS: [&str; 8] = ["owner", "claims", "hp4", "hip4", "hp6", "hip6", "masq4", "masq6"];

/// The DNAT maps.
pub const DNAT_SETS: [&str; 4] = ["hp4", "hip4", "hp6", "hip6"];

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
    /// The 128-bit claim value stored in the `owner` map while this attachment is the only
    /// claimant of a host port.
    pub hash: Ipv6Addr,
    /// The container part of the tag (the id, or its hash when long).
    pub container: String,
}

/// The `owner` value of a host port claimed by several attachments of one container (the
/// container part of their tags): no single attachment's hash, so that neither a fast ADD of
/// another attachment nor a fast DEL of one claimant can succeed on it without the lock.
pub fn shared_hash(container: &str) -> Ipv6Addr {
    let d = sha(&["shared", container]);
    let mut h = [0u8; 16];
    h.copy_from_slice(&d[..16]);
    Ipv6Addr::from(h)
}

/// The container part of an owner tag.
pub fn container_of(tag: &str) -> Option<&str> {
    let mut p = tag.split(',');
    match (p.next(), p.next(), p.next(), p.next()) {
        (Some(_), Some(c), Some(_), None) => Some(c),
        _ => None,
    }
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
        let container = short("id", id, 64);
        let tag = format!("{}{container},{}", net_prefix(net), short("if", &ifn, 15));
        let d = sha(&["owner", net, id, ifname]);
        let mut h = [0u8; 16];
        h.copy_from_slice(&d[..16]);
        Owner { tag, hash: Ipv6Addr::from(h), container }
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

/// The `owner` (and `claims`) key of an entry: `host address . proto . host port`.
fn owner_key(e: &Entry) -> String {
    format!("{} . {} . {}", owner_addr(e), e.proto.as_str(), e.host_port)
}

fn mapped(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
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
        push(Elem::new("owner", owner_key(e), Some(owner.hash.to_string())));
    }
    for e in entries {
        let target = format!("{} . {}", mapped(e.ctr.addr()), e.ctr_port);
        push(Elem::new("claims", format!("{} . {}", owner_key(e), owner.hash), Some(target)));
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
         \tmap claims {{ type ipv6_addr . inet_proto . inet_service . ipv6_addr : ipv6_addr . inet_service; }}\n\
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

// ---- reading the table back ----

/// An element as read from the kernel (see [`crate::wire`]).
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
    pub rules: Vec<NftRule>,
    /// gates map: (nfproto, verdict text)
    pub gates: Vec<(String, String)>,
}

impl Listing {
    pub fn find(&self, set: &str, key: &str) -> Option<&Listed> {
        self.elems.iter().find(|x| x.set == set && x.key == key)
    }

    /// Every `claims` element: who wants which host port, and where it should lead.
    pub fn claims(&self) -> Vec<Claim> {
        self.elems
            .iter()
            .filter(|x| x.set == "claims")
            .filter_map(|x| {
                let (key, hash) = x.key.rsplit_once(" . ")?;
                Some(Claim {
                    key: key.to_string(),
                    hash: hash.to_string(),
                    target: x.data.clone()?,
                    tag: x.comment.clone().unwrap_or_default(),
                })
            })
            .collect()
    }

    pub fn gate_chains(&self) -> Vec<String> {
        self.chains.iter().filter(|c| c.starts_with("gate4") || c.starts_with("gate6")).cloned().collect()
    }

    fn uses_set(&self, chain: &str, set: &str) -> bool {
        self.rules.iter().any(|r| r.chain == chain && r.uses_set(set))
    }

    fn jumps_to(&self, chain: &str, target: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.chain == chain && r.verdicts().any(|v| *v == Verdict::Jump(target.to_string())))
    }

    /// Whether the static part matches what `conf` needs; the first problem otherwise.
    pub fn static_problem(&self, conf: &Conf) -> Option<String> {
        let (g4, g6) = gate_names(conf);
        let checks: [(&str, &str); 8] = [
            ("prerouting", "gates"),
            ("output", "gates"),
            ("hostports4", "hp4"),
            ("hostports4", "hip4"),
            ("hostports6", "hp6"),
            ("hostports6", "hip6"),
            ("masquerading", "masq4"),
            ("masquerading", "masq6"),
        ];
        for (chain, set) in checks {
            if !self.uses_set(chain, set) {
                return Some(format!("chain {chain} lacks its rule using @{set}"));
            }
        }
        for (fam, g, hp) in [("ipv4", &g4, "hostports4"), ("ipv6", &g6, "hostports6")] {
            if !self.gates.iter().any(|(k, v)| k == fam && *v == format!("jump {g}")) {
                return Some(format!("gates map does not send {fam} to chain {g} (conditions changed?)"));
            }
            if !self.jumps_to(g, hp) {
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

/// Host ports (family, port) of UDP DNAT elements, to flush conntrack for.
pub fn udp_ports_of<'a>(elems: impl IntoIterator<Item = (&'a str, &'a str)>) -> HashSet<(Fam, u16)> {
    let mut out = HashSet::new();
    for (set, key) in elems {
        let fam = match set {
            "hp4" | "hip4" => Fam::V4,
            "hp6" | "hip6" => Fam::V6,
            _ => continue,
        };
        let parts: Vec<&str> = key.split(" . ").collect();
        if parts.len() >= 2 && parts[parts.len() - 2] == "udp" {
            if let Ok(p) = parts[parts.len() - 1].parse() {
                out.insert((fam, p));
            }
        }
    }
    out
}

// ---- several claimants of one host port ----
//
// Every attachment that wants a host port has a `claims` element `owner key . its hash :
// container address . container port` (IPv4 addresses v4-mapped). The `owner` and DNAT
// elements of the port follow from the claims:
// - one claimant: `owner` holds its hash and the DNAT element its target (the fast paths
//   create and delete exactly this state in one transaction, without reading the table);
// - several claimants, necessarily of one container (a runtime attaching the container to
//   several networks with the same portMappings, as Podman does): `owner` holds the
//   container's [`shared_hash`], and the DNAT element leads to one of them, the *active*
//   claimant: the one that had the port first stays active; when it goes, the remaining
//   claimant whose tag sorts first takes over. Changes happen under the lock ([`plan`]).

/// One attachment's claim on a host port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The `owner` key: `host address . proto . host port`.
    pub key: String,
    /// The claimant's hash (its exclusive `owner` value).
    pub hash: String,
    /// `container address . container port`, IPv4 v4-mapped.
    pub target: String,
    /// The claimant's owner tag.
    pub tag: String,
}

/// The DNAT map element (set, key) that an `owner` key controls.
pub fn dnat_slot(owner_key: &str) -> Option<(&'static str, String)> {
    let mut p = owner_key.splitn(2, " . ");
    let (addr, rest) = (p.next()?, p.next()?);
    let addr: Ipv6Addr = addr.parse().ok()?;
    Some(match addr.to_ipv4_mapped() {
        Some(v4) if v4.is_unspecified() => ("hp4", rest.to_string()),
        Some(v4) => ("hip4", format!("{v4} . {rest}")),
        None if addr.is_unspecified() => ("hp6", rest.to_string()),
        None => ("hip6", format!("{addr} . {rest}")),
    })
}

/// The `owner` key of a DNAT map element.
fn owner_key_of_slot(set: &str, key: &str) -> Option<String> {
    let key_addr = |key: &str| -> Option<(IpAddr, String)> {
        let (a, rest) = key.split_once(" . ")?;
        Some((a.parse().ok()?, rest.to_string()))
    };
    Some(match set {
        "hp4" => format!("{} . {key}", Ipv4Addr::UNSPECIFIED.to_ipv6_mapped()),
        "hp6" => format!("{} . {key}", Ipv6Addr::UNSPECIFIED),
        "hip4" | "hip6" => {
            let (a, rest) = key_addr(key)?;
            format!("{} . {rest}", mapped(a))
        }
        _ => return None,
    })
}

/// A claim target as the data of a DNAT element of `set`.
fn dnat_data(set: &str, target: &str) -> String {
    match set {
        "hp4" | "hip4" => target.strip_prefix("::ffff:").unwrap_or(target).to_string(),
        _ => target.to_string(),
    }
}

/// The `owner` and DNAT elements (with their comments) a host port needs, given its claimants
/// and its current DNAT element; None when nobody claims it.
pub fn desired_slots(key: &str, claimants: &[&Claim], dnat: Option<&Listed>) -> Option<[(Elem, String); 2]> {
    let first = claimants.iter().min_by(|a, b| a.tag.cmp(&b.tag))?;
    let active = dnat
        .and_then(|d| claimants.iter().find(|c| d.comment.as_deref() == Some(c.tag.as_str())))
        .unwrap_or(first);
    let value = if claimants.len() == 1 {
        active.hash.clone()
    } else {
        shared_hash(container_of(&active.tag).unwrap_or_default()).to_string()
    };
    let (set, dkey) = dnat_slot(key)?;
    let data = dnat_data(set, &active.target);
    Some([
        (Elem::new("owner", key.to_string(), Some(value)), active.tag.clone()),
        (Elem::new(set, dkey, Some(data)), active.tag.clone()),
    ])
}

/// The first claim among `want`'s keys that belongs to another container: (our element,
/// the holder's tag or comment, the conflicting listed element).
pub fn foreign_claim<'a>(
    l: &'a Listing,
    want: &'a [Elem],
    owner: &Owner,
) -> Option<(&'a Elem, Option<String>, &'a Listed)> {
    let mine = |c: Option<&str>| c.and_then(container_of) == Some(owner.container.as_str());
    let claims = l.claims();
    let shared = shared_hash(&owner.container).to_string();
    for e in want.iter().filter(|e| e.set == "owner") {
        let dnat = dnat_slot(&e.key).and_then(|(set, k)| l.find(set, &k));
        let holder = || dnat.and_then(|d| d.comment.clone());
        if let Some(d) = dnat {
            if !mine(d.comment.as_deref()) {
                return Some((e, d.comment.clone(), d));
            }
        }
        if let Some(o) = l.find("owner", &e.key) {
            let ours = o.data == e.data || o.data.as_deref() == Some(shared.as_str());
            if !ours && !mine(o.comment.as_deref()) {
                return Some((e, holder().or(o.comment.clone()), o));
            }
        }
        for c in claims.iter().filter(|c| c.key == e.key && c.tag != owner.tag) {
            if !mine(Some(&c.tag)) {
                if let Some(x) = l.find("claims", &format!("{} . {}", c.key, c.hash)) {
                    return Some((e, holder().or(Some(c.tag.clone())), x));
                }
            }
        }
    }
    None
}

/// A change to the table: deletions, then additions with their comments.
#[derive(Debug, Default)]
pub struct Plan {
    pub delete: Vec<Listed>,
    pub add: Vec<(Elem, String)>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.add.is_empty()
    }

    pub fn script(&self) -> String {
        let mut s = String::new();
        for x in &self.delete {
            s.push_str(&delete_line(&x.set, &x.key));
        }
        for (e, tag) in &self.add {
            s.push_str(&add_line(e, tag));
        }
        s
    }

    /// UDP host ports whose DNAT target is removed or set.
    pub fn udp_ports(&self) -> HashSet<(Fam, u16)> {
        let deleted = self.delete.iter().map(|x| (x.set.as_str(), x.key.as_str()));
        let added = self.add.iter().map(|(e, _)| (e.set.as_str(), e.key.as_str()));
        udp_ports_of(deleted.chain(added))
    }
}

/// How the table changes when the claims of attachments for which `gone(tag, hash)` holds are
/// withdrawn and `want` (the elements of one attachment, tagged `tag`; empty for DEL and GC)
/// is claimed, read from `l` under the lock.
///
/// `claims` and masquerade elements are per attachment and simply deleted or added. The
/// `owner` and DNAT elements of every host port whose claimants change are recomputed with
/// [`desired_slots`]. Every claim the result relies on is deleted and re-added in the same
/// transaction, so that the transaction fails (and is retried) if a lock-free fast path
/// removed it in the meantime; a fast ADD in the meantime makes the `owner` addition fail.
pub fn plan(l: &Listing, gone: &dyn Fn(&str, &str) -> bool, want: &[Elem], tag: &str) -> Plan {
    let mut p = Plan::default();
    let per_attachment = |set: &str| set == "claims" || set == "masq4" || set == "masq6";
    let hash_of = |x: &Listed| match x.set.as_str() {
        "claims" => x.key.rsplit_once(" . ").map(|(_, h)| h.to_string()).unwrap_or_default(),
        "owner" => x.data.clone().unwrap_or_default(),
        _ => String::new(),
    };
    let gone_elem = |x: &Listed| x.comment.as_deref().is_some_and(|c| gone(c, &hash_of(x)));
    // per-attachment elements
    let mut keep: HashSet<(String, String)> = HashSet::new();
    for x in l.elems.iter().filter(|x| per_attachment(&x.set)) {
        if gone_elem(x) && !want.contains(&x.elem()) {
            p.delete.push(x.clone());
        } else {
            keep.insert((x.set.clone(), x.key.clone()));
        }
    }
    for e in want.iter().filter(|e| per_attachment(&e.set)) {
        match l.find(&e.set, &e.key) {
            Some(x) if keep.contains(&(x.set.clone(), x.key.clone())) => {
                if x.data != e.data {
                    // someone else's element under our key (tampering): replace it
                    p.delete.push(x.clone());
                    p.add.push((e.clone(), tag.to_string()));
                }
            }
            _ => p.add.push((e.clone(), tag.to_string())),
        }
    }
    // host ports whose claimants change
    let claims = l.claims();
    let new_claims: Vec<Claim> = want
        .iter()
        .filter(|e| e.set == "claims")
        .filter_map(|e| {
            let (key, hash) = e.key.rsplit_once(" . ")?;
            Some(Claim { key: key.into(), hash: hash.into(), target: e.data.clone()?, tag: tag.into() })
        })
        .collect();
    let mut keys: Vec<String> =
        claims.iter().filter(|c| gone(&c.tag, &c.hash)).map(|c| c.key.clone()).collect();
    keys.extend(new_claims.iter().map(|c| c.key.clone()));
    for x in l.elems.iter().filter(|x| x.set == "owner" && gone_elem(x)) {
        keys.push(x.key.clone());
    }
    for x in l.elems.iter().filter(|x| DNAT_SETS.contains(&x.set.as_str()) && gone_elem(x)) {
        keys.extend(owner_key_of_slot(&x.set, &x.key));
    }
    keys.sort();
    keys.dedup();
    for key in &keys {
        let staying: Vec<&Claim> = claims
            .iter()
            .filter(|c| c.key == *key && !gone(&c.tag, &c.hash))
            .filter(|c| !new_claims.iter().any(|n| n.hash == c.hash))
            .collect();
        let mut claimants = staying.clone();
        claimants.extend(new_claims.iter().filter(|c| c.key == *key));
        let slot = dnat_slot(key);
        let dnat = slot.as_ref().and_then(|(set, k)| l.find(set, k));
        let current = [l.find("owner", key), dnat];
        let desired = desired_slots(key, &claimants, dnat);
        for (i, cur) in current.iter().enumerate() {
            let want_i = desired.as_ref().map(|d| &d[i]);
            let same = match (cur, want_i) {
                (Some(x), Some((e, t))) => x.elem() == *e && x.comment.as_deref() == Some(t.as_str()),
                (None, None) => true,
                _ => false,
            };
            if same {
                continue;
            }
            if let Some(x) = cur {
                p.delete.push((*x).clone());
            }
            if let Some((e, t)) = want_i {
                p.add.push((e.clone(), t.clone()));
            }
        }
        // re-assert the claims that stay (they would vanish with a concurrent fast DEL)
        for c in staying {
            if let Some(x) = l.find("claims", &format!("{} . {}", c.key, c.hash)) {
                if !p.delete.contains(x) {
                    p.delete.push(x.clone());
                    p.add.push((x.elem(), c.tag.clone()));
                }
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Mapping, RawConf};
    use cni_common::netlink::nft::{NftExpr, NftOp};

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
                format!("claims ::ffff:0.0.0.0 . tcp . 8080 . {h} : ::ffff:10.0.0.5 . 80"),
                format!("claims :: . tcp . 8080 . {h} : fd00::5 . 80"),
                format!("claims ::ffff:192.0.2.1 . udp . 53 . {h} : ::ffff:10.0.0.5 . 53"),
                format!("claims :: . tcp . 9000 . {h} : fd00::5 . 90"),
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
            elements(&c, &en, &o)[3].key,
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
    fn fast_paths_are_element_only_and_plans_script_like_nft() {
        let c = conf(vec![m(80, 8080, Proto::Tcp, HostIp::Any)]);
        let o = Owner::new("n", "c", "eth0");
        let en = entries(&c, Some("10.0.0.5/24".parse().unwrap()), None).unwrap();
        let el = elements(&c, &en, &o);
        let ops = crate::wire::fast_add_ops(&c, &el, &o).unwrap();
        assert!(ops.iter().all(|op| matches!(op, NftOp::AddElements { .. })), "{ops:?}");
        let d = crate::wire::guarded_delete_ops(&el, &o).unwrap();
        assert!(matches!(&d[0], NftOp::AddElements { set, .. } if set == "owner"));
        let deleted: usize = d
            .iter()
            .map(|op| match op {
                NftOp::DeleteElements { elems, .. } => elems.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(deleted, el.len());
        // the rebuild path writes the same change as nft script
        let l = listed(&[(&el, &o)]);
        let other = Owner::new("n", "c", "eth1");
        let p = plan(&l, &|t: &str, _: &str| t == o.tag, &[], "");
        let s = p.script();
        assert!(s.contains("delete element inet cni_portmap hp4 { tcp . 80 }\n"), "{s}");
        let p = plan(&Listing::default(), &|_: &str, _: &str| false, &el, &other.tag);
        assert!(p.script().contains(
            "add element inet cni_portmap hp4 { tcp . 80 comment \"n,c,eth1\" : 10.0.0.5 . 8080 }"
        ));
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

    fn rule(chain: &str, exprs: Vec<NftExpr>) -> NftRule {
        NftRule { table: TABLE.into(), chain: chain.into(), handle: 1, comment: None, exprs }
    }

    #[test]
    fn static_part_is_checked_from_the_rules() {
        let c = conf(vec![]);
        let lookup = |set: &str| NftExpr::Lookup { set: set.into() };
        let mut l = Listing {
            chains: vec!["gate4".into(), "gate6".into(), "hostports4".into()],
            gates: vec![("ipv4".into(), "jump gate4".into()), ("ipv6".into(), "jump gate6".into())],
            ..Default::default()
        };
        for (chain, sets) in [
            ("prerouting", &["gates"][..]),
            ("output", &["gates"]),
            ("hostports4", &["hip4", "hp4"]),
            ("hostports6", &["hip6", "hp6"]),
            ("masquerading", &["masq4", "masq6"]),
        ] {
            for set in sets {
                l.rules.push(rule(chain, vec![NftExpr::Other("fib".into()), lookup(set)]));
            }
        }
        for (g, hp) in [("gate4", "hostports4"), ("gate6", "hostports6")] {
            l.rules.push(rule(g, vec![NftExpr::Verdict(Verdict::Jump(hp.into()))]));
        }
        assert_eq!(l.static_problem(&c), None);
        assert_eq!(l.gate_chains(), vec!["gate4".to_string(), "gate6".to_string()]);
        let mut cond = c.clone();
        cond.conditions_v4 = vec!["ip".into(), "saddr".into(), "10.0.0.1".into()];
        assert!(l.static_problem(&cond).unwrap().contains("conditions changed"));
        l.rules.retain(|r| !(r.chain == "hostports4" && r.uses_set("hp4")));
        assert_eq!(l.static_problem(&c).unwrap(), "chain hostports4 lacks its rule using @hp4");
        let udp = [("hip6", "fd00::1 . udp . 53"), ("hp4", "tcp . 53"), ("owner", ":: . udp . 54")];
        assert_eq!(udp_ports_of(udp), HashSet::from([(Fam::V6, 53)]));
    }

    /// The table as one attachment's ADD leaves it (every element tagged with its owner).
    fn listed(parts: &[(&[Elem], &Owner)]) -> Listing {
        let mut l = Listing::default();
        for (els, o) in parts {
            for e in els.iter() {
                l.elems.push(Listed {
                    set: e.set.clone(),
                    key: e.key.clone(),
                    data: e.data.clone(),
                    comment: Some(o.tag.clone()),
                });
            }
        }
        l
    }

    /// Apply a plan to a listing the way nft would.
    fn apply(l: &Listing, p: &Plan) -> Listing {
        let elems = l.elems.iter().filter(|x| !p.delete.contains(x)).cloned().collect();
        let mut out = Listing { elems, ..Default::default() };
        for (e, t) in &p.add {
            assert!(out.find(&e.set, &e.key).is_none(), "add of an existing key {e:?}");
            out.elems.push(Listed {
                set: e.set.clone(),
                key: e.key.clone(),
                data: e.data.clone(),
                comment: Some(t.clone()),
            });
        }
        out
    }

    fn one_port(o: &Owner, addr: &str) -> Vec<Elem> {
        let c = conf(vec![m(18090, 80, Proto::Tcp, HostIp::AnyOf(Fam::V4))]);
        elements(&c, &entries(&c, Some(addr.parse().unwrap()), None).unwrap(), o)
    }

    fn active(l: &Listing) -> (String, String) {
        let d = l.find("hp4", "tcp . 18090").expect("DNAT element");
        let o = l.find("owner", "::ffff:0.0.0.0 . tcp . 18090").expect("owner element");
        assert_eq!(o.comment, d.comment, "owner and DNAT name the same claimant");
        (d.data.clone().unwrap(), o.data.clone().unwrap())
    }

    #[test]
    fn slots_and_owner_keys_convert_both_ways() {
        for (okey, set, dkey) in [
            ("::ffff:0.0.0.0 . tcp . 80", "hp4", "tcp . 80"),
            (":: . udp . 53", "hp6", "udp . 53"),
            ("::ffff:192.0.2.1 . tcp . 80", "hip4", "192.0.2.1 . tcp . 80"),
            ("fd00::1 . sctp . 9", "hip6", "fd00::1 . sctp . 9"),
        ] {
            assert_eq!(dnat_slot(okey), Some((set, dkey.to_string())));
            assert_eq!(owner_key_of_slot(set, dkey).as_deref(), Some(okey));
        }
        assert_eq!(dnat_data("hp4", "::ffff:10.0.0.5 . 80"), "10.0.0.5 . 80");
        assert_eq!(dnat_data("hp6", "fd00::5 . 80"), "fd00::5 . 80");
        assert_eq!(container_of("n,c1,eth0"), Some("c1"));
        assert_eq!(container_of("n,c1"), None);
    }

    #[test]
    fn a_second_network_of_the_same_container_shares_the_port() {
        let (a1, a2) = (Owner::new("n1", "ctr", "eth0"), Owner::new("n2", "ctr", "eth1"));
        let (e1, e2) = (one_port(&a1, "10.0.0.5/24"), one_port(&a2, "10.1.0.5/24"));
        let l = listed(&[(&e1, &a1)]);
        assert!(foreign_claim(&l, &e2, &a2).is_none(), "same container: compatible");
        let gone = |t: &str, h: &str| t == a2.tag || h == a2.hash.to_string();
        let p = plan(&l, &gone, &e2, &a2.tag);
        let l2 = apply(&l, &p);
        // the first claimant stays active; the owner value is the container's shared hash
        assert_eq!(active(&l2), ("10.0.0.5 . 80".into(), shared_hash("ctr").to_string()));
        assert_eq!(l2.claims().len(), 2);
        assert!(l2.find("masq4", "10.1.0.0/24 . 10.1.0.5 . tcp . 80").is_some());
        // the claim it relies on is re-asserted (fails the transaction if a fast DEL took it)
        assert!(p.delete.iter().any(|x| x.set == "claims" && x.comment.as_deref() == Some(a1.tag.as_str())));
        assert!(p.udp_ports().is_empty());
        // a repeated ADD of either changes nothing but the re-assertions
        for (o, e) in [(&a1, &e1), (&a2, &e2)] {
            let h = o.hash.to_string();
            let p = plan(&l2, &|t: &str, x: &str| t == o.tag || x == h, e, &o.tag);
            assert_eq!(apply(&l2, &p).elems.len(), l2.elems.len());
            assert_eq!(active(&apply(&l2, &p)), active(&l2));
        }
        // another container is refused, naming the active claimant
        let b = Owner::new("n1", "other", "eth0");
        let (_, holder, _) = foreign_claim(&l2, &one_port(&b, "10.0.0.6/24"), &b).expect("conflict");
        assert_eq!(holder.as_deref(), Some(a1.tag.as_str()));

        // DEL of the active claimant: the other takes over and holds the port alone again
        let h1 = a1.hash.to_string();
        let p = plan(&l2, &|t: &str, h: &str| t == a1.tag || h == h1, &[], "");
        let l3 = apply(&l2, &p);
        assert_eq!(active(&l3), ("10.1.0.5 . 80".into(), a2.hash.to_string()));
        assert!(l3.elems.iter().all(|x| x.comment.as_deref() == Some(a2.tag.as_str())), "{:?}", l3.elems);
        assert_eq!(l3.elems.len(), e2.len(), "exactly a2's own elements: its fast DEL works again");
        // DEL of the last one empties the table
        let h2 = a2.hash.to_string();
        let l4 = apply(&l3, &plan(&l3, &|t: &str, h: &str| t == a2.tag || h == h2, &[], ""));
        assert!(l4.elems.is_empty(), "{:?}", l4.elems);

        // DEL of the inactive claimant leaves the active one in place
        let l3 = apply(&l2, &plan(&l2, &gone, &[], ""));
        assert_eq!(active(&l3), ("10.0.0.5 . 80".into(), a1.hash.to_string()));
        assert_eq!(l3.elems.len(), e1.len());
    }

    #[test]
    fn three_claimants_and_udp_switch_over() {
        let c = conf(vec![m(53, 53, Proto::Udp, HostIp::AnyOf(Fam::V4))]);
        let o: Vec<Owner> = ["n3", "n1", "n2"].iter().map(|n| Owner::new(n, "ctr", "eth0")).collect();
        let els: Vec<Vec<Elem>> = o
            .iter()
            .enumerate()
            .map(|(i, ow)| {
                let a = format!("10.{i}.0.5/24").parse().unwrap();
                elements(&c, &entries(&c, Some(a), None).unwrap(), ow)
            })
            .collect();
        let mut l = listed(&[(&els[0], &o[0])]);
        for i in 1..3 {
            let h = o[i].hash.to_string();
            l = apply(&l, &plan(&l, &|t: &str, x: &str| t == o[i].tag || x == h, &els[i], &o[i].tag));
        }
        let d = |l: &Listing| l.find("hp4", "udp . 53").unwrap().data.clone().unwrap();
        assert_eq!(d(&l), "10.0.0.5 . 53", "n3 came first");
        // n3 goes: the remaining claimant whose tag sorts first (n1) takes over, still shared
        let h = o[0].hash.to_string();
        let p = plan(&l, &|t: &str, x: &str| t == o[0].tag || x == h, &[], "");
        assert_eq!(p.udp_ports(), HashSet::from([(Fam::V4, 53)]), "flows to the old target are flushed");
        let l = apply(&l, &p);
        assert_eq!(d(&l), "10.1.0.5 . 53");
        assert_eq!(
            l.find("owner", "::ffff:0.0.0.0 . udp . 53").unwrap().data,
            Some(shared_hash("ctr").to_string())
        );
        // GC of network n1 (nothing valid): n2 alone
        let l = apply(&l, &plan(&l, &|t: &str, _: &str| t.starts_with("n1,"), &[], ""));
        assert_eq!(d(&l), "10.2.0.5 . 53");
        assert_eq!(l.find("owner", "::ffff:0.0.0.0 . udp . 53").unwrap().data, Some(o[2].hash.to_string()));
    }

    #[test]
    fn desired_slots_are_deterministic() {
        let claim = |tag: &str, t: &str| Claim {
            key: "::ffff:0.0.0.0 . tcp . 80".into(),
            hash: "1::1".into(),
            target: t.into(),
            tag: tag.into(),
        };
        let (x, y) = (claim("b,c,eth0", "::ffff:10.0.0.1 . 80"), claim("a,c,eth1", "::ffff:10.0.0.2 . 80"));
        let [_, (d, t)] = desired_slots(&x.key, &[&x, &y], None).unwrap();
        assert_eq!((d.data.as_deref(), t.as_str()), (Some("10.0.0.2 . 80"), "a,c,eth1"));
        let cur = Listed {
            set: "hp4".into(),
            key: "tcp . 80".into(),
            data: Some("10.0.0.1 . 80".into()),
            comment: Some("b,c,eth0".into()),
        };
        let [(o, _), (d, _)] = desired_slots(&x.key, &[&y, &x], Some(&cur)).unwrap();
        assert_eq!(d.data.as_deref(), Some("10.0.0.1 . 80"), "the active claimant stays");
        assert_eq!(o.data, Some(shared_hash("c").to_string()));
        assert!(desired_slots(&x.key, &[], Some(&cur)).is_none());
    }
}
