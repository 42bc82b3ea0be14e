//! The attachment index: an on-disk open-addressing hash table from "owner" (container id +
//! ifname, or a legacy bare container id) to the addresses it holds, so that DEL, CHECK and
//! the duplicate check of ADD read a handful of slots instead of every file of the store.
//!
//! The index is a cache. The IP files stay the truth: every hit is verified by reading the IP
//! file it names, and the whole table is trusted only while its stamp (boot id, directory
//! device/inode and the directory's mtime, which we set ourselves after each change, see
//! [`crate::store`]) matches the directory. Otherwise it is rebuilt from the IP files.
//!
//! Layout (little-endian): a 4096-byte header, then `slots` slots of 32 bytes.
//! Header: magic (64 bytes, with spaces so that upstream's content comparison can never match
//! it), slots, used (live + tombstones), live, dev, ino, mtime sec, mtime nsec, boot id (16),
//! FNV-1a checksum of the fields. Slot: tag (0 empty, 1 live, 2 tombstone), kind (0 attachment,
//! 1 legacy), family (4/6), 5 bytes padding, key hash (u64), address (16 bytes).

use cni_common::fsread::open_regular_at;
use nix::fcntl::OFlag;
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;

pub const INDEX_NAME: &str = ".host-local-index";
const TMP_NAME: &str = ".host-local-index.tmp";
const MAGIC: &[u8; 64] = b"cni-rs host-local attachment index v1: not a reservation file.\n\n";
const HDR: u64 = 4096;
const SLOT: u64 = 32;
const MIN_SLOTS: u64 = 1024;
/// The largest table accepted or written: 2^24 slots (512 MiB), room for over 5 million
/// reservations at ≤ 30 % load. A header claiming more is not ours (or damaged), and the
/// arithmetic on what it claims can never overflow.
pub const MAX_SLOTS: u64 = 1 << 24;
const FIELDS_END: usize = 64 + 8 * 7 + 16;

const EMPTY: u8 = 0;
const LIVE: u8 = 1;
const TOMB: u8 = 2;

/// Whose reservation a slot records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `<id>\r\n<ifname>` files.
    Attachment,
    /// Files holding only `<id>` (written by old upstream versions).
    Legacy,
}

/// FNV-1a, 64 bit.
pub fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff; // part separator
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The hash an owner is filed under.
pub fn key_hash(kind: Kind, id: &str, ifname: &str) -> u64 {
    match kind {
        Kind::Attachment => fnv(&[b"a", id.as_bytes(), ifname.as_bytes()]),
        Kind::Legacy => fnv(&[b"l", id.as_bytes()]),
    }
}

/// What the index must agree with to be trusted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub sec: i64,
    pub nsec: i64,
    pub boot: [u8; 16],
}

/// One live entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub key: u64,
    pub ip: IpAddr,
}

pub struct Index {
    file: File,
    slots: u64,
    used: u64,
    live: u64,
    stamp: Stamp,
    /// Written under the temporary name and not yet renamed into place ([`Index::publish`]).
    unpublished: bool,
}

fn encode_slot(tag: u8, e: &Entry) -> [u8; SLOT as usize] {
    let mut b = [0u8; SLOT as usize];
    b[0] = tag;
    b[1] = match e.kind {
        Kind::Attachment => 0,
        Kind::Legacy => 1,
    };
    match e.ip {
        IpAddr::V4(a) => {
            b[2] = 4;
            b[16..20].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            b[2] = 6;
            b[16..32].copy_from_slice(&a.octets());
        }
    }
    b[8..16].copy_from_slice(&e.key.to_le_bytes());
    b
}

fn decode_slot(b: &[u8]) -> Option<Entry> {
    let kind = match b[1] {
        0 => Kind::Attachment,
        1 => Kind::Legacy,
        _ => return None,
    };
    let ip = match b[2] {
        4 => IpAddr::V4(Ipv4Addr::new(b[16], b[17], b[18], b[19])),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[16..32]).expect("16 bytes"))),
        _ => return None,
    };
    let key = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    Some(Entry { kind, key, ip })
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// The checksum of a header's fields (FNV-1a: it catches damage, not forgery).
fn checksum(h: &[u8]) -> u64 {
    fnv(&[&h[64..FIELDS_END]])
}

