//! The bridge plugin's configuration: every upstream key plus our documented extensions, decoded
//! with Go-compatible key matching and validated completely before anything is touched.

use cni_common::error::{code, CniError, Result};
use cni_common::mac::Mac;
use cni_common::spec::config::{validate_plugin_type, Args};
use cni_common::spec::env::validate_ifname;
use cni_common::spec::result::Dns;
use cni_common::spec::Version;
use cni_common::Request;
use ipnet::IpNet;
use serde::Deserialize;

/// The bridge used when `bridge` is not given.
pub const DEFAULT_BRIDGE: &str = "cni0";

/// One `vlanTrunk` entry: `{"id": N}` or `{"minID": A, "maxID": B}` (or both forms at once).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawTrunk {
    #[serde(rename = "minID", default)]
    pub min_id: Option<i64>,
    #[serde(rename = "maxID", default)]
    pub max_id: Option<i64>,
    #[serde(default)]
    pub id: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RuntimeConfig {
    #[serde(default)]
    pub mac: String,
}

/// The keys as written. Types follow upstream's Go struct, so a JSON type mismatch is a decode
/// error (code 6) naming the key, as in Go.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawConf {
    #[serde(default)]
    pub bridge: Option<String>,
    #[serde(default)]
    pub is_gateway: bool,
    #[serde(default)]
    pub is_default_gateway: bool,
    #[serde(default)]
    pub force_address: bool,
    #[serde(default)]
    pub ip_masq: bool,
    #[serde(default)]
    pub ip_masq_backend: Option<String>,
    #[serde(default)]
    pub mtu: i64,
    #[serde(default)]
    pub hairpin_mode: bool,
    #[serde(default)]
    pub promisc_mode: bool,
    #[serde(default)]
    pub vlan: i64,
    #[serde(default)]
    pub vlan_trunk: Option<Vec<RawTrunk>>,
    #[serde(default)]
    pub preserve_default_vlan: bool,
    #[serde(rename = "macspoofchk", default)]
    pub macspoofchk: bool,
    #[serde(rename = "enabledad", default)]
    pub enabledad: bool,
    #[serde(default)]
    pub disable_container_interface: bool,
    #[serde(default)]
    pub port_isolation: bool,
    #[serde(default)]
    pub args: Option<Args>,
    #[serde(default)]
    pub runtime_config: Option<RuntimeConfig>,
    // ---- our extensions (not upstream; Go's decoder ignores them) ----
    #[serde(default)]
    pub auto_mtu: bool,
    #[serde(rename = "nonMasqueradeCIDRs", default)]
    pub non_masquerade_cidrs: Option<Vec<String>>,
    #[serde(default)]
    pub bridge_nf_call_iptables: bool,
    #[serde(default)]
    pub deferred_delete: Option<bool>,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conf {
    pub bridge: String,
    /// `isGateway`, also implied by `isDefaultGateway`.
    pub is_gateway: bool,
    pub is_default_gateway: bool,
    pub force_address: bool,
    pub ip_masq: bool,
    /// Explicit MTU for a new bridge and both veth ends.
    pub mtu: Option<u32>,
    /// Extension: pick the MTU like kubenet when `mtu` is not set.
    pub auto_mtu: bool,
    pub hairpin: bool,
    pub promisc: bool,
    /// Access VLAN (0 = none).
    pub vlan: u16,
    /// Trunk VIDs, sorted, without duplicates.
    pub trunk: Vec<u16>,
    pub preserve_default_vlan: bool,
    pub macspoofchk: bool,
    pub enable_dad: bool,
    pub disable_container_interface: bool,
    pub port_isolation: bool,
    /// Container MAC (CNI_ARGS `MAC` < `args.cni.mac` < `runtimeConfig.mac`).
    pub mac: Option<Mac>,
    /// Replaces the DNS of the IPAM result when any field is set.
    pub dns: Option<Dns>,
    /// An IPAM plugin is configured (`ipam.type` non-empty); otherwise L2 only.
    pub l3: bool,
    /// Extension: destinations (besides the attachment's own subnet) not to masquerade, and
    /// masquerade only non-local destinations (kubenet's `--non-masquerade-cidr`).
    pub non_masquerade: Option<Vec<IpNet>>,
    /// Extension: set `net.bridge.bridge-nf-call-iptables=1` (and `-ip6tables` for IPv6).
    pub bridge_nf_call_iptables: bool,
    /// Extension: DEL unregisters the container's veth in a detached helper (default false).
    pub deferred_delete: bool,
}

