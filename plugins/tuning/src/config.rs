//! The keys of a tuning configuration (upstream's), validated before anything is touched
//! (pure, apart from reading the sysctl allowlist when there is one).
//!
//! - `sysctl`: `{"net.ipv4.conf.IFNAME.arp_filter": "1", …}` written in the container's network
//!   namespace; dots are path separators, the first `IFNAME` is CNI_IFNAME. Only keys under
//!   `net/` are accepted (per-namespace: a global `net.core` key has no file in a container's
//!   namespace and fails there), and no component may be empty, `.` or `..`. A key given twice
//!   is refused, as upstream does.
//! - `mac`, `promisc`, `mtu`, `allmulti`, `txQLen`: link settings of CNI_IFNAME, saved before they
//!   change and restored by DEL.
//! - `mac` also from `CNI_ARGS` (`MAC=…`) and `runtimeConfig.mac`; everything from
//!   `args.cni` (`sysctl` merged in, the others replacing). Precedence as upstream:
//!   CNI_ARGS < runtimeConfig < args.cni.
//! - `dataDir`: where the saved settings go (default `/run/cni/tuning`).
//! - `/etc/cni/tuning/allowlist.conf`, when present: every sysctl key must match one of its
//!   lines (regular expressions, unanchored, as Go's `regexp.MatchString`).

use std::fmt;
use std::path::{Path, PathBuf};

use cni_common::error::{CniError, Result};
use cni_common::mac::Mac;
use cni_common::Request;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

pub const DEFAULT_DATA_DIR: &str = "/run/cni/tuning";
pub const ALLOWLIST: &str = "/etc/cni/tuning/allowlist.conf";

/// `sysctl` as written: key order kept, a key given twice refused (code 6, like upstream's
/// decode error).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SysctlMap(pub Vec<(String, String)>);

impl<'de> Deserialize<'de> for SysctlMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SysctlMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of sysctl keys and string values")
            }
            fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<SysctlMap, E> {
                Ok(SysctlMap::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<SysctlMap, A::Error> {
                let mut v: Vec<(String, String)> = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, String>()? {
                    if v.iter().any(|(x, _)| *x == k) {
                        return Err(serde::de::Error::custom(format!(
                            "duplicated sysctl keys are not allowed ({k:?})"
                        )));
                    }
                    v.push((k, val));
                }
                Ok(SysctlMap(v))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RuntimeConfig {
    #[serde(default)]
    pub mac: String,
}

/// `args.cni`: every key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArgsCni {
    #[serde(default)]
    pub sysctl: Option<SysctlMap>,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub promisc: Option<bool>,
    #[serde(default)]
    pub mtu: Option<i64>,
    #[serde(default)]
    pub allmulti: Option<bool>,
    #[serde(rename = "txQLen", default)]
    pub txqlen: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Args {
    #[serde(default)]
    pub cni: Option<ArgsCni>,
}

/// The keys as written; types follow upstream's Go struct (a mismatch is code 6).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawConf {
    #[serde(default)]
    pub data_dir: String,
    #[serde(default)]
    pub sysctl: Option<SysctlMap>,
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub promisc: bool,
    #[serde(default)]
    pub mtu: i64,
    #[serde(rename = "txQLen", default)]
    pub txqlen: Option<i64>,
    #[serde(default)]
    pub allmulti: Option<bool>,
    #[serde(default)]
    pub runtime_config: Option<RuntimeConfig>,
    #[serde(default)]
    pub args: Option<Args>,
}

/// One sysctl: the key as configured, its path below /proc/sys (slash form), the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysctl {
    pub key: String,
    pub path: String,
    pub value: String,
}

/// The link settings ADD makes (`None`/false: left alone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkSettings {
    pub mac: Option<Mac>,
    /// Only `true` does anything (upstream's `promisc: false` leaves the link as it is).
    pub promisc: bool,
    pub mtu: Option<u32>,
    pub allmulti: Option<bool>,
    pub txqlen: Option<u32>,
}

impl LinkSettings {
    pub fn any(&self) -> bool {
        self.mac.is_some()
            || self.promisc
            || self.mtu.is_some()
            || self.allmulti.is_some()
            || self.txqlen.is_some()
    }
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conf {
    pub sysctls: Vec<Sysctl>,
    pub link: LinkSettings,
    pub data_dir: PathBuf,
}

fn data_dir_of(raw: &RawConf) -> PathBuf {
    PathBuf::from(if raw.data_dir.is_empty() { DEFAULT_DATA_DIR } else { raw.data_dir.as_str() })
}

impl Conf {
    pub fn from_request(req: &Request) -> Result<Conf> {
        // type errors first: the decoder of the parsed object names the field
        let raw: RawConf = req.plugin_config()?;
        reject_duplicate_sysctls(&req.stdin)?;
        let args = req.cni_args(&["MAC"])?;
        let allowlist = read_allowlist(Path::new(ALLOWLIST))?;
        Conf::from_raw(raw, args.get("MAC"), &req.env.ifname, allowlist.as_deref())
    }

