//! Test servers and traffic probes: real connections through the rules the plugins make.
//!
//! Every server answers a connection or datagram with one line, `<name> <peer address>`: the
//! name says which container a host port led to, the peer address whether the connection was
//! masqueraded on the way. Every probe returns that line with the peer in canonical form
//! (`ctrA 10.250.1.2`, also when an IPv4 client reached a dual-stack socket as
//! `[::ffff:10.250.1.2]`), or `""` when nothing answered. Servers stop when dropped.
//!
//! TCP and SCTP go through `socat` (scripts/install-deps.sh installs it): [`Server`] listens
//! with `fork` and answers each connection from a `SYSTEM:echo` child, [`fetch`] and
//! [`request`] connect. UDP is a thread of the test instead ([`UdpServer`], [`fetch_udp`]);
//! [`UdpServer`] says why.

use crate::{wait_until, Netns};
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// socat ends a forked child `-t` seconds after one direction saw EOF (default 0.5 s). The
/// client half-closes at once (nothing on stdin), so with the default a child whose `sh`
/// needs longer than that to start on a loaded machine would close without answering, and a
/// client would give up before the answer: both wait up to this instead (they end as soon as
/// both directions are done, so this is only an upper bound).
pub const HALF_CLOSE_WAIT: &str = "-t10";

/// How long a server may take to listen before the test fails.
const LISTEN_LIMIT: Duration = Duration::from_secs(10);

/// A socat server in a namespace answering every connection with `<name> <peer address>`;
/// killed on drop.
pub struct Server(Child);

impl Server {
    /// TCP on `port`, both families (`[::]` with `ipv6only=0`).
    pub fn tcp(ns: &Netns, port: u16, name: &str) -> Server {
        Server::socat(
            ns,
            &format!("TCP6-LISTEN:{port},fork,reuseaddr,ipv6only=0"),
            &format!("sport = :{port}"),
            name,
        )
    }

    /// TCP on `port`, IPv4 only (`0.0.0.0`).
    pub fn tcp4(ns: &Netns, port: u16, name: &str) -> Server {
        Server::socat(ns, &format!("TCP4-LISTEN:{port},fork,reuseaddr"), &format!("sport = :{port}"), name)
    }

    /// TCP on one IPv4 address only.
    pub fn tcp4_on(ns: &Netns, addr: &str, port: u16, name: &str) -> Server {
        Server::socat(
            ns,
            &format!("TCP4-LISTEN:{port},bind={addr},fork,reuseaddr"),
            &format!("src {addr}:{port}"),
            name,
        )
    }

