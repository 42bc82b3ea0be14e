//! The plugin's configuration: static keys or `runtimeConfig.bandwidth`, validated into the
//! two token buckets to build.

use cni_common::spec::json;
use cni_common::{CniError, Result};
use serde::Deserialize;
use serde_json::Value;

/// The four shaping keys, as upstream spells them.
const KEYS: [&str; 4] = ["ingressRate", "ingressBurst", "egressRate", "egressBurst"];

/// Largest burst in bits: upstream rejects `burst / 8 >= 2^32 - 1` ("more than 4GB").
pub const MAX_BURST_BITS: u64 = (u32::MAX as u64 - 1) * 8 + 7;

/// A burst from `runtimeConfig.bandwidth` at or above this many bits means "not set": the CRI
/// has no burst annotation, so containerd sends 2^32 − 1 (MaxUint32) and CRI-O just under 4 GiB
/// with every rate.
pub const CRI_UNSET_BURST_BITS: u64 = u32::MAX as u64;

/// A default burst holds this long at the rate: 1/10 s.
pub const DEFAULT_BURST_DIVISOR: u64 = 10;

/// Bytes an Ethernet header adds to an MTU-sized packet as tbf counts it.
const ETH_HLEN: u64 = 14;

/// The burst used when none is set: 100 ms of traffic at the rate, and at least one full-size
/// packet (MTU + Ethernet header) so that no packet is larger than the bucket. For `1M`
/// (125 000 B/s) that is 12 500 B: the limit holds from the first kilobytes.
pub fn default_burst_bytes(rate_bytes: u64, mtu: u32) -> u64 {
    (rate_bytes / DEFAULT_BURST_DIVISOR).max(u64::from(mtu) + ETH_HLEN)
}

/// One direction's limit, in the units of the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// bits per second
    pub rate: u64,
    /// bits; `None`: not set (the CRI's sentinel), see [`default_burst_bytes`]
    pub burst: Option<u64>,
}

impl Shape {
    /// Rate in bytes per second (what tc works in).
    pub fn rate_bytes(&self) -> u64 {
        self.rate / 8
    }

    /// Burst in bytes, for a device of `mtu`.
    pub fn burst_bytes(&self, mtu: u32) -> u64 {
        match self.burst {
            Some(b) => b / 8,
            None => default_burst_bytes(self.rate_bytes(), mtu),
        }
    }
}

/// Where the limits came from (for messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Static,
    Runtime,
}

impl Source {
    fn prefix(self) -> &'static str {
        match self {
            Source::Static => "",
            Source::Runtime => "runtimeConfig.bandwidth.",
        }
    }
}

/// What to build. `ingress` limits traffic into the container (egress of the host veth),
/// `egress` traffic out of it (redirected through an ifb).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub ingress: Option<Shape>,
    pub egress: Option<Shape>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }
}

#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(rename = "ingressRate", default)]
    ingress_rate: u64,
    #[serde(rename = "ingressBurst", default)]
    ingress_burst: u64,
    #[serde(rename = "egressRate", default)]
    egress_rate: u64,
    #[serde(rename = "egressBurst", default)]
    egress_burst: u64,
    /// Upstream v1.5.x only (reverted in v1.6.0): see [`reject_subnets`].
    #[serde(rename = "shapedSubnets", default)]
    shaped_subnets: Vec<String>,
    #[serde(rename = "unshapedSubnets", default)]
    unshaped_subnets: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct RuntimeConfig {
    #[serde(default)]
    bandwidth: Option<Entry>,
}

#[derive(Debug, Default, Deserialize)]
struct Runtime {
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<RuntimeConfig>,
}

/// Whether the top-level object names any shaping key. Go decodes the keys into an embedded
/// pointer struct that exists as soon as one key is present (any value, even 0 or null), and
/// then ignores `runtimeConfig.bandwidth` completely: static keys win.
fn has_static_keys(config: &Value) -> bool {
    config.as_object().is_some_and(|o| o.keys().any(|k| KEYS.iter().any(|key| key.eq_ignore_ascii_case(k))))
}

