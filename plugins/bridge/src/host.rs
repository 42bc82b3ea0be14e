//! Small host probes and writes several verbs share.

use cni_common::error::{code, CniError, Result};
use cni_common::netlink::Link;

/// The sysctl that exists only with br_netfilter loaded.
pub(crate) const BR_NF_CALL_IPTABLES: &str = "net/bridge/bridge-nf-call-iptables";

/// `bridgeNfCallIptables` needs br_netfilter (`present`: whether [`BR_NF_CALL_IPTABLES`]
/// exists): without it ADD could never work (code 50), which ADD and STATUS both say.
pub(crate) fn br_netfilter_present(present: bool) -> Result<()> {
    if !present {
        return Err(CniError::new(
            code::NOT_AVAILABLE,
            "bridgeNfCallIptables: /proc/sys/net/bridge/bridge-nf-call-iptables does not exist (load the br_netfilter module)",
        ));
    }
    Ok(())
}

/// `N` random bytes from the kernel.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    let mut filled = 0;
    while filled < N {
        // SAFETY: writes at most N - filled bytes into the buffer's tail.
        let n = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), N - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            panic!("getrandom failed: {}", std::io::Error::last_os_error());
        }
    }
    buf
}

/// A host-side veth name: `veth` + 8 random hex digits, as upstream (NetworkManager and
/// friends ignore `veth*`).
pub(crate) fn host_veth_name() -> String {
    let b: [u8; 4] = random_bytes();
    format!("veth{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3])
}

/// A random unicast, locally administered MAC.
pub(crate) fn random_mac() -> [u8; 6] {
    let mut m: [u8; 6] = random_bytes();
    m[0] = (m[0] & 0xfe) | 0x02;
    m
}

const IFF_LOOPBACK: u32 = 0x8;
const IFF_POINTOPOINT: u32 = 0x10;

/// kubenet's MTU choice: the smallest MTU among up, non-loopback, non-point-to-point host
/// interfaces if that is at least 576, else 1460.
pub fn kubenet_mtu(links: &[Link]) -> u32 {
    let min = links
        .iter()
        .filter(|l| l.up() && l.flags & (IFF_LOOPBACK | IFF_POINTOPOINT) == 0)
        .map(|l| l.mtu)
        .min();
    match min {
        Some(m) if m >= 576 => m,
        _ => 1460,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, mtu: u32, flags: u32) -> Link {
        Link { name: name.into(), mtu, flags, ..Link::default() }
    }

    #[test]
    fn kubenet_mtu_rules() {
        const UP: u32 = 0x1;
        let links = vec![
            link("lo", 65536, UP | IFF_LOOPBACK),
            link("eth0", 9001, UP),
            link("tun0", 1400, UP | IFF_POINTOPOINT),
            link("eth1", 1500, 0), // down
        ];
        assert_eq!(kubenet_mtu(&links), 9001);
        let mut more = links.clone();
        more.push(link("ipsec0", 8873, UP));
        assert_eq!(kubenet_mtu(&more), 8873);
        more.push(link("tiny", 500, UP));
        assert_eq!(kubenet_mtu(&more), 1460, "below 576 falls back to 1460");
        assert_eq!(kubenet_mtu(&[link("lo", 65536, UP | IFF_LOOPBACK)]), 1460);
    }

    #[test]
    fn generated_names_and_macs() {
        let n = host_veth_name();
        assert!(
            n.starts_with("veth") && n.len() == 12 && n[4..].chars().all(|c| c.is_ascii_hexdigit()),
            "{n}"
        );
        let m = random_mac();
        assert_eq!(m[0] & 0x03, 0x02, "unicast, locally administered");
    }

    #[test]
    fn random_macs_are_unicast_locally_administered_and_differ() {
        let macs: Vec<[u8; 6]> = (0..64).map(|_| random_mac()).collect();
        for m in &macs {
            assert_eq!(m[0] & 0x03, 0x02, "unicast and locally administered: {m:02x?}");
        }
        // 64 draws of 46 random bits: all distinct, and the first octet is random apart from
        // its two low bits (not a constant).
        let distinct: std::collections::HashSet<_> = macs.iter().collect();
        assert_eq!(distinct.len(), macs.len());
        let firsts: std::collections::HashSet<u8> = macs.iter().map(|m| m[0]).collect();
        assert!(firsts.len() > 8, "{firsts:?}");
        let names: std::collections::HashSet<String> = (0..64).map(|_| host_veth_name()).collect();
        assert_eq!(names.len(), 64);
        let bytes: [u8; 32] = random_bytes();
        assert!(bytes.iter().any(|b| *b != bytes[0]), "{bytes:?}");
    }
}