    /// Any socat listening address (`SCTP4-LISTEN:…,fork`, …); returns once `ss` lists the
    /// socket, which `ss_filter` selects (`sport = :80`, `src 10.0.0.1:80`). TCP and SCTP only
    /// (what `ss -l` is asked for).
    pub fn socat(ns: &Netns, listen: &str, ss_filter: &str, name: &str) -> Server {
        let kind = if listen.starts_with("SCTP") { "-HlnS" } else { "-Hltn" };
        let child = ns
            .command("socat")
            .args([HALF_CLOSE_WAIT, listen, &format!("SYSTEM:echo {name} $SOCAT_PEERADDR")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn socat (scripts/install-deps.sh installs it)");
        let server = Server(child); // killed also when the wait below fails
        wait_until(&format!("{name} to listen on {listen}"), LISTEN_LIMIT, || {
            let out = ns.try_run("ss", &[kind, ss_filter]);
            !String::from_utf8_lossy(&out.stdout).trim().is_empty()
        });
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the TCP server behind `addr:port` (IPv4 or IPv6) says to a client in `ns`: `""` when
/// nothing answered within 5 s.
pub fn fetch(ns: &Netns, addr: &str, port: u16) -> String {
    let target =
        if addr.contains(':') { format!("TCP6:[{addr}]:{port}") } else { format!("TCP4:{addr}:{port}") };
    request(ns, &target)
}

/// What the server at the socat connecting address `target` (`SCTP4:10.0.0.1:80`, …) says to
/// a client in `ns`: `""` when nothing answered within 5 s.
pub fn request(ns: &Netns, target: &str) -> String {
    let out = ns
        .command("socat")
        .args([HALF_CLOSE_WAIT, "-T5", "-", &format!("{target},connect-timeout=5")])
        .stdin(Stdio::null())
        .output()
        .expect("run socat (scripts/install-deps.sh installs it)");
    canonical_reply(&String::from_utf8_lossy(&out.stdout))
}

/// `name [0000:…:ffff:0afa:0102]` (socat's peer address) -> `name 10.250.1.2`; anything else
/// trimmed.
fn canonical_reply(reply: &str) -> String {
    let reply = reply.trim();
    let Some((name, peer)) = reply.split_once(' ') else { return reply.to_string() };
    match peer.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(ip) => format!("{name} {}", ip.to_canonical()),
        Err(_) => reply.to_string(),
    }
}

/// A UDP responder in a namespace: every datagram to its port (IPv4 or IPv6) is answered
/// with `<name> <peer address>` from the receiving socket, in a thread of the test; stopped
/// on drop.
///
/// Not socat: `UDP-RECVFROM,fork` + `SYSTEM:echo` hands the datagram to the shell's stdin,
/// and when `echo` has already exited the write fails (EPIPE) and the child exits without
/// answering: a request that reached the container went unanswered now and then.
pub struct UdpServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpServer {
    /// Listen on `[::]:port` in `ns` (dual-stack: bindv6only is 0 in a fresh namespace);
    /// returns once the socket is bound.
    pub fn start(ns: &Netns, port: u16, name: &str) -> UdpServer {
        UdpServer::start_at(ns.path(), port, name)
    }

    /// [`UdpServer::start`] in the namespace at `netns` (e.g. a pod's `/proc/<pid>/ns/net`).
    pub fn start_at(netns: &std::path::Path, port: u16, name: &str) -> UdpServer {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, name) = (stop.clone(), name.to_string());
        let ns_file = std::fs::File::open(netns).expect("open netns");
        let thread = std::thread::spawn(move || {
            nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let sock = UdpSocket::bind((Ipv6Addr::UNSPECIFIED, port)).expect("bind the UDP responder");
            // bounds how long drop() waits for the thread
            sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            tx.send(()).unwrap();
            let mut buf = [0u8; 2048];
            while !stop2.load(Ordering::Relaxed) {
                match sock.recv_from(&mut buf) {
                    Ok((_, peer)) => {
                        let reply = format!("{name} {}\n", peer.ip().to_canonical());
                        let _ = sock.send_to(reply.as_bytes(), peer);
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(e) => panic!("UDP responder {name}: {e}"),
                }
            }
        });
        rx.recv().expect("UDP responder started");
        UdpServer { stop, thread: Some(thread) }
    }
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One UDP request from `ns`, source port `sport`, to `addr:port` (IPv4 or IPv6): the answer,
/// or `""` when the port is closed (ICMP port unreachable, i.e. nothing was DNATed) or nothing
/// answered in 5 s. A thread of the test, so it returns as soon as the answer is in.
pub fn fetch_udp(ns: &Netns, addr: &str, port: u16, sport: u16) -> String {
    let ns_file = std::fs::File::open(ns.path()).expect("open netns");
    let addr: IpAddr = addr.parse().unwrap_or_else(|e| panic!("UDP target {addr}: {e}"));
    let local: IpAddr =
        if addr.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let sock = UdpSocket::bind((local, sport)).expect("bind client port");
            sock.connect((addr, port)).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            sock.send(b"ping\n").unwrap();
            let mut buf = [0u8; 2048];
            match sock.recv(&mut buf) {
                Ok(n) => canonical_reply(&String::from_utf8_lossy(&buf[..n])),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionRefused | ErrorKind::WouldBlock | ErrorKind::TimedOut
                    ) =>
                {
                    String::new()
                }
                Err(e) => panic!("UDP request to {addr}:{port}: {e}"),
            }
        })
        .join()
        .unwrap()
    })
}

#[cfg(test)]
mod tests {
    use super::canonical_reply;

    #[test]
    fn replies_carry_the_canonical_peer() {
        assert_eq!(canonical_reply("ctrA [0000:0000:0000:0000:0000:ffff:0afa:0102]\n"), "ctrA 10.250.1.2");
        assert_eq!(canonical_reply("ctrB [fd01:0001:0000:0000:0000:0000:0000:0002]"), "ctrB fd01:1::2");
        assert_eq!(canonical_reply("pod 10.250.7.2\n"), "pod 10.250.7.2");
        assert_eq!(canonical_reply("  \n"), "");
        assert_eq!(canonical_reply("odd reply here"), "odd reply here");
    }
}
