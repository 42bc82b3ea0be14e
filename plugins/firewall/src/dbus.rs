//! A minimal D-Bus client over the system bus socket: SASL EXTERNAL, `Hello`, and method calls
//! whose arguments are strings, answered by a method return (its first string or boolean) or an
//! error (its name and message). Every call has one deadline for all its reads and writes.
//!
//! Why not a crate: zbus (the maintained pure-Rust client) brings an async executor, serde
//! machinery for the whole type system and ~60 crates; its blocking API still runs that
//! executor on a thread. The firewalld backend needs four calls with string arguments. The
//! wire format of those (header fields, string and boolean bodies) fits here.
//!
//! What else arrives is anyone's: on the system bus every user may send a signal to any
//! connection, and a connection's unique name is announced to all (`NameOwnerChanged`). So
//! while a call waits, each message is framed by its own byte-order flag (`l` or `B`: the bus
//! forwards a sender's messages in the sender's order), and every one that is not the
//! METHOD_RETURN or ERROR naming the call's serial is read and dropped, however many, until the
//! call's deadline or [`DROP_BUDGET`] bytes, whichever comes first (issue 37, finding 1). Only a
//! broken stream (a flag that is neither, a length past the spec's maximum, end of file) or the
//! deadline or budget ends a call early. We never negotiate Unix fd passing, so the bus sends
//! us no descriptors.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

pub const SYSTEM_BUS: &str = "/run/dbus/system_bus_socket";

/// The longest message the specification allows (2^27 bytes, header included): a longer
/// length in a header means the stream is not D-Bus, since the bus validates what it forwards.
pub const MAX_MESSAGE: usize = 1 << 27;

/// The largest message a call keeps to read as its reply; larger ones are drained and dropped
/// (no reply of the calls made here comes near).
pub const MAX_KEPT: usize = 1 << 20;

/// How many bytes of other messages one call reads and drops before it gives up: twice what
/// the system bus queues for one connection by default (`max_outgoing_bytes`, 127 MiB), so the
/// backlog present when the call was sent always fits.
pub const DROP_BUDGET: usize = 256 << 20;

/// The system bus socket: `DBUS_SYSTEM_BUS_ADDRESS` when it is a `unix:path=` address, else the
/// well-known path.
pub fn system_bus_path() -> String {
    std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
        .ok()
        .and_then(|a| {
            a.split(';').find_map(|one| {
                one.strip_prefix("unix:path=").map(|p| p.split(',').next().unwrap_or(p).to_string())
            })
        })
        .unwrap_or_else(|| SYSTEM_BUS.to_string())
}

/// What a call returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A method return: its first argument when it is a string or a boolean (as text).
    Return(Option<String>),
    /// An error reply: its name and message.
    Error(String, String),
}

/// Why a connection or call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// There is no socket at the bus's path (`ENOENT`): this host runs no system bus.
    NoBus(String),
    /// The deadline passed.
    TimedOut(String),
    /// Anything else: refused, reset, authentication refused, a stream that is not D-Bus, the
    /// drop budget spent.
    Broken(String),
}

impl Failure {
    pub fn message(&self) -> &str {
        match self {
            Failure::NoBus(m) | Failure::TimedOut(m) | Failure::Broken(m) => m,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

fn io(e: std::io::Error, what: &str) -> Failure {
    let m = format!("D-Bus {what}: {e}");
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Failure::TimedOut(m),
        _ => Failure::Broken(m),
    }
}

fn broken(m: impl Into<String>) -> Failure {
    Failure::Broken(m.into())
}

/// A message's byte order, from the first byte of its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Little,
    Big,
}

impl Order {
    pub fn of(flag: u8) -> Option<Order> {
        match flag {
            b'l' => Some(Order::Little),
            b'B' => Some(Order::Big),
            _ => None,
        }
    }