    /// `env_mac`: CNI_ARGS' `MAC`; `allowlist`: the lines of the allowlist file, if it exists.
    pub fn from_raw(
        raw: RawConf,
        env_mac: Option<&str>,
        ifname: &str,
        allowlist: Option<&[String]>,
    ) -> Result<Conf> {
        let data_dir = data_dir_of(&raw);
        let mut sysctls: Vec<(String, String)> = raw.sysctl.map(|s| s.0).unwrap_or_default();
        let mut mac = Some(raw.mac).filter(|m| !m.is_empty());
        if let Some(m) = env_mac.filter(|m| !m.is_empty()) {
            mac = Some(m.to_string());
        }
        if let Some(m) = raw.runtime_config.map(|r| r.mac).filter(|m| !m.is_empty()) {
            mac = Some(m);
        }
        let (mut promisc, mut mtu, mut allmulti, mut txqlen) =
            (raw.promisc, raw.mtu, raw.allmulti, raw.txqlen);
        if let Some(a) = raw.args.and_then(|a| a.cni) {
            for (k, v) in a.sysctl.map(|s| s.0).unwrap_or_default() {
                match sysctls.iter_mut().find(|(x, _)| *x == k) {
                    Some(e) => e.1 = v,
                    None => sysctls.push((k, v)),
                }
            }
            mac = a.mac.or(mac);
            promisc = a.promisc.unwrap_or(promisc);
            mtu = a.mtu.unwrap_or(mtu);
            allmulti = a.allmulti.or(allmulti);
            txqlen = a.txqlen.or(txqlen);
        }
        let mut resolved = Vec::new();
        for (key, value) in sysctls {
            let path = sysctl_path(&key, ifname)?;
            if let Some(list) = allowlist {
                if !allowed(&key, list)? {
                    return Err(CniError::config(format!(
                        "Sysctl {key} is not allowed. Only the following sysctls are allowed: {list:?} ({ALLOWLIST})"
                    )));
                }
            }
            resolved.push(Sysctl { key, path, value });
        }
        let mac = match mac {
            None => None,
            Some(m) => Some(Mac::parse(&m).map_err(|e| {
                CniError::config(format!(
                    "invalid args {m:?} for MAC addr: {e} (want six hex octets, e.g. 02:00:00:00:00:01)"
                ))
            })?),
        };
        let mtu = match mtu {
            0 => None,
            m if (68..=65535).contains(&m) => Some(m as u32),
            m => return Err(CniError::config(format!("mtu {m} is out of range: use 68-65535"))),
        };
        let txqlen = match txqlen {
            None => None,
            Some(q) if (0..=i64::from(u32::MAX)).contains(&q) => Some(q as u32),
            Some(q) => return Err(CniError::config(format!("txQLen {q} is out of range: use 0-4294967295"))),
        };
        Ok(Conf { sysctls: resolved, link: LinkSettings { mac, promisc, mtu, allmulti, txqlen }, data_dir })
    }
}

/// A `sysctl` key given twice in the configuration as sent (the parsed object keeps only the
/// last): refused with code 6, as upstream's decoder refuses it.
pub fn reject_duplicate_sysctls(stdin: &[u8]) -> Result<()> {
    #[derive(Deserialize)]
    struct Only {
        #[serde(default)]
        #[allow(dead_code)]
        sysctl: Option<SysctlMap>,
    }
    serde_json::from_slice::<Only>(stdin)
        .map(drop)
        .map_err(|e| CniError::decode(format!("invalid network config: {e}")))
}

/// What DEL and GC read: the directory of saved settings only (values only ADD judges never
/// stop a cleanup; a type error is still code 6).
pub fn teardown_data_dir(req: &Request) -> Result<PathBuf> {
    let raw: RawConf = req.plugin_config()?;
    Ok(data_dir_of(&raw))
}

/// The path below /proc/sys of a sysctl key, upstream's way (dots become slashes, then the
/// first `IFNAME` becomes `ifname`), refused unless it stays below `net/`.
pub fn sysctl_path(key: &str, ifname: &str) -> Result<String> {
    let path = key.replace('.', "/").replacen("IFNAME", ifname, 1);
    let parts: Vec<&str> = path.split('/').collect();
    let escapes = parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..");
    if parts.first() != Some(&"net") || parts.len() < 2 || escapes || path.contains('\0') {
        return Err(CniError::config(format!(
            "invalid net sysctl key: {key:?}: only keys of the container's network namespace (net.*) can be set"
        )));
    }
    Ok(path)
}

fn allowed(key: &str, list: &[String]) -> Result<bool> {
    for pattern in list {
        let re = regex_lite::Regex::new(pattern)
            .map_err(|e| CniError::config(format!("{ALLOWLIST}: pattern {pattern:?}: {e}")))?;
        if re.is_match(key) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The allowlist's non-empty lines, trimmed; `None` when there is no such file.
pub fn read_allowlist(path: &Path) -> Result<Option<Vec<String>>> {
    match cni_common::fsread::read_named_regular(path, 1 << 20) {
        Ok(bytes) => Ok(Some(
            String::from_utf8_lossy(&bytes)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CniError::io(format!("read {}: {e}", path.display()))),
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
        Conf::from_raw(raw, None, "eth0", None)
    }

    #[test]
    fn sysctl_keys_stay_in_the_namespaces_net_tree() {
        assert_eq!(
            sysctl_path("net.ipv4.conf.IFNAME.arp_filter", "eth0").unwrap(),
            "net/ipv4/conf/eth0/arp_filter"
        );
        assert_eq!(
            sysctl_path("net/ipv6/conf/IFNAME/accept_ra", "e.1").unwrap(),
            "net/ipv6/conf/e.1/accept_ra"
        );
        assert_eq!(sysctl_path("net.core.somaxconn", "eth0").unwrap(), "net/core/somaxconn");
        // Two parts pass here, as upstream's; the kernel refuses a directory when it is written.
        assert_eq!(sysctl_path("net.core", "eth0").unwrap(), "net/core");
        for bad in [
            "kernel.panic",
            "net",
            "net.",
            "net..ipv4",
            "net/../kernel/panic",
            "/net/ipv4/ip_forward",
            "vm.swappiness",
            "net/./x",
            "",
        ] {
            let e = sysctl_path(bad, "eth0").unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
        }
    }

    /// DEL and GC read only the data directory: the configured one, or the default.
    #[test]
    fn teardown_reads_the_data_directory_or_its_default() {
        use cni_common::spec::env::Env;
        use cni_common::spec::{Command, Version};
        let req = |conf: serde_json::Value| {
            let env = Env {
                command: Some(Command::Del),
                container_id: "c0ffee".into(),
                netns: String::new(),
                ifname: "eth0".into(),
                args: String::new(),
                path: "/opt/cni/bin".into(),
                netns_override: true,
            };
            Request::new(env, serde_json::to_vec(&conf).unwrap(), &Version::ALL).unwrap()
        };
        let base = json!({"cniVersion": "1.0.0", "name": "n", "type": "tuning"});
        assert_eq!(teardown_data_dir(&req(base.clone())).unwrap(), PathBuf::from(DEFAULT_DATA_DIR));
        let mut with = base;
        with["dataDir"] = json!("/var/lib/tuning-test");
        assert_eq!(teardown_data_dir(&req(with)).unwrap(), PathBuf::from("/var/lib/tuning-test"));
    }

    #[test]
    fn a_sysctl_of_another_type_names_what_is_expected() {
        let e = serde_json::from_str::<RawConf>(r#"{"sysctl": 5}"#).unwrap_err().to_string();
        assert!(e.contains("an object of sysctl keys and string values"), "{e}");
    }

    /// The allowlist file: absent is no list, present is its trimmed non-empty lines, and one
    /// that cannot be read (a directory there) is an error, not an absent list.
    #[test]
    fn the_allowlist_is_absent_read_or_an_error() {
        let dir = std::env::temp_dir().join(format!("tuning-allowlist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_allowlist(&dir.join("none")).unwrap(), None);
        let file = dir.join("list");
        std::fs::write(&file, "  ^net\\.core\\..*$ \n\n\tsomaxconn\n   \n").unwrap();
        assert_eq!(
            read_allowlist(&file).unwrap(),
            Some(vec!["^net\\.core\\..*$".to_string(), "somaxconn".to_string()])
        );
        std::fs::write(&file, "\n").unwrap();
        assert_eq!(read_allowlist(&file).unwrap(), Some(vec![]));
        let e = read_allowlist(&dir).unwrap_err();
        assert_eq!(e.code, code::IO, "{}", e.msg);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn duplicate_keys_and_types_are_decode_errors() {
        let raw = r#"{"sysctl": {"net.core.somaxconn": "1", "net.core.somaxconn": "2"}}"#;
        let e = serde_json::from_str::<RawConf>(raw).unwrap_err().to_string();
        assert!(e.contains("duplicated sysctl keys"), "{e}");
        let e = reject_duplicate_sysctls(raw.as_bytes()).unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(reject_duplicate_sysctls(br#"{"sysctl": {"net.a": "1"}, "other": {"x": 1, "x": 2}}"#).is_ok());
        assert!(conf(json!({"sysctl": {"net.core.somaxconn": 5}})).is_err());
        assert!(conf(json!({"mtu": "1500"})).is_err());
        assert!(conf(json!({"sysctl": null})).unwrap().sysctls.is_empty());
    }

    #[test]
    fn precedence_cni_args_then_runtime_config_then_args_cni() {
        let raw = |v| json::from_value::<RawConf>(v).unwrap();
        let m = |c: Conf| c.link.mac.unwrap().to_string();
        let base = json!({"mac": "02:00:00:00:00:01"});
        assert_eq!(m(Conf::from_raw(raw(base.clone()), None, "eth0", None).unwrap()), "02:00:00:00:00:01");
        assert_eq!(
            m(Conf::from_raw(raw(base), Some("02:00:00:00:00:02"), "eth0", None).unwrap()),
            "02:00:00:00:00:02"
        );
        let rc = json!({"mac": "02:00:00:00:00:01", "runtimeConfig": {"mac": "02:00:00:00:00:03"}});
        assert_eq!(
            m(Conf::from_raw(raw(rc), Some("02:00:00:00:00:02"), "eth0", None).unwrap()),
            "02:00:00:00:00:03"
        );
        let all = json!({"runtimeConfig": {"mac": "02:00:00:00:00:03"}, "mtu": 1400, "promisc": false,
                         "sysctl": {"net.core.somaxconn": "1", "net.ipv4.conf.IFNAME.arp_filter": "1"},
                         "args": {"cni": {"mac": "02:00:00:00:00:04", "mtu": 1300, "promisc": true,
                                          "allmulti": true, "txQLen": 7,
                                          "sysctl": {"net.core.somaxconn": "2"}}}});
        let c = Conf::from_raw(raw(all), None, "eth0", None).unwrap();
        assert_eq!(c.link.mac.unwrap().to_string(), "02:00:00:00:00:04");
        assert_eq!(
            (c.link.mtu, c.link.promisc, c.link.allmulti, c.link.txqlen),
            (Some(1300), true, Some(true), Some(7))
        );
        let s: Vec<(&str, &str)> = c.sysctls.iter().map(|s| (s.path.as_str(), s.value.as_str())).collect();
        assert_eq!(s, vec![("net/core/somaxconn", "2"), ("net/ipv4/conf/eth0/arp_filter", "1")]);
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    }

    /// Both ends of each range (issue 28: a boundary is tested on both sides of it).
    #[test]
    fn mtu_and_txqlen_at_the_ends_of_their_ranges() {
        for (m, want) in [(0, None), (68, Some(68)), (1500, Some(1500)), (65535, Some(65535))] {
            assert_eq!(conf(json!({"mtu": m})).unwrap().link.mtu, want, "mtu {m}");
        }
        for m in [1, 67, 65536, -1] {
            let e = conf(json!({"mtu": m})).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "mtu {m}");
            assert!(e.msg.contains("use 68-65535"), "{}", e.msg);
        }
        for (q, want) in [(0, Some(0)), (4_294_967_295_i64, Some(u32::MAX))] {
            assert_eq!(conf(json!({"txQLen": q})).unwrap().link.txqlen, want, "txQLen {q}");
        }
        assert_eq!(conf(json!({"txQLen": 4_294_967_296_i64})).unwrap_err().code, code::INVALID_CONFIG);
    }

    #[test]
    fn bad_values_are_config_errors() {
        for (v, part) in [
            (json!({"mac": "02:00:00:00:00"}), "MAC"),
            (json!({"mtu": 20}), "mtu 20"),
            (json!({"txQLen": -1}), "txQLen"),
            (json!({"sysctl": {"kernel.panic": "1"}}), "kernel.panic"),
        ] {
            let e = conf(v).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{}", e.msg);
            assert!(e.msg.contains(part), "{}", e.msg);
        }
    }

    #[test]
    fn the_allowlist_is_unanchored_regular_expressions() {
        let list = vec!["^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]+$".to_string(), "somaxconn".to_string()];
        let raw = |v| json::from_value::<RawConf>(v).unwrap();
        let ok = json!({"sysctl": {"net.ipv4.conf.IFNAME.arp_filter": "1", "net.core.somaxconn": "9"}});
        assert!(Conf::from_raw(raw(ok), None, "eth0", Some(&list)).is_ok());
        let no = json!({"sysctl": {"net.ipv4.ip_forward": "1"}});
        let e = Conf::from_raw(raw(no), None, "eth0", Some(&list)).unwrap_err();
        assert!(e.msg.contains("not allowed"), "{}", e.msg);
        let bad = vec!["(".to_string()];
        assert!(Conf::from_raw(raw(json!({"sysctl": {"net.a": "1"}})), None, "eth0", Some(&bad)).is_err());
    }
}