/// For fuzzing and tests, no use in the plugin: make the bytes of an index file pass the first
/// check of [`Index::from_file`] (magic and checksum) whatever else they say, so that the checks
/// after it (slot count, file length, counters) and the table are what gets exercised. The
/// magic is put in place and the checksum recomputed over the header fields as they are (a
/// file shorter than the header is zero-extended to hold them). With `fit_up_to`, the file is
/// also cut or zero-extended to the length its slot count claims (`4096 + slots × 32`), when
/// that is at most `fit_up_to` bytes.
#[doc(hidden)]
pub fn seal_header(file: &mut Vec<u8>, fit_up_to: Option<u64>) {
    if file.len() < FIELDS_END + 8 {
        file.resize(FIELDS_END + 8, 0);
    }
    file[..64].copy_from_slice(MAGIC);
    let sum = checksum(file);
    file[FIELDS_END..FIELDS_END + 8].copy_from_slice(&sum.to_le_bytes());
    let claimed = u64_at(file, 64).checked_mul(SLOT).and_then(|t| t.checked_add(HDR));
    if let (Some(len), Some(max)) = (claimed, fit_up_to) {
        if len <= max {
            file.resize(len as usize, 0);
        }
    }
}

/// The table size for `n` entries: room for one more at most a third full (a power of two,
/// at least [`MIN_SLOTS`]); more than [`MAX_SLOTS`] is an error.
fn slots_for(n: usize) -> io::Result<u64> {
    let slots = (n as u64 + 1).saturating_mul(3).next_power_of_two().max(MIN_SLOTS);
    if slots > MAX_SLOTS {
        return Err(io::Error::other(format!(
            "{n} reservations are more than an index of at most {MAX_SLOTS} slots holds"
        )));
    }
    Ok(slots)
}

