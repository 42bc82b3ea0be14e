//! A TCP SYN written as a raw Ethernet frame: what a container can send with `CAP_NET_RAW`
//! alone (the default in containerd, CRI-O and Podman), whatever its routes say. Used to show
//! that a destination the container may not reach (the host's 127.0.0.1) does not answer, and,
//! as the control, that it does once the rule that stops it is gone.
//!
//! Segments that get no answer (conntrack calls a SYN with FIN set invalid, and TCP ignores it)
//! are sent with [`SynProbe::send`] and watched for where they arrive, with a [`TcpTap`].

use crate::Netns;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

const ETH_P_ALL: u16 = 0x0003;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// One SYN probe: sent from `ifname` in a namespace, from `src` to `dst`:`dport`, in a frame
/// addressed to `dst_mac` (the gateway's MAC: the frame goes to the host whatever the
/// container's routes say).
pub struct SynProbe<'a> {
    pub ns: &'a Netns,
    pub ifname: &'a str,
    pub dst_mac: [u8; 6],
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dport: u16,
}

/// A MAC address as `ip -j link` prints it.
pub fn parse_mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s.split(':').map(|b| u8::from_str_radix(b, 16).expect("hex MAC byte")).collect();
    v.try_into().unwrap_or_else(|_| panic!("MAC address {s:?}"))
}

/// The MAC address of link `name` in `ns`.
pub fn mac_of(ns: &Netns, name: &str) -> [u8; 6] {
    let l = ns.link(name).unwrap_or_else(|| panic!("no link {name} in {}", ns.name()));
    parse_mac(l["address"].as_str().expect("link address"))
}

