//! The plugin's keys (upstream's: `backend`, `iptablesAdminChainName`, `firewalldZone`,
//! `ingressPolicy`), validated before anything touches the host, and the attachment's
//! [`Intent`]: the addresses of the chained result and the bridge it sits on (pure).

use cni_common::spec::result::CniResult;
use cni_common::{CniError, Result};
use serde_json::Value;
use std::net::IpAddr;

/// Where the rules go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// nf_tables over netlink: upstream's chains, in the form iptables-nft writes, in the
    /// `ip filter` / `ip6 filter` tables (the forward chain Docker and iptables-nft users drop in).
    Nftables,
    /// The node's `iptables` / `ip6tables` commands (either backend), upstream's rules exactly.
    Iptables,
    /// firewalld's zones over D-Bus.
    Firewalld,
}

/// `ingressPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingress {
    Open,
    SameBridge,
    Isolated,
}

impl Ingress {
    pub fn name(self) -> &'static str {
        match self {
            Ingress::Open => "open",
            Ingress::SameBridge => "same-bridge",
            Ingress::Isolated => "isolated",
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conf {
    /// None: not named; [`crate::backend::choose`] applies the default rule.
    pub backend: Option<Backend>,
    pub admin_chain: String,
    pub zone: String,
    pub ingress: Ingress,
}

/// iptables' chain name limit (`XT_EXTENSION_MAXNAMELEN` - 1).
pub const CHAIN_MAX: usize = 28;

/// A chain name that iptables accepts and that can never be read as an option or a target
/// of its own: 1..=28 of `[A-Za-z0-9_.-]`, not starting with `-`, not a builtin target.
pub fn valid_chain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= CHAIN_MAX
        && !name.starts_with('-')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !matches!(
            name,
            "ACCEPT"
                | "DROP"
                | "RETURN"
                | "QUEUE"
                | "REJECT"
                | "FORWARD"
                | "INPUT"
                | "OUTPUT"
                | "CNI-FORWARD"
        )
}

/// A firewalld zone name: 1 to 64 of `A-Za-z0-9_-+./`, not starting with `-`.
pub fn valid_zone(z: &str) -> bool {
    !z.is_empty()
        && z.len() <= 64
        && !z.starts_with('-')
        && z.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-+./".contains(&b))
}

fn string_key(raw: &Value, key: &str) -> Result<Option<String>> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(CniError::config(format!("{key}: expected a string, got {other}"))),
    }
}

impl Conf {
    pub fn from_raw(raw: &Value) -> Result<Conf> {
        let backend = match string_key(raw, "backend")?.as_deref() {
            None | Some("") => None,
            Some("nftables") => Some(Backend::Nftables),
            Some("iptables") => Some(Backend::Iptables),
            Some("firewalld") => Some(Backend::Firewalld),
            Some(other) => {
                return Err(CniError::config(format!(
                    "backend: {other:?} is not a backend: use \"nftables\", \"iptables\" or \"firewalld\" (or leave it out)"
                )))
            }
        };
        let admin_chain = match string_key(raw, "iptablesAdminChainName")?.as_deref() {
            None | Some("") => "CNI-ADMIN".to_string(),
            Some(c) if valid_chain(c) => c.to_string(),
            Some(c) => {
                return Err(CniError::config(format!(
                    "iptablesAdminChainName: {c:?} is not a usable chain name: 1 to {CHAIN_MAX} of A-Z a-z 0-9 _ . -, \
                     not starting with '-', not a builtin chain or target"
                )))
            }
        };
        let zone = match string_key(raw, "firewalldZone")?.as_deref() {
            None | Some("") => "trusted".to_string(),
            // the attachment's record keeps the zone, and reads back only a `valid_zone`
            Some(z) if valid_zone(z) => z.to_string(),
            Some(z) => {
                return Err(CniError::config(format!(
                    "firewalldZone: {z:?} is not a zone name (up to 64 of A-Z a-z 0-9 _ - + . /, not starting with '-')"
                )))
            }
        };
        let ingress = match string_key(raw, "ingressPolicy")?.as_deref() {
            None | Some("") | Some("open") => Ingress::Open,
            Some("same-bridge") => Ingress::SameBridge,
            Some("isolated") => Ingress::Isolated,
            Some(other) => {
                return Err(CniError::config(format!(
                    "ingressPolicy: unknown ingress policy {other:?}: use \"open\", \"same-bridge\" or \"isolated\""
                )))
            }
        };
        Ok(Conf { backend, admin_chain, zone, ingress })
    }
}

/// What the attachment asks of the host (pure): every address of the chained result (as
/// upstream, whatever interface it is on) and, for the bridge policies, the bridge.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Intent {
    pub addrs: Vec<IpAddr>,
    /// `interfaces[0]` of the result (upstream's choice: bridge's first interface is the bridge).
    pub bridge: Option<String>,
}