impl Conf {
    /// VLAN filtering is needed on the bridge and its port.
    pub fn uses_vlans(&self) -> bool {
        self.vlan != 0 || !self.trunk.is_empty()
    }
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::config(msg)
}

/// Expand `vlanTrunk` into sorted unique VIDs, with upstream's messages.
pub fn collect_trunk(list: &[RawTrunk]) -> Result<Vec<u16>> {
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let at = |msg: &str| invalid(format!("vlanTrunk[{i}]: {msg}"));
        match (t.min_id, t.max_id) {
            (Some(min), Some(max)) => {
                if !(1..=4094).contains(&min) {
                    return Err(at("incorrect trunk minID parameter (must be 1-4094)"));
                }
                if !(1..=4094).contains(&max) {
                    return Err(at("incorrect trunk maxID parameter (must be 1-4094)"));
                }
                if max < min {
                    return Err(at("minID is greater than maxID in trunk parameter"));
                }
                out.extend((min..=max).map(|v| v as u16));
            }
            (None, Some(_)) => {
                return Err(at("minID and maxID should be configured simultaneously, minID is missing"))
            }
            (Some(_), None) => {
                return Err(at("minID and maxID should be configured simultaneously, maxID is missing"))
            }
            (None, None) => {}
        }
        if let Some(id) = t.id {
            if !(1..=4094).contains(&id) {
                return Err(at("incorrect trunk id parameter (must be 1-4094)"));
            }
            out.push(id as u16);
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// `ipMasqBackend`: only nftables (upstream's other backend, iptables, is refused with code 2).
fn check_masq_backend(backend: Option<&str>) -> Result<()> {
    match backend {
        None | Some("" | "nftables") => Ok(()),
        Some("iptables") => Err(CniError::unsupported_field(
            "ipMasqBackend",
            "\"iptables\"",
            "this bridge plugin masquerades with nftables only (table inet cni_plugins_masquerade, \
             upstream's nftables layout); remove the key or set it to \"nftables\"",
        )),
        Some(other) => Err(invalid(format!(
            "ipMasqBackend {other:?} is not valid: use \"nftables\" (\"iptables\" is not supported here)"
        ))),
    }
}

/// `mtu`: 0 means the kernel's default.
fn mtu_of(mtu: i64) -> Result<Option<u32>> {
    match mtu {
        0 => Ok(None),
        m if (68..=65535).contains(&m) => Ok(Some(m as u32)),
        m => Err(invalid(format!("mtu {m} is out of range: use 68-65535, or 0 for the kernel default"))),
    }
}

/// The container MAC, with upstream's precedence: CNI_ARGS < args.cni.mac < runtimeConfig.mac.
fn container_mac(raw: &RawConf, env_mac: &str) -> Result<Option<Mac>> {
    let from_args = raw.args.as_ref().and_then(|a| a.cni.as_ref()).map(|c| c.mac.as_str());
    let from_runtime = raw.runtime_config.as_ref().map(|r| r.mac.as_str());
    let mut mac = None;
    for (field, value) in
        [("CNI_ARGS MAC", Some(env_mac)), ("args.cni.mac", from_args), ("runtimeConfig.mac", from_runtime)]
    {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            mac = Some(Mac::parse_interface(field, v)?);
        }
    }
    Ok(mac)
}

/// `nonMasqueradeCIDRs`: networks without host bits; only meaningful with `ipMasq`.
fn non_masquerade(list: Option<&[String]>, ip_masq: bool) -> Result<Option<Vec<IpNet>>> {
    let Some(list) = list else { return Ok(None) };
    let mut nets = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let n: IpNet = s
            .parse()
            .map_err(|_| invalid(format!("nonMasqueradeCIDRs[{i}]: {s:?} is not a CIDR like 10.0.0.0/8")))?;
        if n.trunc() != n {
            return Err(invalid(format!(
                "nonMasqueradeCIDRs[{i}]: {s:?} has host bits set (did you mean {}?)",
                n.trunc()
            )));
        }
        nets.push(n);
    }
    if !ip_masq {
        return Err(invalid("nonMasqueradeCIDRs only makes sense with \"ipMasq\": true"));
    }
    Ok(Some(nets))
}

