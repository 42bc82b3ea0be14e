//! The blocking `NETLINK_ROUTE` request/response loop.
//!
//! One request at a time: serialize, send with `NLM_F_REQUEST | NLM_F_ACK` and a fresh sequence
//! number, then read datagrams until the request is answered — by an ACK (`NLMSG_ERROR` with
//! code 0), an error (`NLMSG_ERROR` with a negative errno), or for dumps `NLMSG_DONE`. Messages
//! carrying another sequence number are leftovers of an earlier, abandoned request and are
//! skipped. A dump the kernel marks `NLM_F_DUMP_INTR` (the table changed while it was being
//! dumped, so the result may be inconsistent) is read to its end and repeated, up to
//! [`DUMP_ATTEMPTS`] times in all, like the Go plugins' `netlinksafe` package.
//!
//! This is the one transport of the crate: rtnetlink requests ([`super::Netlink`]), rtnetlink
//! notifications ([`NlSocket::join`], [`NlSocket::recv_until`], used by `events`), and
//! nfnetlink (nf_tables batches and dumps, conntrack) all go through it. System calls
//! interrupted by a signal (EINTR) are retried.
//!
//! Nothing waits forever: every receive has a deadline ([`RECV_DEADLINE`], `SO_RCVTIMEO`).
//! The kernel answers a request before `send` returns, so a wait that long means the answer
//! was lost (e.g. dropped because the receive buffer was full); the error is `ETIMEDOUT`,
//! which callers report as "try again later" (code 11).

use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NlasIterator, NLMSG_DONE, NLMSG_ERROR,
    NLMSG_NOOP, NLMSG_OVERRUN, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST,
};
use std::os::fd::AsRawFd;
use std::time::Instant;

use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use super::error::NlError;

/// How many times a dump is tried before an interrupted result is reported as an error.
pub(crate) const DUMP_ATTEMPTS: usize = 5;

/// How long one receive waits for the kernel's answer before the request fails with
/// `ETIMEDOUT`.
pub const RECV_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Requests sent in one datagram by [`NlSocket::request_many`]: their answers (one message
/// each) must fit the receive buffer together.
const PIPELINE: usize = 64;

/// Initial receive buffer: larger than any dump datagram the kernel builds (it caps those at
/// 32 KiB); grown when a single datagram is bigger.
const RX_BUFFER: usize = 64 * 1024;

const NLMSG_HDRLEN: usize = 16;
/// `NLMSGERR_ATTR_MSG`: the human-readable extended-ack message.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// One reply message: its type and its payload (the bytes after the netlink header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub msg_type: u16,
    pub payload: Vec<u8>,
}

pub(crate) struct NlSocket {
    sock: Socket,
    seq: u32,
    rx: Vec<u8>,
    /// Learn each datagram's size first (`MSG_PEEK`): rtnetlink replies can be larger than any
    /// buffer set aside (a link with many VFs). nfnetlink's never exceed [`RX_BUFFER`] (dumps
    /// are cut at 32 KiB, acknowledgements are capped), so those are received in one call.
    peek: bool,
    /// How long a receive waits for a datagram ([`NlSocket::set_recv_deadline`]).
    deadline: std::time::Duration,
    /// Whether a receive has run on this socket ([`NlSocket::prime`]).
    primed: bool,
    /// Datagrams received so far (tests count them).
    #[cfg(test)]
    received: u64,
}

impl NlSocket {
    /// Create a socket in the calling thread's network namespace and connect it to the kernel.
    pub(crate) fn open() -> Result<NlSocket, NlError> {
        Self::open_protocol(NETLINK_ROUTE)
    }

    /// Like [`NlSocket::open`] for another netlink protocol (e.g. `NETLINK_NETFILTER`).
    pub(crate) fn open_protocol(protocol: isize) -> Result<NlSocket, NlError> {
        Self::open_to(protocol, 0)
    }