impl Intent {
    pub fn new(conf: &Conf, prev: &CniResult) -> Result<Intent> {
        let mut addrs: Vec<IpAddr> = Vec::new();
        for ip in &prev.ips {
            let a = ip.address.addr();
            if !addrs.contains(&a) {
                addrs.push(a);
            }
        }
        let bridge = prev.interfaces.first().map(|i| i.name.clone()).filter(|n| !n.is_empty());
        if conf.ingress != Ingress::Open {
            let Some(b) = bridge.as_deref() else {
                return Err(CniError::config(format!(
                    "ingressPolicy {:?}: interface needs to be set for ingress policy (prevResult.interfaces is empty), make sure to chain \"firewall\" plugin with \"bridge\"",
                    conf.ingress.name()
                )));
            };
            if cni_common::spec::env::validate_ifname(b).is_err() {
                return Err(CniError::config(format!(
                    "prevResult.interfaces[0].name: {b:?} is not an interface name (ingressPolicy {:?} needs the bridge)",
                    conf.ingress.name()
                )));
            }
        }
        Ok(Intent { addrs, bridge })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_upstreams() {
        let c = Conf::from_raw(&json!({"type": "firewall"})).unwrap();
        assert_eq!(c.backend, None);
        assert_eq!(c.admin_chain, "CNI-ADMIN");
        assert_eq!(c.zone, "trusted");
        assert_eq!(c.ingress, Ingress::Open);
        let n =
            Conf::from_raw(&json!({"backend": "iptables", "iptablesAdminChainName": "NOMAD-ADMIN"})).unwrap();
        assert_eq!((n.backend, n.admin_chain.as_str()), (Some(Backend::Iptables), "NOMAD-ADMIN"));
        let b = Conf::from_raw(&json!({"ingressPolicy": "same-bridge", "backend": ""})).unwrap();
        assert_eq!((b.backend, b.ingress), (None, Ingress::SameBridge));
    }

    #[test]
    fn hostile_values_are_refused_with_the_key() {
        for (k, v) in [
            ("backend", json!("ipfw")),
            ("backend", json!(3)),
            ("iptablesAdminChainName", json!("-j ACCEPT")),
            ("iptablesAdminChainName", json!("a b")),
            ("iptablesAdminChainName", json!("X".repeat(29))),
            ("iptablesAdminChainName", json!("ACCEPT")),
            ("iptablesAdminChainName", json!("CNI-FORWARD")),
            ("iptablesAdminChainName", json!("A\nB")),
            ("firewalldZone", json!("trusted\"; rm")),
            ("ingressPolicy", json!("closed")),
        ] {
            let e = Conf::from_raw(&json!({ k: v })).unwrap_err();
            assert_eq!(e.code, cni_common::code::INVALID_CONFIG, "{k}={v}");
            assert!(e.msg.contains(k), "{k}: {}", e.msg);
        }
    }

    #[test]
    fn intent_takes_every_address_once_and_the_bridge_for_its_policies() {
        let prev = CniResult::decode(
            &json!({"cniVersion": "1.0.0",
                "interfaces": [{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/x"}],
                "ips": [{"address": "10.1.0.5/24", "interface": 2}, {"address": "fd00::5/64", "interface": 2},
                        {"address": "10.1.0.5/24"}]}),
            cni_common::Version::V1_0_0,
        )
        .unwrap();
        let open = Conf::from_raw(&json!({})).unwrap();
        let i = Intent::new(&open, &prev).unwrap();
        assert_eq!(i.addrs, vec!["10.1.0.5".parse::<IpAddr>().unwrap(), "fd00::5".parse().unwrap()]);
        assert_eq!(i.bridge.as_deref(), Some("cni0"));
        let sb = Conf::from_raw(&json!({"ingressPolicy": "same-bridge"})).unwrap();
        let none = CniResult::decode(&json!({"cniVersion": "1.0.0", "ips": []}), cni_common::Version::V1_0_0)
            .unwrap();
        assert!(Intent::new(&sb, &none)
            .unwrap_err()
            .msg
            .contains("chain \"firewall\" plugin with \"bridge\""));
    }

    /// A zone is accepted exactly when the attachment's record can keep it: GC and a DEL
    /// without prevResult find the attachment's firewalld sources through that record.
    #[test]
    fn a_firewalld_zone_is_accepted_when_the_record_can_keep_it() {
        let record = |zone: &str| crate::record::Record {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            backend: "firewalld".into(),
            zone: zone.into(),
            addrs: Vec::new(),
        };
        let long = "z".repeat(64);
        for zone in ["internal", "my_zone-1+a.b/c", long.as_str()] {
            let c = Conf::from_raw(&json!({ "firewalldZone": zone }))
                .unwrap_or_else(|e| panic!("{zone}: {}", e.msg));
            assert_eq!(c.zone, zone);
            let r = record(&c.zone);
            assert_eq!(crate::record::Record::parse(&r.text()), Some(r), "{zone}");
        }
        let longer = "z".repeat(65);
        for zone in ["-x", longer.as_str(), "a b", "a;b"] {
            let e = Conf::from_raw(&json!({ "firewalldZone": zone })).unwrap_err();
            assert_eq!(e.code, cni_common::code::INVALID_CONFIG, "{zone}");
            assert!(e.msg.contains("firewalldZone"), "{zone}: {}", e.msg);
            assert_eq!(crate::record::Record::parse(&record(zone).text()), None, "{zone}");
        }
    }

    #[test]
    fn the_bridge_policies_refusals_name_the_policy() {
        let decode = |v| CniResult::decode(&v, cni_common::Version::V1_0_0).unwrap();
        let none = decode(json!({"cniVersion": "1.0.0", "ips": []}));
        let bad = decode(json!({"cniVersion": "1.0.0", "interfaces": [{"name": "a/b"}], "ips": []}));
        for policy in ["same-bridge", "isolated"] {
            let c = Conf::from_raw(&json!({ "ingressPolicy": policy })).unwrap();
            for (what, prev) in [("no interface", &none), ("not an interface name", &bad)] {
                let e = Intent::new(&c, prev).unwrap_err();
                assert_eq!(e.code, cni_common::code::INVALID_CONFIG, "{policy}, {what}");
                assert!(
                    e.msg.contains(&format!("ingressPolicy \"{policy}\"")),
                    "{policy}, {what}: {}",
                    e.msg
                );
            }
        }
    }
}