/// Decode and validate the limits of a whole stdin object.
pub fn limits(config: &Value) -> Result<Limits> {
    let decode = |e: String| CniError::decode(format!("invalid network config: {e}"));
    // Both are decoded whichever is used: a type error anywhere fails, as in Go.
    let top: Entry = json::from_ref(config).map_err(decode)?;
    let rt: Runtime = json::from_ref(config).map_err(decode)?;
    let (entry, source) = if has_static_keys(config) {
        (top, Source::Static)
    } else {
        match rt.runtime_config.and_then(|r| r.bandwidth) {
            Some(e) => (e, Source::Runtime),
            None => return Ok(Limits::default()),
        }
    };
    reject_subnets(&entry, source)?;
    Ok(Limits {
        ingress: shape(source, "ingress", entry.ingress_rate, entry.ingress_burst)?,
        egress: shape(source, "egress", entry.egress_rate, entry.egress_burst)?,
    })
}

/// `shapedSubnets`/`unshapedSubnets` existed in upstream v1.5.x only (HTB-based, PR #921) and
/// were removed again in v1.6.0. Silently shaping traffic the user asked to leave unshaped (or
/// the reverse) would be worse than saying so.
fn reject_subnets(e: &Entry, source: Source) -> Result<()> {
    for (key, list) in [("shapedSubnets", &e.shaped_subnets), ("unshapedSubnets", &e.unshaped_subnets)] {
        if !list.is_empty() {
            return Err(CniError::unsupported_field(
                &format!("{}{key}", source.prefix()),
                format!("{list:?}"),
                "per-subnet shaping (upstream v1.5 only, reverted in v1.6.0) is not supported; \
                 remove the key to shape all traffic",
            ));
        }
    }
    Ok(())
}

