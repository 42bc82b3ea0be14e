//! Read and write kernel parameters under `/proc/sys`.
//!
//! Keys are given relative to `/proc/sys`, either in slash form (`net/ipv6/conf/eth0/accept_ra`)
//! or in dotted form (`net.ipv4.ip_forward`). A key containing a `/` is taken as slash form.
//! Dotted form is only for keys **without interface components**: interface names may contain
//! dots (`eth0.100`), so `net.ipv4.conf.eth0.100.forwarding` is ambiguous. Build per-interface
//! keys with [`iface_key`].
//!
//! `/proc/sys/net/…` resolves against the network namespace of the thread that opens the file,
//! so these functions act on the namespace entered with [`crate::netns::NetNs::run`].

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::PathBuf;

use crate::{CniError, Result};

const PROC_SYS: &str = "/proc/sys";

/// The file behind `key`. Rejects empty, `.` and `..` components so a key cannot leave
/// `/proc/sys`.
pub fn path_of(key: &str) -> io::Result<PathBuf> {
    let rel = key.strip_prefix("/proc/sys/").unwrap_or(key);
    let rel = if rel.contains('/') { rel.to_string() } else { rel.replace('.', "/") };
    if rel.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid sysctl key {key:?}")));
    }
    Ok(PathBuf::from(PROC_SYS).join(rel))
}

/// The slash-form key of a per-interface parameter: `iface_key("ipv6", "eth0", "accept_ra")` is
/// `net/ipv6/conf/eth0/accept_ra`. `family` is `"ipv4"` or `"ipv6"`; `ifname` must be a valid
/// interface name (no `/`), which the skeleton validates for `CNI_IFNAME`.
pub fn iface_key(family: &str, ifname: &str, leaf: &str) -> String {
    debug_assert!(family == "ipv4" || family == "ipv6", "family {family:?}");
    format!("net/{family}/conf/{ifname}/{leaf}")
}

/// The current value of `key`, surrounding whitespace trimmed.
pub fn get(key: &str) -> io::Result<String> {
    let s = std::fs::read_to_string(path_of(key)?)?;
    Ok(s.trim().to_string())
}

/// Set `key` to `value` unless it already has that value. Returns whether it wrote. Values are
/// compared word by word, so `"32768 60999"` matches the kernel's `"32768\t60999"`.
/// Errors are code 5 (I/O) and name the key.
pub fn set(key: &str, value: &str) -> Result<bool> {
    let current = get(key).map_err(|e| CniError::io(format!("read sysctl {key}: {e}")))?;
    if current.split_whitespace().eq(value.split_whitespace()) {
        return Ok(false);
    }
    let write = || -> io::Result<()> {
        // No O_CREAT/O_TRUNC: the file must exist, and /proc/sys takes one write.
        let mut f = OpenOptions::new().write(true).open(path_of(key)?)?;
        f.write_all(value.as_bytes())
    };
    write().map_err(|e| CniError::io(format!("set sysctl {key} to {value:?}: {e}")))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::test_support::private_netns;

    #[test]
    fn key_forms() {
        assert_eq!(path_of("net.ipv4.ip_forward").unwrap(), PathBuf::from("/proc/sys/net/ipv4/ip_forward"));
        assert_eq!(
            path_of("net/ipv6/conf/eth0.100/accept_ra").unwrap(),
            PathBuf::from("/proc/sys/net/ipv6/conf/eth0.100/accept_ra")
        );
        assert_eq!(
            path_of("/proc/sys/net/ipv4/ip_forward").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/ip_forward")
        );
        assert_eq!(iface_key("ipv4", "eth0.100", "rp_filter"), "net/ipv4/conf/eth0.100/rp_filter");
        for bad in ["", "net/../etc", "net//ipv4", "net.ipv4..x", "net/./x"] {
            assert!(path_of(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn get_reads_trimmed_value() {
        let v = get("kernel.ostype").unwrap();
        assert_eq!(v, "Linux");
        assert!(get("net.ipv4.no_such_key").is_err());
    }

    #[test]
    fn set_writes_only_when_different() {
        private_netns();
        // A fresh netns starts with forwarding off.
        assert_eq!(get("net.ipv4.ip_forward").unwrap(), "0");
        assert!(set("net.ipv4.ip_forward", "1").unwrap());
        assert_eq!(get("net/ipv4/ip_forward").unwrap(), "1");
        assert!(!set("net.ipv4.ip_forward", "1").unwrap());
        assert!(set("net/ipv4/ip_forward", "0").unwrap());

        // Multi-word values compare word by word.
        let range = get("net.ipv4.ip_local_port_range").unwrap();
        let spaced = range.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(!set("net.ipv4.ip_local_port_range", &spaced).unwrap());

        let key = iface_key("ipv6", "lo", "disable_ipv6");
        set(&key, "1").unwrap();
        assert!(set(&key, "0").unwrap());
        assert!(!set(&key, "0").unwrap());
    }

    #[test]
    fn set_errors_name_the_key() {
        private_netns();
        let e = set("net/ipv4/conf/nosuchif0/forwarding", "1").unwrap_err();
        assert_eq!(e.code, crate::code::IO);
        assert!(e.msg.contains("net/ipv4/conf/nosuchif0/forwarding"), "{}", e.msg);
    }
}