    /// A socket of `protocol` talking to port `peer` (0: the kernel; another port only in tests).
    fn open_to(protocol: isize, peer: u32) -> Result<NlSocket, NlError> {
        let mut sock = Socket::new(protocol).map_err(|e| NlError::from_io("open netlink socket", &e))?;
        sock.bind_auto().map_err(|e| NlError::from_io("bind netlink socket", &e))?;
        sock.connect(&SocketAddr::new(peer, 0))
            .map_err(|e| NlError::from_io("connect netlink socket", &e))?;
        // Best effort, all of these only improve things on kernels that support them:
        // strict checking makes the kernel validate requests and filter dumps (e.g. addresses
        // of one link) itself; extended ACKs carry a readable reason with errors; capped ACKs
        // do not echo our whole request back.
        let _ = sock.set_netlink_get_strict_chk(true);
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        let peek = protocol == NETLINK_ROUTE;
        // capacity, not zeroes: a zeroed buffer is 16 page faults per socket before the first
        // answer, and only what the kernel writes need ever be touched
        let rx = Vec::with_capacity(RX_BUFFER);
        let mut out = NlSocket {
            sock,
            seq: 0,
            rx,
            peek,
            deadline: RECV_DEADLINE,
            primed: false,
            #[cfg(test)]
            received: 0,
        };
        out.set_recv_deadline(RECV_DEADLINE)?;
        Ok(out)
    }

