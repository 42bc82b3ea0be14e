//! CNI specification versions 0.1.0 … 1.1.0 and what each one allows.

use crate::error::{code, CniError, Result};
use std::fmt;

/// A CNI specification version this suite speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V0_1_0,
    V0_2_0,
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl Version {
    /// Every supported version, oldest first.
    pub const ALL: [Version; 7] = [
        Version::V0_1_0,
        Version::V0_2_0,
        Version::V0_3_0,
        Version::V0_3_1,
        Version::V0_4_0,
        Version::V1_0_0,
        Version::V1_1_0,
    ];

    /// The newest version: what VERSION replies and errors default to.
    pub const LATEST: Version = Version::V1_1_0;

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_1_0 => "0.1.0",
            Version::V0_2_0 => "0.2.0",
            Version::V0_3_0 => "0.3.0",
            Version::V0_3_1 => "0.3.1",
            Version::V0_4_0 => "0.4.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }

    /// Exact lookup of a supported version string. An empty string means 0.1.0, as the spec
    /// says of a configuration without `cniVersion`.
    pub fn from_str_exact(s: &str) -> Option<Version> {
        if s.is_empty() {
            return Some(Version::V0_1_0);
        }
        Version::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Resolve a configuration's `cniVersion` against the versions a plugin supports.
    /// A well-formed but unsupported version is code 1 with both sides in `details`; a string
    /// that is not a version at all is code 6 when `strict_syntax` (CHECK/GC compare versions
    /// and cannot), code 1 otherwise, as the Go skeleton does.
    pub fn negotiate(config: &str, supported: &[Version]) -> Result<Version> {
        if let Some(v) = Version::from_str_exact(config) {
            if supported.contains(&v) {
                return Ok(v);
            }
        }
        let list: Vec<String> = supported.iter().map(|v| format!("{:?}", v.as_str())).collect();
        Err(CniError::new(code::INCOMPATIBLE_VERSION, "incompatible CNI versions")
            .with_details(format!("config is {config:?}, plugin supports [{}]", list.join(" "))))
    }

    /// 0.3.0 and later carry `interfaces` and an `ips` list (several addresses per family).
    pub fn has_rich_result(self) -> bool {
        self >= Version::V0_3_0
    }

    /// 0.3.0 … 0.4.0 tag each IP with `"version": "4"|"6"`; 1.0.0 dropped it.
    pub fn has_ip_version_field(self) -> bool {
        (Version::V0_3_0..=Version::V0_4_0).contains(&self)
    }

    /// CHECK exists from 0.4.0, which also gives DEL the prevResult.
    pub fn has_check(self) -> bool {
        self >= Version::V0_4_0
    }

    /// GC and STATUS exist from 1.1.0.
    pub fn has_gc_and_status(self) -> bool {
        self >= Version::V1_1_0
    }

    /// 1.1.0 result fields: interface mtu/socketPath/pciID, route mtu/advmss/priority/table/scope.
    pub fn has_1_1_fields(self) -> bool {
        self >= Version::V1_1_0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parse "x.y.z" into numbers; used to compare versions we do not support (e.g. a
/// `cniVersion` of "2.0.0" sent to CHECK is still "newer than 0.4.0").
pub fn parse_semver(s: &str) -> Option<(u64, u64, u64)> {
    let mut it = s.split('.');
    let mut next = || -> Option<u64> {
        let p = it.next()?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || (p.len() > 1 && p.starts_with('0')) {
            return None;
        }
        p.parse().ok()
    };
    let v = (next()?, next()?, next()?);
    if it.next().is_some() {
        return None;
    }
    Some(v)
}

/// The reply to `CNI_COMMAND=VERSION`.
pub fn version_reply(supported: &[Version]) -> serde_json::Value {
    let newest = supported.iter().max().copied().unwrap_or(Version::LATEST);
    serde_json::json!({
        "cniVersion": newest.as_str(),
        "supportedVersions": supported.iter().map(|v| v.as_str()).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_version_roundtrips_and_is_ordered() {
        for (i, v) in Version::ALL.iter().enumerate() {
            assert_eq!(Version::from_str_exact(v.as_str()), Some(*v));
            if i > 0 {
                assert!(Version::ALL[i - 1] < *v);
            }
        }
    }

    #[test]
    fn missing_version_means_0_1_0() {
        assert_eq!(Version::from_str_exact(""), Some(Version::V0_1_0));
        assert_eq!(Version::negotiate("", &Version::ALL).unwrap(), Version::V0_1_0);
    }

    #[test]
    fn unsupported_version_is_code_1_with_both_sides() {
        let e = Version::negotiate("0.5.0", &Version::ALL).unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.details.contains("\"0.5.0\""), "{}", e.details);
        assert!(e.details.contains("\"1.1.0\""), "{}", e.details);
        let e = Version::negotiate("0.2.0", &Version::ALL[2..]).unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.details.contains("plugin supports [\"0.3.0\""), "{}", e.details);
    }

    #[test]
    fn capability_table() {
        use Version::*;
        let rich: Vec<_> = Version::ALL.iter().map(|v| v.has_rich_result()).collect();
        assert_eq!(rich, [false, false, true, true, true, true, true]);
        let ipv: Vec<_> = Version::ALL.iter().map(|v| v.has_ip_version_field()).collect();
        assert_eq!(ipv, [false, false, true, true, true, false, false]);
        assert!(!V0_3_1.has_check() && V0_4_0.has_check());
        assert!(!V1_0_0.has_gc_and_status() && V1_1_0.has_gc_and_status());
    }

    #[test]
    fn semver_parsing() {
        assert_eq!(parse_semver("1.1.0"), Some((1, 1, 0)));
        assert_eq!(parse_semver("10.20.30"), Some((10, 20, 30)));
        for bad in ["", "1", "1.0", "1.0.0.0", "a.b.c", "01.0.0", "1..0", "1.0.x", "-1.0.0"] {
            assert_eq!(parse_semver(bad), None, "{bad}");
        }
    }

    #[test]
    fn version_reply_lists_all() {
        let v = version_reply(&Version::ALL);
        assert_eq!(
            v.to_string(),
            r#"{"cniVersion":"1.1.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#
        );
    }

    #[test]
    fn semver_parts_are_plain_digits() {
        assert_eq!(parse_semver("2.10.0"), Some((2, 10, 0)));
        for bad in ["+1.0.0", "1.+2.0", "1..0", "01.0.0", "1.0", "1.0.0.0", "a.0.0"] {
            assert_eq!(parse_semver(bad), None, "{bad}");
        }
    }
}