/// Keys that cannot be combined.
fn check_combinations(raw: &RawConf, l3: bool) -> Result<()> {
    if raw.hairpin_mode && raw.promisc_mode {
        return Err(invalid("cannot set hairpin mode and promiscuous mode at the same time"));
    }
    if l3 && raw.disable_container_interface {
        return Err(invalid(
            "cannot use IPAM when the container interface is disabled (disableContainerInterface): \
             remove ipam or disableContainerInterface",
        ));
    }
    Ok(())
}

impl Conf {
    /// Decode and validate the request's configuration (CNI_ARGS included).
    pub fn from_request(req: &Request) -> Result<Conf> {
        let raw: RawConf = req.plugin_config()?;
        let env_mac = req.cni_args(&["MAC"])?.get("MAC").map(str::to_string).unwrap_or_default();
        Conf::from_raw(raw, &env_mac, req.conf.ipam_type().is_some(), req.conf.dns.clone())
    }

    pub fn from_raw(raw: RawConf, env_mac: &str, l3: bool, dns: Option<Dns>) -> Result<Conf> {
        let bridge = match &raw.bridge {
            None => DEFAULT_BRIDGE.to_string(),
            Some(b) => {
                validate_ifname(b).map_err(|e| invalid(format!("bridge {b:?}: {}", e.msg)))?;
                b.clone()
            }
        };
        check_masq_backend(raw.ip_masq_backend.as_deref())?;
        if !(0..=4094).contains(&raw.vlan) {
            return Err(invalid(format!("invalid VLAN ID {} (must be between 0 and 4094)", raw.vlan)));
        }
        let trunk = collect_trunk(raw.vlan_trunk.as_deref().unwrap_or_default())?;
        let mtu = mtu_of(raw.mtu)?;
        check_combinations(&raw, l3)?;
        let mac = container_mac(&raw, env_mac)?;
        let non_masquerade = non_masquerade(raw.non_masquerade_cidrs.as_deref(), raw.ip_masq)?;
        Ok(Conf {
            bridge,
            is_gateway: raw.is_gateway || raw.is_default_gateway,
            is_default_gateway: raw.is_default_gateway,
            force_address: raw.force_address,
            ip_masq: raw.ip_masq,
            mtu,
            auto_mtu: raw.auto_mtu,
            hairpin: raw.hairpin_mode,
            promisc: raw.promisc_mode,
            vlan: raw.vlan as u16,
            trunk,
            preserve_default_vlan: raw.preserve_default_vlan,
            macspoofchk: raw.macspoofchk,
            enable_dad: raw.enabledad,
            disable_container_interface: raw.disable_container_interface,
            port_isolation: raw.port_isolation,
            mac,
            dns: dns.filter(|d| !d.is_empty()),
            l3,
            non_masquerade,
            bridge_nf_call_iptables: raw.bridge_nf_call_iptables,
            deferred_delete: raw.deferred_delete.unwrap_or(false),
        })
    }

    /// Checks that depend on the spec version of the request (ADD only).
    pub fn check_version(&self, v: Version) -> Result<()> {
        if !self.l3 && !v.has_rich_result() {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "a layer-2 bridge attachment (no ipam) has no IP address, which a {v} result cannot express: \
                     use cniVersion 0.3.0 or later"
                ),
            ));
        }
        Ok(())
    }
}

/// What DEL and GC read of the configuration, and all they judge of it. A runtime DELs with the
/// configuration it cached at ADD time, which upstream may have accepted although this ADD
/// refuses it (`ipMasqBackend: "iptables"`, a bridge name or MAC we find invalid, …): cleanup
/// must not depend on values only ADD uses. What still fails: type errors (code 6, as in Go)
/// and an IPAM `type` that is not a bare binary name — hostile, never executed, and refused
/// before anything is touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Teardown {
    /// An IPAM plugin is configured: DEL and GC forward to it.
    pub l3: bool,
    pub ip_masq: bool,
    pub macspoofchk: bool,
    pub deferred_delete: bool,
    /// The bridge's name (`bridge`, or [`DEFAULT_BRIDGE`]), not judged: DEL only compares it
    /// with the name of the bridge a container interface's host end is a port of.
    pub bridge: String,
}