/// The one's complement sum of `data` added to `acc`, folded (not inverted).
fn sum16(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

fn checksum(data: &[u8], acc: u32) -> [u8; 2] {
    (!(sum16(data, acc) as u16)).to_be_bytes()
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// An AF_PACKET socket bound to interface `ifindex` of the calling thread's namespace, whose
/// receives return after 100 ms at most.
fn packet_socket(ifindex: u32) -> (OwnedFd, libc::sockaddr_ll) {
    // SAFETY: plain socket(2); the descriptor is owned right away.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(ETH_P_ALL.to_be())) };
    assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETH_P_ALL.to_be();
    sll.sll_ifindex = ifindex as i32;
    let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: sll lives across the call and has the length given.
    let rc = unsafe { libc::bind(sock.as_raw_fd(), (&sll as *const libc::sockaddr_ll).cast(), len) };
    assert_eq!(rc, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
    let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
    // SAFETY: tv lives across the call and has the length given.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVTIMEO: {}", std::io::Error::last_os_error());
    (sock, sll)
}

impl SynProbe<'_> {
    /// The Ethernet frame of a segment with `flags` (a SYN: [`TCP_SYN`]) from `sport` with
    /// sequence number `seq`.
    fn frame(&self, src_mac: [u8; 6], sport: u16, seq: u32, flags: u8) -> Vec<u8> {
        let mut tcp = Vec::with_capacity(20);
        tcp.extend(sport.to_be_bytes());
        tcp.extend(self.dport.to_be_bytes());
        tcp.extend(seq.to_be_bytes());
        tcp.extend(0u32.to_be_bytes()); // ack
        tcp.extend([5 << 4, flags]);
        tcp.extend(64240u16.to_be_bytes()); // window
        tcp.extend([0, 0, 0, 0]); // checksum, urgent pointer
        let (src, dst) = (octets(self.src), octets(self.dst));
        // the pseudo header: addresses, protocol, TCP length
        let mut pseudo = [src.clone(), dst.clone()].concat();
        pseudo.extend([0, 6]);
        pseudo.extend((tcp.len() as u16).to_be_bytes());
        let c = checksum(&tcp, sum16(&pseudo, 0));
        tcp[16..18].copy_from_slice(&c);
        let mut f = Vec::with_capacity(14 + 40 + 20);
        f.extend(self.dst_mac);
        f.extend(src_mac);
        match self.src {
            IpAddr::V4(_) => {
                f.extend(ETH_P_IP.to_be_bytes());
                let mut ip = vec![0x45, 0];
                ip.extend((20 + tcp.len() as u16).to_be_bytes());
                ip.extend([0x12, 0x34, 0x40, 0, 64, 6, 0, 0]); // id, DF, ttl, TCP, checksum
                ip.extend(&src);
                ip.extend(&dst);
                let c = checksum(&ip, 0);
                ip[10..12].copy_from_slice(&c);
                f.extend(ip);
            }
            IpAddr::V6(_) => {
                f.extend(ETH_P_IPV6.to_be_bytes());
                f.extend([0x60, 0, 0, 0]);
                f.extend((tcp.len() as u16).to_be_bytes());
                f.extend([6, 64]); // next header TCP, hop limit
                f.extend(&src);
                f.extend(&dst);
            }
        }
        f.extend(tcp);
        f
    }

    /// Whether `frame` is the SYN-ACK to a SYN from `sport`.
    fn is_syn_ack(&self, frame: &[u8], sport: u16) -> bool {
        let Some(ethertype) = frame.get(12..14) else { return false };
        let (l4, src) = match (u16::from_be_bytes([ethertype[0], ethertype[1]]), self.dst) {
            (ETH_P_IP, IpAddr::V4(_)) => {
                let Some(ip) = frame.get(14..34) else { return false };
                if ip[9] != 6 {
                    return false;
                }
                (frame.get(14 + usize::from(ip[0] & 0x0f) * 4..), &ip[12..16])
            }
            (ETH_P_IPV6, IpAddr::V6(_)) => {
                let Some(ip) = frame.get(14..54) else { return false };
                if ip[6] != 6 {
                    return false;
                }
                (frame.get(54..), &ip[8..24])
            }
            _ => return false,
        };
        let Some(tcp) = l4.filter(|t| t.len() >= 20) else { return false };
        src == octets(self.dst).as_slice()
            && u16::from_be_bytes([tcp[0], tcp[1]]) == self.dport
            && u16::from_be_bytes([tcp[2], tcp[3]]) == sport
            && tcp[13] & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK
    }

    /// Run `f` on a thread inside the probe's namespace with a packet socket on its interface
    /// and a way to send a frame to the destination's MAC, passing it the interface's MAC.
    fn on_interface<R: Send>(&self, f: impl FnOnce(&OwnedFd, &dyn Fn(&[u8]), [u8; 6]) -> R + Send) -> R {
        let src_mac = mac_of(self.ns, self.ifname);
        let ns_file = std::fs::File::open(self.ns.path()).expect("open netns");
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                let name = std::ffi::CString::new(self.ifname).expect("interface name");
                // SAFETY: a NUL-terminated name.
                let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
                assert_ne!(ifindex, 0, "no interface {} in {}", self.ifname, self.ns.name());
                let (sock, mut to) = packet_socket(ifindex);
                to.sll_halen = 6;
                to.sll_addr[..6].copy_from_slice(&self.dst_mac);
                let to_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                let send = |frame: &[u8]| {
                    // SAFETY: frame and `to` live across the call.
                    let n = unsafe {
                        libc::sendto(
                            sock.as_raw_fd(),
                            frame.as_ptr().cast(),
                            frame.len(),
                            0,
                            (&to as *const libc::sockaddr_ll).cast(),
                            to_len,
                        )
                    };
                    assert_eq!(n, frame.len() as isize, "send frame: {}", std::io::Error::last_os_error());
                };
                f(&sock, &send, src_mac)
            })
            .join()
            .expect("probe thread")
        })
    }

    /// Send one segment with `flags` from `sport` with sequence number `seq`, and wait for
    /// nothing.
    pub fn send(&self, flags: u8, sport: u16, seq: u32) {
        self.on_interface(|_, send, src_mac| send(&self.frame(src_mac, sport, seq, flags)))
    }

    /// Send the SYN (again every half second) and watch the interface for the SYN-ACK until
    /// `wait` has passed: true as soon as one is seen.
    pub fn answered(&self, wait: Duration) -> bool {
        // a source port of its own for every probe: a connection an earlier probe opened
        // (and the host's repeated SYN-ACKs of it) says nothing about this one
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let sport =
            40000 + (std::process::id() % 10000) as u16 + NEXT.fetch_add(1, Ordering::Relaxed) % 10000;
        self.on_interface(|sock, send, src_mac| {
            let end = Instant::now() + wait;
            let mut next_send = Instant::now();
            let mut seq = 0x1000_0000u32;
            let mut buf = vec![0u8; 65536];
            while Instant::now() < end {
                if Instant::now() >= next_send {
                    send(&self.frame(src_mac, sport, seq, TCP_SYN));
                    seq += 1;
                    next_send = Instant::now() + Duration::from_millis(500);
                }
                // SAFETY: buf is writable for its length.
                let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n > 0 && self.is_syn_ack(&buf[..n as usize], sport) {
                    return true;
                }
            }
            false
        })
    }
}

