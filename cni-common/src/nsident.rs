//! What makes a network namespace unambiguous over time: its nsfs inode and its netns cookie.
//!
//! Inode numbers of namespaces are handed out lowest-free-first, so a namespace created after
//! another was freed often gets the same number. The netns cookie (`SO_NETNS_COOKIE` of a
//! socket made inside the namespace, Linux 5.14) is a 64-bit counter the kernel never reuses
//! while it runs. Together with the boot id (`/proc/sys/kernel/random/boot_id`) they tell
//! "the namespace an attachment was made for" from "a namespace that has its name now".

use crate::netns::NetNs;
use crate::{CniError, Result};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixDatagram;

/// The identity of a network namespace. `cookie` is 0 when the kernel has no netns cookies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsIdent {
    pub ino: u64,
    pub cookie: u64,
}

impl NsIdent {
    /// Whether `other` is certainly another namespace: the inodes differ, or both cookies are
    /// known and differ.
    pub fn differs(&self, other: &NsIdent) -> bool {
        self.ino != other.ino || (self.cookie != 0 && other.cookie != 0 && self.cookie != other.cookie)
    }
}

/// Whether a CNI_NETNS path can be recorded beside an attachment's state (an element comment,
/// an address store's record) and read back as one token: not empty, at most `max` bytes,
/// and only characters that cannot break a line or need escaping (no space, control or
/// non-ASCII character). What is read back is still only opened by [`NetNs::open_recorded`].
pub fn recordable_path(path: &str, max: usize) -> bool {
    !path.is_empty()
        && path.len() <= max
        && path.bytes().all(|b| b.is_ascii_alphanumeric() || b"/_.:@,=+-~".contains(&b))
}

/// The netns cookie of the calling thread's network namespace; 0 when the kernel lacks
/// `SO_NETNS_COOKIE`.
pub fn cookie_here() -> u64 {
    let Ok(sock) = UnixDatagram::unbound() else { return 0 };
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`, which lives across the call,
    // on a socket `sock` keeps open.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc == 0 && len as usize == std::mem::size_of::<u64>() {
        cookie
    } else {
        0
    }
}

/// The identity of an open namespace (its cookie is read from inside: the calling thread
/// enters the namespace for one socket and comes back).
pub fn ident(ns: &NetNs) -> Result<NsIdent> {
    let st = nix::sys::stat::fstat(ns.as_fd())
        .map_err(|e| CniError::io(format!("stat network namespace {}: {}", ns.path().display(), e.desc())))?;
    let cookie = ns.run(|| Ok(cookie_here()))?;
    Ok(NsIdent { ino: st.st_ino, cookie })
}

/// The current boot's id (the 128-bit UUID of `/proc/sys/kernel/random/boot_id`). `None` when
/// it cannot be read or is not a UUID: callers then know nothing about boots (unknown is alive:
/// nothing is judged "made in an earlier boot" and nothing is recorded as "made in this one").
pub fn boot_id() -> Option<[u8; 16]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    parse_boot_id(&text)
}

/// A boot id as the kernel prints it: 32 hex digits in 8-4-4-4-12 groups, a newline; not all
/// zero.
pub fn parse_boot_id(text: &str) -> Option<[u8; 16]> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    let groups: Vec<&str> = text.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: Vec<u8> = groups.concat().into_bytes();
    if !hex.iter().all(u8::is_ascii_hexdigit) {
        return None; // from_str_radix takes a sign
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    (out != [0; 16]).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::test_support::{private_netns, spare_netns};

    #[test]
    fn identities_tell_namespaces_apart() {
        private_netns();
        let here = NetNs::current().unwrap();
        let other = spare_netns();
        let a = ident(&here).unwrap();
        let b = ident(&other).unwrap();
        assert_ne!(a.cookie, 0, "SO_NETNS_COOKIE (Linux >= 5.14)");
        assert_eq!(a, ident(&NetNs::current().unwrap()).unwrap(), "stable");
        assert!(a.differs(&b) && !a.differs(&a));
        // a reused inode number with another cookie is another namespace
        assert!(a.differs(&NsIdent { ino: a.ino, cookie: a.cookie + 1 }));
        // without cookies only the inode can tell
        assert!(!a.differs(&NsIdent { ino: a.ino, cookie: 0 }));
        assert!(boot_id().is_some());
    }

    #[test]
    fn a_boot_id_is_a_uuid_or_unknown() {
        let id = parse_boot_id("0123abcd-ef01-2345-6789-abcdef012345\n").unwrap();
        assert_eq!(id[0], 0x01);
        assert_eq!(id[15], 0x45);
        for bad in [
            "",
            "\n",
            "0123abcd",
            "00000000-0000-0000-0000-000000000000\n",
            "0123abcd-ef01-2345-6789-abcdef01234g\n",
            "0123abcd-ef01-2345-6789-abcdef0123456\n",
            "+123abcd-ef01-2345-6789-abcdef012345",
        ] {
            assert_eq!(parse_boot_id(bad), None, "{bad:?}");
        }
    }
}
