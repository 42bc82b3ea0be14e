//! The parts of a plugin's stdin configuration that every plugin shares.
//!
//! Plugin-specific keys are decoded by each plugin into its own struct through
//! [`super::json::from_value`] (Go-compatible key matching); this module holds the common keys,
//! the well-known sub-objects (`ipam`, `dns`, `args`, runtime capabilities) and the GC list.

use super::json;
use super::result::{CniResult, Dns};
use super::version::Version;
use crate::error::{code, CniError, Result};
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;
use std::net::IpAddr;

/// Common keys of a plugin's request configuration.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NetConf {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    #[serde(default)]
    pub ipam: Option<IpamRef>,
    #[serde(default)]
    pub dns: Option<Dns>,
    #[serde(rename = "prevResult", default)]
    pub prev_result: Option<Value>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// The misspelled key older libcni sent (cni#1101); libcni now sends both.
    #[serde(rename = "cni.dev/attachments", default)]
    pub attachments_legacy: Option<Vec<Attachment>>,
}

/// The `ipam` object as seen by a main plugin: only its `type` matters for delegation.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct IpamRef {
    #[serde(rename = "type", default)]
    pub plugin_type: String,
}

/// One `{containerID, ifname}` entry of the GC list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID", default)]
    pub container_id: String,
    #[serde(default)]
    pub ifname: String,
}

impl NetConf {
    /// Decode the common keys of `value` (a JSON object).
    pub fn from_value(value: &Value) -> Result<NetConf> {
        json::from_ref(value).map_err(|e| CniError::decode(format!("error decoding network config: {e}")))
    }

    /// The GC list: the union of both keys (`null` or absent contributes nothing). Whether a
    /// request without either key is acceptable is decided by the skeleton, which sees the raw
    /// document.
    pub fn gc_valid_attachments(&self) -> Result<Vec<Attachment>> {
        let mut all = Vec::new();
        for list in [&self.valid_attachments, &self.attachments_legacy].into_iter().flatten() {
            for a in list {
                if !all.contains(a) {
                    all.push(a.clone());
                }
            }
        }
        Ok(all)
    }

    /// Decode `prevResult` (any version; a missing `cniVersion` means the config's).
    pub fn prev_result(&self, version: Version) -> Result<Option<CniResult>> {
        match &self.prev_result {
            None | Some(Value::Null) => Ok(None),
            Some(v) => CniResult::decode(v, version).map(Some).map_err(|e| e.context("prevResult")),
        }
    }

    /// `ipam.type`, when an IPAM plugin is configured (an empty `ipam: {}` means L2 only).
    pub fn ipam_type(&self) -> Option<&str> {
        self.ipam.as_ref().map(|i| i.plugin_type.as_str()).filter(|t| !t.is_empty())
    }
}

/// Reject a plugin `type` that could escape CNI_PATH (CVE-2021-20206).
pub fn validate_plugin_type(field: &str, t: &str) -> Result<()> {
    if t.is_empty() {
        return Err(CniError::config(format!("{field} is empty: name a plugin binary")));
    }
    if t.contains('/') || t.contains('\\') || t == "." || t == ".." || t.contains('\0') {
        return Err(CniError::config(format!(
            "{field} {t:?} contains a path separator: it must be a bare binary name found on CNI_PATH"
        )));
    }
    Ok(())
}

// ---- well-known runtime capabilities (`runtimeConfig`) and `args.cni` ----

/// `runtimeConfig.portMappings[]` (capability `portMappings`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    pub host_port: i64,
    pub container_port: i64,
    #[serde(default)]
    pub protocol: String,
    #[serde(rename = "hostIP", default)]
    pub host_ip: String,
}

/// One `runtimeConfig.ipRanges` / `ipam.ranges` range.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RangeConf {
    pub subnet: IpNet,
    #[serde(default, deserialize_with = "empty_ip_is_none")]
    pub range_start: Option<IpAddr>,
    #[serde(default, deserialize_with = "empty_ip_is_none")]
    pub range_end: Option<IpAddr>,
    #[serde(default, deserialize_with = "empty_ip_is_none")]
    pub gateway: Option<IpAddr>,
}

/// An optional IP address where `""` means absent, as Go's `net.IP` decodes it (configs
/// generated from templates carry `"gateway": ""`).
pub fn empty_ip_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    struct OptIp;
    impl serde::de::Visitor<'_> for OptIp {
        type Value = Option<IpAddr>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an IP address or an empty string")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
            if s.is_empty() {
                return Ok(None);
            }
            s.parse().map(Some).map_err(|_| E::custom(format!("invalid IP address {s:?}")))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    // deserialize_any: the error is raised inside the visitor, so the decoder adds the path.
    d.deserialize_any(OptIp)
}

/// `args.cni`: the structured successor of CNI_ARGS.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ArgsCni {
    #[serde(default)]
    pub ips: Vec<String>,
    #[serde(default)]
    pub mac: String,
}

