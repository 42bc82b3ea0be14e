//! One canonical result model (the 1.1.0 shape) encoded exactly per requested version, and
//! decoding of results of any version (prevResult, delegated IPAM output).
//!
//! Conversion rules follow the Go library:
//! - 0.1.0/0.2.0 -> rich: `ip4`/`ip6` become `ips`, per-family routes are flattened, no interfaces;
//! - rich -> 0.1.0/0.2.0: the first IPv4 and the first IPv6 address are kept, routes go to the
//!   family of their destination keeping only `dst`/`gw`; no address at all is an error;
//! - 0.3.x/0.4.0 carry `ips[].version`, 1.x does not; 1.1.0 adds interface `mtu`, `socketPath`,
//!   `pciID` and route `mtu`, `advmss`, `priority`, `table`, `scope`;
//! - `"dns"` is printed at every version up to 1.0.0, `{}` when empty, as upstream 1.1.1 prints
//!   it (golden: `tests/result_golden.rs` against its captured output); 1.1.0 omits an empty one.

use super::json;
use super::version::Version;
use crate::error::{code, CniError, Result};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::net::IpAddr;

/// A result in the canonical (1.1.0) model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// MAC address as text ("aa:bb:…"); empty when unknown.
    pub mac: String,
    /// 1.1.0 only.
    pub mtu: Option<u32>,
    /// Path of the netns the interface lives in; empty for host-side interfaces.
    pub sandbox: String,
    /// 1.1.0 only.
    pub socket_path: String,
    /// 1.1.0 only.
    pub pci_id: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpConfig {
    /// Index into `interfaces`; absent in IPAM results.
    pub interface: Option<usize>,
    /// Address with the prefix length of its subnet (host bits kept).
    pub address: IpNet,
    pub gateway: Option<IpAddr>,
}

/// A route, as results and IPAM configurations' `routes` carry it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, deserialize_with = "super::config::empty_ip_is_none")]
    pub gw: Option<IpAddr>,
    /// The fields below are 1.1.0 only. 0 (what Go writes for "unset") reads as unset.
    #[serde(default, deserialize_with = "zero_is_none")]
    pub mtu: Option<u32>,
    #[serde(default, deserialize_with = "zero_is_none")]
    pub advmss: Option<u32>,
    #[serde(default, deserialize_with = "zero_is_none")]
    pub priority: Option<u32>,
    #[serde(default)]
    pub table: Option<u32>,
    #[serde(default)]
    pub scope: Option<u8>,
}

fn zero_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(Option::<u32>::deserialize(d)?.filter(|v| *v != 0))
}

impl Route {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Route {
        Route { dst, gw, mtu: None, advmss: None, priority: None, table: None, scope: None }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

fn is_v4(ip: &IpAddr) -> bool {
    ip.is_ipv4()
}

impl CniResult {
    /// Encode for `version`, exactly in that version's shape. Fails only when a 0.1.0/0.2.0
    /// result cannot be formed (no IP address at all).
    pub fn encode(&self, version: Version) -> Result<Value> {
        let mut m = Map::new();
        m.insert("cniVersion".into(), version.as_str().into());
        if !version.has_rich_result() {
            self.encode_legacy(version, &mut m)?;
            return Ok(Value::Object(m));
        }
        let v11 = version.has_1_1_fields();
        if !self.interfaces.is_empty() {
            let list = self.interfaces.iter().map(|i| i.encode(v11)).collect();
            m.insert("interfaces".into(), Value::Array(list));
        }
        if !self.ips.is_empty() {
            let list = self.ips.iter().map(|ip| ip.encode(version.has_ip_version_field())).collect();
            m.insert("ips".into(), Value::Array(list));
        }
        if !self.routes.is_empty() {
            let list = self.routes.iter().map(|r| r.encode(v11)).collect();
            m.insert("routes".into(), Value::Array(list));
        }
        // Up to 1.0.0 "dns" is always printed, `{}` when empty: upstream's Go type is a struct,
        // which `omitempty` never drops (what upstream 1.1.1 prints, and tools parse). The
        // library versions that speak 1.1.0 (libcni 1.2+) drop an empty one, so 1.1.0 does too.
        if version < Version::V1_1_0 || !self.dns.is_empty() {
            m.insert("dns".into(), serde_json::to_value(&self.dns).expect("dns serializes"));
        }
        Ok(Value::Object(m))
    }