    /// Every receive on this socket fails with `ETIMEDOUT` after `d` without a datagram.
    pub(crate) fn set_recv_deadline(&mut self, d: std::time::Duration) -> Result<(), NlError> {
        let tv = libc::timeval {
            // capped at 2^31 - 1 s (68 years), which fits every platform's time_t
            tv_sec: d.as_secs().min(i32::MAX as u64) as _,
            tv_usec: d.subsec_micros().into(),
        };
        // SAFETY: setsockopt with a pointer to a timeval of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(NlError::from_io("set netlink receive deadline", &std::io::Error::last_os_error()));
        }
        self.deadline = d;
        Ok(())
    }

    /// Send `msg` with `NLM_F_REQUEST | NLM_F_ACK | flags` and collect the reply messages.
    /// Errors carry a generic `op`; callers replace it with what they were doing.
    pub(crate) fn request(&mut self, msg: RouteNetlinkMessage, flags: u16) -> Result<Vec<Reply>, NlError> {
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        self.request_packet(encode(msg, NLM_F_REQUEST | NLM_F_ACK | flags), dump)
    }

    /// Send an already serialized request (header flags set by the caller; the sequence number
    /// is filled in here) and collect the replies, with the same dump retry as [`request`].
    ///
    /// [`request`]: NlSocket::request
    pub(crate) fn request_packet(&mut self, mut packet: Vec<u8>, dump: bool) -> Result<Vec<Reply>, NlError> {
        if dump {
            self.prime()?;
        }
        let attempts = if dump { DUMP_ATTEMPTS } else { 1 };
        for _ in 0..attempts {
            self.seq = self.seq.wrapping_add(1).max(1);
            set_sequence(&mut packet, self.seq);
            self.send(&packet)?;
            let mut collector = Collector::new(self.seq);
            loop {
                let n = self.recv()?;
                if collector.absorb(&self.rx[..n])? == Step::Done {
                    break;
                }
            }
            if !collector.interrupted {
                return Ok(collector.replies);
            }
        }
        let mut e = NlError::new("netlink dump", libc::EINTR);
        e.detail = Some(format!("interrupted by concurrent changes {DUMP_ATTEMPTS} times in a row"));
        Err(e)
    }

    /// Send `messages` (serialized, header flags set by the caller) as one datagram — e.g. an
    /// nfnetlink batch — and wait until each message with `NLM_F_ACK` has been answered (the
    /// kernel answers every one of them, also when the batch is aborted). An error for a message
    /// without `NLM_F_ACK` (a batch header) ends the wait at once. Sequence numbers are assigned
    /// here. Returns the first error reported.
    pub(crate) fn request_batch(&mut self, mut messages: Vec<Vec<u8>>) -> Result<(), NlError> {
        let mut waiting = Vec::new();
        let mut all = Vec::new();
        let mut packet = Vec::new();
        for m in &mut messages {
            self.seq = self.seq.wrapping_add(1).max(1);
            set_sequence(m, self.seq);
            all.push(self.seq);
            if NetlinkBuffer::new(&m[..]).flags() & NLM_F_ACK != 0 {
                waiting.push(self.seq);
            }
            packet.extend_from_slice(m);
        }
        self.fit_send_buffer(packet.len());
        // Every failing message is answered, and the answers wait in the receive buffer until
        // the whole batch is processed: make room for one per message of a large batch.
        self.fit_buffer(
            libc::SO_RCVBUFFORCE,
            libc::SO_RCVBUF,
            messages.len().saturating_mul(1024),
            200 * 1024,
        );
        self.send(&packet)?;
        let mut first_error: Option<NlError> = None;
        'recv: while !waiting.is_empty() {
            let n = self.recv()?;
            let mut data = &self.rx[..n];
            while !data.is_empty() {
                let msg = NetlinkBuffer::new_checked(data)
                    .map_err(|_| NlError::new("decode netlink reply (truncated message)", libc::EBADMSG))?;
                let (len, seq, flags) = (msg.length() as usize, msg.sequence_number(), msg.flags());
                if msg.message_type() == NLMSG_ERROR && all.contains(&seq) {
                    let code = read_i32(msg.payload()).unwrap_or(-libc::EBADMSG);
                    let expected = waiting.contains(&seq);
                    waiting.retain(|s| *s != seq);
                    if code != 0 && first_error.is_none() {
                        let mut e = NlError::new("netlink batch", code.saturating_neg());
                        e.detail = error_ext_ack(flags, msg.payload());
                        first_error = Some(e);
                    }
                    if code != 0 && !expected {
                        break 'recv;
                    }
                }
                data = &data[align4(len).min(data.len())..];
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Send several requests pipelined — up to [`PIPELINE`] in one datagram, a dump only as
    /// the last of its datagram (the kernel runs one dump per socket at a time) — and collect
    /// each one's answer: `Ok(replies)`, or the kernel's error for that request alone. A
    /// non-dump request (sent without `NLM_F_ACK`) is answered by exactly one message, its
    /// reply or its error; a dump by its messages up to `NLMSG_DONE` (an interrupted dump is
    /// an `EINTR` error: the caller reads again). `requests`: (serialized request, is a dump).
    pub(crate) fn request_many(
        &mut self,
        requests: Vec<(Vec<u8>, bool)>,
    ) -> Result<Vec<Result<Vec<Reply>, NlError>>, NlError> {
        let mut out = Vec::with_capacity(requests.len());
        let mut batch: Vec<(Vec<u8>, bool)> = Vec::new();
        let mut it = requests.into_iter().peekable();
        while let Some(r) = it.next() {
            let dump = r.1;
            batch.push(r);
            if dump || batch.len() == PIPELINE || it.peek().is_none() {
                out.extend(self.exchange(std::mem::take(&mut batch))?);
            }
        }
        Ok(out)
    }

    /// Before the first dump on this socket, one receive: an acknowledged `NLMSG_NOOP`.
    ///
    /// The kernel builds a dump's first datagram while the request is being sent, sized by the
    /// largest receive buffer this socket has offered so far: one page (`NLMSG_GOODSIZE`, about
    /// 3.7 KiB) on a socket that never received, 32 KiB after one receive into [`RX_BUFFER`].
    /// Each later datagram resumes the dump by counting objects, and nf_tables counts the rules
    /// an uncommitted transaction of another process has linked into a chain (a dry run, `nft
    /// -c`): when that transaction ends between two datagrams, the count shifts, and the rules
    /// at the seam are listed twice or skipped, with no mark of interruption and at the same
    /// generation. A skip of the last rules of a chain cannot be seen in the listing (the
    /// rules left are linked; `nft::read`'s check finds every other tear). With one datagram
    /// of 32 KiB a listing of that size is never resumed: a table's rules arrive whole.
    pub(crate) fn prime(&mut self) -> Result<(), NlError> {
        if self.primed {
            return Ok(());
        }
        self.seq = self.seq.wrapping_add(1).max(1);
        let mut noop = vec![0u8; NLMSG_HDRLEN];
        {
            let mut b = NetlinkBuffer::new(&mut noop[..]);
            b.set_length(NLMSG_HDRLEN as u32);
            b.set_message_type(NLMSG_NOOP);
            b.set_flags(NLM_F_REQUEST | NLM_F_ACK);
            b.set_sequence_number(self.seq);
        }
        self.send(&noop)?;
        let mut collector = Collector::new(self.seq);
        loop {
            let n = self.recv()?;
            if collector.absorb(&self.rx[..n])? == Step::Done {
                return Ok(());
            }
        }
    }

    /// Datagrams received on this socket so far (a peeking socket counts a datagram when it
    /// learns its size).
    #[cfg(test)]
    pub(crate) fn received(&self) -> u64 {
        self.received
    }

    /// Take this socket as primed (tests: what a dump on a socket that never received gets).
    #[cfg(test)]
    pub(crate) fn skip_priming(&mut self) {
        self.primed = true;
    }

    /// One datagram of [`NlSocket::request_many`].
    fn exchange(
        &mut self,
        mut reqs: Vec<(Vec<u8>, bool)>,
    ) -> Result<Vec<Result<Vec<Reply>, NlError>>, NlError> {
        if reqs.iter().any(|(_, dump)| *dump) {
            self.prime()?;
        }
        let first = self.seq.wrapping_add(1).max(1);
        let mut packet = Vec::new();
        for (m, _) in &mut reqs {
            self.seq = self.seq.wrapping_add(1).max(1);
            set_sequence(m, self.seq);
            packet.extend_from_slice(m);
        }
        self.send(&packet)?;
        let seqs: Vec<u32> = (0..reqs.len() as u32).map(|i| first.wrapping_add(i).max(1)).collect();
        let mut collectors: Vec<Collector> = seqs.iter().map(|s| Collector::new(*s)).collect();
        let mut results: Vec<Option<Result<Vec<Reply>, NlError>>> = (0..reqs.len()).map(|_| None).collect();
        let dumps: Vec<bool> = reqs.iter().map(|(_, d)| *d).collect();
        while results.iter().any(Option::is_none) {
            let n = self.recv()?;
            let mut data = &self.rx[..n];
            while !data.is_empty() {
                let msg = NetlinkBuffer::new_checked(data)
                    .map_err(|_| NlError::new("decode netlink reply (truncated message)", libc::EBADMSG))?;
                let len = align4(msg.length() as usize).min(data.len());
                if let Some(i) = seqs.iter().position(|s| *s == msg.sequence_number()) {
                    if results[i].is_none() {
                        let c = &mut collectors[i];
                        match c.absorb(&data[..len]) {
                            Err(e) => results[i] = Some(Err(e)),
                            Ok(Step::Done) => results[i] = Some(Ok(std::mem::take(&mut c.replies))),
                            // a get is answered by one message
                            Ok(Step::More) if !dumps[i] => {
                                results[i] = Some(Ok(std::mem::take(&mut c.replies)))
                            }
                            Ok(Step::More) => {}
                        }
                        if dumps[i] && c.interrupted && matches!(results[i], Some(Ok(_))) {
                            let mut e = NlError::new("netlink dump", libc::EINTR);
                            e.detail = Some("interrupted by a concurrent change".into());
                            results[i] = Some(Err(e));
                        }
                    }
                }
                data = &data[len..];
            }
        }
        Ok(results.into_iter().map(|r| r.expect("every request answered")).collect())
    }

    /// The kernel refuses a datagram larger than the socket's send buffer (about 200 KiB by
    /// default): grow it for a large batch (SO_SNDBUFFORCE as root, else up to the sysctl limit).
    fn fit_send_buffer(&self, len: usize) {
        self.fit_buffer(libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, len.saturating_mul(2), 256 * 1024);
    }

    /// Grow a socket buffer (`force` as root, else `plain` up to the sysctl limit) to `want`
    /// bytes when that is more than the default (`default_fits`).
    fn fit_buffer(&self, force: libc::c_int, plain: libc::c_int, want: usize, default_fits: usize) {
        if want <= default_fits {
            return;
        }
        let size = libc::c_int::try_from(want).unwrap_or(libc::c_int::MAX);
        let fd = self.sock.as_raw_fd();
        for opt in [force, plain] {
            // SAFETY: setsockopt with a pointer to a c_int of the size passed.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                return;
            }
        }
    }

    /// Join multicast group `group` (e.g. `RTNLGRP_LINK`): its notifications arrive on this
    /// socket from now on.
    pub(crate) fn join(&mut self, group: u32) -> Result<(), NlError> {
        self.sock.add_membership(group).map_err(|e| NlError::from_io("join netlink multicast group", &e))
    }

    /// The next datagram (notifications), waiting until `deadline` at most. `None` when the
    /// deadline passed or the kernel dropped notifications because the socket's buffer was full
    /// (ENOBUFS): either way the caller looks at the current state again.
    pub(crate) fn recv_until(&mut self, deadline: Instant) -> Result<Option<&[u8]>, NlError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(NlError::from_io("poll netlink socket", &e));
            }
            if n == 0 {
                continue; // re-check the deadline
            }
            return match self.recv() {
                Ok(len) => Ok(Some(&self.rx[..len])),
                Err(e) if e.errno == libc::ENOBUFS => Ok(None),
                Err(e) => Err(e.during("receive netlink notification")),
            };
        }
    }

    fn send(&self, packet: &[u8]) -> Result<(), NlError> {
        loop {
            match self.sock.send(packet, 0) {
                Ok(n) if n == packet.len() => return Ok(()),
                Ok(_) => return Err(NlError::new("send to netlink (short write)", libc::EMSGSIZE)),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(NlError::from_io("send to netlink", &e)),
            }
        }
    }

    /// Receive one datagram into `self.rx` (its length becomes the datagram's), growing it
    /// first when the datagram is larger. The kernel writes into the buffer's spare capacity.
    fn recv(&mut self) -> Result<usize, NlError> {
        loop {
            // MSG_TRUNC: the datagram's real size, also when it did not fit.
            let flags = if self.peek { libc::MSG_PEEK | libc::MSG_TRUNC } else { libc::MSG_TRUNC };
            self.rx.clear();
            let size = match self.sock.recv(&mut self.rx, flags) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let mut e = NlError::new("receive from netlink", libc::ETIMEDOUT);
                    e.detail = Some(format!("no answer from the kernel within {:?}", self.deadline));
                    return Err(e);
                }
                Err(e) => return Err(NlError::from_io("receive from netlink", &e)),
            };
            self.primed = true;
            #[cfg(test)]
            {
                self.received += 1;
            }
            if !self.peek {
                if size > self.rx.len() {
                    let mut e = NlError::new("receive from netlink", libc::EMSGSIZE);
                    e.detail = Some(format!(
                        "a datagram of {size} bytes did not fit the {} of the buffer",
                        self.rx.capacity()
                    ));
                    return Err(e);
                }
                return Ok(size);
            }
            self.rx.clear();
            if size > self.rx.capacity() {
                self.rx.reserve_exact(size.next_power_of_two());
            }
            match self.sock.recv(&mut self.rx, 0) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(NlError::from_io("receive from netlink", &e)),
            }
        }
    }
}