/// A TCP segment a [`TcpTap`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub flags: u8,
}

/// A raw `IPPROTO_TCP` socket of one family in a namespace. The kernel hands such a socket a
/// copy of every TCP segment the namespace delivers locally (`raw_local_deliver`,
/// `raw6_local_deliver`), after the INPUT hook and before TCP itself looks at the segment: what
/// nftables' input chains dropped never reaches it, what they let through always does, whether
/// TCP then answers or not.
pub struct TcpTap {
    sock: OwnedFd,
    v6: bool,
}

impl TcpTap {
    /// A tap in `ns` for IPv4 (`v6` false) or IPv6 segments.
    pub fn open(ns: &Netns, v6: bool) -> TcpTap {
        let ns_file = std::fs::File::open(ns.path()).expect("open netns");
        let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        let sock = std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                // SAFETY: plain socket(2); the descriptor is owned right away. A socket stays in
                // the namespace it was made in, whichever thread reads it.
                let fd =
                    unsafe { libc::socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_TCP) };
                assert!(fd >= 0, "raw TCP socket: {}", std::io::Error::last_os_error());
                // SAFETY: fd is a fresh descriptor nobody else owns.
                unsafe { OwnedFd::from_raw_fd(fd) }
            })
            .join()
            .expect("tap thread")
        });
        TcpTap { sock, v6 }
    }

    /// The segments received since the last call (without waiting).
    pub fn drain(&self) -> Vec<Seen> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: buf is writable for its length.
            let n = unsafe {
                libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "receive on the TCP tap: {e}");
                return out;
            }
            let data = &buf[..n as usize];
            // an IPv4 raw socket gets the IP header too, an IPv6 one the payload only
            let tcp = if self.v6 {
                Some(data)
            } else {
                data.first().and_then(|b| data.get(usize::from(b & 0x0f) * 4..))
            };
            if let Some(t) = tcp.filter(|t| t.len() >= 20) {
                out.push(Seen {
                    sport: u16::from_be_bytes([t[0], t[1]]),
                    dport: u16::from_be_bytes([t[2], t[3]]),
                    seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
                    flags: t[13],
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_verify() {
        // a header with its checksum filled in sums to 0xffff
        let mut h = vec![0x45u8, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 2, 127, 0, 0, 1];
        let c = checksum(&h, 0);
        h[10..12].copy_from_slice(&c);
        assert_eq!(sum16(&h, 0), 0xffff);
        assert_eq!(parse_mac("02:00:0a:FF:00:01"), [2, 0, 10, 255, 0, 1]);
    }
}
