//! Conntrack over `NETLINK_NETFILTER` (ctnetlink): delete the entries of the calling
//! thread's network namespace whose original-direction tuple has a given layer-4 protocol and
//! destination port.
//!
//! This is what portmap needs against stale UDP flows: a UDP "connection" created before a
//! host port was mapped (or while it pointed at another container) keeps its old NAT binding
//! for as long as packets keep arriving, so new DNAT rules never see it (plugins#123).
//!
//! The kernel offers no delete-by-filter, so this dumps the table of one family
//! (`IPCTNL_MSG_CT_GET` + `NLM_F_DUMP`), keeps the entries that match, and deletes each by its
//! original tuple (and zone) with `IPCTNL_MSG_CT_DELETE`. An entry that disappears in between
//! (ENOENT) is not an error. Messages are encoded by hand: the format is a handful of nested
//! attributes and no maintained crate covers ctnetlink.

use crate::error::{CniError, Result};
use netlink_sys::{Socket, SocketAddr};

/// `NETLINK_NETFILTER`.
const NETLINK_NETFILTER: isize = 12;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_TYPE_MASK: u16 = 0x3fff;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;

/// IP protocol numbers.
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_SCTP: u8 = 132;

/// Address family of the table to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtFamily {
    V4,
    V6,
}

impl CtFamily {
    fn af(self) -> u8 {
        match self {
            CtFamily::V4 => libc::AF_INET as u8,
            CtFamily::V6 => libc::AF_INET6 as u8,
        }
    }
}

/// One conntrack entry as far as deletion needs it: the raw original tuple and zone
/// attributes (re-sent verbatim) and the fields we match on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    tuple_orig: Vec<u8>,
    zone: Option<Vec<u8>>,
    proto: Option<u8>,
    dst_port: Option<u16>,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Iterate `(type without flags, payload)` over a buffer of netlink attributes.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let whole = &b[..len];
        let payload = &b[4..len];
        b = &b[align4(len).min(b.len())..];
        Some((ty, payload, whole))
    })
}

/// Parse the attributes of one `IPCTNL_MSG_CT_NEW` dump message (after the nfgenmsg header).
fn parse_entry(body: &[u8]) -> Option<Entry> {
    let mut e = Entry { tuple_orig: Vec::new(), zone: None, proto: None, dst_port: None };
    for (ty, payload, whole) in attrs(body) {
        match ty {
            CTA_TUPLE_ORIG => {
                e.tuple_orig = whole.to_vec();
                for (t2, p2, _) in attrs(payload) {
                    if t2 != CTA_TUPLE_PROTO {
                        continue;
                    }
                    for (t3, p3, _) in attrs(p2) {
                        match t3 {
                            CTA_PROTO_NUM if !p3.is_empty() => e.proto = Some(p3[0]),
                            CTA_PROTO_DST_PORT if p3.len() >= 2 => {
                                e.dst_port = Some(u16::from_be_bytes([p3[0], p3[1]]))
                            }
                            _ => {}
                        }
                    }
                }
            }
            CTA_ZONE => e.zone = Some(whole.to_vec()),
            _ => {}
        }
    }
    (!e.tuple_orig.is_empty()).then_some(e)
}

fn message(msg_type: u16, flags: u16, seq: u32, family: u8, attrs: &[&[u8]]) -> Vec<u8> {
    let mut body = vec![family, 0, 0, 0]; // nfgenmsg: family, NFNETLINK_V0, res_id 0
    for a in attrs {
        body.extend_from_slice(a);
        body.resize(align4(body.len()), 0);
    }
    let len = 16 + body.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&msg_type.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&body);
    m
}

/// Replies of one request: the payloads of data messages, or the kernel's errno.
enum Reply {
    Data(Vec<Vec<u8>>),
    Errno(i32),
}

struct CtSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn io_err(what: &str, e: std::io::Error) -> CniError {
    CniError::internal(format!("conntrack: {what}: {e}"))
}

impl CtSocket {
    fn open() -> Result<CtSocket> {
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(|e| io_err("open netlink socket", e))?;
        sock.bind_auto().map_err(|e| io_err("bind", e))?;
        sock.connect(&SocketAddr::new(0, 0)).map_err(|e| io_err("connect", e))?;
        Ok(CtSocket { sock, seq: 0, buf: vec![0; 256 * 1024] })
    }

