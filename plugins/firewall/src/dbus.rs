//! A minimal D-Bus client over the system bus socket: SASL EXTERNAL, `Hello`, and method calls
//! whose arguments are strings, answered by a method return (its first string or boolean) or an
//! error (its name and message). Every read and write has a deadline.
//!
//! Why not a crate: zbus (the maintained pure-Rust client) brings an async executor, serde
//! machinery for the whole type system and ~60 crates; its blocking API still runs that
//! executor on a thread. The firewalld backend needs four calls with string arguments. The
//! wire format of those (header fields, string and boolean bodies, little-endian) fits here.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

pub const SYSTEM_BUS: &str = "/run/dbus/system_bus_socket";

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

pub struct Bus {
    sock: UnixStream,
    serial: u32,
}

fn io(e: std::io::Error, what: &str) -> String {
    format!("D-Bus {what}: {e}")
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

/// A message as read: type, reply serial, error name, signature, body.
#[derive(Debug, Default)]
pub struct Message {
    pub kind: u8,
    pub reply_serial: Option<u32>,
    pub error_name: Option<String>,
    pub signature: String,
    pub body: Vec<u8>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Decode the header fields of a little-endian message whose fixed part is `head` (16 bytes)
/// and whose fields are `fields` (pure). Big-endian messages are refused.
pub fn parse_fields(head: &[u8], fields: &[u8]) -> Option<Message> {
    if head.first() != Some(&b'l') {
        return None;
    }
    let mut m = Message { kind: head[1], ..Message::default() };
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
                let n = u32_at(fields, at)? as usize;
                let s = String::from_utf8_lossy(fields.get(at + 4..at + 4 + n)?).into_owned();
                at += 5 + n;
                if code == 4 {
                    m.error_name = Some(s);
                }
            }
            b"u" => {
                at = at.next_multiple_of(4);
                let v = u32_at(fields, at)?;
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

/// The first argument of a body of signature `sig`, when it is a string or a boolean (pure).
pub fn first_arg(sig: &str, body: &[u8]) -> Option<String> {
    match sig.as_bytes().first()? {
        b's' | b'o' => {
            let n = u32_at(body, 0)? as usize;
            Some(String::from_utf8_lossy(body.get(4..4 + n)?).into_owned())
        }
        b'b' => Some((u32_at(body, 0)? != 0).to_string()),
        _ => None,
    }
}

impl Bus {
    /// Connect to the socket at `path`, authenticate as this process's uid and say Hello, all
    /// within `deadline` per read and write.
    pub fn connect(path: &str, deadline: Duration) -> Result<Bus, String> {
        let sock = UnixStream::connect(path).map_err(|e| io(e, &format!("connect {path}")))?;
        sock.set_read_timeout(Some(deadline)).map_err(|e| io(e, "timeout"))?;
        sock.set_write_timeout(Some(deadline)).map_err(|e| io(e, "timeout"))?;
        let mut bus = Bus { sock, serial: 0 };
        let uid: String = nix_uid().to_string().bytes().map(|b| format!("{b:02x}")).collect();
        bus.sock.write_all(format!("\0AUTH EXTERNAL {uid}\r\n").as_bytes()).map_err(|e| io(e, "auth"))?;
        let line = bus.read_line()?;
        if !line.starts_with("OK ") {
            return Err(format!("D-Bus authentication refused: {line:?}"));
        }
        bus.sock.write_all(b"BEGIN\r\n").map_err(|e| io(e, "auth"))?;
        match bus.call(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "Hello",
            &[],
        )? {
            Reply::Return(_) => Ok(bus),
            Reply::Error(n, m) => Err(format!("D-Bus Hello: {n}: {m}")),
        }
    }

    fn read_line(&mut self) -> Result<String, String> {
        let mut out = Vec::new();
        let mut b = [0u8; 1];
        while !out.ends_with(b"\r\n") {
            if out.len() > 512 {
                return Err("D-Bus authentication: overlong line".into());
            }
            self.sock.read_exact(&mut b).map_err(|e| io(e, "auth reply"))?;
            out.push(b[0]);
        }
        Ok(String::from_utf8_lossy(&out[..out.len() - 2]).into_owned())
    }

    fn read_message(&mut self) -> Result<Message, String> {
        let mut head = [0u8; 16];
        self.sock.read_exact(&mut head).map_err(|e| io(e, "read"))?;
        let body_len = u32_at(&head, 4).unwrap_or(0) as usize;
        let fields_len = u32_at(&head, 12).unwrap_or(0) as usize;
        if body_len > 1 << 20 || fields_len > 1 << 16 {
            return Err("D-Bus: oversized message".into());
        }
        let mut fields = vec![0u8; fields_len.next_multiple_of(8)];
        self.sock.read_exact(&mut fields).map_err(|e| io(e, "read"))?;
        let mut body = vec![0u8; body_len];
        self.sock.read_exact(&mut body).map_err(|e| io(e, "read"))?;
        let mut m =
            parse_fields(&head, &fields[..fields_len]).ok_or("D-Bus: a message that does not parse")?;
        m.body = body;
        Ok(m)
    }

    /// Call `member` and wait for its reply (signals and other traffic are skipped).
    pub fn call(
        &mut self,
        dest: &str,
        path: &str,
        iface: &str,
        member: &str,
        args: &[&str],
    ) -> Result<Reply, String> {
        self.serial += 1;
        let serial = self.serial;
        let msg = method_call(serial, dest, path, iface, member, args);
        self.sock.write_all(&msg).map_err(|e| io(e, member))?;
        for _ in 0..64 {
            let m = self.read_message()?;
            if m.reply_serial != Some(serial) {
                continue;
            }
            return Ok(match m.kind {
                2 => Reply::Return(first_arg(&m.signature, &m.body)),
                3 => Reply::Error(
                    m.error_name.clone().unwrap_or_default(),
                    first_arg(&m.signature, &m.body).unwrap_or_default(),
                ),
                k => return Err(format!("D-Bus: reply of type {k} to {member}")),
            });
        }
        Err(format!("D-Bus: no reply to {member} among 64 messages"))
    }
}

fn nix_uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dbus-send --system --dest=org.fedoraproject.FirewallD1 /org/fedoraproject/FirewallD1
    /// org.fedoraproject.FirewallD1.zone.addSource string:trusted string:10.88.0.5/32`'s
    /// message, as the spec lays it out (header fields 8-aligned, strings length-prefixed).
    #[test]
    fn a_call_is_laid_out_as_the_spec_says() {
        let m = method_call(7, "org.x.Y", "/o", "org.x.Y.zone", "addSource", &["trusted", "10.0.0.5/32"]);
        assert_eq!(&m[..4], &[b'l', 1, 0, 1]);
        let body_len = u32_at(&m, 4).unwrap() as usize;
        assert_eq!(body_len, 4 + 8 + 4 + 12);
        assert_eq!(u32_at(&m, 8), Some(7));
        let fields_len = u32_at(&m, 12).unwrap() as usize;
        let parsed = parse_fields(&m[..16], &m[16..16 + fields_len]).unwrap();
        assert_eq!((parsed.kind, parsed.signature.as_str()), (1, "ss"));
        let body = &m[(16 + fields_len).next_multiple_of(8)..];
        assert_eq!(body.len(), body_len);
        assert_eq!(first_arg("ss", body).as_deref(), Some("trusted"));
        assert_eq!(first_arg("b", &1u32.to_le_bytes()).as_deref(), Some("true"));
        assert_eq!(parse_fields(b"B\x01\x00\x01", &[]).map(|m| m.kind), None);
    }
}
