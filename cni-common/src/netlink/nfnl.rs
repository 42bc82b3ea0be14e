//! nfnetlink framing shared by [`super::nft`] and [`super::conntrack`]: the `NETLINK_NETFILTER`
//! message header (`nlmsghdr` + `nfgenmsg`) and the netlink attributes of its payload.
//!
//! Both subsystems are encoded by hand (no maintained crate covers them) and sent over the
//! same transport as rtnetlink ([`super::socket::NlSocket`]).

/// `NETLINK_NETFILTER`.
pub(crate) const NETLINK_NETFILTER: isize = 12;
/// `NFNETLINK_V0`.
const NFNETLINK_V0: u8 = 0;
const NLMSG_HDRLEN: usize = 16;
/// The attribute type bits without `NLA_F_NESTED` / `NLA_F_NET_BYTEORDER`.
const NLA_TYPE_MASK: u16 = 0x3fff;
pub(crate) const NLA_F_NESTED: u16 = 0x8000;

/// The message type of `msg` of nfnetlink subsystem `subsys`.
pub(crate) const fn msg_type(subsys: u16, msg: u16) -> u16 {
    (subsys << 8) | msg
}

/// One nfnetlink message: header (sequence number and port id 0, set when sent), `nfgenmsg`
/// (`family`, version 0, `res_id` big-endian) and `attrs`, each padded to 4 bytes.
pub(crate) fn message(
    msg_type: u16,
    flags: u16,
    family: u8,
    res_id: u16,
    attrs: &[(u16, Vec<u8>)],
) -> Vec<u8> {
    let len = NLMSG_HDRLEN + 4 + attrs.iter().map(|(_, v)| (4 + v.len()).next_multiple_of(4)).sum::<usize>();
    let mut packet = Vec::with_capacity(len);
    packet.extend_from_slice(&(len as u32).to_ne_bytes());
    packet.extend_from_slice(&msg_type.to_ne_bytes());
    packet.extend_from_slice(&flags.to_ne_bytes());
    packet.extend_from_slice(&[0; 8]); // sequence number (set when sent) and port id
    packet.extend_from_slice(&[family, NFNETLINK_V0]);
    packet.extend_from_slice(&res_id.to_be_bytes());
    for (kind, value) in attrs {
        put_attr(&mut packet, *kind, value);
    }
    debug_assert_eq!(packet.len(), len);
    packet
}

/// Append attribute `kind` holding `value`, padded to 4 bytes.
pub(crate) fn put_attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.reserve(len.next_multiple_of(4));
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// Append nested attribute `kind` (flagged `NLA_F_NESTED`) holding the attributes `inner`.
pub(crate) fn put_nested(out: &mut Vec<u8>, kind: u16, inner: &[u8]) {
    put_attr(out, kind | NLA_F_NESTED, inner);
}

/// The attributes of `buf` as (type without flag bits, value); stops at the first malformed one.
pub(crate) fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let value = &buf[4..len];
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        Some((kind, value))
    })
}

/// The value of the first attribute of type `kind` in `buf`.
pub(crate) fn find_attr(buf: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(buf).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

/// A NUL-terminated string value.
pub(crate) fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A string value, up to its first NUL.
pub(crate) fn string_of(v: &[u8]) -> String {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// Encode `v` as a big-endian (network order) 32-bit value.
pub(crate) fn encode_be32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// Decode the big-endian (network order) 32-bit value at the start of `v`.
pub(crate) fn decode_be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_layout() {
        let m = message(0x0102, 0x5, 2, 10, &[(1, vec![9, 8, 7])]);
        assert_eq!(u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize, m.len());
        assert_eq!(m.len(), 16 + 4 + 8);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x0102);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), 0x5);
        assert_eq!(&m[16..20], &[2, 0, 0, 10]);
        assert_eq!(attrs(&m[20..]).collect::<Vec<_>>(), vec![(1, &[9u8, 8, 7][..])]);
    }

    #[test]
    fn attributes_round_trip_and_stop_at_garbage() {
        let mut b = Vec::new();
        put_attr(&mut b, 3, &cstr("abc"));
        put_nested(&mut b, 4, &encode_be32(7));
        b.extend_from_slice(&[200, 0, 1, 0]); // claims more bytes than there are
        let v: Vec<_> = attrs(&b).collect();
        assert_eq!(v.len(), 2);
        assert_eq!(string_of(v[0].1), "abc");
        assert_eq!((v[1].0, decode_be32(v[1].1)), (4, Some(7)));
        assert_eq!(find_attr(&b, 4), Some(&[0u8, 0, 0, 7][..]));
        assert_eq!(decode_be32(&[1, 2]), None);
    }
}
