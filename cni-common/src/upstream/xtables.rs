//! Chain names of the legacy x_tables `nat` table, read without running `iptables-legacy`.
//!
//! `/proc/net/ip_tables_names` (`ip6_tables_names`; read through `/proc/thread-self`) lists the
//! legacy tables that exist in the calling thread's network namespace; on a node that never used `iptables-legacy` it has no
//! `nat`, and nothing else is done (asking the kernel for a table that is not there would load
//! and instantiate it). When `nat` exists, its chain names come from the same two
//! `getsockopt` calls `iptables-legacy-save` starts with: `IPT_SO_GET_INFO` (size of the rule
//! blob) and `IPT_SO_GET_ENTRIES` (the blob), in which every user-defined chain begins with an
//! entry whose target is `ERROR` and whose target data is the chain's name.

use super::iptables::Fam;
use crate::{CniError, Result};

/// `IPT_SO_GET_INFO` / `IP6T_SO_GET_INFO` (`IPT_BASE_CTL` + 0, + 1 for entries).
const SO_GET_INFO: libc::c_int = 64;
const SO_GET_ENTRIES: libc::c_int = 65;
const TABLE_NAME_LEN: usize = 32;
/// `struct ipt_getinfo`: name[32], valid_hooks, hook_entry[5], underflow[5], num_entries, size.
const GETINFO_LEN: usize = 32 + 4 + 20 + 20 + 4 + 4;
const GETINFO_SIZE_OFFSET: usize = GETINFO_LEN - 4;
/// `struct ipt_get_entries` / `ip6t_get_entries`: name[32], size, then the entries (8-byte
/// aligned: they hold 64-bit counters).
const GET_ENTRIES_HEADER: usize = 40;
/// Offsets of `target_offset` and `next_offset` inside `struct ipt_entry` (after the 84-byte
/// `struct ipt_ip` and `nfcache`) and `struct ip6t_entry` (after the 136-byte `struct ip6t_ip6`).
const IPT_TARGET_OFFSET: usize = 88;
const IP6T_TARGET_OFFSET: usize = 140;
/// `struct xt_entry_target`: target_size (u16), name[29], revision (u8); data follows.
const TARGET_NAME_AT: usize = 2;
const TARGET_NAME_LEN: usize = 29;
const TARGET_DATA_AT: usize = 32;

fn names_file(fam: Fam) -> &'static str {
    match fam {
        Fam::V4 => "/proc/thread-self/net/ip_tables_names",
        Fam::V6 => "/proc/thread-self/net/ip6_tables_names",
    }
}

/// Whether a legacy `nat` table exists in this namespace (false when x_tables is not even
/// loaded).
pub fn has_nat(fam: Fam) -> bool {
    std::fs::read_to_string(names_file(fam)).is_ok_and(|s| s.lines().any(|l| l.trim() == "nat"))
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The user-defined chains in an `IPT_SO_GET_ENTRIES` blob.
pub(crate) fn chains_in_blob(blob: &[u8], fam: Fam) -> Vec<String> {
    let offsets_at = match fam {
        Fam::V4 => IPT_TARGET_OFFSET,
        Fam::V6 => IP6T_TARGET_OFFSET,
    };
    let u16_at = |at: usize| blob.get(at..at + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]) as usize);
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < blob.len() {
        let (Some(target), Some(next)) = (u16_at(pos + offsets_at), u16_at(pos + offsets_at + 2)) else {
            break;
        };
        if next == 0 {
            break;
        }
        let t = pos + target;
        if let Some(name) = blob.get(t + TARGET_NAME_AT..t + TARGET_NAME_AT + TARGET_NAME_LEN) {
            if cstr(name) == "ERROR" {
                let end = (pos + next).min(blob.len());
                if let Some(data) = blob.get(t + TARGET_DATA_AT..end) {
                    let chain = cstr(data);
                    // The table ends with an ERROR entry named "ERROR".
                    if !chain.is_empty() && chain != "ERROR" {
                        out.push(chain);
                    }
                }
            }
        }
        pos += next;
    }
    out
}

struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: closing a descriptor this struct owns.
        unsafe { libc::close(self.0) };
    }
}