    fn u32_at(self, b: &[u8], at: usize) -> Option<u32> {
        let four: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(match self {
            Order::Little => u32::from_le_bytes(four),
            Order::Big => u32::from_be_bytes(four),
        })
    }
}

pub struct Bus {
    sock: UnixStream,
    serial: u32,
    /// Each call's deadline.
    deadline: Duration,
    /// Bytes of other messages one call may drop ([`DROP_BUDGET`]).
    budget: usize,
    /// What was read from the socket and not yet consumed: `inbuf[at..end]`.
    inbuf: Vec<u8>,
    at: usize,
    end: usize,
}

fn pad(buf: &mut Vec<u8>, to: usize) {
    while !buf.len().is_multiple_of(to) {
        buf.push(0);
    }
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    pad(buf, 4);
    buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
}

/// One header field: code, variant of signature `sig` holding string `v`.
fn put_field(buf: &mut Vec<u8>, code: u8, sig: u8, v: &str) {
    pad(buf, 8);
    buf.extend_from_slice(&[code, 1, sig, 0]);
    if sig == b'g' {
        buf.push(v.len() as u8);
        buf.extend_from_slice(v.as_bytes());
        buf.push(0);
    } else {
        put_str(buf, v);
    }
}

/// A method call message (pure).
pub fn method_call(serial: u32, dest: &str, path: &str, iface: &str, member: &str, args: &[&str]) -> Vec<u8> {
    let mut body = Vec::new();
    for a in args {
        put_str(&mut body, a);
    }
    let mut fields = Vec::new();
    put_field(&mut fields, 1, b'o', path);
    put_field(&mut fields, 2, b's', iface);
    put_field(&mut fields, 3, b's', member);
    put_field(&mut fields, 6, b's', dest);
    if !args.is_empty() {
        put_field(&mut fields, 8, b'g', &"s".repeat(args.len()));
    }
    let mut m = vec![b'l', 1, 0, 1];
    m.extend_from_slice(&(body.len() as u32).to_le_bytes());
    m.extend_from_slice(&serial.to_le_bytes());
    m.extend_from_slice(&(fields.len() as u32).to_le_bytes());
    m.extend_from_slice(&fields);
    pad(&mut m, 8);
    m.extend_from_slice(&body);
    m
}

/// How a message is laid out after its fixed 16-byte part, from that part alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub order: Order,
    pub kind: u8,
    /// The header fields' length (without the padding to 8 that follows them).
    pub fields: usize,
    pub body: usize,
}

impl Frame {
    /// The bytes that follow the fixed part: the fields, their padding, the body.
    pub fn rest(&self) -> usize {
        self.fields.next_multiple_of(8) + self.body
    }
}

/// Frame a message by its own byte-order flag (pure). An error means the stream cannot be
/// followed past this header: nothing after it can be trusted to start a message.
pub fn frame(head: &[u8; 16]) -> Result<Frame, String> {
    let order = Order::of(head[0]).ok_or_else(|| {
        format!("D-Bus: a message whose byte-order flag is {:#04x}, neither 'l' nor 'B'", head[0])
    })?;
    if head[3] != 1 {
        return Err(format!("D-Bus: a message of protocol version {}", head[3]));
    }
    let body = order.u32_at(head, 4).unwrap_or(u32::MAX) as usize;
    let fields = order.u32_at(head, 12).unwrap_or(u32::MAX) as usize;
    let f = Frame { order, kind: head[1], fields, body };
    if 16 + f.rest() > MAX_MESSAGE {
        return Err(format!(
            "D-Bus: a message of {} bytes, past the specification's maximum of {MAX_MESSAGE}",
            16 + f.rest()
        ));
    }
    Ok(f)
}

/// A message as read: type, reply serial, error name, signature, body.
#[derive(Debug)]
pub struct Message {
    pub order: Order,
    pub kind: u8,
    pub reply_serial: Option<u32>,
    pub error_name: Option<String>,
    pub signature: String,
    pub body: Vec<u8>,
}