fn shape(source: Source, dir: &str, rate: u64, burst: u64) -> Result<Option<Shape>> {
    let p = source.prefix();
    let bad = |msg: String| Err(CniError::config(msg));
    let rate_too_small = || {
        bad(format!(
            "{p}{dir}Rate is {rate} bit/s: the kernel shapes whole bytes per second, so the rate must be \
             at least 8 bit/s"
        ))
    };
    if source == Source::Runtime && burst >= CRI_UNSET_BURST_BITS {
        // The CRI's "no burst": a default derived from the rate. Explicit bursts of a conflist
        // (static keys) keep their meaning whatever their size.
        return match rate {
            0 => Ok(None),
            r if r < 8 => rate_too_small(),
            rate => Ok(Some(Shape { rate, burst: None })),
        };
    }
    match (rate, burst) {
        (0, 0) => Ok(None),
        (r, 0) => bad(format!(
            "{p}{dir}Rate is {r} bit/s but {p}{dir}Burst is not set: if rate is set, burst must also be set"
        )),
        (0, b) => bad(format!(
            "{p}{dir}Burst is {b} bits but {p}{dir}Rate is not set: if burst is set, rate must also be set"
        )),
        (_, b) if b > MAX_BURST_BITS => bad(format!(
            "{p}{dir}Burst is {b} bits: burst cannot be more than 4GB (at most {MAX_BURST_BITS} bits)"
        )),
        (r, _) if r < 8 => rate_too_small(),
        (_, b) if b < 8 => {
            bad(format!("{p}{dir}Burst is {b} bits: the burst must be at least 8 bits (one byte)"))
        }
        (rate, burst) => Ok(Some(Shape { rate, burst: Some(burst) })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::code;
    use serde_json::json;

    fn base(extra: Value) -> Value {
        let mut v = json!({"cniVersion": "1.0.0", "name": "net", "type": "bandwidth"});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    }

    #[test]
    fn static_keys() {
        let l = limits(&base(
            json!({"ingressRate": 8000, "ingressBurst": 800, "egressRate": 16000, "egressBurst": 1600}),
        ))
        .unwrap();
        assert_eq!(l.ingress, Some(Shape { rate: 8000, burst: Some(800) }));
        assert_eq!(l.egress, Some(Shape { rate: 16000, burst: Some(1600) }));
        assert_eq!((l.egress.unwrap().rate_bytes(), l.egress.unwrap().burst_bytes(1500)), (2000, 200));
    }

    #[test]
    fn runtime_config_when_no_static_keys() {
        let l = limits(&base(json!({
            "capabilities": {"bandwidth": true},
            "runtimeConfig": {"bandwidth": {"ingressRate": 1000000, "ingressBurst": 4294967295u64}}
        })))
        .unwrap();
        assert_eq!(l.ingress, Some(Shape { rate: 1_000_000, burst: None }), "the CRI's unset burst");
        assert_eq!(l.egress, None);
    }

    #[test]
    fn static_keys_win_even_when_zero() {
        let rt = json!({"bandwidth": {"egressRate": 1000000, "egressBurst": 10000}});
        let l =
            limits(&base(json!({"ingressRate": 8000, "ingressBurst": 800, "runtimeConfig": rt}))).unwrap();
        assert_eq!(l, Limits { ingress: Some(Shape { rate: 8000, burst: Some(800) }), egress: None });
        // one static key, even 0 (or null), hides runtimeConfig like Go's embedded pointer
        let l = limits(&base(json!({"egressRate": 0, "runtimeConfig": rt}))).unwrap();
        assert!(l.is_empty());
        let l = limits(&base(json!({"EgressBurst": null, "runtimeConfig": rt}))).unwrap();
        assert!(l.is_empty());
    }

    #[test]
    fn keys_match_case_insensitively() {
        let l = limits(&base(json!({"IngressRate": 8000, "INGRESSBURST": 80}))).unwrap();
        assert_eq!(l.ingress, Some(Shape { rate: 8000, burst: Some(80) }));
        let l = limits(&base(json!({"RuntimeConfig": {"Bandwidth": {"egressrate": 80, "egressburst": 80}}})))
            .unwrap();
        assert_eq!(l.egress, Some(Shape { rate: 80, burst: Some(80) }));
    }

    #[test]
    fn nothing_configured() {
        assert!(limits(&base(json!({}))).unwrap().is_empty());
        assert!(limits(&base(json!({"runtimeConfig": {}}))).unwrap().is_empty());
        assert!(limits(&base(json!({"runtimeConfig": {"bandwidth": null}}))).unwrap().is_empty());
        assert!(limits(&base(json!({"runtimeConfig": {"bandwidth": {}}}))).unwrap().is_empty());
    }

    #[test]
    fn rate_and_burst_go_together() {
        let e = limits(&base(json!({"ingressRate": 1000}))).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert_eq!(
            e.msg,
            "ingressRate is 1000 bit/s but ingressBurst is not set: if rate is set, burst must also be set"
        );
        let e = limits(&base(json!({"runtimeConfig": {"bandwidth": {"egressBurst": 1000}}}))).unwrap_err();
        assert_eq!(
            e.msg,
            "runtimeConfig.bandwidth.egressBurst is 1000 bits but runtimeConfig.bandwidth.egressRate is not set: \
             if burst is set, rate must also be set"
        );
    }

    #[test]
    fn burst_limit_is_4gb() {
        let ok = limits(&base(json!({"egressRate": 8, "egressBurst": MAX_BURST_BITS}))).unwrap();
        assert_eq!(ok.egress.unwrap().burst_bytes(1500), u64::from(u32::MAX) - 1);
        let e = limits(&base(json!({"egressRate": 8, "egressBurst": MAX_BURST_BITS + 1}))).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("burst cannot be more than 4GB"), "{}", e.msg);
        assert!(e.msg.starts_with("egressBurst is 34359738360 bits"), "{}", e.msg);
    }

    #[test]
    fn sub_byte_values_are_rejected() {
        let e = limits(&base(json!({"ingressRate": 7, "ingressBurst": 800}))).unwrap_err();
        assert!(e.msg.contains("at least 8 bit/s"), "{}", e.msg);
        let e = limits(&base(json!({"ingressRate": 800, "ingressBurst": 7}))).unwrap_err();
        assert!(e.msg.contains("at least 8 bits"), "{}", e.msg);
        // One byte is enough, for the rate and the burst, static or from the runtime.
        let l = limits(&base(json!({"ingressRate": 8, "ingressBurst": 8}))).unwrap();
        assert_eq!(l.ingress, Some(Shape { rate: 8, burst: Some(8) }));
        let rt = json!({"bandwidth": {"egressRate": 8, "egressBurst": CRI_UNSET_BURST_BITS}});
        let l = limits(&base(json!({"runtimeConfig": rt}))).unwrap();
        assert_eq!(l.egress, Some(Shape { rate: 8, burst: None }));
        let rt = json!({"bandwidth": {"egressRate": 7, "egressBurst": CRI_UNSET_BURST_BITS}});
        assert!(limits(&base(json!({"runtimeConfig": rt}))).unwrap_err().msg.contains("at least 8 bit/s"));
    }

    #[test]
    fn limits_are_empty_only_without_either_direction() {
        let one =
            |k: &str| limits(&base(json!({format!("{k}Rate"): 8000, format!("{k}Burst"): 800}))).unwrap();
        assert!(!one("ingress").is_empty());
        assert!(!one("egress").is_empty());
        assert!(limits(&base(json!({}))).unwrap().is_empty());
    }

    #[test]
    fn wrong_types_are_decode_errors() {
        for bad in [json!({"ingressRate": -1}), json!({"ingressRate": "1M"}), json!({"ingressRate": 1.5})] {
            let e = limits(&base(bad.clone())).unwrap_err();
            assert_eq!(e.code, code::DECODE, "{bad}");
            assert!(e.msg.contains("ingressRate"), "{}", e.msg);
        }
        let e = limits(&base(json!({"runtimeConfig": {"bandwidth": {"egressRate": true}}}))).unwrap_err();
        assert_eq!(e.code, code::DECODE);
    }

    #[test]
    fn subnet_selection_is_refused_not_ignored() {
        let e = limits(&base(
            json!({"ingressRate": 8000, "ingressBurst": 800, "unshapedSubnets": ["10.0.0.0/8"]}),
        ))
        .unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        assert!(e.msg.contains("\"unshapedSubnets\""), "{}", e.msg);
        // empty lists are harmless
        let l =
            limits(&base(json!({"ingressRate": 8000, "ingressBurst": 800, "shapedSubnets": []}))).unwrap();
        assert!(l.ingress.is_some());
    }

    #[test]
    fn cri_sentinel_burst_means_not_set_at_or_above_max_uint32() {
        let rt = |rate: u64, burst: u64| {
            limits(&base(
                json!({"runtimeConfig": {"bandwidth": {"ingressRate": rate, "ingressBurst": burst}}}),
            ))
        };
        // containerd (MaxUint32) and CRI-O (just under 4 GiB) send these with every annotation.
        for sentinel in [u64::from(u32::MAX), MAX_BURST_BITS, MAX_BURST_BITS + 8, u64::MAX] {
            let l = rt(1_000_000, sentinel).unwrap();
            assert_eq!(l.ingress, Some(Shape { rate: 1_000_000, burst: None }), "{sentinel}");
        }
        // Just below the sentinel a runtime burst is a burst.
        let l = rt(1_000_000, u64::from(u32::MAX) - 1).unwrap();
        assert_eq!(l.ingress.unwrap().burst, Some(u64::from(u32::MAX) - 1));
        // A sentinel without a rate: nothing set at all.
        assert!(rt(0, u64::from(u32::MAX)).unwrap().is_empty());
        assert_eq!(rt(7, u64::from(u32::MAX)).unwrap_err().code, code::INVALID_CONFIG);
        // Static keys of a conflist keep their meaning, however large.
        let l = limits(&base(json!({"egressRate": 1_000_000, "egressBurst": 4_294_967_295u64}))).unwrap();
        assert_eq!(l.egress, Some(Shape { rate: 1_000_000, burst: Some(4_294_967_295) }));
    }

    #[test]
    fn default_burst_is_a_tenth_of_a_second_and_at_least_one_full_packet() {
        // The `1M` annotation: 125 000 B/s, so 12 500 B — far below 1 MiB.
        assert_eq!(default_burst_bytes(125_000, 1500), 12_500);
        assert!(default_burst_bytes(125_000, 1500) <= 1 << 20);
        // Slow rates: one MTU-sized frame with its Ethernet header.
        assert_eq!(default_burst_bytes(1, 1500), 1514);
        assert_eq!(default_burst_bytes(12_500, 1500), 1514);
        assert_eq!(default_burst_bytes(12_500, 9000), 9014, "jumbo frames");
        // Fast rates: 100 ms of traffic.
        assert_eq!(default_burst_bytes(125_000_000, 1500), 12_500_000);
        let s = Shape { rate: 1_000_000, burst: None };
        assert_eq!(s.burst_bytes(1500), 12_500);
        assert_eq!(Shape { rate: 1_000_000, burst: Some(80_000) }.burst_bytes(1500), 10_000);
    }
}