fn getsockopt(fd: &Fd, level: libc::c_int, opt: libc::c_int, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf is valid for len bytes; the kernel writes at most len bytes and updates len.
    let r = unsafe { libc::getsockopt(fd.0, level, opt, buf.as_mut_ptr().cast(), &mut len) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(len as usize)
}

/// The user-defined chains of the legacy `nat` table of `fam`, or None when there is no such
/// table in this namespace.
pub fn nat_chains(fam: Fam) -> Result<Option<Vec<String>>> {
    if !has_nat(fam) {
        return Ok(None);
    }
    let (af, level) = match fam {
        Fam::V4 => (libc::AF_INET, libc::IPPROTO_IP),
        Fam::V6 => (libc::AF_INET6, libc::IPPROTO_IPV6),
    };
    let fail = |what: &str, e: std::io::Error| {
        CniError::internal(format!("read the legacy iptables nat table ({what}): {e}"))
    };
    // SAFETY: plain socket(2) call; the descriptor is owned by `Fd`.
    let raw = unsafe { libc::socket(af, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW) };
    if raw < 0 {
        return Err(fail("socket", std::io::Error::last_os_error()));
    }
    let fd = Fd(raw);
    // The blob can change size between the two calls (another process edited the table):
    // the kernel then refuses GET_ENTRIES with EAGAIN; ask again.
    for _ in 0..5 {
        let mut info = [0u8; GETINFO_LEN];
        info[..3].copy_from_slice(b"nat");
        match getsockopt(&fd, level, SO_GET_INFO, &mut info) {
            Ok(_) => {}
            // The table went away since /proc was read.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(fail("IPT_SO_GET_INFO", e)),
        }
        let size =
            u32::from_ne_bytes(info[GETINFO_SIZE_OFFSET..GETINFO_LEN].try_into().expect("4 bytes")) as usize;
        let mut buf = vec![0u8; GET_ENTRIES_HEADER + size];
        buf[..3].copy_from_slice(b"nat");
        buf[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&(size as u32).to_ne_bytes());
        match getsockopt(&fd, level, SO_GET_ENTRIES, &mut buf) {
            Ok(_) => return Ok(Some(chains_in_blob(&buf[GET_ENTRIES_HEADER..], fam))),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
            Err(e) => return Err(fail("IPT_SO_GET_ENTRIES", e)),
        }
    }
    Err(CniError::internal("read the legacy iptables nat table: it kept changing (5 attempts)"))
}

/// The harness's visible skips (tests/src/skip.rs), shared with the end-to-end tests.
#[cfg(test)]
#[path = "../../../tests/src/skip.rs"]
#[allow(dead_code)] // the harness's whole API; this file's tests use part of it
mod skip;

#[cfg(test)]
mod tests {
    use super::skip::{skip_unless, Feature};
    use super::*;
    use std::process::Command;

    fn run(args: &[&str]) {
        let out = Command::new(args[0]).args(&args[1..]).output().expect("iptables-legacy is installed");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Kernel test (private namespace): no legacy table at first, and asking creates none.
    #[test]
    fn looking_for_the_legacy_nat_table_creates_none() {
        crate::netns::test_support::private_netns();
        for fam in [Fam::V4, Fam::V6] {
            assert_eq!(nat_chains(fam).unwrap(), None);
            assert!(!has_nat(fam), "looking must not instantiate the table");
        }
    }

    /// Kernel test (private namespace): chains made with iptables-legacy are found by name, in
    /// both families.
    #[test]
    fn reads_chain_names_of_legacy_nat() {
        crate::netns::test_support::private_netns();
        if !skip_unless(Feature::IptablesLegacyNat) {
            return;
        }
        assert_eq!(nat_chains(Fam::V6).unwrap(), None);
        run(&["iptables-legacy", "-t", "nat", "-N", "CNI-6c848780a988c4f72c3ef534"]);
        run(&["iptables-legacy", "-t", "nat", "-N", "CNI-DN-6c848780a988c4f72c3ef"]);
        run(&[
            "iptables-legacy",
            "-t",
            "nat",
            "-A",
            "CNI-DN-6c848780a988c4f72c3ef",
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "DNAT",
            "--to-destination",
            "10.1.1.2:80",
        ]);
        run(&["ip6tables-legacy", "-t", "nat", "-N", "CNI-HOSTPORT-DNAT"]);
        let v4 = nat_chains(Fam::V4).unwrap().expect("legacy nat exists now");
        assert_eq!(v4, vec!["CNI-6c848780a988c4f72c3ef534", "CNI-DN-6c848780a988c4f72c3ef"]);
        assert_eq!(nat_chains(Fam::V6).unwrap(), Some(vec!["CNI-HOSTPORT-DNAT".to_string()]));
    }
}
