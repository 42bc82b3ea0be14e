//! host-local configuration: decoding (Go-compatible keys), merging of the range sources,
//! requested addresses, and validation. Nothing here touches the filesystem except reading
//! `resolvConf` on ADD.

use crate::range::RangeSet;
use cni_common::error::{code, CniError, Result};
use cni_common::spec::config::{empty_ip_is_none, Args, RangeConf};
use cni_common::spec::result::{Dns, Route};
use cni_common::{Request, Version};
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default)]
    ipam: Option<WireIpam>,
    #[serde(default)]
    runtime_config: Option<WireRuntime>,
    #[serde(default)]
    args: Option<Args>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireIpam {
    #[serde(default)]
    ranges: Vec<Vec<RangeConf>>,
    #[serde(default)]
    subnet: Option<IpNet>,
    #[serde(default, deserialize_with = "empty_ip_is_none")]
    range_start: Option<IpAddr>,
    #[serde(default, deserialize_with = "empty_ip_is_none")]
    range_end: Option<IpAddr>,
    #[serde(default, deserialize_with = "empty_ip_is_none")]
    gateway: Option<IpAddr>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    data_dir: Option<String>,
    #[serde(default)]
    resolv_conf: Option<String>,
    /// Ours: seconds a call waits for the store lock (default 60).
    #[serde(default)]
    lock_timeout: Option<u64>,
    /// Ours: STATUS fails (code 50) when a range set is exhausted.
    #[serde(default)]
    report_exhaustion_in_status: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRuntime {
    #[serde(default)]
    ip_ranges: Vec<Vec<RangeConf>>,
    #[serde(default)]
    ips: Vec<String>,
}

/// The validated configuration of one invocation.
#[derive(Debug, Clone)]
pub struct Config {
    /// Network name (validated by the skeleton: no path characters).
    pub name: String,
    pub data_dir: PathBuf,
    /// Merged range sets: `runtimeConfig.ipRanges`, then the legacy single range, then `ranges`.
    /// The position is the `N` of `last_reserved_ip.N`.
    pub sets: Vec<RangeSet>,
    pub routes: Vec<Route>,
    pub resolv_conf: Option<PathBuf>,
    /// Requested addresses (CNI_ARGS `IP`, `args.cni.ips`, `runtimeConfig.ips`), deduplicated,
    /// in that order.
    pub requested: Vec<IpAddr>,
    /// How long a call waits for the store lock (`ipam.lockTimeout`, seconds).
    pub lock_timeout: Duration,
    /// `ipam.reportExhaustionInStatus`: STATUS reports an exhausted range set with code 50.
    pub report_exhaustion_in_status: bool,
}

/// Bounds of `ipam.lockTimeout`, in seconds.
const LOCK_TIMEOUT_RANGE: std::ops::RangeInclusive<u64> = 1..=3600;
/// The largest resolv.conf read: real ones are a few hundred bytes.
pub const RESOLV_CONF_CAP: u64 = 1 << 20;

/// Parse `10.0.0.5` or `10.0.0.5/24` (the prefix length is ignored, as upstream does).
pub fn parse_requested_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    let ip = match s.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => s.parse::<IpNet>().ok()?.addr(),
    };
    Some(ip.to_canonical())
}

/// `dataDir` must be absolute and free of `..` components (and of NUL bytes): it names where
/// files are created and deleted.
pub fn validate_data_dir(d: &str) -> Result<PathBuf> {
    let bad = |why: &str| CniError::config(format!("ipam.dataDir {d:?} {why}"));
    if d.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    let p = Path::new(d);
    if !p.is_absolute() {
        return Err(bad("is not an absolute path: give a path starting with /"));
    }
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(bad("contains a \"..\" component: give a path without it"));
    }
    Ok(p.components().collect())
}

/// `ipam.lockTimeout` (seconds), within [`LOCK_TIMEOUT_RANGE`]; the default when unset.
fn lock_timeout(secs: Option<u64>) -> Result<Duration> {
    match secs {
        None => Ok(crate::store::DEFAULT_LOCK_TIMEOUT),
        Some(s) if LOCK_TIMEOUT_RANGE.contains(&s) => Ok(Duration::from_secs(s)),
        Some(s) => Err(CniError::config(format!(
            "ipam.lockTimeout {s} is out of range: give a number of seconds from {} to {}",
            LOCK_TIMEOUT_RANGE.start(),
            LOCK_TIMEOUT_RANGE.end()
        ))),
    }
}