    fn encode_legacy(&self, version: Version, m: &mut Map<String, Value>) -> Result<()> {
        let first4 = self.ips.iter().find(|i| is_v4(&i.address.addr()));
        let first6 = self.ips.iter().find(|i| !is_v4(&i.address.addr()));
        if first4.is_none() && first6.is_none() {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("cannot convert result to version {version}: no valid IP addresses"),
            ));
        }
        for (key, ip, want_v4) in [("ip4", first4, true), ("ip6", first6, false)] {
            let Some(ip) = ip else { continue };
            let mut o = Map::new();
            o.insert("ip".into(), ip.address.to_string().into());
            if let Some(gw) = ip.gateway {
                o.insert("gateway".into(), gw.to_string().into());
            }
            let routes: Vec<Value> = self
                .routes
                .iter()
                .filter(|r| is_v4(&r.dst.addr()) == want_v4)
                .map(|r| r.encode(false))
                .collect();
            if !routes.is_empty() {
                o.insert("routes".into(), Value::Array(routes));
            }
            m.insert(key.into(), Value::Object(o));
        }
        m.insert("dns".into(), serde_json::to_value(&self.dns).expect("dns serializes"));
        Ok(())
    }

    /// Encode for `version` as the pretty-printed text a plugin writes on stdout.
    pub fn to_pretty(&self, version: Version) -> Result<String> {
        Ok(pretty(&self.encode(version)?))
    }

    /// Decode a result of any supported version. A document without `cniVersion` is taken
    /// to be `default_version` (the config's version), as the Go library and libcni do.
    pub fn decode(value: &Value, default_version: Version) -> Result<CniResult> {
        let obj = value.as_object().ok_or_else(|| CniError::decode("result is not a JSON object"))?;
        let version = match obj.get("cniVersion") {
            None | Some(Value::Null) => default_version,
            Some(Value::String(s)) if s.is_empty() => default_version,
            Some(Value::String(s)) => Version::from_str_exact(s).ok_or_else(|| {
                CniError::new(code::INCOMPATIBLE_VERSION, format!("unsupported CNI result version {s:?}"))
            })?,
            Some(other) => {
                return Err(CniError::decode(format!("result cniVersion is not a string: {other}")))
            }
        };
        let bad = |e: String| CniError::decode(format!("cannot decode {version} result: {e}"));
        if version.has_rich_result() {
            let w: WireRich = json::from_ref(value).map_err(bad)?;
            Ok(CniResult {
                interfaces: w.interfaces.unwrap_or_default().into_iter().map(Into::into).collect(),
                ips: w.ips.unwrap_or_default().into_iter().map(Into::into).collect(),
                routes: w.routes.unwrap_or_default(),
                dns: w.dns.unwrap_or_default(),
            })
        } else {
            let w: WireLegacy = json::from_ref(value).map_err(bad)?;
            let mut r = CniResult { dns: w.dns.unwrap_or_default(), ..Default::default() };
            for fam in [w.ip4, w.ip6].into_iter().flatten() {
                r.ips.push(IpConfig { interface: None, address: fam.ip, gateway: fam.gateway });
                r.routes.extend(fam.routes.unwrap_or_default());
            }
            Ok(r)
        }
    }
}

/// Pretty-print like the Go library (four-space indent).
pub fn pretty(v: &Value) -> String {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    v.serialize(&mut ser).expect("a Value always serializes");
    String::from_utf8(buf).expect("serde_json writes UTF-8")
}

impl Interface {
    fn encode(&self, v11: bool) -> Value {
        let mut o = Map::new();
        o.insert("name".into(), self.name.clone().into());
        if !self.mac.is_empty() {
            o.insert("mac".into(), self.mac.clone().into());
        }
        if v11 {
            if let Some(mtu) = self.mtu.filter(|m| *m != 0) {
                o.insert("mtu".into(), mtu.into());
            }
        }
        if !self.sandbox.is_empty() {
            o.insert("sandbox".into(), self.sandbox.clone().into());
        }
        if v11 {
            if !self.socket_path.is_empty() {
                o.insert("socketPath".into(), self.socket_path.clone().into());
            }
            if !self.pci_id.is_empty() {
                o.insert("pciID".into(), self.pci_id.clone().into());
            }
        }
        Value::Object(o)
    }
}

