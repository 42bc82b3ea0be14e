//! Netns records: beside each reservation it makes, ADD records which network namespace the
//! attachment was made for, so that a reservation whose pod is provably gone can be released
//! ([`crate::liveness`]). The reservation files stay exactly upstream's.
//!
//! Layout: `<dataDir>/<net>/.host-local-ns/<ip>` per reservation, plus `boot`, the boot id of
//! the last pass that released reservations of earlier boots. Upstream's host-local walks this
//! directory too (its `filepath.Walk` descends into subdirectories) and compares each file's
//! trimmed content with `<id>\r\n<ifname>` and `<id>`: a record and the marker always contain
//! spaces, which neither can, so upstream never takes them for reservations. An upstream DEL
//! removes the reservation and leaves the record: a record counts only while the reservation
//! file is the very file it was written for (same inode, same ctime, same content), so a stale
//! one never applies to a later reservation of the address.
//!
//! A record:
//! ```text
//! cni-rs host-local netns record v1
//! file <inode> <ctime s> <ctime ns> <FNV-1a of the content, hex>
//! boot <boot id, 32 hex digits>
//! netns <nsfs inode> <netns cookie> <CNI_NETNS path, or - when it could not be recorded>
//! ```

use cni_common::nsident::NsIdent;

pub const RECORDS_DIR: &str = ".host-local-ns";
pub const BOOT_MARKER: &str = "boot";
/// Records are a few hundred bytes; anything longer is not one of ours.
pub const RECORD_CAP: u64 = 4096;
const MAGIC: &str = "cni-rs host-local netns record v1";
const BOOT_PREFIX: &str = "boot id of the last release of earlier boots' reservations: ";
/// Paths longer than this are not recorded.
const PATH_MAX: usize = 1024;

/// Which file a record was written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    pub ino: u64,
    pub ctime_sec: i64,
    pub ctime_nsec: i64,
    /// FNV-1a of the file's content.
    pub hash: u64,
}

/// What ADD recorded about the attachment a reservation was made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub file: FileId,
    pub boot: [u8; 16],
    pub ns: NsIdent,
    /// CNI_NETNS as ADD got it; empty when it could not be recorded.
    pub path: String,
}

/// Whether `path` can be written into a record (one token of a line).
pub fn recordable(path: &str) -> bool {
    cni_common::nsident::recordable_path(path, PATH_MAX)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Record {
    pub fn encode(&self) -> String {
        let f = &self.file;
        let path = if self.path.is_empty() { "-" } else { &self.path };
        format!(
            "{MAGIC}\nfile {} {} {} {:016x}\nboot {}\nnetns {} {} {path}\n",
            f.ino,
            f.ctime_sec,
            f.ctime_nsec,
            f.hash,
            hex(&self.boot),
            self.ns.ino,
            self.ns.cookie
        )
    }

    /// The record in `b`, if it is exactly one (anything else, damaged or foreign, is `None`
    /// and counts as no record: the reservation stays live).
    pub fn parse(b: &[u8]) -> Option<Record> {
        let text = std::str::from_utf8(b).ok()?;
        let mut lines = text.strip_suffix('\n')?.split('\n');
        if lines.next()? != MAGIC {
            return None;
        }
        let file: Vec<&str> = lines.next()?.strip_prefix("file ")?.split(' ').collect();
        let [ino, sec, nsec, hash] = file[..] else { return None };
        if hash.len() != 16 {
            return None;
        }
        let file = FileId {
            ino: ino.parse().ok()?,
            ctime_sec: sec.parse().ok()?,
            ctime_nsec: nsec.parse().ok()?,
            hash: u64::from_str_radix(hash, 16).ok()?,
        };
        let boot = unhex16(lines.next()?.strip_prefix("boot ")?)?;
        let ns: Vec<&str> = lines.next()?.strip_prefix("netns ")?.split(' ').collect();
        let [ino, cookie, path] = ns[..] else { return None };
        let path = match path {
            "-" => String::new(),
            p if recordable(p) => p.to_string(),
            _ => return None,
        };
        if lines.next().is_some() {
            return None;
        }
        let ns = NsIdent { ino: ino.parse().ok()?, cookie: cookie.parse().ok()? };
        Some(Record { file, boot, ns, path })
    }
}

/// The content of the boot marker.
pub fn boot_marker(boot: &[u8; 16]) -> String {
    format!("{BOOT_PREFIX}{}\n", hex(boot))
}

/// The boot id a marker holds.
pub fn parse_boot_marker(b: &[u8]) -> Option<[u8; 16]> {
    let text = std::str::from_utf8(b).ok()?;
    unhex16(text.strip_prefix(BOOT_PREFIX)?.strip_suffix('\n')?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(path: &str) -> Record {
        Record {
            file: FileId { ino: 12, ctime_sec: 1_700_000_000, ctime_nsec: 5, hash: 0xdead_beef },
            boot: [0xab; 16],
            ns: NsIdent { ino: 4_026_532_000, cookie: 77 },
            path: path.into(),
        }
    }

    #[test]
    fn records_round_trip_and_reject_anything_else() {
        for path in ["/var/run/netns/cni-1b2c3d4e-0000-1111-2222-333344445555", ""] {
            let r = sample(path);
            let text = r.encode();
            assert_eq!(Record::parse(text.as_bytes()), Some(r), "{text}");
            // upstream compares the trimmed content with "<id>\r\n<ifname>" and "<id>": never
            // equal to text with spaces
            assert!(text.trim().contains(' '));
        }
        let good = sample("/run/netns/a").encode();
        for bad in [
            good.replace("v1", "v2"),
            good.replace("file 12", "file -12"),
            good.replace("/run/netns/a", "/run/netns/a b"),
            good.replace("/run/netns/a", "/run/netns/\u{e9}"),
            format!("{good}extra\n"),
            good.trim_end().to_string(),
            good.replace("deadbeef", "xx"),
            String::new(),
        ] {
            assert_eq!(Record::parse(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(Record::parse(&[0xff, 0xfe]), None);
    }

    #[test]
    fn recordable_paths() {
        assert!(recordable("/var/run/netns/cni-1b2c3d4e"));
        assert!(recordable("/proc/1234/ns/net"));
        assert!(!recordable("/run/netns/with space"));
        assert!(!recordable("/run/netns/new\nline"));
        assert!(!recordable(""));
        assert!(!recordable(&format!("/run/netns/{}", "x".repeat(2000))));
    }

    #[test]
    fn boot_marker_round_trip() {
        let m = boot_marker(&[1; 16]);
        assert_eq!(parse_boot_marker(m.as_bytes()), Some([1; 16]));
        assert!(m.trim().contains(' '), "never mistaken for a legacy reservation by upstream");
        assert_eq!(parse_boot_marker(b"0101"), None);
    }
}