    fn request(&mut self, msg_type: u16, flags: u16, family: u8, attrs: &[&[u8]]) -> Result<Reply> {
        self.seq = self.seq.wrapping_add(1).max(1);
        let seq = self.seq;
        let packet = message(msg_type, flags, seq, family, attrs);
        self.sock.send(&packet, 0).map_err(|e| io_err("send", e))?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        loop {
            let n = {
                let mut window: &mut [u8] = &mut self.buf[..];
                self.sock.recv(&mut window, 0).map_err(|e| io_err("receive", e))?
            };
            let mut data = &self.buf[..n];
            while data.len() >= 16 {
                let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
                if len < 16 || len > data.len() {
                    return Err(CniError::internal("conntrack: truncated netlink message"));
                }
                let ty = u16::from_ne_bytes([data[4], data[5]]);
                let mflags = u16::from_ne_bytes([data[6], data[7]]);
                let mseq = u32::from_ne_bytes([data[8], data[9], data[10], data[11]]);
                let payload = &data[16..len];
                data = &data[align4(len).min(data.len())..];
                if mseq != seq {
                    continue;
                }
                match ty {
                    NLMSG_ERROR => {
                        let code = payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        return Ok(match code {
                            Some(0) => Reply::Data(out),
                            Some(c) => Reply::Errno(-c),
                            None => Reply::Errno(libc::EBADMSG),
                        });
                    }
                    NLMSG_DONE => return Ok(Reply::Data(out)),
                    _ => {
                        out.push(payload.to_vec());
                        // Without NLM_F_ACK a single (non-multipart) reply ends the request.
                        if !dump && mflags & NLM_F_MULTI == 0 && flags & NLM_F_ACK == 0 {
                            return Ok(Reply::Data(out));
                        }
                    }
                }
            }
        }
    }
}

/// Delete every conntrack entry of `family` whose original tuple has protocol `proto` and
/// destination port `dst_port`. Returns how many were deleted.
pub fn delete_by_dst_port(family: CtFamily, proto: u8, dst_port: u16) -> Result<usize> {
    let mut s = CtSocket::open()?;
    let get = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
    let entries = match s.request(get, NLM_F_REQUEST | NLM_F_DUMP, family.af(), &[])? {
        Reply::Data(d) => d,
        Reply::Errno(e) => {
            return Err(CniError::internal(format!(
                "conntrack: dump: {}",
                std::io::Error::from_raw_os_error(e)
            )))
        }
    };
    let victims: Vec<Entry> = entries
        .iter()
        .filter(|p| p.len() >= 4)
        .filter_map(|p| parse_entry(&p[4..]))
        .filter(|e| e.proto == Some(proto) && e.dst_port == Some(dst_port))
        .collect();
    let del = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE;
    let mut n = 0;
    for v in &victims {
        let mut a: Vec<&[u8]> = vec![&v.tuple_orig];
        if let Some(z) = &v.zone {
            a.push(z);
        }
        match s.request(del, NLM_F_REQUEST | NLM_F_ACK, family.af(), &a)? {
            Reply::Data(_) => n += 1,
            Reply::Errno(e) if e == libc::ENOENT => {}
            Reply::Errno(e) => {
                return Err(CniError::internal(format!(
                    "conntrack: delete entry: {}",
                    std::io::Error::from_raw_os_error(e)
                )))
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NLA_F_NESTED: u16 = 0x8000;

    fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(payload);
        v.resize(align4(v.len()), 0);
        v
    }

    #[test]
    fn parses_proto_and_dst_port_of_the_original_tuple() {
        let ip = nla(1 | NLA_F_NESTED, &[nla(1, &[10, 0, 0, 1]), nla(2, &[10, 0, 0, 2])].concat());
        let proto = nla(
            CTA_TUPLE_PROTO | NLA_F_NESTED,
            &[nla(CTA_PROTO_NUM, &[17]), nla(2, &1234u16.to_be_bytes()), nla(3, &5353u16.to_be_bytes())]
                .concat(),
        );
        let orig = nla(CTA_TUPLE_ORIG | NLA_F_NESTED, &[ip.clone(), proto].concat());
        // the reply tuple (type 2) must not be mistaken for the original one
        let reply_proto = nla(
            CTA_TUPLE_PROTO | NLA_F_NESTED,
            &[nla(CTA_PROTO_NUM, &[17]), nla(3, &9999u16.to_be_bytes())].concat(),
        );
        let reply = nla(2 | NLA_F_NESTED, &[ip, reply_proto].concat());
        let zone = nla(CTA_ZONE, &7u16.to_be_bytes());
        let body = [reply, orig.clone(), zone.clone()].concat();
        let e = parse_entry(&body).unwrap();
        assert_eq!(e.proto, Some(17));
        assert_eq!(e.dst_port, Some(5353));
        assert_eq!(e.tuple_orig, orig);
        assert_eq!(e.zone.as_deref(), Some(&zone[..6]), "unpadded attribute; message() pads");
    }

    #[test]
    fn message_layout() {
        let m = message(0x0102, NLM_F_REQUEST | NLM_F_ACK, 7, 2, &[&[5, 0, 1, 0, 9]]);
        assert_eq!(m.len(), 16 + 4 + 8);
        assert_eq!(u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize, m.len());
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x0102);
        assert_eq!(m[16], 2);
        assert!(parse_entry(&[]).is_none());
    }
}