impl Teardown {
    pub fn from_request(req: &Request) -> Result<Teardown> {
        let raw: RawConf = req.plugin_config()?;
        if let Some(t) = req.conf.ipam_type() {
            validate_plugin_type("ipam.type", t)?;
        }
        Ok(Teardown::from_raw(&raw, req.conf.ipam_type().is_some()))
    }

    pub fn from_raw(raw: &RawConf, l3: bool) -> Teardown {
        Teardown {
            l3,
            ip_masq: raw.ip_masq,
            macspoofchk: raw.macspoofchk,
            deferred_delete: raw.deferred_delete.unwrap_or(false),
            bridge: raw.bridge.clone().unwrap_or_else(|| DEFAULT_BRIDGE.to_string()),
        }
    }

    /// The attachment may have nf_tables state (and a kernel without nf_tables is an error).
    pub fn firewall(&self) -> bool {
        self.ip_masq || self.macspoofchk
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::spec::json;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> Result<Conf> {
        let l3 =
            v.get("ipam").and_then(|i| i.get("type")).and_then(|t| t.as_str()).is_some_and(|t| !t.is_empty());
        let raw: RawConf = json::from_value(v).map_err(CniError::decode)?;
        Conf::from_raw(raw, "", l3, None)
    }

    #[test]
    fn defaults() {
        let c = conf(json!({"name": "n", "type": "bridge"})).unwrap();
        assert_eq!(c.bridge, "cni0");
        assert!(!c.is_gateway && !c.ip_masq && !c.hairpin && !c.l3);
        assert_eq!(c.mtu, None);
        assert!(!c.preserve_default_vlan, "upstream HEAD defaults preserveDefaultVlan to false");
        assert!(!c.deferred_delete, "DEL waits for the kernel unless asked not to");
        assert!(!c.uses_vlans());
    }

    #[test]
    fn every_upstream_key_case_insensitively() {
        let c = conf(json!({
            "Bridge": "br9", "IsGateway": false, "isDefaultGateway": true, "forceAddress": true,
            "IPMASQ": true, "ipMasqBackend": "nftables", "MTU": 1400, "hairpinmode": true,
            "vlan": 100, "vlanTrunk": [{"id": 5}, {"minID": 200, "maxID": 202}, {"id": 201}],
            "preserveDefaultVlan": true, "macspoofchk": true, "enabledad": true, "portIsolation": true,
            "args": {"cni": {"mac": "0a:58:00:00:00:01"}}, "addIf": "eth0"
        }))
        .unwrap();
        assert_eq!(c.bridge, "br9");
        assert!(c.is_gateway, "isDefaultGateway implies isGateway");
        assert!(c.is_default_gateway && c.force_address && c.ip_masq && c.hairpin);
        assert_eq!(c.mtu, Some(1400));
        assert_eq!(c.vlan, 100);
        assert_eq!(c.trunk, vec![5, 200, 201, 202]);
        assert!(c.preserve_default_vlan && c.macspoofchk && c.enable_dad && c.port_isolation);
        assert_eq!(c.mac, Some(Mac([0x0a, 0x58, 0, 0, 0, 1])));
    }

    #[test]
    fn mac_precedence_env_then_args_then_runtime_config() {
        let raw = |v: serde_json::Value| -> RawConf { json::from_value(v).unwrap() };
        let c = Conf::from_raw(raw(json!({})), "0a:00:00:00:00:01", false, None).unwrap();
        assert_eq!(c.mac.unwrap().0[5], 1);
        let c = Conf::from_raw(
            raw(json!({"args": {"cni": {"mac": "0a:00:00:00:00:02"}}})),
            "0a:00:00:00:00:01",
            false,
            None,
        )
        .unwrap();
        assert_eq!(c.mac.unwrap().0[5], 2);
        let c = Conf::from_raw(
            raw(json!({"args": {"cni": {"mac": "0a:00:00:00:00:02"}}, "runtimeConfig": {"mac": "0a-00-00-00-00-03"}})),
            "0a:00:00:00:00:01",
            false,
            None,
        )
        .unwrap();
        assert_eq!(c.mac.unwrap().0[5], 3);
        for bad in [
            "0a:00:00:00:00",
            "zz:00:00:00:00:01",
            "01:00:5e:00:00:01",
            "00:00:00:00:00:00",
            "0a:0:00:00:00:01",
        ] {
            let e = Conf::from_raw(raw(json!({"runtimeConfig": {"mac": bad}})), "", false, None).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
            assert!(e.msg.starts_with("runtimeConfig.mac: invalid MAC address"), "{}", e.msg);
        }
    }

    #[test]
    fn vlan_validation_matches_upstream() {
        for (v, ok) in [(0, true), (1, true), (4094, true), (-1, false), (4095, false)] {
            let r = conf(json!({"vlan": v}));
            assert_eq!(r.is_ok(), ok, "vlan {v}");
            if let Err(e) = r {
                assert_eq!(e.msg, format!("invalid VLAN ID {v} (must be between 0 and 4094)"));
            }
        }
        let cases = [
            (json!([{"minID": 0, "maxID": 5}]), "incorrect trunk minID parameter"),
            (json!([{"minID": -1, "maxID": 5}]), "incorrect trunk minID parameter"),
            (json!([{"minID": 5, "maxID": 4095}]), "incorrect trunk maxID parameter"),
            (json!([{"minID": 5, "maxID": 0}]), "incorrect trunk maxID parameter"),
            (json!([{"minID": 10, "maxID": 5}]), "minID is greater than maxID"),
            (json!([{"maxID": 5}]), "minID is missing"),
            (json!([{"minID": 5}]), "maxID is missing"),
            (json!([{"id": 0}]), "incorrect trunk id parameter"),
            (json!([{"id": 4095}]), "incorrect trunk id parameter"),
        ];
        for (trunk, msg) in cases {
            let e = conf(json!({"vlanTrunk": trunk})).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG);
            assert!(e.msg.contains(msg), "{trunk}: {}", e.msg);
        }
        assert_eq!(conf(json!({"vlanTrunk": []})).unwrap().trunk, Vec::<u16>::new());
        assert_eq!(conf(json!({"vlanTrunk": [{"id": 7}, {"id": 7}]})).unwrap().trunk, vec![7]);
        assert!(conf(json!({"vlan": 5, "vlanTrunk": [{"id": 7}]})).unwrap().uses_vlans());
    }

