//! Telling a stale holder of a host port from a live one.
//!
//! ADD records, per attachment, the network namespace it was made for: the path it got in
//! CNI_NETNS (the element comment) and the namespace's identity, its nsfs inode and its netns
//! cookie (`SO_NETNS_COOKIE` of a socket made inside it: a 64-bit number the kernel never
//! reuses while it runs; inode numbers are reused as soon as a namespace is freed). When
//! another container's ADD wants a host port the attachment holds, the holder is **stale**
//! when that path no longer exists, is no longer a network namespace, or is another namespace:
//! its pod is gone even if nobody ran DEL. Everything else counts as live: a recorded path
//! that cannot be inspected, one outside the places runtimes put namespaces, an attachment
//! recorded without a path.
//!
//! A recorded path is read back from the kernel, so it is never trusted: it is opened by
//! [`NetNs::open_recorded`], only when it is `/run/netns/<name>`, `/var/run/netns/<name>` or
//! `/proc/<pid>/ns/net`, with `O_PATH` (a FIFO or a device there cannot block or be opened for
//! real), and used only once `fstatfs` says it is on nsfs.

use crate::model::NsId;
use cni_common::netns::NetNs;
use cni_common::{CniError, Result};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// Paths longer than this, or with other characters than these, are not recorded: the comment
/// that holds the path is limited to 128 bytes, and nft would escape other characters.
const PATH_MAX: usize = 128;

fn recordable(path: &str) -> bool {
    path.len() <= PATH_MAX && path.bytes().all(|b| b.is_ascii_alphanumeric() || b"/_.:@,=+-".contains(&b))
}

/// The netns cookie of the calling thread's network namespace; None when the kernel does not
/// have `SO_NETNS_COOKIE` (before Linux 5.14).
fn cookie_here() -> Option<u64> {
    let sock = UnixDatagram::unbound().ok()?;
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
    (rc == 0 && len as usize == std::mem::size_of::<u64>()).then_some(cookie)
}

/// The identity of an open namespace.
fn id_of(ns: &NetNs) -> Result<NsId> {
    let fd = ns
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| CniError::io(format!("duplicate a netns handle: {e}")))?;
    let ino = std::fs::File::from(fd)
        .metadata()
        .map_err(|e| CniError::io(format!("stat network namespace {}: {e}", ns.path().display())))?
        .ino();
    let cookie = ns.run(|| Ok(cookie_here()))?.unwrap_or(0);
    Ok(NsId { ino, cookie })
}

/// What ADD records for CNI_NETNS (already verified by the skeleton to be a network
/// namespace): its identity and its path (empty when the path cannot be recorded).
pub fn record(path: Option<&Path>) -> Result<Option<(NsId, String)>> {
    let Some(path) = path else { return Ok(None) };
    let Some(ns) = NetNs::open_if_exists(path)? else { return Ok(None) };
    let id = id_of(&ns)?;
    let text = path.to_str().filter(|p| recordable(p)).unwrap_or_default();
    Ok(Some((id, text.to_string())))
}

/// Whether the holder recorded with (`id`, `path`) is gone: Some(why) when its namespace no
/// longer exists or is another one; None when it is, or may be, alive.
pub fn gone(id: &NsId, path: &str) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    match NetNs::open_recorded(path) {
        Ok(None) => Some(format!("its network namespace {path} no longer exists")),
        Ok(Some(ns)) => {
            let now = id_of(&ns).ok()?;
            id.differs(&now).then(|| format!("{path} is now another network namespace"))
        }
        Err(_) => None, // cannot tell: treat as alive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_are_recorded() {
        assert!(recordable("/var/run/netns/cni-1b2c3d4e-0000-1111-2222-333344445555"));
        assert!(recordable("/proc/1234/ns/net"));
        assert!(!recordable("/run/netns/with space"));
        assert!(!recordable("/run/netns/quote\""));
        assert!(!recordable(&format!("/run/netns/{}", "x".repeat(130))));
    }

    #[test]
    fn only_known_places_are_opened() {
        for bad in
            ["/etc/shadow", "/run/netns/..", "/run/netns/a/b", "/proc/self/ns/net", "/dev/zero", "relative/x"]
        {
            assert_eq!(gone(&NsId::default(), bad), None, "{bad}: cannot tell, so alive");
        }
    }

    #[test]
    fn a_missing_namespace_is_gone_and_the_current_one_is_not() {
        let missing = format!("/run/netns/cni-rs-test-missing-{}", std::process::id());
        assert!(gone(&NsId::default(), &missing).is_some());
        let pid = std::process::id();
        let here = NetNs::current().unwrap();
        let id = id_of(&here).unwrap();
        assert_eq!(gone(&id, &format!("/proc/{pid}/ns/net")), None);
        assert!(gone(&NsId { ino: id.ino + 1, cookie: 0 }, &format!("/proc/{pid}/ns/net")).is_some());
    }

    #[test]
    fn the_cookie_of_this_namespace_is_stable() {
        let a = cookie_here().expect("SO_NETNS_COOKIE");
        assert_ne!(a, 0);
        assert_eq!(cookie_here(), Some(a));
    }
}