impl Index {
    /// Open the index in the store directory `dir` (never through a symbolic link, never a
    /// FIFO or device); `None` when it is missing or not an intact index of ours. `writable`:
    /// opened for updates, else read-only (a read-only verb, or a read-only filesystem).
    pub fn open(dir: BorrowedFd<'_>, writable: bool) -> Option<Index> {
        let file = if writable {
            match open_regular_at(dir, INDEX_NAME, OFlag::O_RDWR, 0) {
                Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                    open_regular_at(dir, INDEX_NAME, OFlag::O_RDONLY, 0)
                }
                r => r,
            }
        } else {
            open_regular_at(dir, INDEX_NAME, OFlag::O_RDONLY, 0)
        };
        Index::from_file(file.ok()?)
    }

    /// Read and check the header of an index file: magic, checksum, a slot count that is a power
    /// of two within [`MIN_SLOTS`, `MAX_SLOTS`], a file length that matches it exactly, and
    /// counters that fit (`live` ≤ `used` ≤ `slots`). Anything else is `None` (rebuilt).
    pub fn from_file(file: File) -> Option<Index> {
        let mut h = [0u8; FIELDS_END + 8];
        file.read_exact_at(&mut h, 0).ok()?;
        if &h[..64] != MAGIC || u64_at(&h, FIELDS_END) != checksum(&h) {
            return None;
        }
        let slots = u64_at(&h, 64);
        if !(MIN_SLOTS..=MAX_SLOTS).contains(&slots) || !slots.is_power_of_two() {
            return None;
        }
        let len = file.metadata().ok()?.len();
        if Some(len) != slots.checked_mul(SLOT).and_then(|t| t.checked_add(HDR)) {
            return None;
        }
        let (used, live) = (u64_at(&h, 72), u64_at(&h, 80));
        if used > slots || live > used {
            return None;
        }
        let stamp = Stamp {
            dev: u64_at(&h, 88),
            ino: u64_at(&h, 96),
            sec: u64_at(&h, 104) as i64,
            nsec: u64_at(&h, 112) as i64,
            boot: h[120..136].try_into().expect("16 bytes"),
        };
        Some(Index { file, slots, used, live, stamp, unpublished: false })
    }

    pub fn stamp(&self) -> &Stamp {
        &self.stamp
    }

    pub fn live(&self) -> u64 {
        self.live
    }

    /// Write a fresh index holding `entries` and put it in place (the caller re-stamps).
    pub fn create(dir: BorrowedFd<'_>, entries: &[Entry]) -> io::Result<Index> {
        let mut idx = Index::build(dir, entries)?;
        idx.publish(dir)?;
        Ok(idx)
    }

    /// Write a fresh index holding `entries` under the temporary name: it replaces the index in
    /// place only with [`Index::publish`] (a call that fails leaves the old one, or none, as it
    /// was: [`Index::discard`]). A partly written temporary file (no space left) is removed.
    pub fn build(dir: BorrowedFd<'_>, entries: &[Entry]) -> io::Result<Index> {
        let slots = slots_for(entries.len())?;
        let mut table = vec![0u8; (slots * SLOT) as usize];
        let mask = slots - 1;
        for e in entries {
            let mut i = e.key & mask;
            while table[(i * SLOT) as usize] != EMPTY {
                i = (i + 1) & mask;
            }
            let off = (i * SLOT) as usize;
            table[off..off + SLOT as usize].copy_from_slice(&encode_slot(LIVE, e));
        }
        // A new inode: an unpublished index being replaced (growth) keeps its own.
        unlink_if_there(dir, TMP_NAME)?;
        let create = OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL;
        let file = open_regular_at(dir, TMP_NAME, create, 0o600)?;
        let idx = Index {
            file,
            slots,
            used: entries.len() as u64,
            live: entries.len() as u64,
            stamp: Stamp::default(),
            unpublished: true,
        };
        let written = idx.write_header().and_then(|()| idx.file.write_all_at(&table, HDR));
        if let Err(e) = written {
            let _ = unlink_if_there(dir, TMP_NAME);
            return Err(e);
        }
        Ok(idx)
    }

    /// Rename an index written by [`Index::build`] into place (nothing to do for one opened
    /// in place).
    pub fn publish(&mut self, dir: BorrowedFd<'_>) -> io::Result<()> {
        if self.unpublished {
            nix::fcntl::renameat(dir, TMP_NAME, dir, INDEX_NAME)?;
            self.unpublished = false;
        }
        Ok(())
    }

    /// Drop an index that was never published, with its temporary file.
    pub fn discard(self, dir: BorrowedFd<'_>) {
        if self.unpublished {
            let _ = unlink_if_there(dir, TMP_NAME);
        }
    }

    fn write_header(&self) -> io::Result<()> {
        let mut h = vec![0u8; HDR as usize];
        h[..64].copy_from_slice(MAGIC);
        let s = &self.stamp;
        for (i, v) in [self.slots, self.used, self.live, s.dev, s.ino, s.sec as u64, s.nsec as u64]
            .into_iter()
            .enumerate()
        {
            h[64 + i * 8..72 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        h[120..136].copy_from_slice(&s.boot);
        let sum = checksum(&h);
        h[FIELDS_END..FIELDS_END + 8].copy_from_slice(&sum.to_le_bytes());
        self.file.write_all_at(&h, 0)
    }

    /// Record the stamp (and the counters) in the header.
    pub fn set_stamp(&mut self, stamp: Stamp) -> io::Result<()> {
        self.stamp = stamp;
        self.write_header()
    }

    /// Walk the probe sequence of `key`, calling `f(slot, tag, bytes)` until it returns true
    /// or an empty slot ends the sequence. Reads 128 slots per syscall.
    fn probe(&self, key: u64, mut f: impl FnMut(u64, u8, &[u8]) -> bool) -> io::Result<Option<u64>> {
        let mask = self.slots - 1;
        let mut i = key & mask;
        let mut buf = vec![0u8; 4096];
        for _ in 0..self.slots.div_ceil(128) + 1 {
            let n = (self.slots - i).min(128);
            let chunk = &mut buf[..(n * SLOT) as usize];
            self.file.read_exact_at(chunk, HDR + i * SLOT)?;
            for k in 0..n {
                let off = (k * SLOT) as usize;
                let s = &chunk[off..off + SLOT as usize];
                if f(i + k, s[0], s) {
                    return Ok(Some(i + k));
                }
                if s[0] == EMPTY {
                    return Ok(None);
                }
            }
            i = (i + n) & mask;
        }
        Ok(None)
    }

    /// Live entries filed under (`kind`, `key`), with their slot numbers.
    pub fn lookup(&self, kind: Kind, key: u64) -> io::Result<Vec<(u64, IpAddr)>> {
        let mut out = Vec::new();
        self.probe(key, |slot, tag, s| {
            if tag == LIVE {
                if let Some(e) = decode_slot(s) {
                    if e.kind == kind && e.key == key {
                        out.push((slot, e.ip));
                    }
                }
            }
            false
        })?;
        Ok(out)
    }

    /// Add an entry. Grows (rewrites) the table when it is 70% used.
    pub fn insert(&mut self, dir: BorrowedFd<'_>, e: Entry) -> io::Result<()> {
        if (self.used + 1).saturating_mul(10) > self.slots * 7 {
            let mut all = self.entries()?;
            all.push(e);
            let stamp = self.stamp;
            *self = Index::build(dir, &all)?;
            self.stamp = stamp;
            return Ok(());
        }
        let mut found_tag = EMPTY;
        let slot = self.probe(e.key, |_, tag, _| {
            found_tag = tag;
            tag != LIVE
        })?;
        let Some(slot) = slot else {
            return Err(io::Error::other("index full"));
        };
        if found_tag == EMPTY {
            self.used += 1;
        }
        self.live += 1;
        self.file.write_all_at(&encode_slot(LIVE, &e), HDR + slot * SLOT)
    }

    /// Turn a live slot into a tombstone.
    pub fn remove(&mut self, slot: u64) -> io::Result<()> {
        if slot >= self.slots {
            return Err(io::Error::other(format!("index slot {slot} out of range")));
        }
        self.live = self.live.saturating_sub(1);
        self.file.write_all_at(&[TOMB], HDR + slot * SLOT)
    }

    /// Every live entry (reads the whole table; used when growing).
    pub fn entries(&self) -> io::Result<Vec<Entry>> {
        let mut table = vec![0u8; (self.slots * SLOT) as usize];
        self.file.read_exact_at(&mut table, HDR)?;
        Ok(table.chunks_exact(SLOT as usize).filter(|s| s[0] == LIVE).filter_map(decode_slot).collect())
    }
}

/// Remove `name` from `dir`; a missing file is fine.
pub fn unlink_if_there(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    match nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::os::fd::AsFd;

    fn e(kind: Kind, id: &str, ifname: &str, ip: &str) -> Entry {
        Entry { kind, key: key_hash(kind, id, ifname), ip: ip.parse().unwrap() }
    }

    #[test]
    fn create_lookup_insert_remove_reopen() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let at = dir.as_fd();
        let mut idx = Index::create(
            at,
            &[e(Kind::Attachment, "a", "eth0", "10.0.0.2"), e(Kind::Legacy, "old", "", "10.0.0.3")],
        )
        .unwrap();
        let ka = key_hash(Kind::Attachment, "a", "eth0");
        assert_eq!(idx.lookup(Kind::Attachment, ka).unwrap().len(), 1);
        assert!(idx.lookup(Kind::Legacy, ka).unwrap().is_empty(), "kind is part of the key");
        idx.insert(at, e(Kind::Attachment, "a", "eth0", "2001:db8::2")).unwrap();
        let hits = idx.lookup(Kind::Attachment, ka).unwrap();
        let ips: Vec<String> = hits.iter().map(|(_, ip)| ip.to_string()).collect();
        assert_eq!(ips, ["10.0.0.2", "2001:db8::2"]);
        idx.remove(hits[0].0).unwrap();
        let stamp = Stamp { dev: 1, ino: 2, sec: 3, nsec: 4, boot: [7; 16] };
        idx.set_stamp(stamp).unwrap();
        let again = Index::open(at, true).unwrap();
        assert_eq!(*again.stamp(), stamp);
        assert_eq!(again.live(), 2);
        let ips: Vec<String> =
            again.lookup(Kind::Attachment, ka).unwrap().iter().map(|(_, ip)| ip.to_string()).collect();
        assert_eq!(ips, ["2001:db8::2"]);
    }

    #[test]
    fn colliding_keys_and_growth() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let at = dir.as_fd();
        let mut idx = Index::create(at, &[]).unwrap();
        // 3000 entries force two growths; a shared fake key exercises long probe sequences.
        for i in 0..3000u32 {
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            let key = if i % 100 == 0 { 42 } else { key_hash(Kind::Attachment, &format!("c{i}"), "eth0") };
            idx.insert(at, Entry { kind: Kind::Attachment, key, ip }).unwrap();
        }
        assert_eq!(idx.live(), 3000);
        assert_eq!(idx.lookup(Kind::Attachment, 42).unwrap().len(), 30);
        let k = key_hash(Kind::Attachment, "c1234", "eth0");
        let hit = idx.lookup(Kind::Attachment, k).unwrap();
        assert_eq!(hit.len(), 1);
        assert_eq!(hit[0].1, IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + 1234)));
        // tombstones keep later entries of a probe sequence reachable
        for (slot, _) in idx.lookup(Kind::Attachment, 42).unwrap().into_iter().take(29) {
            idx.remove(slot).unwrap();
        }
        assert_eq!(idx.lookup(Kind::Attachment, 42).unwrap().len(), 1);
        assert_eq!(idx.entries().unwrap().len(), 3000 - 29);
    }

    #[test]
    fn rejects_foreign_or_damaged_files() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let at = dir.as_fd();
        assert!(Index::open(at, true).is_none(), "missing");
        std::fs::write(d.path().join(INDEX_NAME), b"c1\r\neth0").unwrap();
        assert!(Index::open(at, true).is_none(), "not ours");
        Index::create(at, &[]).unwrap();
        assert!(Index::open(at, true).is_some());
        let f = OpenOptions::new().write(true).open(d.path().join(INDEX_NAME)).unwrap();
        f.write_all_at(&[9], 100).unwrap();
        assert!(Index::open(at, true).is_none(), "checksum");
        Index::create(at, &[]).unwrap();
        let f = OpenOptions::new().write(true).open(d.path().join(INDEX_NAME)).unwrap();
        f.set_len(HDR + 10).unwrap();
        assert!(Index::open(at, true).is_none(), "truncated");
        // never through a symbolic link, never a FIFO
        std::fs::remove_file(d.path().join(INDEX_NAME)).unwrap();
        Index::create(at, &[]).unwrap();
        std::fs::rename(d.path().join(INDEX_NAME), d.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", d.path().join(INDEX_NAME)).unwrap();
        assert!(Index::open(at, true).is_none(), "symlink");
        std::fs::remove_file(d.path().join(INDEX_NAME)).unwrap();
        nix::unistd::mkfifo(&d.path().join(INDEX_NAME), nix::sys::stat::Mode::from_bits_truncate(0o600))
            .unwrap();
        assert!(Index::open(at, false).is_none(), "FIFO");
    }

    /// A header with a valid checksum (FNV is no MAC: anyone can compute it) whose slot count
    /// makes `HDR + slots * SLOT` wrap to the file's real length was accepted by release
    /// builds, after which every lookup failed; `used`/`live` beyond the table overflowed the
    /// growth check.
    pub fn crafted_header(slots: u64, used: u64, live: u64) -> Vec<u8> {
        let mut h = vec![0u8; HDR as usize];
        for (i, v) in [slots, used, live].into_iter().enumerate() {
            h[64 + i * 8..72 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        seal_header(&mut h, None);
        h
    }

    #[test]
    fn a_sealed_header_passes_the_checksum_and_meets_the_checks_after_it() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(INDEX_NAME);
        let opened = |b: &[u8]| {
            std::fs::write(&path, b).unwrap();
            Index::from_file(File::open(&path).unwrap())
        };
        // what a fuzzer makes of a real index: some header bytes changed
        let real = Index::create(File::open(d.path()).unwrap().as_fd(), &[]).unwrap();
        let mut bytes = vec![0u8; real.file.metadata().unwrap().len() as usize];
        real.file.read_exact_at(&mut bytes, 0).unwrap();
        assert!(opened(&bytes).is_some());
        bytes[3] ^= 1; // the magic
        bytes[72] = 7; // used
        bytes[80] = 5; // live
        assert!(opened(&bytes).is_none(), "refused by magic and checksum");
        seal_header(&mut bytes, None);
        let idx = opened(&bytes).expect("sealed, and the numbers are sane: it opens");
        assert_eq!((idx.slots, idx.used, idx.live), (MIN_SLOTS, 7, 5));
        // sealed again with a counter out of bounds: now the counter check is what refuses it
        bytes[80] = 9;
        seal_header(&mut bytes, None);
        assert!(opened(&bytes).is_none(), "live 9 > used 7");
        // fitting: cut or extended to the length the slot count claims, within the bound
        let mut short = crafted_header(2 * MIN_SLOTS, 1, 1);
        seal_header(&mut short, Some(1 << 20));
        assert_eq!(short.len() as u64, HDR + 2 * MIN_SLOTS * SLOT);
        assert!(opened(&short).is_some());
        let mut wrapping = crafted_header(1 << 59, 0, 0);
        seal_header(&mut wrapping, Some(1 << 20));
        assert_eq!(wrapping.len() as u64, HDR, "a claim that does not fit leaves the length alone");
        assert!(opened(&wrapping).is_none());
        // too short to hold the fields: extended (and refused by the slot count, 0)
        let mut tiny = vec![0xff; 10];
        seal_header(&mut tiny, None);
        assert_eq!(tiny.len(), FIELDS_END + 8);
        assert!(opened(&tiny).is_none());
        // one that holds the fields but not the checksum is extended; a longer one keeps its length
        for len in [FIELDS_END, FIELDS_END + 16] {
            let mut b = vec![0u8; len];
            seal_header(&mut b, None);
            assert_eq!(b.len(), len.max(FIELDS_END + 8), "{len}");
        }
    }

    #[test]
    fn crafted_headers_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let at = dir.as_fd();
        let put = |b: &[u8]| std::fs::write(d.path().join(INDEX_NAME), b).unwrap();
        // 2^59 slots * 32 bytes = 2^64: wraps to 0, so HDR + slots * SLOT == HDR == the length
        assert_eq!(HDR.wrapping_add((1u64 << 59).wrapping_mul(SLOT)), HDR);
        put(&crafted_header(1 << 59, 0, 0));
        assert!(Index::open(at, true).is_none(), "wrapping slot count");
        put(&crafted_header(MAX_SLOTS * 2, 0, 0));
        let f = OpenOptions::new().write(true).open(d.path().join(INDEX_NAME)).unwrap();
        f.set_len(HDR + MAX_SLOTS * 2 * SLOT).unwrap(); // sparse
        assert!(Index::open(at, true).is_none(), "more slots than the cap");
        let mut ok = crafted_header(MIN_SLOTS, 0, 0);
        ok.resize((HDR + MIN_SLOTS * SLOT) as usize, 0);
        put(&ok);
        assert!(Index::open(at, true).is_some(), "the same shape with sane numbers is fine");
        let mut full = crafted_header(MIN_SLOTS, MIN_SLOTS, MIN_SLOTS);
        full.resize(ok.len(), 0);
        put(&full);
        assert!(Index::open(at, true).is_some(), "live ≤ used ≤ slots holds for a full table");
        for (used, live) in [(u64::MAX, 0), (MIN_SLOTS + 1, 0), (5, 6)] {
            let mut bad = crafted_header(MIN_SLOTS, used, live);
            bad.resize(ok.len(), 0);
            put(&bad);
            assert!(Index::open(at, true).is_none(), "used {used} live {live}");
        }
    }

    #[test]
    fn magic_can_never_equal_upstream_match_strings() {
        // Upstream compares the trimmed content of every file with "<id>\r\n<ifname>" or "<id>";
        // neither may contain a space, our header always does.
        let trimmed = String::from_utf8_lossy(MAGIC).trim().to_string();
        assert!(trimmed.contains(' '));
    }

    #[test]
    fn a_built_index_replaces_the_old_one_only_when_published() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let at = dir.as_fd();
        let old = Index::create(at, &[e(Kind::Attachment, "a", "eth0", "10.0.0.2")]).unwrap();
        let before = std::fs::read(d.path().join(INDEX_NAME)).unwrap();
        let fresh = Index::build(at, &[]).unwrap();
        assert_eq!(std::fs::read(d.path().join(INDEX_NAME)).unwrap(), before, "not in place yet");
        fresh.discard(at);
        assert_eq!(std::fs::read(d.path().join(INDEX_NAME)).unwrap(), before);
        assert!(!d.path().join(TMP_NAME).exists(), "the temporary file goes with it");
        drop(old);
        let mut fresh = Index::build(at, &[]).unwrap();
        fresh.publish(at).unwrap();
        assert_eq!(Index::open(at, true).unwrap().live(), 0);
        assert!(!d.path().join(TMP_NAME).exists());
        // Without any index before: nothing appears unless published.
        let e2 = tempfile::tempdir().unwrap();
        let e2dir = File::open(e2.path()).unwrap();
        Index::build(e2dir.as_fd(), &[]).unwrap().discard(e2dir.as_fd());
        assert_eq!(std::fs::read_dir(e2.path()).unwrap().count(), 0);
    }

    /// FNV-1a (64 bit) as published, for checking [`fnv`] against.
    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
    }

    /// Index keys and the records' content hashes are on disk: an upgraded plugin must compute
    /// the same values as the build that wrote them.
    #[test]
    fn hashes_are_fnv1a_with_a_separator_after_each_part() {
        // the published test vectors
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv(&[b"foobar"]), fnv1a(b"foobar\xff"));
        assert_eq!(fnv(&[b"c1\r\neth0"]), fnv1a(b"c1\r\neth0\xff"));
        assert_eq!(key_hash(Kind::Attachment, "c1", "eth0"), fnv1a(b"a\xffc1\xffeth0\xff"));
        assert_eq!(key_hash(Kind::Legacy, "c1", "ignored"), fnv1a(b"l\xffc1\xff"));
        assert_eq!(fnv(&[]), fnv1a(b""));
    }

    /// The header as documented at the top of this file, byte for byte: an index written by
    /// one build is trusted by the next.
    #[test]
    fn the_header_layout_is_fixed() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let at = dir.as_fd();
        let mut idx = Index::create(at, &[e(Kind::Legacy, "old", "", "10.0.0.3")]).unwrap();
        let stamp = Stamp { dev: 11, ino: 12, sec: 13, nsec: 14, boot: [0xb0; 16] };
        idx.set_stamp(stamp).unwrap();
        let b = std::fs::read(d.path().join(INDEX_NAME)).unwrap();
        assert_eq!(b.len(), 4096 + 1024 * 32);
        assert_eq!(&b[..64], MAGIC);
        let field = |i: usize| u64::from_le_bytes(b[64 + 8 * i..72 + 8 * i].try_into().unwrap());
        assert_eq!(
            [1024, 1, 1, 11, 12, 13, 14],
            [0, 1, 2, 3, 4, 5, 6].map(field),
            "slots used live dev ino sec nsec"
        );
        assert_eq!(b[120..136], [0xb0; 16], "boot id");
        let sum = u64::from_le_bytes(b[136..144].try_into().unwrap());
        assert_eq!(sum, fnv1a(&[&b[64..136], &[0xff][..]].concat()), "checksum of the fields");
        assert!(b[144..4096].iter().all(|&x| x == 0));
        // the one slot: tag, kind, family, padding, key, address
        let key = key_hash(Kind::Legacy, "old", "");
        let slot = 4096 + (key & 1023) as usize * 32;
        assert_eq!(b[slot..slot + 8], [1, 1, 4, 0, 0, 0, 0, 0]);
        assert_eq!(b[slot + 8..slot + 16], key.to_le_bytes());
        assert_eq!(b[slot + 16..slot + 32], [10, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_table_has_room_for_one_more_entry_at_most_a_third_full() {
        assert_eq!(slots_for(0).unwrap(), MIN_SLOTS);
        assert_eq!(slots_for(341).unwrap(), 2048, "3 × 342 = 1026");
        assert_eq!(slots_for(681).unwrap(), 2048, "3 × 682 = 2046");
        assert_eq!(slots_for(682).unwrap(), 4096, "3 × 683 = 2049");
        assert_eq!(slots_for(5_592_404).unwrap(), MAX_SLOTS, "3 × 5 592 405 = 2^24 - 1");
        let e = slots_for(5_592_405).unwrap_err();
        assert_eq!(
            e.to_string(),
            "5592405 reservations are more than an index of at most 16777216 slots holds"
        );
    }

    #[test]
    fn the_table_grows_when_seventy_percent_used() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let at = dir.as_fd();
        let len = || std::fs::metadata(d.path().join(INDEX_NAME)).unwrap().len();
        let mut idx = Index::create(at, &[]).unwrap();
        let entry = |i: u32| Entry {
            kind: Kind::Attachment,
            key: u64::from(i) * 7,
            ip: IpAddr::V4(Ipv4Addr::from(i)),
        };
        for i in 0..716 {
            idx.insert(at, entry(i)).unwrap();
        }
        idx.publish(at).unwrap();
        assert_eq!(len(), HDR + 1024 * SLOT, "716 of 1024 slots: below 70 %");
        idx.insert(at, entry(716)).unwrap();
        idx.publish(at).unwrap();
        assert_eq!(len(), HDR + 4096 * SLOT, "the 717th: rebuilt for 717 entries");
        assert_eq!(Index::open(at, true).unwrap().entries().unwrap().len(), 717);
    }

    /// Lookups read 128 slots at a time: a probe sequence that runs past the end of the table
    /// or past one read finds every entry.
    #[test]
    fn probe_sequences_wrap_around_the_table_and_span_reads() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let at = dir.as_fd();
        let mut entries = Vec::new();
        for i in 0..10u32 {
            entries.push(Entry { kind: Kind::Attachment, key: 1020, ip: IpAddr::V4(Ipv4Addr::from(i)) });
        }
        for i in 0..200u32 {
            entries.push(Entry { kind: Kind::Legacy, key: 300, ip: IpAddr::V4(Ipv4Addr::from(1000 + i)) });
        }
        let idx = Index::create(at, &entries).unwrap();
        assert_eq!(idx.slots, 1024);
        let wrapped = idx.lookup(Kind::Attachment, 1020).unwrap();
        assert_eq!(
            wrapped.iter().map(|h| h.0).collect::<Vec<_>>(),
            [1020, 1021, 1022, 1023, 0, 1, 2, 3, 4, 5]
        );
        assert_eq!(idx.lookup(Kind::Legacy, 300).unwrap().len(), 200, "slots 300 … 499");
    }

    /// A table without an empty slot (damaged, or written by something else: the header check
    /// allows `used == slots`): a lookup walks all of it, also the slots before where its
    /// sequence starts, across the end of the table and a short read there.
    #[test]
    fn a_lookup_in_a_table_without_an_empty_slot_sees_every_slot() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let idx = Index::create(dir.as_fd(), &[]).unwrap();
        assert_eq!(idx.slots, 1024);
        let e = Entry { kind: Kind::Attachment, key: 100, ip: "10.0.0.2".parse().unwrap() };
        let mut table = vec![0u8; (idx.slots * SLOT) as usize];
        for (slot, s) in table.chunks_exact_mut(SLOT as usize).enumerate() {
            s.copy_from_slice(&encode_slot(TOMB, &e));
            if slot == 99 {
                s.copy_from_slice(&encode_slot(LIVE, &e));
            }
        }
        idx.file.write_all_at(&table, HDR).unwrap();
        assert_eq!(idx.lookup(Kind::Attachment, 100).unwrap(), [(99, e.ip)]);
    }
}