impl IpConfig {
    fn encode(&self, with_version: bool) -> Value {
        let mut o = Map::new();
        if with_version {
            let v = if is_v4(&self.address.addr()) { "4" } else { "6" };
            o.insert("version".into(), v.into());
        }
        if let Some(i) = self.interface {
            o.insert("interface".into(), i.into());
        }
        o.insert("address".into(), self.address.to_string().into());
        if let Some(gw) = self.gateway {
            o.insert("gateway".into(), gw.to_string().into());
        }
        Value::Object(o)
    }
}

impl Route {
    fn encode(&self, v11: bool) -> Value {
        let mut o = Map::new();
        o.insert("dst".into(), self.dst.to_string().into());
        if let Some(gw) = self.gw {
            o.insert("gw".into(), gw.to_string().into());
        }
        if v11 {
            for (k, v) in [("mtu", self.mtu), ("advmss", self.advmss), ("priority", self.priority)] {
                if let Some(v) = v.filter(|v| *v != 0) {
                    o.insert(k.into(), v.into());
                }
            }
            if let Some(t) = self.table {
                o.insert("table".into(), t.into());
            }
            if let Some(s) = self.scope {
                o.insert("scope".into(), s.into());
            }
        }
        Value::Object(o)
    }
}

// ---- wire types used for decoding (Go-compatible key matching via spec::json) ----

#[derive(Deserialize)]
struct WireRich {
    interfaces: Option<Vec<WireInterface>>,
    ips: Option<Vec<WireIp>>,
    routes: Option<Vec<Route>>,
    dns: Option<Dns>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireInterface {
    #[serde(default)]
    name: String,
    #[serde(default)]
    mac: String,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    sandbox: String,
    #[serde(default)]
    socket_path: String,
    #[serde(default, rename = "pciID")]
    pci_id: String,
}

#[derive(Deserialize)]
struct WireIp {
    interface: Option<usize>,
    address: IpNet,
    gateway: Option<IpAddr>,
}

#[derive(Deserialize)]
struct WireLegacy {
    ip4: Option<WireLegacyIp>,
    ip6: Option<WireLegacyIp>,
    dns: Option<Dns>,
}

#[derive(Deserialize)]
struct WireLegacyIp {
    ip: IpNet,
    gateway: Option<IpAddr>,
    routes: Option<Vec<Route>>,
}

impl From<WireInterface> for Interface {
    fn from(w: WireInterface) -> Self {
        Interface {
            name: w.name,
            mac: w.mac,
            mtu: w.mtu.filter(|m| *m != 0),
            sandbox: w.sandbox,
            socket_path: w.socket_path,
            pci_id: w.pci_id,
        }
    }
}

impl From<WireIp> for IpConfig {
    fn from(w: WireIp) -> Self {
        IpConfig { interface: w.interface, address: w.address, gateway: w.gateway }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dns_is_empty_only_without_any_field() {
        assert!(Dns::default().is_empty());
        for d in [
            Dns { nameservers: vec!["10.0.0.1".into()], ..Dns::default() },
            Dns { domain: "example.com".into(), ..Dns::default() },
            Dns { search: vec!["svc".into()], ..Dns::default() },
            Dns { options: vec!["ndots:5".into()], ..Dns::default() },
        ] {
            assert!(!d.is_empty(), "{d:?}");
        }
    }

    #[test]
    fn an_empty_result_version_means_the_configs() {
        let r = json!({"cniVersion": "", "ips": [{"version": "4", "address": "10.0.0.2/24"}]});
        let decoded = CniResult::decode(&r, Version::V0_3_1).unwrap();
        assert_eq!(decoded.ips[0].address.to_string(), "10.0.0.2/24");
        let e = CniResult::decode(&json!({"cniVersion": "9.9.9"}), Version::V0_3_1).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
    }
}
