//! Conntrack over `NETLINK_NETFILTER` (ctnetlink): delete the entries of the calling thread's
//! network namespace whose original-direction tuple has a given layer-4 protocol and one of a
//! set of (family, destination port) pairs.
//!
//! This is what host-port mapping needs against stale UDP flows: a UDP "connection" created before a
//! host port was mapped (or while it pointed at another container) keeps its old NAT binding
//! for as long as packets keep arriving, so new DNAT rules never see it (plugins#123).
//!
//! The kernel offers no delete-by-filter, so this dumps the table once (`IPCTNL_MSG_CT_GET` +
//! `NLM_F_DUMP`, of one family or of all when both are wanted), keeps the entries that match,
//! and deletes each by its original tuple (and zone) with `IPCTNL_MSG_CT_DELETE`, all on one
//! socket ([`NlSocket`], which also retries system calls interrupted by signals). An entry
//! that disappears in between (ENOENT) is not an error.

use std::collections::HashSet;

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

use super::nfnl::{self, attrs, find_attr, message, NETLINK_NETFILTER, NLA_F_NESTED};
use super::socket::NlSocket;
use super::{Family, NlError};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;

/// The IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

fn af(family: Family) -> u8 {
    match family {
        Family::V4 => libc::AF_INET as u8,
        Family::V6 => libc::AF_INET6 as u8,
    }
}

fn family_of(af: u8) -> Option<Family> {
    match i32::from(af) {
        libc::AF_INET => Some(Family::V4),
        libc::AF_INET6 => Some(Family::V6),
        _ => None,
    }
}

/// One conntrack entry as far as deletion needs it: the original tuple and zone attributes
/// (re-sent as they came) and the fields we match on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    family: Option<Family>,
    tuple_orig: Vec<u8>,
    zone: Option<Vec<u8>>,
    proto: Option<u8>,
    dst_port: Option<u16>,
}

/// Parse one `IPCTNL_MSG_CT_NEW` dump message (payload after the netlink header).
fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let family = family_of(*payload.first()?);
    let body = payload.get(4..)?; // nfgenmsg
    let mut e = Entry { family, tuple_orig: Vec::new(), zone: None, proto: None, dst_port: None };
    for (ty, value) in attrs(body) {
        match ty {
            CTA_TUPLE_ORIG => {
                e.tuple_orig = value.to_vec();
                let proto = find_attr(value, CTA_TUPLE_PROTO).unwrap_or_default();
                e.proto = find_attr(proto, CTA_PROTO_NUM).and_then(|p| p.first().copied());
                e.dst_port = find_attr(proto, CTA_PROTO_DST_PORT)
                    .and_then(|p| Some(u16::from_be_bytes(p.get(..2)?.try_into().ok()?)));
            }
            CTA_ZONE => e.zone = Some(value.to_vec()),
            _ => {}
        }
    }
    (!e.tuple_orig.is_empty()).then_some(e)
}

/// The deletion of `e`: its original tuple and zone, in its family.
fn delete_message(e: &Entry, family: Family) -> Vec<u8> {
    let mut a = vec![(CTA_TUPLE_ORIG | NLA_F_NESTED, e.tuple_orig.clone())];
    if let Some(z) = &e.zone {
        a.push((CTA_ZONE, z.clone()));
    }
    let ty = nfnl::msg_type(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_DELETE);
    message(ty, NLM_F_REQUEST | NLM_F_ACK, af(family), 0, &a)
}

/// Forget the UDP flows to `ports` (family, destination port), best effort: a flow created
/// before a host port's DNAT target changed would keep its old binding (plugins#123). Nothing
/// to do for no ports; a failure is a note on stderr naming `who` and the ports.
pub fn flush_udp_ports(who: &str, ports: &[(Family, u16)]) {
    if ports.is_empty() {
        return;
    }
    if let Err(e) = delete_by_dst_ports(IPPROTO_UDP, ports) {
        let list: Vec<String> = ports.iter().map(|(_, p)| p.to_string()).collect();
        crate::log!(who, "note: could not delete UDP conntrack entries for ports {}: {e}", list.join(", "));
    }
}