    #[test]
    fn conflicting_and_bad_values() {
        let e = conf(json!({"hairpinMode": true, "promiscMode": true})).unwrap_err();
        assert_eq!(e.msg, "cannot set hairpin mode and promiscuous mode at the same time");
        let e = conf(json!({"disableContainerInterface": true, "ipam": {"type": "host-local"}})).unwrap_err();
        assert!(e.msg.starts_with("cannot use IPAM when the container interface is disabled"), "{}", e.msg);
        assert!(conf(json!({"disableContainerInterface": true, "ipam": {}})).is_ok(), "empty ipam is L2");
        let e = conf(json!({"ipMasq": true, "ipMasqBackend": "iptables"})).unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        assert!(e.msg.contains("\"ipMasqBackend\""), "{}", e.msg);
        let e = conf(json!({"ipMasqBackend": "pf"})).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        for m in [-1, 1, 67, 65536] {
            assert_eq!(conf(json!({"mtu": m})).unwrap_err().code, code::INVALID_CONFIG, "mtu {m}");
        }
        for b in ["", "a/b", "this-name-is-too-long", "with space"] {
            let e = conf(json!({"bridge": b})).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{b}");
            assert!(e.msg.starts_with("bridge "), "{}", e.msg);
        }
        // Booleans must be booleans, as in Go.
        assert_eq!(conf(json!({"isGateway": "true"})).unwrap_err().code, code::DECODE);
        assert_eq!(conf(json!({"vlan": "100"})).unwrap_err().code, code::DECODE);
    }