/// Decode the header fields `fields` of a message framed as `f` (pure). None when they do not
/// parse: such a message is dropped like any other that is not the reply.
pub fn parse_fields(f: &Frame, fields: &[u8]) -> Option<Message> {
    let order = f.order;
    let mut m = Message {
        order,
        kind: f.kind,
        reply_serial: None,
        error_name: None,
        signature: String::new(),
        body: Vec::new(),
    };
    let mut at = 0;
    while at < fields.len() {
        at = at.next_multiple_of(8);
        if at >= fields.len() {
            break;
        }
        let code = fields[at];
        let siglen = *fields.get(at + 1)? as usize;
        let sig = fields.get(at + 2..at + 2 + siglen)?;
        at += 3 + siglen;
        match sig {
            b"s" | b"o" => {
                at = at.next_multiple_of(4);
                let n = order.u32_at(fields, at)? as usize;
                let s = String::from_utf8_lossy(fields.get(at + 4..(at + 4).checked_add(n)?)?).into_owned();
                at += 5 + n;
                if code == 4 {
                    m.error_name = Some(s);
                }
            }
            b"u" => {
                at = at.next_multiple_of(4);
                let v = order.u32_at(fields, at)?;
                at += 4;
                if code == 5 {
                    m.reply_serial = Some(v);
                }
            }
            b"g" => {
                let n = *fields.get(at)? as usize;
                let s = String::from_utf8_lossy(fields.get(at + 1..at + 1 + n)?).into_owned();
                at += 2 + n;
                if code == 8 {
                    m.signature = s;
                }
            }
            _ => return None,
        }
    }
    Some(m)
}

/// The first argument of a body of signature `sig` in byte order `order`, when it is a string
/// or a boolean (pure).
pub fn first_arg(order: Order, sig: &str, body: &[u8]) -> Option<String> {
    match sig.as_bytes().first()? {
        b's' | b'o' => {
            let n = order.u32_at(body, 0)? as usize;
            Some(String::from_utf8_lossy(body.get(4..4usize.checked_add(n)?)?).into_owned())
        }
        b'b' => Some((order.u32_at(body, 0)? != 0).to_string()),
        _ => None,
    }
}

/// What the call loop does with one message read while waiting for the reply to `serial`.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// The call's reply.
    Reply(Reply),
    /// Anything else: dropped.
    Other,
}

/// Judge one message (pure): only a METHOD_RETURN (2) or ERROR (3) naming `serial` is the
/// reply; a signal or call carrying the serial in its REPLY_SERIAL field is someone else's.
pub fn judge(m: &Message, serial: u32) -> Seen {
    if m.reply_serial != Some(serial) {
        return Seen::Other;
    }
    match m.kind {
        2 => Seen::Reply(Reply::Return(first_arg(m.order, &m.signature, &m.body))),
        3 => Seen::Reply(Reply::Error(
            m.error_name.clone().unwrap_or_default(),
            first_arg(m.order, &m.signature, &m.body).unwrap_or_default(),
        )),
        _ => Seen::Other,
    }
}

impl Bus {
    /// Connect to the socket at `path`, authenticate as this process's uid and say Hello, all
    /// within `deadline`; each later call has `deadline` of its own.
    pub fn connect(path: &str, deadline: Duration) -> Result<Bus, Failure> {
        let sock = UnixStream::connect(path).map_err(|e| {
            let m = format!("D-Bus connect {path}: {e}");
            if e.kind() == std::io::ErrorKind::NotFound {
                Failure::NoBus(m)
            } else {
                Failure::Broken(m)
            }
        })?;
        let mut bus = Bus::over(sock, deadline);
        let until = Instant::now() + deadline;
        let uid: String = nix_uid().to_string().bytes().map(|b| format!("{b:02x}")).collect();
        bus.write(format!("\0AUTH EXTERNAL {uid}\r\n").as_bytes(), until, "auth")?;
        let line = bus.read_line(until)?;
        if !line.starts_with("OK ") {
            return Err(broken(format!("D-Bus authentication refused: {line:?}")));
        }
        bus.write(b"BEGIN\r\n", until, "auth")?;
        match bus.call(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "Hello",
            &[],
        )? {
            Reply::Return(_) => Ok(bus),
            Reply::Error(n, m) => Err(broken(format!("D-Bus Hello: {n}: {m}"))),
        }
    }

    /// A connection over `sock`, past authentication (tests hand it one end of a pair).
    fn over(sock: UnixStream, deadline: Duration) -> Bus {
        Bus { sock, serial: 0, deadline, budget: DROP_BUDGET, inbuf: vec![0; 64 << 10], at: 0, end: 0 }
    }