impl std::os::fd::AsFd for NlSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// Serialize a request with the given header flags (sequence number 0, set when sending).
pub(crate) fn encode(msg: RouteNetlinkMessage, flags: u16) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    buf
}

/// Patch the sequence number of a serialized request (so a dump can be resent as is).
fn set_sequence(packet: &mut [u8], seq: u32) {
    NetlinkBuffer::new(packet).set_sequence_number(seq);
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn read_i32(bytes: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
}

#[derive(Debug, PartialEq, Eq)]
enum Step {
    More,
    Done,
}

/// Accumulates the answer to one request across datagrams.
struct Collector {
    seq: u32,
    replies: Vec<Reply>,
    interrupted: bool,
}

impl Collector {
    fn new(seq: u32) -> Self {
        Collector { seq, replies: Vec::new(), interrupted: false }
    }

    /// Take in one datagram; `Done` once the request has been answered.
    fn absorb(&mut self, mut data: &[u8]) -> Result<Step, NlError> {
        while !data.is_empty() {
            let msg = NetlinkBuffer::new_checked(data)
                .map_err(|_| NlError::new("decode netlink reply (truncated message)", libc::EBADMSG))?;
            let len = msg.length() as usize;
            let flags = msg.flags();
            let payload = msg.payload();
            if msg.sequence_number() == self.seq {
                if flags & NLM_F_DUMP_INTR != 0 {
                    self.interrupted = true;
                }
                match msg.message_type() {
                    NLMSG_NOOP => {}
                    NLMSG_ERROR => {
                        let code = read_i32(payload)
                            .ok_or_else(|| NlError::new("decode netlink error message", libc::EBADMSG))?;
                        if code == 0 {
                            return Ok(Step::Done);
                        }
                        let mut e = NlError::new("netlink request", code.saturating_neg());
                        e.detail = error_ext_ack(flags, payload);
                        return Err(e);
                    }
                    NLMSG_DONE => {
                        // Dumps may end with an error in NLMSG_DONE.
                        let code = read_i32(payload).unwrap_or(0);
                        if code < 0 {
                            let mut e = NlError::new("netlink dump", code.saturating_neg());
                            if flags & NLM_F_ACK_TLVS != 0 {
                                e.detail = ext_ack_message(&payload[4..]);
                            }
                            return Err(e);
                        }
                        return Ok(Step::Done);
                    }
                    NLMSG_OVERRUN => return Err(NlError::new("netlink reply (overrun)", libc::ENOBUFS)),
                    msg_type => self.replies.push(Reply { msg_type, payload: payload.to_vec() }),
                }
            }
            data = &data[align4(len).min(data.len())..];
        }
        Ok(Step::More)
    }
}

/// The extended-ack message of an `NLMSG_ERROR` payload: error code, the echoed request (only
/// its header when `NLM_F_CAPPED`), then TLVs when `NLM_F_ACK_TLVS`.
fn error_ext_ack(flags: u16, payload: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let echoed = payload.get(4..)?;
    let echoed_len = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        u32::from_ne_bytes(echoed.get(..4)?.try_into().ok()?) as usize
    };
    ext_ack_message(echoed.get(align4(echoed_len)..)?)
}