/// Delete every conntrack entry whose original tuple has protocol `proto` and whose (family,
/// destination port) is one of `targets`: one socket, one dump (of the one family wanted, or of
/// all), one deletion per matching entry. Returns how many were deleted.
pub fn delete_by_dst_ports(proto: u8, targets: &[(Family, u16)]) -> Result<usize, NlError> {
    let wanted: HashSet<(Family, u16)> = targets.iter().copied().collect();
    let families: HashSet<Family> = wanted.iter().map(|(f, _)| *f).collect();
    let dump_af = match families.iter().collect::<Vec<_>>()[..] {
        [] => return Ok(0),
        [one] => af(*one),
        _ => libc::AF_UNSPEC as u8,
    };
    let mut sock = NlSocket::open_protocol(NETLINK_NETFILTER)?;
    let get = nfnl::msg_type(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET);
    let new = nfnl::msg_type(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_NEW);
    let dump = message(get, NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP, dump_af, 0, &[]);
    let entries = sock.request_packet(dump, true).map_err(|e| e.during("conntrack: dump"))?;
    let victims =
        entries.iter().filter(|r| r.msg_type == new).filter_map(|r| parse_entry(&r.payload)).filter_map(
            |e| match (e.family, e.proto, e.dst_port) {
                (Some(f), Some(p), Some(port)) if p == proto && wanted.contains(&(f, port)) => Some((e, f)),
                _ => None,
            },
        );
    let mut n = 0;
    for (e, family) in victims {
        match sock.request_packet(delete_message(&e, family), false) {
            Ok(_) => n += 1,
            Err(err) if err.errno == libc::ENOENT => {}
            Err(err) => return Err(err.during("conntrack: delete entry")),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::nfnl::{encode_be32, put_attr, put_nested};
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    const IPPROTO_TCP: u8 = 6;
    const CTA_TUPLE_REPLY: u16 = 2;
    const CTA_TUPLE_IP: u16 = 1;
    const CTA_PROTO_SRC_PORT: u16 = 2;
    const CTA_TIMEOUT: u16 = 7;

    fn tuple(src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
        let mut ip = Vec::new();
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                put_attr(&mut ip, 1, &s.octets());
                put_attr(&mut ip, 2, &d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                put_attr(&mut ip, 3, &s.octets());
                put_attr(&mut ip, 4, &d.octets());
            }
            _ => unreachable!("one family per tuple"),
        }
        let mut p = Vec::new();
        put_attr(&mut p, CTA_PROTO_NUM, &[proto]);
        put_attr(&mut p, CTA_PROTO_SRC_PORT, &sport.to_be_bytes());
        put_attr(&mut p, CTA_PROTO_DST_PORT, &dport.to_be_bytes());
        let mut t = Vec::new();
        put_nested(&mut t, CTA_TUPLE_IP, &ip);
        put_nested(&mut t, CTA_TUPLE_PROTO, &p);
        t
    }

    /// `conntrack -I` for one flow src:sport -> dst:dport (and its reply direction).
    fn create_message(src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
        let family = if src.is_ipv4() { Family::V4 } else { Family::V6 };
        let attrs = [
            (CTA_TUPLE_ORIG | NLA_F_NESTED, tuple(src, dst, proto, sport, dport)),
            (CTA_TUPLE_REPLY | NLA_F_NESTED, tuple(dst, src, proto, dport, sport)),
            (CTA_TIMEOUT, encode_be32(600).to_vec()),
        ];
        let ty = nfnl::msg_type(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_NEW);
        message(ty, NLM_F_REQUEST | NLM_F_ACK | netlink_packet_core::NLM_F_CREATE, af(family), 0, &attrs)
    }

    /// Every entry of the namespace as (family, proto, destination port).
    fn table() -> Vec<(Family, u8, u16)> {
        let mut sock = NlSocket::open_protocol(NETLINK_NETFILTER).unwrap();
        let get = nfnl::msg_type(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET);
        let replies = sock.request_packet(message(get, NLM_F_REQUEST | NLM_F_DUMP, 0, 0, &[]), true).unwrap();
        let mut v: Vec<_> = replies
            .iter()
            .filter_map(|r| parse_entry(&r.payload))
            .map(|e| (e.family.unwrap(), e.proto.unwrap(), e.dst_port.unwrap()))
            .collect();
        v.sort_by_key(|(f, p, port)| (*f == Family::V6, *p, *port));
        v
    }

    #[test]
    fn parses_family_proto_and_dst_port_of_the_original_tuple() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let orig = tuple(a, b, 17, 1234, 5353);
        let mut body = vec![libc::AF_INET as u8, 0, 0, 0];
        // the reply tuple (type 2) must not be mistaken for the original one
        put_nested(&mut body, CTA_TUPLE_REPLY, &tuple(b, a, 17, 5353, 9999));
        put_nested(&mut body, CTA_TUPLE_ORIG, &orig);
        put_attr(&mut body, CTA_ZONE, &7u16.to_be_bytes());
        let e = parse_entry(&body).unwrap();
        assert_eq!((e.family, e.proto, e.dst_port), (Some(Family::V4), Some(17), Some(5353)));
        assert_eq!(e.tuple_orig, orig);
        assert_eq!(e.zone.as_deref(), Some(&7u16.to_be_bytes()[..]));
        // the deletion names the same tuple and zone
        let del = delete_message(&e, Family::V4);
        let sent = parse_entry(&del[16..]).unwrap();
        assert_eq!(sent, e);
        assert!(parse_entry(&[2, 0, 0, 0]).is_none());
    }

    extern "C" fn on_signal(_: libc::c_int) {}

    /// Kernel test: many entries of both families in a private namespace, one call deletes
    /// exactly those of the wanted (family, port) pairs, while the calling thread is hit by a
    /// stream of signals whose handler is installed without `SA_RESTART` (so every blocking
    /// system call they interrupt fails with EINTR unless retried).
    #[test]
    fn deletes_exactly_the_wanted_ports_of_both_families_under_a_signal_storm() {
        crate::netns::test_support::private_netns();
        let mut sock = NlSocket::open_protocol(NETLINK_NETFILTER).unwrap();
        let (v4a, v4b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (v6a, v6b): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let mut create = Vec::new();
        for sport in 1000..3000u16 {
            // UDP to 53 and 5353 in both families, and TCP to 53 (kept: another protocol)
            create.push(create_message(v4a, v4b, IPPROTO_UDP, sport, 53));
            create.push(create_message(v6a, v6b, IPPROTO_UDP, sport, 53));
            if sport < 1100 {
                create.push(create_message(v4a, v4b, IPPROTO_UDP, sport, 5353));
                create.push(create_message(v6a, v6b, IPPROTO_UDP, sport, 5353));
                create.push(create_message(v4a, v4b, IPPROTO_TCP, sport, 53));
            }
        }
        // a few at a time: every message is acknowledged, and the acks must fit the receive buffer
        for chunk in create.chunks(64) {
            sock.request_batch(chunk.to_vec()).expect("create conntrack entries (nf_conntrack loaded?)");
        }
        assert_eq!(table().len(), 2 * 2000 + 3 * 100);

        // SIGUSR1 without SA_RESTART, fired at this thread until the call returns.
        // SAFETY: a handler that does nothing; sigaction with a zeroed, then filled, struct.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
        // SAFETY: pthread_self of the calling thread, which outlives the firing thread (joined).
        let me = unsafe { libc::pthread_self() } as usize;
        let done = Arc::new(AtomicBool::new(false));
        let firing = {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut fired = 0u64;
                while !done.load(Ordering::Relaxed) {
                    // SAFETY: the target thread is alive until `done` is set and we are joined.
                    unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
                    fired += 1;
                    std::thread::yield_now();
                }
                fired
            })
        };
        let deleted =
            delete_by_dst_ports(IPPROTO_UDP, &[(Family::V4, 53), (Family::V6, 5353), (Family::V4, 53)]);
        done.store(true, Ordering::Relaxed);
        let fired = firing.join().unwrap();
        assert_eq!(deleted.expect("delete under signals"), 2000 + 100);
        assert!(fired > 0);

        let left = table();
        assert_eq!(left.len(), 2000 + 2 * 100);
        assert!(!left.contains(&(Family::V4, IPPROTO_UDP, 53)));
        assert!(!left.contains(&(Family::V6, IPPROTO_UDP, 5353)));
        assert_eq!(left.iter().filter(|e| **e == (Family::V6, IPPROTO_UDP, 53)).count(), 2000);
        assert_eq!(left.iter().filter(|e| **e == (Family::V4, IPPROTO_UDP, 5353)).count(), 100);
        assert_eq!(left.iter().filter(|e| **e == (Family::V4, IPPROTO_TCP, 53)).count(), 100);
        // nothing wanted, nothing sent; a port nobody uses deletes nothing
        assert_eq!(delete_by_dst_ports(IPPROTO_UDP, &[]).unwrap(), 0);
        assert_eq!(delete_by_dst_ports(IPPROTO_UDP, &[(Family::V6, 9)]).unwrap(), 0);
        assert_eq!(table().len(), left.len());
    }
}
