//! The keys of a ptp configuration, validated before anything is touched (pure).
//!
//! Upstream's keys: `ipMasq`, `ipMasqBackend`, `mtu`, `dns`, `ipam` (required: ptp has no
//! addresses of its own). Unknown keys are ignored, as the Go decoder does.

use cni_common::error::{CniError, Result};
use cni_common::spec::config::validate_plugin_type;
use cni_common::spec::result::Dns;
use cni_common::Request;
use serde::Deserialize;

/// The keys as written; types follow upstream's Go struct, so a type mismatch is code 6.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawConf {
    #[serde(default)]
    pub ip_masq: bool,
    #[serde(default)]
    pub ip_masq_backend: Option<String>,
    #[serde(default)]
    pub mtu: i64,
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conf {
    pub ip_masq: bool,
    /// Both veth ends; `None`: the kernel's default.
    pub mtu: Option<u32>,
    /// `dns` of the configuration, when it sets anything (it then replaces IPAM's).
    pub dns: Option<Dns>,
}

impl Conf {
    pub fn from_request(req: &Request) -> Result<Conf> {
        let raw: RawConf = req.plugin_config()?;
        Conf::from_raw(&raw, req.conf.ipam_type(), req.conf.dns.clone())
    }

    pub fn from_raw(raw: &RawConf, ipam_type: Option<&str>, dns: Option<Dns>) -> Result<Conf> {
        match ipam_type {
            None => {
                return Err(CniError::config(
                    "ipam is required: ptp has no addresses of its own (e.g. \"ipam\": {\"type\": \"host-local\", …})",
                ))
            }
            Some(t) => validate_plugin_type("ipam.type", t)?,
        }
        check_masq_backend(raw.ip_masq_backend.as_deref())?;
        let mtu = match raw.mtu {
            0 => None,
            m if (68..=65535).contains(&m) => Some(m as u32),
            m => {
                return Err(CniError::config(format!(
                    "mtu {m} is out of range: use 68-65535, or 0 for the kernel default"
                )))
            }
        };
        let dns = dns.filter(|d| {
            !d.nameservers.is_empty() || !d.search.is_empty() || !d.options.is_empty() || !d.domain.is_empty()
        });
        Ok(Conf { ip_masq: raw.ip_masq, mtu, dns })
    }
}

/// `ipMasqBackend`: nftables only (upstream's other backend, iptables, is refused with code 2;
/// what upstream's iptables backend wrote is still found and removed by DEL and GC).
fn check_masq_backend(backend: Option<&str>) -> Result<()> {
    match backend {
        None | Some("" | "nftables") => Ok(()),
        Some("iptables") => Err(CniError::unsupported_field(
            "ipMasqBackend",
            "\"iptables\"",
            "this ptp plugin masquerades with nftables only (table inet cni_plugins_masquerade, \
             upstream's nftables layout); remove the key or set it to \"nftables\"",
        )),
        Some(other) => Err(CniError::config(format!(
            "ipMasqBackend {other:?} is not valid: use \"nftables\" (\"iptables\" is not supported here)"
        ))),
    }
}

/// What DEL and GC read: only what cleanup needs, so a value only ADD judges (an `mtu` out of
/// range, `ipMasqBackend: "iptables"`) never stops a cleanup. A type error is still code 6, and
/// a hostile IPAM `type` is refused before anything is touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Teardown {
    /// An IPAM plugin is configured: DEL and GC forward to it.
    pub l3: bool,
    pub ip_masq: bool,
}

impl Teardown {
    pub fn from_request(req: &Request) -> Result<Teardown> {
        let raw: RawConf = req.plugin_config()?;
        if let Some(t) = req.conf.ipam_type() {
            validate_plugin_type("ipam.type", t)?;
        }
        Ok(Teardown { l3: req.conf.ipam_type().is_some(), ip_masq: raw.ip_masq })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::code;
    use cni_common::spec::json;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> Result<Conf> {
        let raw: RawConf = json::from_value(v).map_err(CniError::decode)?;
        Conf::from_raw(&raw, Some("host-local"), None)
    }

    #[test]
    fn keys_and_their_limits() {
        let c = conf(json!({"ipMasq": true, "mtu": 1400})).unwrap();
        assert_eq!(c, Conf { ip_masq: true, mtu: Some(1400), dns: None });
        assert_eq!(conf(json!({})).unwrap().mtu, None);
        assert_eq!(conf(json!({"mtu": 0})).unwrap().mtu, None);
        for bad in [67, 65536, -1] {
            let e = conf(json!({ "mtu": bad })).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}: {}", e.msg);
            assert!(e.msg.contains(&bad.to_string()), "{}", e.msg);
        }
        assert!(!conf(json!({"ipMasqBackend": "nftables"})).unwrap().ip_masq);
        assert_eq!(conf(json!({"ipMasqBackend": "iptables"})).unwrap_err().code, code::UNSUPPORTED_FIELD);
        assert_eq!(conf(json!({"ipMasqBackend": "ebpf"})).unwrap_err().code, code::INVALID_CONFIG);
        assert!(conf(json!({"mtu": "1400"})).is_err(), "a string where Go wants an int");
        let raw: RawConf = json::from_value(json!({})).unwrap();
        let e = Conf::from_raw(&raw, None, None).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("ipam"), "{}", e.msg);
        let e = Conf::from_raw(&raw, Some("../host-local"), None).unwrap_err();
        assert!(e.msg.contains("ipam.type"), "{}", e.msg);
    }

    #[test]
    fn dns_replaces_ipams_only_when_it_sets_something() {
        let raw: RawConf = json::from_value(json!({})).unwrap();
        let empty = Dns::default();
        assert_eq!(Conf::from_raw(&raw, Some("host-local"), Some(empty)).unwrap().dns, None);
        let set = Dns { nameservers: vec!["10.0.0.10".into()], ..Default::default() };
        assert_eq!(Conf::from_raw(&raw, Some("host-local"), Some(set.clone())).unwrap().dns, Some(set));
    }
}