fn ext_ack_message(tlvs: &[u8]) -> Option<String> {
    for nla in NlasIterator::new(tlvs) {
        let nla = nla.ok()?;
        if nla.kind() == NLMSGERR_ATTR_MSG {
            let text = String::from_utf8_lossy(nla.value());
            let text = text.trim_end_matches('\0').trim();
            return (!text.is_empty()).then(|| text.to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::NLM_F_MULTIPART;

    const RTM_NEWLINK: u16 = 16;

    fn nlmsg(msg_type: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let len = NLMSG_HDRLEN + payload.len();
        let mut v = Vec::new();
        v.extend_from_slice(&(len as u32).to_ne_bytes());
        v.extend_from_slice(&msg_type.to_ne_bytes());
        v.extend_from_slice(&flags.to_ne_bytes());
        v.extend_from_slice(&seq.to_ne_bytes());
        v.extend_from_slice(&4242u32.to_ne_bytes());
        v.extend_from_slice(payload);
        v.resize(align4(v.len()), 0);
        v
    }

    fn error_payload(code: i32, tlv_msg: Option<&str>) -> Vec<u8> {
        let mut p = code.to_ne_bytes().to_vec();
        // Capped echo of the request header.
        p.extend_from_slice(&nlmsg(RTM_NEWLINK, NLM_F_REQUEST, 7, &[])[..NLMSG_HDRLEN]);
        if let Some(m) = tlv_msg {
            let mut value = m.as_bytes().to_vec();
            value.push(0);
            p.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
            p.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
            p.extend_from_slice(&value);
            p.resize(align4(p.len()), 0);
        }
        p
    }

    #[test]
    fn multipart_dump_until_done() {
        let mut c = Collector::new(3);
        let mut d1 = nlmsg(RTM_NEWLINK, NLM_F_MULTIPART, 3, &[1, 2, 3, 4]);
        d1.extend(nlmsg(RTM_NEWLINK, NLM_F_MULTIPART, 3, &[5, 6, 7, 8]));
        assert_eq!(c.absorb(&d1).unwrap(), Step::More);
        let d2 = nlmsg(NLMSG_DONE, NLM_F_MULTIPART, 3, &0i32.to_ne_bytes());
        assert_eq!(c.absorb(&d2).unwrap(), Step::Done);
        assert_eq!(c.replies.len(), 2);
        assert_eq!(c.replies[1].payload, vec![5, 6, 7, 8]);
        assert_eq!(c.replies[0].msg_type, RTM_NEWLINK);
        assert!(!c.interrupted);
    }

    #[test]
    fn empty_done_is_accepted() {
        let mut c = Collector::new(1);
        assert_eq!(c.absorb(&nlmsg(NLMSG_DONE, 0, 1, &[])).unwrap(), Step::Done);
    }

    #[test]
    fn ack_finishes_a_request_after_its_reply() {
        let mut c = Collector::new(9);
        let mut d = nlmsg(RTM_NEWLINK, 0, 9, &[0; 16]);
        d.extend(nlmsg(NLMSG_ERROR, NLM_F_CAPPED, 9, &error_payload(0, None)));
        assert_eq!(c.absorb(&d).unwrap(), Step::Done);
        assert_eq!(c.replies.len(), 1);
    }

    #[test]
    fn errors_carry_errno_and_extended_ack() {
        let mut c = Collector::new(9);
        let d = nlmsg(NLMSG_ERROR, NLM_F_CAPPED, 9, &error_payload(-libc::EEXIST, None));
        let e = c.absorb(&d).unwrap_err();
        assert!(e.is_exists());
        assert_eq!(e.errno(), libc::EEXIST);
        assert_eq!(e.detail, None);

        let mut c = Collector::new(9);
        let payload = error_payload(-libc::EINVAL, Some("Invalid MTU"));
        let d = nlmsg(NLMSG_ERROR, NLM_F_CAPPED | NLM_F_ACK_TLVS, 9, &payload);
        let e = c.absorb(&d).unwrap_err().during("set mtu of eth0");
        assert_eq!(e.detail.as_deref(), Some("Invalid MTU"));
        assert_eq!(e.to_string(), "set mtu of eth0: Invalid argument (Invalid MTU)");
    }

    #[test]
    fn error_in_done_fails_the_dump() {
        let mut c = Collector::new(2);
        let d = nlmsg(NLMSG_DONE, NLM_F_MULTIPART, 2, &(-libc::EBUSY).to_ne_bytes());
        assert_eq!(c.absorb(&d).unwrap_err().errno(), libc::EBUSY);
    }

    #[test]
    fn other_sequence_numbers_are_skipped() {
        let mut c = Collector::new(5);
        let mut d = nlmsg(RTM_NEWLINK, NLM_F_MULTIPART, 4, &[9; 4]);
        d.extend(nlmsg(NLMSG_DONE, NLM_F_MULTIPART, 4, &0i32.to_ne_bytes()));
        assert_eq!(c.absorb(&d).unwrap(), Step::More);
        assert!(c.replies.is_empty());
    }

    #[test]
    fn dump_interrupted_flag_is_noticed() {
        let mut c = Collector::new(5);
        let mut d = nlmsg(RTM_NEWLINK, NLM_F_MULTIPART | NLM_F_DUMP_INTR, 5, &[9; 4]);
        d.extend(nlmsg(NLMSG_DONE, NLM_F_MULTIPART, 5, &0i32.to_ne_bytes()));
        assert_eq!(c.absorb(&d).unwrap(), Step::Done);
        assert!(c.interrupted);
    }

    #[test]
    fn truncated_datagram_is_an_error() {
        let mut c = Collector::new(5);
        let d = nlmsg(RTM_NEWLINK, 0, 5, &[0; 16]);
        assert_eq!(c.absorb(&d[..20]).unwrap_err().errno(), libc::EBADMSG);
    }

    extern "C" fn on_signal(_: libc::c_int) {}

    /// A request whose answer is late: the requesting thread blocks in recv and is hit by
    /// signals whose handler is installed without `SA_RESTART`, so each one makes recv fail with
    /// EINTR. The kernel answers netlink requests before send returns, so its replies never
    /// leave recv waiting; a user-space peer (`NETLINK_USERSOCK`) plays the kernel here and
    /// answers only after the signals.
    #[test]
    fn requests_survive_signals_while_waiting_for_the_answer() {
        // SIGUSR1 without SA_RESTART.
        // SAFETY: a handler that does nothing; sigaction with a zeroed, then filled, struct.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
        let (peer, mut client) = usersock_pair();
        // SAFETY: pthread_self of the calling thread, which outlives the peer thread (joined).
        let me = unsafe { libc::pthread_self() } as usize;
        let kernel = std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            let (n, from) = {
                let mut window: &mut [u8] = &mut buf[..];
                peer.recv_from(&mut window, 0).unwrap()
            };
            let req = NetlinkBuffer::new_checked(&buf[..n]).unwrap();
            let seq = req.sequence_number();
            for _ in 0..50 {
                // SAFETY: the requesting thread is alive: it waits for our answer.
                unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            let mut ack = 0i32.to_ne_bytes().to_vec();
            ack.extend_from_slice(&buf[..NLMSG_HDRLEN]);
            peer.send_to(&nlmsg(NLMSG_ERROR, NLM_F_CAPPED, seq, &ack), &from, 0).unwrap();
        });
        let packet = encode(RouteNetlinkMessage::GetLink(Default::default()), NLM_F_REQUEST | NLM_F_ACK);
        let answer = client.request_packet(packet, false);
        kernel.join().unwrap();
        assert_eq!(answer.expect("the request survives the signals"), Vec::new());
    }

    const NETLINK_USERSOCK: isize = 2;

    /// A user-space netlink peer (`NETLINK_USERSOCK`, no kernel behind it) and one of our
    /// sockets connected to it: what the peer sends, and whether it answers, is the test's.
    fn usersock_pair() -> (Socket, NlSocket) {
        let mut peer = Socket::new(NETLINK_USERSOCK).unwrap();
        let peer_port = peer.bind_auto().unwrap().port_number();
        (peer, NlSocket::open_to(NETLINK_USERSOCK, peer_port).unwrap())
    }

    /// A peer that never answers: the request fails at the socket's deadline with `ETIMEDOUT`
    /// (code 11, "try again later"), saying how long it waited, instead of blocking for ever.
    #[test]
    fn a_request_nobody_answers_fails_at_the_deadline_with_code_11() {
        let (peer, mut client) = usersock_pair();
        client.set_recv_deadline(std::time::Duration::from_millis(300)).unwrap();
        let packet = encode(RouteNetlinkMessage::GetLink(Default::default()), NLM_F_REQUEST | NLM_F_ACK);
        let e = client.request_packet(packet, false).expect_err("nobody answers");
        // the request did reach the peer, which kept silent
        let mut buf = vec![0u8; 4096];
        let mut window: &mut [u8] = &mut buf[..];
        assert!(peer.recv_from(&mut window, libc::MSG_DONTWAIT).is_ok(), "the request was never sent");
        assert_eq!(e.errno, libc::ETIMEDOUT, "{e}");
        assert!(e.is_transient());
        assert!(e.to_string().contains("no answer from the kernel within 300ms"), "{e}");
        let cni = crate::CniError::from(e);
        assert_eq!(cni.code, crate::code::TRY_AGAIN, "{}", cni.msg);
        // a batch (nf_tables' transactions) waits the same way
        let acked = encode(RouteNetlinkMessage::GetLink(Default::default()), NLM_F_REQUEST | NLM_F_ACK);
        let e = client.request_batch(vec![acked]).expect_err("nobody answers");
        assert_eq!(e.errno, libc::ETIMEDOUT, "{e}");
    }

    /// The receive buffer is capacity the kernel writes into: a datagram arrives whole, one
    /// larger than the buffer grows it when the socket peeks first (rtnetlink's), and fails
    /// with EMSGSIZE when it does not (nfnetlink's never exceed the buffer).
    #[test]
    fn datagrams_land_whole_in_the_buffers_capacity_and_a_larger_one_grows_it_or_is_refused() {
        let (peer, mut client) = usersock_pair();
        let mut me = SocketAddr::new(0, 0);
        client.sock.get_address(&mut me).unwrap();
        let to = SocketAddr::new(me.port_number(), 0);
        let datagram = |n: usize| (0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
        assert_eq!(client.rx.len(), 0, "nothing written before the first answer");
        for n in [20, 4096 + 7, RX_BUFFER] {
            peer.send_to(&datagram(n), &to, 0).unwrap();
            assert_eq!(client.recv().unwrap(), n);
            assert_eq!(client.rx[..n], datagram(n)[..], "{n} bytes");
        }
        client.peek = true;
        let big = RX_BUFFER + RX_BUFFER / 2;
        peer.send_to(&datagram(big), &to, 0).unwrap();
        assert_eq!(client.recv().unwrap(), big);
        assert_eq!(client.rx[..big], datagram(big)[..]);
        assert!(client.rx.capacity() >= big);
        let (other, mut refusing) = usersock_pair();
        refusing.sock.get_address(&mut me).unwrap();
        other.send_to(&datagram(big), &SocketAddr::new(me.port_number(), 0), 0).unwrap();
        let e = refusing.recv().expect_err("does not fit");
        assert_eq!(e.errno, libc::EMSGSIZE, "{e}");
        assert!(e.to_string().contains(&format!("a datagram of {big} bytes did not fit")), "{e}");
    }

    #[test]
    fn encode_sets_flags_and_sequence() {
        let mut packet =
            encode(RouteNetlinkMessage::GetLink(Default::default()), NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP);
        set_sequence(&mut packet, 77);
        let b = NetlinkBuffer::new_checked(&packet[..]).unwrap();
        assert_eq!(b.message_type(), 18);
        assert_eq!(b.flags(), NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP);
        assert_eq!(b.sequence_number(), 77);
        assert_eq!(b.length() as usize, packet.len());
    }
}
