//! host-local's on-disk formats, read back as untrusted data: the index file (header checks,
//! then lookups, tombstones and a full read of what the header allowed), reservation
//! contents, netns records and the boot marker, and a whole store directory of such files
//! scanned by a read-only call. Invariants: no panic, no read past the file, bounded memory
//! (the header caps the table), records that parse re-encode to themselves.
//!
//! The first byte selects the mode (modulo 6). Index files come three ways: as given (0); with
//! magic and checksum made valid first (4), since the FNV checksum rejects nearly every
//! mutated header before the slot-count, length and counter checks; and sealed and also cut
//! or extended to the length the header's slot count claims, when that is at most 1 MiB (5),
//! so that mutated counters reach the table code too.
#![no_main]

use cni_common::attachment::AttachmentId;
use host_local::index::{key_hash, seal_header, Index, Kind};
use host_local::record::{parse_boot_marker, Record};
use host_local::store::{reservation_name, Access, Owner, Store};
use libfuzzer_sys::fuzz_target;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::time::Duration;

/// An anonymous file holding `data`.
fn memfile(data: &[u8]) -> std::fs::File {
    // SAFETY: a fresh descriptor from memfd_create is owned by the File from here on.
    let fd = unsafe { libc::memfd_create(c"fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(data).unwrap();
    f
}

fn index(data: &[u8]) {
    let Some(mut idx) = Index::from_file(memfile(data)) else { return };
    for (kind, id) in [(Kind::Attachment, "c1"), (Kind::Legacy, "c1"), (Kind::Attachment, "")] {
        let hits = idx.lookup(kind, key_hash(kind, id, "eth0")).expect("lookups stay inside the file");
        for (slot, _) in hits {
            idx.remove(slot).expect("a slot found by a lookup is in range");
        }
    }
    let _ = idx.lookup(Kind::Attachment, u64::from_le_bytes(data[..8].try_into().unwrap()));
    assert!(idx.entries().unwrap().len() as u64 <= host_local::index::MAX_SLOTS);
    let _ = idx.remove(u64::MAX);
}

/// A store directory of the files `data` describes (name NUL content NUL …), opened and read
/// as CHECK and STATUS do.
fn store(data: &[u8]) {
    // tmpfs where there is one: thousands of tiny stores a second
    let tmp = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let base = tmp.join(format!("cni-fuzz-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("net");
    std::fs::create_dir_all(dir.join(".host-local-ns")).unwrap();
    let mut parts = data.split(|b| *b == 0);
    while let (Some(name), Some(content)) = (parts.next(), parts.next()) {
        let Ok(name) = std::str::from_utf8(name) else { continue };
        if name.is_empty() || name.contains('/') || name == "." || name == ".." || name.len() > 200 {
            continue;
        }
        let _ = std::fs::write(dir.join(name), content);
        let _ = std::fs::write(dir.join(".host-local-ns").join(name), content);
    }
    let mut s = Store::open(&dir, Access::Read, Duration::from_secs(5)).unwrap().unwrap();
    let _ = s.scan().unwrap();
    let _ = s.held_exact(&AttachmentId::new("net", "c1", "eth0")).unwrap();
    let _ = s.held_legacy("c1").unwrap();
    for (ip, _) in s.records() {
        let _ = s.file_id(ip);
    }
    let _ = s.last_reserved(0);
    let _ = s.records_boot();
    drop(s);
    let _ = Store::usable(&dir, 2);
    std::fs::remove_dir_all(&base).unwrap();
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    match sel % 6 {
        0 if rest.len() >= 8 => index(rest),
        4 | 5 => {
            let mut file = rest.to_vec();
            seal_header(&mut file, (sel % 6 == 5).then_some(1 << 20));
            index(&file)
        }
        1 => {
            let _ = Owner::parse(rest);
            if let Ok(s) = std::str::from_utf8(rest) {
                if let Some(ip) = reservation_name(s) {
                    assert_eq!(ip.to_string(), s);
                }
            }
            let _ = parse_boot_marker(rest);
        }
        2 => {
            if let Some(r) = Record::parse(rest) {
                assert_eq!(Record::parse(r.encode().as_bytes()), Some(r));
            }
        }
        _ => store(rest),
    }
});