/// `args` as a whole: only the `cni` sub-object is defined by the conventions.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Args {
    #[serde(default)]
    pub cni: Option<ArgsCni>,
}

/// A config object that is not a JSON object is a decode error (code 6).
pub fn require_object(v: &Value) -> Result<()> {
    if v.is_object() {
        Ok(())
    } else {
        Err(CniError::new(
            code::DECODE,
            "error unmarshall network config: the configuration must be a JSON object",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn common_keys_and_tolerated_extras() {
        let v = json!({
            "cniVersion": "1.1.0", "name": "net", "type": "example",
            "capabilities": {"portMappings": true}, "addIf": "eth0",
            "ipam": {"type": "example-ipam", "subnet": "10.0.0.0/24"},
            "dns": {"nameservers": ["10.0.0.1"]},
            "runtimeConfig": {"portMappings": []}
        });
        let c = NetConf::from_value(&v).unwrap();
        assert_eq!(
            (c.cni_version.as_str(), c.name.as_str(), c.plugin_type.as_str()),
            ("1.1.0", "net", "example")
        );
        assert_eq!(c.ipam_type(), Some("example-ipam"));
        assert_eq!(c.dns.unwrap().nameservers, vec!["10.0.0.1"]);
    }

    #[test]
    fn empty_ipam_means_l2() {
        let c = NetConf::from_value(&json!({"name": "n", "ipam": {}})).unwrap();
        assert_eq!(c.ipam_type(), None);
    }

    #[test]
    fn both_gc_keys_are_merged() {
        let v = json!({
            "name": "n",
            "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}],
            "cni.dev/attachments": [{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth1"}]
        });
        let c = NetConf::from_value(&v).unwrap();
        let list = c.gc_valid_attachments().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[1], Attachment { container_id: "b".into(), ifname: "eth1".into() });
    }

    #[test]
    fn plugin_type_rejects_paths() {
        assert!(validate_plugin_type("type", "example").is_ok());
        for bad in ["../bin/sh", "/bin/sh", "a/b", "..", "", "a\\b"] {
            let e = validate_plugin_type("ipam.type", bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
        }
    }

    #[test]
    fn empty_ip_strings_mean_absent_like_go() {
        let r: RangeConf =
            json::from_value(json!({"subnet": "10.0.0.0/24", "rangeStart": "", "gateway": "10.0.0.9"}))
                .unwrap();
        assert_eq!((r.range_start, r.range_end), (None, None));
        assert_eq!(r.gateway, Some("10.0.0.9".parse().unwrap()));
        let e = json::from_value::<RangeConf>(json!({"subnet": "10.0.0.0/24", "rangeEnd": "x"})).unwrap_err();
        assert!(e.starts_with("rangeEnd: invalid IP address \"x\""), "{e}");
        assert!(json::from_value::<RangeConf>(json!({"subnet": "10.0.0.0/24", "gateway": 5})).is_err());
    }

    #[test]
    fn runtime_capabilities_decode_case_insensitively() {
        let pm: PortMapping = json::from_value(
            json!({"HOSTPORT": 8080, "containerPort": 80, "Protocol": "TCP", "hostIP": "0.0.0.0"}),
        )
        .unwrap();
        assert_eq!((pm.host_port, pm.protocol.as_str(), pm.host_ip.as_str()), (8080, "TCP", "0.0.0.0"));
    }

    #[test]
    fn prev_result_is_decoded_in_any_version_and_absent_or_null_is_none() {
        let conf = |prev: Value| -> NetConf {
            let mut v = json!({"cniVersion": "1.0.0", "name": "n", "type": "t"});
            v["prevResult"] = prev;
            NetConf::from_value(&v).unwrap()
        };
        let prev = json!({"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.0.0.2/24"}]});
        let r = conf(prev).prev_result(Version::V1_0_0).unwrap().expect("a result");
        assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
        assert_eq!(conf(json!(null)).prev_result(Version::V1_0_0).unwrap(), None);
        let none = NetConf::from_value(&json!({"cniVersion": "1.0.0", "name": "n", "type": "t"})).unwrap();
        assert_eq!(none.prev_result(Version::V1_0_0).unwrap(), None);
        let e = conf(json!({"ips": 5})).prev_result(Version::V1_0_0).unwrap_err();
        assert!(e.msg.starts_with("prevResult"), "{}", e.msg);
    }

    #[test]
    fn a_gateway_of_the_wrong_type_says_what_it_expects() {
        #[derive(Debug, Deserialize)]
        struct G {
            #[serde(default, deserialize_with = "empty_ip_is_none")]
            gw: Option<IpAddr>,
        }
        let e = serde_json::from_value::<G>(json!({"gw": 5})).unwrap_err().to_string();
        assert!(e.contains("an IP address or an empty string"), "{e}");
        for none in [json!({"gw": ""}), json!({"gw": null}), json!({})] {
            assert_eq!(serde_json::from_value::<G>(none).unwrap().gw, None);
        }
    }
}