    #[test]
    fn extension_keys() {
        let c =
            conf(json!({"autoMtu": true, "ipMasq": true, "nonMasqueradeCIDRs": ["10.0.0.0/8", "fd00::/8"],
                            "bridgeNfCallIptables": true, "deferredDelete": true}))
            .unwrap();
        assert!(c.auto_mtu && c.bridge_nf_call_iptables && c.deferred_delete);
        assert_eq!(c.non_masquerade.unwrap().len(), 2);
        let e = conf(json!({"ipMasq": true, "nonMasqueradeCIDRs": ["10.0.0.1/8"]})).unwrap_err();
        assert!(e.msg.contains("host bits"), "{}", e.msg);
        let e = conf(json!({"ipMasq": true, "nonMasqueradeCIDRs": ["nope"]})).unwrap_err();
        assert!(e.msg.starts_with("nonMasqueradeCIDRs[0]"), "{}", e.msg);
        let e = conf(json!({"nonMasqueradeCIDRs": ["10.0.0.0/8"]})).unwrap_err();
        assert!(e.msg.contains("ipMasq"), "{}", e.msg);
    }

    #[test]
    fn l2_needs_a_rich_result_version() {
        let c = conf(json!({})).unwrap();
        assert_eq!(c.check_version(Version::V0_2_0).unwrap_err().code, code::INCOMPATIBLE_VERSION);
        assert!(c.check_version(Version::V0_3_0).is_ok());
        let c = conf(json!({"ipam": {"type": "host-local"}})).unwrap();
        assert!(c.check_version(Version::V0_1_0).is_ok());
    }

    #[test]
    fn teardown_reads_what_del_needs_and_tolerates_what_only_add_refuses() {
        let raw = |v: serde_json::Value| -> RawConf { json::from_value(v).unwrap() };
        // Every value here makes ADD fail; DEL and GC still know what to remove.
        for v in [
            json!({"ipMasq": true, "ipMasqBackend": "iptables", "macspoofchk": true}),
            json!({"ipMasq": true, "ipMasqBackend": "pf", "macspoofchk": true}),
            json!({"ipMasq": true, "mtu": 5, "vlan": 9999, "bridge": "no/such", "macspoofchk": true}),
            json!({"ipMasq": true, "hairpinMode": true, "promiscMode": true, "macspoofchk": true}),
            json!({"ipMasq": true, "runtimeConfig": {"mac": "01:00:5e:00:00:01"}, "macspoofchk": true}),
        ] {
            assert!(Conf::from_raw(raw(v.clone()), "", true, None).is_err(), "ADD refuses {v}");
            let t = Teardown::from_raw(&raw(v.clone()), true);
            assert_eq!(
                t,
                Teardown {
                    l3: true,
                    ip_masq: true,
                    macspoofchk: true,
                    deferred_delete: false,
                    bridge: v["bridge"].as_str().unwrap_or(DEFAULT_BRIDGE).to_string()
                },
                "{v}"
            );
            assert!(t.firewall());
        }
        let t = Teardown::from_raw(&raw(json!({"deferredDelete": true})), false);
        assert!(t.deferred_delete && !t.firewall() && !t.l3);
    }

    #[test]
    fn vlans_in_use_a_trunk_of_one_and_what_teardown_needs_a_firewall_for() {
        assert!(conf(json!({"vlan": 7})).unwrap().uses_vlans());
        assert!(conf(json!({"vlanTrunk": [{"id": 7}]})).unwrap().uses_vlans());
        assert_eq!(conf(json!({"vlanTrunk": [{"minID": 9, "maxID": 9}]})).unwrap().trunk, vec![9]);
        let raw = |v: serde_json::Value| -> RawConf { json::from_value(v).unwrap() };
        for (v, fw) in
            [(json!({}), false), (json!({"ipMasq": true}), true), (json!({"macspoofchk": true}), true)]
        {
            assert_eq!(Teardown::from_raw(&raw(v.clone()), false).firewall(), fw, "{v}");
        }
    }

    #[test]
    fn dns_of_the_config_is_kept_unless_empty() {
        let with =
            |dns: Dns| Conf::from_raw(json::from_value(json!({})).unwrap(), "", false, Some(dns)).unwrap();
        let d = Dns { nameservers: vec!["10.0.0.10".into()], ..Dns::default() };
        assert_eq!(with(d.clone()).dns, Some(d));
        assert_eq!(with(Dns::default()).dns, None);
    }
}