/// The note when `rangeStart`, `rangeEnd` or `gateway` come without `subnet`.
const IGNORED_WITHOUT_SUBNET: &str = "ipam.rangeStart/rangeEnd/gateway are ignored without ipam.subnet";

impl Config {
    /// Decode and validate the whole configuration.
    pub fn load(req: &Request) -> Result<Config> {
        let wire: Wire = req.plugin_config()?;
        let ipam = wire.ipam.ok_or_else(|| CniError::config("IPAM config missing 'ipam' key"))?;
        let data_dir = validate_data_dir(
            ipam.data_dir.as_deref().filter(|d| !d.is_empty()).unwrap_or(DEFAULT_DATA_DIR),
        )?;
        let resolv_conf = match ipam.resolv_conf.as_deref() {
            None | Some("") => None,
            Some(p) if p.contains('\0') => {
                return Err(CniError::config(format!("ipam.resolvConf {p:?} contains a NUL byte")))
            }
            Some(p) => Some(PathBuf::from(p)),
        };

        // Requested addresses, in upstream's order.
        let mut requested: Vec<IpAddr> = Vec::new();
        let mut push = |ip: IpAddr| {
            if !requested.contains(&ip) {
                requested.push(ip);
            }
        };
        let cni_args = req.cni_args(&["IP"])?;
        if let Some(v) = cni_args.get("IP").filter(|v| !v.is_empty()) {
            let ip = parse_requested_ip(v)
                .ok_or_else(|| CniError::env(format!("CNI_ARGS IP={v:?} is not an IP address")))?;
            push(ip);
        }
        for s in wire.args.as_ref().and_then(|a| a.cni.as_ref()).map(|c| c.ips.as_slice()).unwrap_or(&[]) {
            push(parse_requested_ip(s).ok_or_else(|| {
                CniError::decode(format!("args.cni.ips: {s:?} is not an IP address (with optional /prefix)"))
            })?);
        }
        let runtime = wire.runtime_config.unwrap_or_default();
        for s in &runtime.ips {
            push(parse_requested_ip(s).ok_or_else(|| {
                CniError::decode(format!(
                    "runtimeConfig.ips: {s:?} is not an IP address (with optional /prefix)"
                ))
            })?);
        }

        // Range sources, each labelled for error messages.
        let mut sources: Vec<(String, Vec<RangeConf>)> = Vec::new();
        for (i, s) in runtime.ip_ranges.into_iter().enumerate() {
            sources.push((format!("runtimeConfig.ipRanges[{i}]"), s));
        }
        match ipam.subnet {
            Some(subnet) => sources.push((
                "ipam.subnet".into(),
                vec![RangeConf {
                    subnet,
                    range_start: ipam.range_start,
                    range_end: ipam.range_end,
                    gateway: ipam.gateway,
                }],
            )),
            None if ipam.range_start.or(ipam.range_end).or(ipam.gateway).is_some() => {
                // Upstream ignores these without `subnet`; so do we, but say so.
                cni_common::log!("host-local", "{IGNORED_WITHOUT_SUBNET}");
            }
            None => {}
        }
        for (i, s) in ipam.ranges.into_iter().enumerate() {
            sources.push((format!("ipam.ranges[{i}]"), s));
        }
        if sources.is_empty() {
            return Err(CniError::config(
                "no IP ranges specified: set ipam.ranges, ipam.subnet or runtimeConfig.ipRanges",
            ));
        }
        let mut sets: Vec<RangeSet> = Vec::with_capacity(sources.len());
        for (i, (label, confs)) in sources.iter().enumerate() {
            let set = RangeSet::canonicalize(confs)
                .map_err(|e| CniError::config(format!("invalid range set {i} ({label}): {e}")))?;
            if let Some(j) = sets.iter().position(|s| s.overlaps(&set)) {
                return Err(CniError::config(format!(
                    "range set {j} overlaps with {i}: {} ({}) and {set} ({label})",
                    sets[j], sources[j].0
                )));
            }
            sets.push(set);
        }
        let v4 = sets.iter().filter(|s| s.is_v4()).count();
        let v6 = sets.len() - v4;
        if (v4 > 1 || v6 > 1) && req.version < Version::V0_3_0 {
            return Err(CniError::new(
                code::UNSUPPORTED_FIELD,
                format!("CNI version {} does not support more than 1 address per family", req.version),
            )
            .with_details(format!(
                "{v4} IPv4 and {v6} IPv6 range sets configured; cniVersion 0.3.0 or later is needed for more than one per family"
            )));
        }

        let lock_timeout = lock_timeout(ipam.lock_timeout)?;

        Ok(Config {
            name: req.network().to_string(),
            data_dir,
            sets,
            routes: ipam.routes,
            resolv_conf,
            requested,
            lock_timeout,
            report_exhaustion_in_status: ipam.report_exhaustion_in_status.unwrap_or(false),
        })
    }