    /// The time left before `until`, or the failure of having none.
    fn left(until: Instant, what: &str) -> Result<Duration, Failure> {
        let d = until.saturating_duration_since(Instant::now());
        if d.is_zero() {
            return Err(Failure::TimedOut(format!("D-Bus {what}: no answer within the deadline")));
        }
        Ok(d)
    }

    fn write(&mut self, b: &[u8], until: Instant, what: &str) -> Result<(), Failure> {
        let mut at = 0;
        while at < b.len() {
            self.sock.set_write_timeout(Some(Bus::left(until, what)?)).map_err(|e| io(e, "timeout"))?;
            match self.sock.write(&b[at..]) {
                Ok(0) => return Err(broken(format!("D-Bus {what}: the bus closed the connection"))),
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e, what)),
            }
        }
        Ok(())
    }

    /// Fill `out` before `until`, from what was read ahead first; each read of the socket asks
    /// for up to 64 KiB (a flood of small signals costs one system call per many), with the
    /// time left as its timeout, so a trickle cannot stretch the deadline.
    fn fill(&mut self, out: &mut [u8], until: Instant) -> Result<(), Failure> {
        let mut done = 0;
        while done < out.len() {
            let n = self.ahead(until)?.min(out.len() - done);
            out[done..done + n].copy_from_slice(&self.inbuf[self.at..self.at + n]);
            self.at += n;
            done += n;
        }
        Ok(())
    }

    /// Consume `n` bytes unread, before `until`.
    fn skip(&mut self, mut n: usize, until: Instant) -> Result<(), Failure> {
        while n > 0 {
            let k = self.ahead(until)?.min(n);
            self.at += k;
            n -= k;
        }
        Ok(())
    }

    /// How many bytes are read ahead, reading the socket when none are.
    fn ahead(&mut self, until: Instant) -> Result<usize, Failure> {
        while self.at == self.end {
            self.sock.set_read_timeout(Some(Bus::left(until, "read")?)).map_err(|e| io(e, "timeout"))?;
            match self.sock.read(&mut self.inbuf) {
                Ok(0) => return Err(broken("D-Bus read: the bus closed the connection")),
                Ok(n) => (self.at, self.end) = (0, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e, "read")),
            }
        }
        Ok(self.end - self.at)
    }

    fn read_line(&mut self, until: Instant) -> Result<String, Failure> {
        let mut out = Vec::new();
        let mut b = [0u8; 1];
        while !out.ends_with(b"\r\n") {
            if out.len() > 512 {
                return Err(broken("D-Bus authentication: overlong line"));
            }
            self.fill(&mut b, until)?;
            out.push(b[0]);
        }
        Ok(String::from_utf8_lossy(&out[..out.len() - 2]).into_owned())
    }

    /// Count `n` more dropped bytes against the budget of the call to `member`.
    fn spend(&self, dropped: &mut usize, n: usize, member: &str) -> Result<(), Failure> {
        *dropped += n;
        if *dropped > self.budget {
            return Err(broken(format!(
                "D-Bus: more than {} bytes of other messages before the reply to {member}",
                self.budget
            )));
        }
        Ok(())
    }

    /// Read one message: the reply to `serial`, or None for anything else (read and dropped).
    fn next(
        &mut self,
        serial: u32,
        until: Instant,
        dropped: &mut usize,
        member: &str,
    ) -> Result<Option<Reply>, Failure> {
        let mut head = [0u8; 16];
        self.fill(&mut head, until)?;
        let f = frame(&head).map_err(Failure::Broken)?;
        let rest = f.rest();
        if rest > MAX_KEPT {
            // too large to be a reply here: drained in pieces, never held whole
            self.spend(dropped, 16 + rest, member)?;
            self.skip(rest, until)?;
            return Ok(None);
        }
        let mut buf = vec![0u8; rest];
        self.fill(&mut buf, until)?;
        let seen = parse_fields(&f, &buf[..f.fields]).map(|mut m| {
            m.body = buf[f.fields.next_multiple_of(8)..].to_vec();
            judge(&m, serial)
        });
        match seen {
            Some(Seen::Reply(r)) => Ok(Some(r)),
            Some(Seen::Other) | None => {
                self.spend(dropped, 16 + rest, member)?;
                Ok(None)
            }
        }
    }

    /// Call `member` and wait for its reply, dropping everything else, within the deadline.
    pub fn call(
        &mut self,
        dest: &str,
        path: &str,
        iface: &str,
        member: &str,
        args: &[&str],
    ) -> Result<Reply, Failure> {
        let until = Instant::now() + self.deadline;
        self.serial += 1;
        let serial = self.serial;
        let msg = method_call(serial, dest, path, iface, member, args);
        self.write(&msg, until, member)?;
        let mut dropped = 0;
        loop {
            if let Some(r) = self.next(serial, until, &mut dropped, member)? {
                return Ok(r);
            }
        }
    }
}

