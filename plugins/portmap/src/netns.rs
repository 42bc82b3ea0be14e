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
use cni_common::{nsident, Request, Result};

/// Paths longer than this are not recorded: the comment that holds the path is limited to 128
/// bytes (nor paths with characters nft would escape: `nsident::recordable_path`).
const PATH_MAX: usize = 128;

fn recordable(path: &str) -> bool {
    nsident::recordable_path(path, PATH_MAX)
}

/// The identity of an open namespace (cni-common's, in portmap's element form).
fn id_of(ns: &NetNs) -> Result<NsId> {
    let id = nsident::ident(ns)?;
    Ok(NsId { ino: id.ino, cookie: id.cookie })
}

/// What ADD records for CNI_NETNS (the skeleton's handle, verified to be a network
/// namespace): its identity and its path (empty when the path cannot be recorded).
pub fn record(req: &Request) -> Result<Option<(NsId, String)>> {
    let (Some(path), Some(ns)) = (req.netns(), req.container_netns()?) else { return Ok(None) };
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
}