    /// The network's directory: `<dataDir>/<name>`.
    pub fn network_dir(&self) -> PathBuf {
        self.data_dir.join(&self.name)
    }
}

/// Parse a resolv.conf like upstream: blank lines and `#`/`;` comments are skipped, lines with
/// fewer than two fields ignored; `nameserver` takes its first argument, `domain` replaces,
/// `search` and `options` append.
pub fn parse_resolv_conf(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 2 {
            continue;
        }
        match fields[0] {
            "nameserver" => dns.nameservers.push(fields[1].to_string()),
            "domain" => dns.domain = fields[1].to_string(),
            "search" => dns.search.extend(fields[1..].iter().map(|s| s.to_string())),
            "options" => dns.options.extend(fields[1..].iter().map(|s| s.to_string())),
            _ => {}
        }
    }
    dns
}

/// Read `ipam.resolvConf` (links followed, only a regular file, at most [`RESOLV_CONF_CAP`]
/// bytes). A missing, unreadable or non-regular file is a configuration error (7); one past
/// the cap an I/O error (5).
pub fn read_resolv_conf(path: &Path) -> Result<Dns> {
    let bytes = cni_common::fsread::read_named_regular(path, RESOLV_CONF_CAP).map_err(|e| {
        let c = if e.kind() == std::io::ErrorKind::FileTooLarge { code::IO } else { code::INVALID_CONFIG };
        CniError::new(c, format!("ipam.resolvConf {}: cannot read: {e}", path.display()))
            .with_details("point ipam.resolvConf at a resolv.conf file (a few hundred bytes of nameserver, search, options lines)")
    })?;
    Ok(parse_resolv_conf(&String::from_utf8_lossy(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::skel::Request;
    use cni_common::spec::{Command, Env};
    use serde_json::{json, Value};

    fn req(config: Value, args: &str) -> Request {
        let env = Env {
            command: Some(Command::Add),
            container_id: "c1".into(),
            netns: "/run/netns/x".into(),
            ifname: "eth0".into(),
            args: args.into(),
            path: "/opt/cni/bin".into(),
            // unit tests: no namespace exists behind the path
            netns_override: true,
        };
        Request::new(env, serde_json::to_vec(&config).unwrap(), &Version::ALL).expect("valid request")
    }

    fn load(config: Value) -> Result<Config> {
        Config::load(&req(config, ""))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn old_style() {
        let c = load(json!({"cniVersion": "0.3.1", "name": "mynet", "ipam": {
            "type": "host-local", "subnet": "10.1.2.0/24", "dataDir": "/tmp/x",
            "routes": [{"dst": "0.0.0.0/0"}]
        }}))
        .unwrap();
        assert_eq!(c.sets.len(), 1);
        assert_eq!(c.sets[0].ranges[0].start, ip("10.1.2.1"));
        assert_eq!(c.sets[0].ranges[0].end, ip("10.1.2.254"));
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.network_dir(), PathBuf::from("/tmp/x/mynet"));
        assert_eq!(c.routes, vec![Route::new("0.0.0.0/0".parse().unwrap(), None)]);
    }

    #[test]
    fn defaults() {
        let c = load(
            json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}]]}}),
        )
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/cni/networks"));
        assert!(c.routes.is_empty() && c.resolv_conf.is_none() && c.requested.is_empty());
        assert_eq!(c.lock_timeout, Duration::from_secs(60));
    }

    #[test]
    fn lock_timeout_in_seconds_from_one_to_an_hour() {
        let with = |t: Value| {
            load(
                json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"subnet": "10.0.0.0/24", "lockTimeout": t}}),
            )
        };
        for secs in [1, 5, 3600] {
            assert_eq!(with(json!(secs)).unwrap().lock_timeout, Duration::from_secs(secs));
        }
        for secs in [0, 3601] {
            let e = with(json!(secs)).unwrap_err();
            assert_eq!(
                (e.code, e.msg),
                (
                    code::INVALID_CONFIG,
                    format!(
                        "ipam.lockTimeout {secs} is out of range: give a number of seconds from 1 to 3600"
                    )
                )
            );
        }
    }

    #[test]
    fn new_style_and_mixed_with_runtime_ranges() {
        let c = load(json!({"cniVersion": "1.1.0", "name": "n",
            "runtimeConfig": {"ipRanges": [[{"subnet": "10.9.0.0/24"}]]},
            "ipam": {
                "subnet": "10.1.2.0/24",
                "ranges": [
                    [{"subnet": "10.2.2.0/24"}, {"subnet": "10.3.2.0/24", "rangeStart": "10.3.2.10"}],
                    [{"subnet": "2001:db8:1::/64"}]
                ]
        }}))
        .unwrap();
        let subnets: Vec<String> = c
            .sets
            .iter()
            .map(|s| s.ranges.iter().map(|r| r.subnet.to_string()).collect::<Vec<_>>().join("+"))
            .collect();
        assert_eq!(subnets, ["10.9.0.0/24", "10.1.2.0/24", "10.2.2.0/24+10.3.2.0/24", "2001:db8:1::/64"]);
        assert_eq!(c.sets[2].ranges[1].start, ip("10.3.2.10"));
    }

    #[test]
    fn empty_strings_for_optional_addresses_mean_absent() {
        // templated configs carry these; Go's net.IP decodes "" as unset
        let c = load(json!({"cniVersion": "1.0.0", "name": "n", "ipam": {
            "subnet": "10.0.0.0/24", "rangeStart": "", "rangeEnd": "", "gateway": "",
            "routes": [{"dst": "0.0.0.0/0", "gw": ""}]}}))
        .unwrap();
        assert_eq!(c.sets[0].ranges[0].gateway, ip("10.0.0.1"));
        assert_eq!(c.routes[0].gw, None);
    }

    #[test]
    fn keys_are_case_insensitive_like_go() {
        let c = load(json!({"cniVersion": "1.1.0", "name": "n", "IPAM": {"Ranges": [[{"Subnet": "10.0.0.0/24", "RANGESTART": "10.0.0.5"}]], "DataDir": "/d"}}))
            .unwrap();
        assert_eq!(c.sets[0].ranges[0].start, ip("10.0.0.5"));
        assert_eq!(c.data_dir, PathBuf::from("/d"));
    }

    #[test]
    fn requested_ips_from_all_sources() {
        let cfg = json!({"cniVersion": "1.1.0", "name": "n",
            "args": {"cni": {"ips": ["10.0.0.7", "2001:db8::7/64"]}},
            "runtimeConfig": {"ips": ["10.0.0.8/24", "10.0.0.7"]},
            "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "2001:db8::/64"}]]}});
        for args in ["IP=10.0.0.6", "IP=10.0.0.6/24", "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.0.0.6"] {
            let c = Config::load(&req(cfg.clone(), args)).unwrap();
            assert_eq!(
                c.requested,
                vec![ip("10.0.0.6"), ip("10.0.0.7"), ip("2001:db8::7"), ip("10.0.0.8")],
                "{args}"
            );
        }
        let e = Config::load(&req(cfg.clone(), "IP=10.0.0.300")).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        let e = Config::load(&req(cfg.clone(), "K8S_POD_NAME=p")).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV, "unknown CNI_ARGS without IgnoreUnknown");
        let mut bad = cfg.clone();
        bad["args"]["cni"]["ips"] = json!(["nope"]);
        let e = load(bad).unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(e.msg.contains("args.cni.ips: \"nope\""), "{}", e.msg);
        let mut bad = cfg;
        bad["runtimeConfig"]["ips"] = json!(["10.0.0.1/99"]);
        assert_eq!(load(bad).unwrap_err().code, code::DECODE);
    }

    #[test]
    fn overlaps_between_and_within_sets() {
        let e = load(json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"ranges": [
            [{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/25"}]]}}))
        .unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.starts_with("range set 0 overlaps with 1"), "{}", e.msg);
        let e = load(json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"ranges": [
            [{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/16"}]]}}))
        .unwrap_err();
        assert!(e.msg.starts_with("invalid range set 0 (ipam.ranges[0]): subnets"), "{}", e.msg);
        // the legacy range overlapping a new-style one
        let e = load(json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"subnet": "10.0.0.0/24",
            "ranges": [[{"subnet": "10.0.0.0/24"}]]}}))
        .unwrap_err();
        assert!(e.msg.contains("(ipam.subnet)") && e.msg.contains("(ipam.ranges[0])"), "{}", e.msg);
    }

    #[test]
    fn mixed_families_in_one_set() {
        let e = load(json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"ranges": [
            [{"subnet": "10.0.0.0/24"}, {"subnet": "2001:db8::/64"}]]}}))
        .unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("mixed address families"), "{}", e.msg);
    }

    #[test]
    fn too_many_ranges_for_old_versions() {
        let two_v4 = json!({"name": "n", "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]]}});
        for v in ["0.1.0", "0.2.0"] {
            let mut c = two_v4.clone();
            c["cniVersion"] = v.into();
            let e = load(c).unwrap_err();
            assert_eq!(e.code, code::UNSUPPORTED_FIELD);
            assert_eq!(e.msg, format!("CNI version {v} does not support more than 1 address per family"));
        }
        let mut c = two_v4.clone();
        c["cniVersion"] = "0.3.0".into();
        assert!(load(c).is_ok());
        let one_each = json!({"cniVersion": "0.2.0", "name": "n", "ipam": {"ranges": [
            [{"subnet": "10.0.0.0/24"}], [{"subnet": "2001:db8::/64"}]]}});
        assert!(load(one_each).is_ok(), "one v4 and one v6 are fine for 0.2.0");
        let two_v6 = json!({"cniVersion": "0.2.0", "name": "n", "ipam": {"ranges": [
            [{"subnet": "2001:db8::/64"}], [{"subnet": "2001:db9::/64"}]]}});
        assert_eq!(load(two_v6).unwrap_err().code, code::UNSUPPORTED_FIELD);
        for subnet in ["10.0.0.0/24", "2001:db8::/64"] {
            let one = json!({"cniVersion": "0.2.0", "name": "n", "ipam": {"ranges": [[{"subnet": subnet}]]}});
            assert!(load(one).is_ok(), "a single {subnet} range is fine for 0.2.0");
        }
    }

    #[test]
    fn bad_input_codes() {
        let base = |ipam: Value| json!({"cniVersion": "1.0.0", "name": "n", "ipam": ipam});
        // a valid single range plus the keys under test
        let single = |mut ipam: Value| {
            ipam["subnet"] = "10.0.0.0/24".into();
            base(ipam)
        };
        let cases: Vec<(Value, u32, &str)> = vec![
            (
                json!({"cniVersion": "1.0.0", "name": "n"}),
                code::INVALID_CONFIG,
                "IPAM config missing 'ipam' key",
            ),
            (base(json!({})), code::INVALID_CONFIG, "no IP ranges specified"),
            (
                base(json!({"ranges": [[{"subnet": "10.0.0.0/33"}]]})),
                code::DECODE,
                "ipam.ranges[0][0].subnet",
            ),
            (base(json!({"ranges": [[{"subnet": "banana"}]]})), code::DECODE, "ipam.ranges[0][0].subnet"),
            (base(json!({"ranges": [[{}]]})), code::DECODE, "subnet"),
            (base(json!({"ranges": "10.0.0.0/24"})), code::DECODE, "ipam.ranges"),
            (base(json!({"ranges": [[]]})), code::INVALID_CONFIG, "empty range set"),
            (single(json!({"rangeStart": 5})), code::DECODE, "ipam.rangeStart"),
            (single(json!({"routes": [{"dst": "x"}]})), code::DECODE, "ipam.routes[0].dst"),
            (single(json!({"dataDir": 7})), code::DECODE, "ipam.dataDir"),
            (single(json!({"dataDir": "var/lib"})), code::INVALID_CONFIG, "not an absolute path"),
            (single(json!({"dataDir": "/var/../etc"})), code::INVALID_CONFIG, "\"..\""),
            (single(json!({"dataDir": "/var/lib/.."})), code::INVALID_CONFIG, "\"..\""),
            (base(json!({"subnet": "10.0.0.5/24"})), code::INVALID_CONFIG, "host bits"),
            (base(json!({"subnet": "10.0.0.0/31"})), code::INVALID_CONFIG, "too small to allocate from"),
            (
                single(json!({"rangeStart": "10.0.1.1"})),
                code::INVALID_CONFIG,
                "rangeStart: 10.0.1.1 not in network 10.0.0.0/24",
            ),
            (
                single(json!({"rangeEnd": "10.0.1.1"})),
                code::INVALID_CONFIG,
                "rangeEnd: 10.0.1.1 not in network",
            ),
            (single(json!({"gateway": "10.0.1.1"})), code::INVALID_CONFIG, "gateway 10.0.1.1 not in network"),
        ];
        for (cfg, want_code, want_msg) in cases {
            let e = load(cfg.clone()).unwrap_err();
            assert_eq!(e.code, want_code, "{cfg}: {e:?}");
            assert!(e.msg.contains(want_msg), "{cfg}: {:?} lacks {want_msg:?}", e.msg);
        }
    }

    #[test]
    fn data_dir_forms() {
        assert_eq!(validate_data_dir("/a/./b/").unwrap(), PathBuf::from("/a/b"));
        assert!(validate_data_dir("/a/b..c").is_ok(), "dots inside a name are fine");
        assert!(validate_data_dir("").is_err());
        assert!(validate_data_dir("/a\0b").is_err());
    }

    #[test]
    fn resolv_conf_parsing() {
        let simple = "nameserver 10.0.0.1\n";
        assert_eq!(parse_resolv_conf(simple).nameservers, vec!["10.0.0.1"]);
        let comments = "# a comment\n; another\n\nnameserver 10.0.0.1 # trailing\nnameserver\n";
        let d = parse_resolv_conf(comments);
        assert_eq!(d.nameservers, vec!["10.0.0.1"]);
        let all = "nameserver 10.0.0.1\nnameserver 2001:db8::1\ndomain example.com\nsearch a.example b.example\nsearch c.example\noptions ndots:5 rotate\n";
        let d = parse_resolv_conf(all);
        assert_eq!(d.nameservers, vec!["10.0.0.1", "2001:db8::1"]);
        assert_eq!(d.domain, "example.com");
        assert_eq!(d.search, vec!["a.example", "b.example", "c.example"]);
        assert_eq!(d.options, vec!["ndots:5", "rotate"]);
    }

    #[test]
    fn resolv_conf_is_read_from_its_path_which_may_not_hold_a_nul() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        std::fs::write(&path, "nameserver 10.0.0.53\nsearch svc.local\n").unwrap();
        let d = read_resolv_conf(&path).unwrap();
        assert_eq!((d.nameservers, d.search), (vec!["10.0.0.53".to_string()], vec!["svc.local".to_string()]));
        let e = read_resolv_conf(&dir.path().join("missing")).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("cannot read"), "{}", e.msg);
        let big = dir.path().join("big");
        std::fs::File::create(&big).unwrap().set_len(RESOLV_CONF_CAP + 1).unwrap();
        let e = read_resolv_conf(&big).unwrap_err();
        assert_eq!(e.code, code::IO, "past the cap: an I/O error");
        assert!(e.msg.contains("larger than 1048576 bytes"), "{}", e.msg);
        let with = |p: &str| {
            load(json!({"cniVersion": "1.0.0", "name": "n",
                                         "ipam": {"subnet": "10.0.0.0/24", "resolvConf": p}}))
        };
        assert_eq!(with(path.to_str().unwrap()).unwrap().resolv_conf.as_deref(), Some(path.as_path()));
        let e = with("/etc/res\u{0}olv.conf").unwrap_err();
        assert!(e.msg.contains("NUL byte"), "{}", e.msg);
    }
}