fn nix_uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn u32_le(b: &[u8], at: usize) -> Option<u32> {
        Order::Little.u32_at(b, at)
    }

    /// A message as another peer lays it out, in either byte order: `kind`, a REPLY_SERIAL field
    /// when given, one string argument, and `extra` bytes of a second (array of bytes) argument.
    fn message(
        order: Order,
        kind: u8,
        serial: u32,
        reply_serial: Option<u32>,
        arg: &str,
        extra: usize,
    ) -> Vec<u8> {
        let u = |v: u32| match order {
            Order::Little => v.to_le_bytes(),
            Order::Big => v.to_be_bytes(),
        };
        let mut body = Vec::new();
        body.extend_from_slice(&u(arg.len() as u32));
        body.extend_from_slice(arg.as_bytes());
        body.push(0);
        let sig = if extra > 0 {
            pad(&mut body, 4);
            body.extend_from_slice(&u(extra as u32));
            body.resize(body.len() + extra, 0xAB);
            "say"
        } else {
            "s"
        };
        let mut fields = Vec::new();
        let mut string_field = |code: u8, sig: u8, v: &str| {
            pad(&mut fields, 8);
            fields.extend_from_slice(&[code, 1, sig, 0]);
            fields.extend_from_slice(&u(v.len() as u32));
            fields.extend_from_slice(v.as_bytes());
            fields.push(0);
        };
        string_field(1, b'o', "/x");
        string_field(2, b's', "org.example.Hostile");
        string_field(3, b's', "Poke");
        if kind == 3 {
            string_field(4, b's', "org.example.Error.Nope");
        }
        if let Some(r) = reply_serial {
            pad(&mut fields, 8);
            fields.extend_from_slice(&[5, 1, b'u', 0]);
            fields.extend_from_slice(&u(r));
        }
        pad(&mut fields, 8);
        fields.extend_from_slice(&[8, 1, b'g', 0, sig.len() as u8]);
        fields.extend_from_slice(sig.as_bytes());
        fields.push(0);
        let mut m = vec![if order == Order::Little { b'l' } else { b'B' }, kind, 0, 1];
        m.extend_from_slice(&u(body.len() as u32));
        m.extend_from_slice(&u(serial));
        m.extend_from_slice(&u(fields.len() as u32));
        m.extend_from_slice(&fields);
        pad(&mut m, 8);
        m.extend_from_slice(&body);
        m
    }

    fn head(m: &[u8]) -> [u8; 16] {
        m[..16].try_into().unwrap()
    }

    /// A connection whose bus is the test: `feed` is written by a thread (the plugin's call is
    /// read and discarded first, as the bus would read it), then the peer closes.
    fn call_against(feed: Vec<u8>, budget: usize, deadline: Duration) -> Result<Reply, Failure> {
        let (mine, mut peer) = UnixStream::pair().unwrap();
        let mut bus = Bus::over(mine, deadline);
        bus.budget = budget;
        let writer = thread::spawn(move || {
            let mut call = [0u8; 16];
            peer.read_exact(&mut call).unwrap();
            let rest = frame(&call).unwrap().rest();
            peer.read_exact(&mut vec![0u8; rest]).unwrap();
            // the plugin may give up before reading everything: a write error then is expected;
            // what was written stays readable after the close
            let _ = peer.write_all(&feed);
        });
        let r = bus.call("org.x.Y", "/o", "org.x.Y", "Ask", &["a"]);
        drop(bus);
        writer.join().unwrap();
        r
    }

    /// `dbus-send --system --dest=org.fedoraproject.FirewallD1 /org/fedoraproject/FirewallD1
    /// org.fedoraproject.FirewallD1.zone.addSource string:trusted string:10.88.0.5/32`'s
    /// message, as the spec lays it out (header fields 8-aligned, strings length-prefixed).
    #[test]
    fn a_call_is_laid_out_as_the_spec_says() {
        let m = method_call(7, "org.x.Y", "/o", "org.x.Y.zone", "addSource", &["trusted", "10.0.0.5/32"]);
        assert_eq!(&m[..4], &[b'l', 1, 0, 1]);
        let body_len = u32_le(&m, 4).unwrap() as usize;
        assert_eq!(body_len, 4 + 8 + 4 + 12);
        assert_eq!(u32_le(&m, 8), Some(7));
        let f = frame(&head(&m)).unwrap();
        assert_eq!((f.order, f.kind, f.body), (Order::Little, 1, body_len));
        assert_eq!(16 + f.rest(), m.len());
        let parsed = parse_fields(&f, &m[16..16 + f.fields]).unwrap();
        assert_eq!((parsed.kind, parsed.signature.as_str()), (1, "ss"));
        let body = &m[(16 + f.fields).next_multiple_of(8)..];
        assert_eq!(body.len(), body_len);
        assert_eq!(first_arg(Order::Little, "ss", body).as_deref(), Some("trusted"));
        assert_eq!(first_arg(Order::Little, "b", &1u32.to_le_bytes()).as_deref(), Some("true"));
        assert_eq!(first_arg(Order::Big, "b", &1u32.to_be_bytes()).as_deref(), Some("true"));
    }

    /// Each message is framed by its own flag: the same message in both orders has the same
    /// lengths, fields and argument (the old reader took a big-endian length as little-endian).
    #[test]
    fn each_message_is_framed_by_its_own_byte_order() {
        for order in [Order::Little, Order::Big] {
            let m = message(order, 2, 9, Some(41), "hello", 0);
            let f = frame(&head(&m)).unwrap();
            assert_eq!(f.order, order);
            assert_eq!(16 + f.rest(), m.len(), "{order:?}");
            let mut parsed = parse_fields(&f, &m[16..16 + f.fields]).unwrap();
            parsed.body = m[(16 + f.fields).next_multiple_of(8)..].to_vec();
            assert_eq!(parsed.reply_serial, Some(41), "{order:?}");
            assert_eq!(judge(&parsed, 41), Seen::Reply(Reply::Return(Some("hello".into()))), "{order:?}");
            assert_eq!(judge(&parsed, 40), Seen::Other);
        }
        let big = message(Order::Big, 4, 1, None, "x", 70_000);
        assert_eq!(16 + frame(&head(&big)).unwrap().rest(), big.len());
    }

    /// Only a return or an error names the call: a signal carrying the call's serial in its
    /// REPLY_SERIAL field (anyone may send one) is dropped, not taken as the reply or a failure.
    #[test]
    fn only_a_return_or_an_error_is_the_reply() {
        for kind in [1, 4] {
            let m = message(Order::Little, kind, 3, Some(1), "forged", 0);
            let f = frame(&head(&m)).unwrap();
            assert_eq!(
                judge(&parse_fields(&f, &m[16..16 + f.fields]).unwrap(), 1),
                Seen::Other,
                "type {kind}"
            );
        }
        let feed =
            [message(Order::Little, 4, 3, Some(1), "forged", 0), message(Order::Big, 3, 4, Some(1), "no", 0)]
                .concat();
        assert_eq!(
            call_against(feed, DROP_BUDGET, Duration::from_secs(30)),
            Ok(Reply::Error("org.example.Error.Nope".into(), "no".into()))
        );
    }

    /// What the hostile sender does, and more, before the reply: a big-endian signal,
    /// 200 ordinary ones, a signal larger than any reply kept (drained in pieces), one whose
    /// fields do not parse here. The reply (big-endian too) is still found.
    #[test]
    fn everything_before_the_reply_is_read_and_dropped() {
        let mut feed = message(Order::Big, 4, 1, None, "big-endian", 0);
        for i in 0..200 {
            feed.extend(message(Order::Little, 4, 2 + i, None, "flood", 0));
        }
        feed.extend(message(Order::Little, 4, 300, None, "large", MAX_KEPT + 1));
        let mut odd = message(Order::Little, 4, 301, None, "odd", 0);
        odd[16 + 2] = b'v'; // the PATH field's signature: a variant, not read here
        feed.extend(odd);
        feed.extend(message(Order::Big, 2, 302, Some(1), "the answer", 0));
        assert_eq!(
            call_against(feed, DROP_BUDGET, Duration::from_secs(30)),
            Ok(Reply::Return(Some("the answer".into())))
        );
    }

    /// The budget ends the wait: more bytes of other messages than it allows fail the call
    /// (as broken, never as an answer); as many as it allows do not.
    #[test]
    fn the_drop_budget_bounds_what_a_call_reads() {
        let one = message(Order::Little, 4, 2, None, "flood", 0).len();
        let flood = |n: usize| {
            let mut feed: Vec<u8> =
                (0..n).flat_map(|_| message(Order::Little, 4, 2, None, "flood", 0)).collect();
            feed.extend(message(Order::Little, 2, 9, Some(1), "ok", 0));
            feed
        };
        let r = call_against(flood(10), 10 * one, Duration::from_secs(30));
        assert_eq!(r, Ok(Reply::Return(Some("ok".into()))));
        match call_against(flood(11), 10 * one, Duration::from_secs(30)) {
            Err(Failure::Broken(m)) => {
                assert!(m.contains("bytes of other messages before the reply to Ask"), "{m}")
            }
            other => panic!("past the budget: {other:?}"),
        }
        // a single message past the budget is refused before it is read
        let r = call_against(
            message(Order::Little, 4, 2, None, "x", MAX_KEPT * 2),
            MAX_KEPT,
            Duration::from_secs(30),
        );
        assert!(matches!(r, Err(Failure::Broken(_))), "{r:?}");
    }

    /// A stream that cannot be followed fails the call as broken; silence fails it at the
    /// deadline; neither is an answer.
    #[test]
    fn broken_streams_and_silence_fail_the_call() {
        let mut bad_flag = message(Order::Little, 4, 2, None, "x", 0);
        bad_flag[0] = b'X';
        let mut huge = message(Order::Little, 4, 2, None, "x", 0);
        huge[4..8].copy_from_slice(&(MAX_MESSAGE as u32).to_le_bytes());
        let mut version = message(Order::Little, 4, 2, None, "x", 0);
        version[3] = 2;
        for (what, feed) in [("flag", bad_flag), ("length", huge), ("version", version)] {
            match call_against(feed, DROP_BUDGET, Duration::from_secs(30)) {
                Err(Failure::Broken(m)) => assert!(m.starts_with("D-Bus: a message"), "{what}: {m}"),
                other => panic!("{what}: {other:?}"),
            }
        }
        assert!(frame(&head(&message(Order::Big, 4, 2, None, "x", 0))).is_ok());
        // the peer closes after half a message
        let half = message(Order::Little, 4, 2, None, "x", 0)[..20].to_vec();
        assert!(matches!(call_against(half, DROP_BUDGET, Duration::from_secs(30)), Err(Failure::Broken(_))));
        // nothing arrives: the deadline (the peer stays open until the call returns)
        let (mine, mut peer) = UnixStream::pair().unwrap();
        let mut bus = Bus::over(mine, Duration::from_millis(200));
        let r = bus.call("org.x.Y", "/o", "org.x.Y", "Ask", &[]);
        assert!(matches!(r, Err(Failure::TimedOut(_))), "{r:?}");
        let mut sent = [0u8; 16];
        peer.read_exact(&mut sent).unwrap();
        // no bus at all is told apart from a bus that fails
        let dir = std::env::temp_dir().join(format!("dbus-unit-{}", std::process::id()));
        let nothing = dir.join("no-such-socket");
        assert!(matches!(
            Bus::connect(nothing.to_str().unwrap(), Duration::from_secs(5)),
            Err(Failure::NoBus(_))
        ));
    }
}
