use super::fsops::{io_err, replace_file};
use super::*;
use crate::index::{key_hash, Index, Kind, INDEX_NAME};
use crate::record::{self, BOOT_MARKER, RECORDS_DIR};
use cni_common::attachment::AttachmentId;
use cni_common::error::code;
use cni_common::nsident::{boot_id, NsIdent};
use nix::errno::Errno;
use nix::sys::stat::Mode;
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn open(d: &Path) -> Store {
    Store::open(d, Access::Add, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap()
}

fn att(id: &str, ifname: &str) -> AttachmentId {
    AttachmentId::new("net", id, ifname)
}

/// A store directory `net` (not created yet) inside a temporary directory, and the guard
/// that removes it.
fn net_dir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let net = d.path().join("net");
    (d, net)
}

/// A store directory that another program (or an older writer) left with `files` in it.
fn seeded(files: &[(&str, &[u8])]) -> (tempfile::TempDir, PathBuf) {
    let (d, net) = net_dir();
    std::fs::create_dir_all(&net).unwrap();
    for (name, content) in files {
        std::fs::write(net.join(name), content).unwrap();
    }
    (d, net)
}

/// Reserve `addr` for container `id` on eth0 with freshly prepared content.
fn reserve(s: &mut Store, addr: &str, id: &str) -> bool {
    s.reserve(&mut None, ip(addr), &att(id, "eth0")).unwrap()
}

#[test]
fn owner_parsing_matches_upstream_comparisons() {
    assert_eq!(Owner::parse(b"abc\r\neth0"), Owner::Attachment { id: "abc".into(), ifname: "eth0".into() });
    assert_eq!(
        Owner::parse(b"  abc\r\neth0 \n"),
        Owner::Attachment { id: "abc".into(), ifname: "eth0".into() },
        "whitespace around the content is ignored"
    );
    assert_eq!(Owner::parse(b"abc\n"), Owner::Legacy { id: "abc".into() });
    assert_eq!(Owner::parse(b"abc\r\n"), Owner::Legacy { id: "abc".into() });
    assert_eq!(Owner::parse(b""), Owner::Unknown);
    assert_eq!(Owner::parse(b" \n"), Owner::Unknown);
}

#[test]
fn reservation_names() {
    assert_eq!(reservation_name("10.0.0.2"), Some(ip("10.0.0.2")));
    assert_eq!(reservation_name("2001:db8::2"), Some(ip("2001:db8::2")));
    for n in ["lock", "last_reserved_ip.0", INDEX_NAME, "010.0.0.2", "2001:DB8::2", "10.0.0.2.bak"] {
        assert_eq!(reservation_name(n), None, "{n}");
    }
}

#[test]
fn reserve_is_exclusive_writes_upstream_format_and_mode() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    let mut p = None;
    assert!(s.reserve(&mut p, ip("10.0.0.2"), &att("c1", "eth0")).unwrap());
    assert!(p.is_none(), "content used up");
    assert!(!s.reserve(&mut p, ip("10.0.0.2"), &att("c2", "eth0")).unwrap(), "taken");
    assert!(p.is_some(), "content kept for the next candidate");
    assert!(s.reserve(&mut p, ip("10.0.0.3"), &att("c2", "eth0")).unwrap());
    s.finish();
    assert_eq!(std::fs::read(net.join("10.0.0.2")).unwrap(), b"c1\r\neth0");
    assert_eq!(std::fs::read(net.join("10.0.0.3")).unwrap(), b"c2\r\neth0");
    let mode = std::fs::metadata(net.join("10.0.0.2")).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // no stray files: the two reservations, the lock, the index
    let mut names: Vec<String> =
        std::fs::read_dir(&net).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, [INDEX_NAME, "10.0.0.2", "10.0.0.3", "lock"]);
}

#[test]
fn an_empty_reservation_file_is_debris_and_is_reclaimed() {
    let (_d, net) = seeded(&[("10.0.0.5", b""), ("10.0.0.6", b"other\r\neth0")]);
    let mut s = open(&net);
    assert!(reserve(&mut s, "10.0.0.5", "c1"), "an empty file (an interrupted write) is taken over");
    assert!(!reserve(&mut s, "10.0.0.6", "c1"), "a file with an owner is not");
    s.finish();
    assert_eq!(std::fs::read(net.join("10.0.0.5")).unwrap(), b"c1\r\neth0");
    assert_eq!(std::fs::read(net.join("10.0.0.6")).unwrap(), b"other\r\neth0");
}

#[test]
fn index_is_trusted_only_while_the_directory_is_unchanged() {
    let (_d, net) = net_dir();
    {
        let mut s = open(&net);
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        assert_eq!(s.rebuilds, 1, "first use builds the index");
        s.finish();
    }
    {
        let mut s = open(&net);
        assert_eq!(s.held_exact(&att("c1", "eth0")).unwrap().len(), 1);
        assert_eq!(s.rebuilds, 0, "unchanged directory: index trusted");
    }
    // another program adds a reservation behind our back (within the same clock tick)
    std::fs::write(net.join("10.0.0.9"), b"c9\r\neth0").unwrap();
    {
        let mut s = open(&net);
        let held = s.held_exact(&att("c9", "eth0")).unwrap();
        assert_eq!(held.iter().map(|h| h.1).collect::<Vec<_>>(), [ip("10.0.0.9")]);
        assert_eq!(s.rebuilds, 1, "foreign change detected");
        s.finish();
    }
    // another program removes one: the stale index hit is verified away
    std::fs::remove_file(net.join("10.0.0.2")).unwrap();
    {
        let mut s = open(&net);
        assert!(s.held_exact(&att("c1", "eth0")).unwrap().is_empty());
    }
    // the index file itself deleted or replaced by garbage
    std::fs::write(net.join(INDEX_NAME), b"junk").unwrap();
    {
        let mut s = open(&net);
        assert_eq!(s.held_exact(&att("c9", "eth0")).unwrap().len(), 1);
        assert_eq!(s.rebuilds, 1);
    }
}

#[test]
fn legacy_files_and_whitespace() {
    let (_d, net) = seeded(&[("10.0.0.4", b"old\n"), ("10.0.0.5", b" new\r\neth1\n"), ("10.0.0.6", b"")]);
    let mut s = open(&net);
    assert_eq!(s.held_legacy("old").unwrap().len(), 1);
    assert!(s.held_exact(&att("old", "eth0")).unwrap().is_empty());
    assert_eq!(s.held_exact(&att("new", "eth1")).unwrap().len(), 1);
    assert_eq!(s.owner_of(ip("10.0.0.6")).unwrap(), Some(Owner::Unknown));
    assert!(!s.is_free(ip("10.0.0.6")) && s.is_free(ip("10.0.0.7")));
}

#[test]
fn stale_named_temp_files_are_cleaned_by_a_scan() {
    let (_d, net) = seeded(&[(".host-local-tmp-123", b"c\r\neth0")]);
    let s = open(&net);
    assert!(s.scan().unwrap().is_empty());
    assert!(!net.join(".host-local-tmp-123").exists());
}

#[test]
fn last_reserved_roundtrip() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(&d.path().join("n"));
    assert_eq!(s.last_reserved(0).unwrap(), None);
    s.set_last_reserved(0, ip("10.0.0.7")).unwrap();
    s.set_last_reserved(1, ip("2001:db8::7")).unwrap();
    assert_eq!(s.last_reserved(0).unwrap(), Some(ip("10.0.0.7")));
    assert_eq!(std::fs::read_to_string(d.path().join("n/last_reserved_ip.1")).unwrap(), "2001:db8::7");
}

#[test]
fn missing_directory_without_create() {
    let d = tempfile::tempdir().unwrap();
    assert!(Store::open(&d.path().join("nope"), Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().is_none());
    assert!(!d.path().join("nope").exists());
}

/// Every file below `d` with its content.
fn files(d: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn an_aborted_call_leaves_every_file_as_it_was() {
    // A store as upstream leaves it: a reservation and the lock, no index.
    let (_d, net) = seeded(&[("10.0.0.9", b"up\r\neth0"), (LOCK_NAME, b"")]);
    let before = files(&net);
    let mut s = open(&net);
    assert!(reserve(&mut s, "10.0.0.2", "c1"));
    assert_eq!(s.held_exact(&att("c1", "eth0")).unwrap(), [(None, ip("10.0.0.2"))], "seen before finish");
    s.release_ip(&att("c1", "eth0"), ip("10.0.0.2")).unwrap();
    s.abort();
    assert_eq!(files(&net), before, "no index appeared, nothing else changed");

    // With a trusted index: its bytes and its trust survive an aborted call.
    let mut s = open(&net);
    assert!(reserve(&mut s, "10.0.0.3", "c3"));
    s.finish();
    drop(s);
    let before = files(&net);
    let mut s = open(&net);
    assert!(reserve(&mut s, "10.0.0.4", "c4"));
    s.release_ip(&att("c4", "eth0"), ip("10.0.0.4")).unwrap();
    s.abort();
    assert_eq!(files(&net), before);
    let mut s = open(&net);
    assert_eq!(s.held_exact(&att("c3", "eth0")).unwrap().len(), 1);
    assert_eq!(s.rebuilds, 0, "the index is still trusted");
}

#[test]
fn read_only_calls_write_nothing() {
    // upstream's store without its lock, and a leftover temp file of ours
    let (_d, net) = seeded(&[("10.0.0.9", b"up\r\neth0"), (".host-local-tmp-1", b"x")]);
    let before = files(&net);
    let mut s = Store::open(&net, Access::Read, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
    assert_eq!(s.held_exact(&att("up", "eth0")).unwrap().len(), 1);
    assert!(s.held_legacy("up").unwrap().is_empty());
    assert_eq!(s.rebuilds, 1, "scanned, in memory");
    s.finish();
    drop(s);
    assert_eq!(files(&net), before, "no lock, no index, no clean-up");
}

#[test]
fn lock_and_cursor_links_are_refused_and_their_targets_left_alone() {
    let (d, net) = seeded(&[("10.0.0.9", b"up\r\neth0")]);
    let target = d.path().join("target");
    std::os::unix::fs::symlink(&target, net.join(LOCK_NAME)).unwrap();
    for access in [Access::Add, Access::Change, Access::Read] {
        let e = Store::open(&net, access, DEFAULT_LOCK_TIMEOUT).err().unwrap();
        assert_eq!(e.code, code::IO);
        assert_eq!(
            e.msg,
            format!("open {}/lock: a symbolic link, which is not followed", net.display()),
            "{access:?}"
        );
    }
    assert!(!target.exists());
    std::fs::remove_file(net.join(LOCK_NAME)).unwrap();
    std::fs::write(&target, "victim").unwrap();
    std::os::unix::fs::symlink(&target, net.join("last_reserved_ip.0")).unwrap();
    let mut s = open(&net);
    let cursor = net.join("last_reserved_ip.0");
    let e = s.last_reserved(0).unwrap_err();
    assert_eq!(e.msg, format!("read {}: a symbolic link, which is not followed", cursor.display()));
    let e = s.set_last_reserved(0, ip("10.0.0.2")).unwrap_err();
    assert_eq!(e.msg, format!("write {}: a symbolic link, which is not followed", cursor.display()));
    assert_eq!(std::fs::read(&target).unwrap(), b"victim");
}

#[test]
fn a_store_others_can_write_is_refused_by_add_only() {
    use std::os::unix::fs::PermissionsExt;
    let (_d, net) = seeded(&[]);
    std::fs::set_permissions(&net, std::fs::Permissions::from_mode(0o775)).unwrap();
    let e = Store::open(&net, Access::Add, DEFAULT_LOCK_TIMEOUT).err().unwrap();
    assert!(e.msg.contains("group or others may write it (mode 0775)"), "{}", e.msg);
    assert!(Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().is_some());
    assert!(Store::usable(&net, 1).unwrap_err().contains("not safe to allocate from"));
}

#[test]
fn records_apply_only_to_the_file_they_were_written_for() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    s.note = Some(NsNote { id: NsIdent { ino: 7, cookie: 8 }, path: "/run/netns/x".into() });
    assert!(reserve(&mut s, "10.0.0.2", "c1"));
    assert!(reserve(&mut s, "10.0.0.3", "c2"));
    s.finish();
    let recs = s.records();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].1.file, s.file_id(ip("10.0.0.2")).unwrap());
    assert_eq!(recs[0].1.path, "/run/netns/x");
    // Another writer (upstream) released 10.0.0.2 and reserved it again, same content.
    std::fs::remove_file(net.join("10.0.0.2")).unwrap();
    std::fs::write(net.join("10.0.0.2"), b"c1\r\neth0").unwrap();
    let released = s.reclaim(|_| Some("judged dead".into())).unwrap();
    assert_eq!(
        released.iter().map(|r| r.0).collect::<Vec<_>>(),
        [ip("10.0.0.3")],
        "only the file its record names"
    );
    assert!(net.join("10.0.0.2").exists());
    assert!(s.records().is_empty(), "the stale record went too");
    assert!(s.held_exact(&att("c2", "eth0")).unwrap().is_empty());
}

#[test]
fn transient_errors_say_try_again() {
    assert_eq!(io_err("remove x", Errno::EBUSY).code, code::TRY_AGAIN);
    assert_eq!(io_err("lock x", Errno::EINTR).code, code::TRY_AGAIN);
    assert_eq!(io_err("x", Errno::EAGAIN).code, code::TRY_AGAIN);
    let e = io_err("remove /d/10.0.0.2", Errno::EROFS);
    assert_eq!(e.code, code::IO);
    assert_eq!(e.msg, "remove /d/10.0.0.2: Read-only file system (os error 30)");
}

/// The names in directory `d`, sorted.
fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

fn note(path: &str) -> Option<NsNote> {
    Some(NsNote { id: NsIdent { ino: 7, cookie: 8 }, path: path.into() })
}

fn ips(held: &[Held]) -> Vec<IpAddr> {
    held.iter().map(|h| h.1).collect()
}

#[test]
fn a_store_directory_that_is_a_link_or_a_file_is_refused() {
    let (d, real) = seeded(&[]);
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let file = d.path().join("file");
    std::fs::write(&file, "").unwrap();
    for access in [Access::Add, Access::Change, Access::Read] {
        let e = Store::open(&link, access, DEFAULT_LOCK_TIMEOUT).err().unwrap();
        assert_eq!(e.code, code::IO);
        assert_eq!(e.msg, format!("store directory {} is a symbolic link, not a directory", link.display()));
    }
    for access in [Access::Change, Access::Read] {
        let e = Store::open(&file, access, DEFAULT_LOCK_TIMEOUT).err().unwrap();
        assert_eq!(e.msg, format!("store directory {} is a regular file, not a directory", file.display()));
    }
    assert_eq!(names(&real), Vec::<String>::new(), "nothing made through the link");
    let why = Store::usable(&link, 1).unwrap_err();
    assert_eq!(why, format!("store directory {} is a symbolic link, not a directory", link.display()));
    let why = Store::usable(&file, 1).unwrap_err();
    assert_eq!(why, format!("store directory {} is a regular file, not a directory", file.display()));
}

#[test]
fn status_finds_a_store_usable_only_when_an_add_could_work() {
    let (d, net) = seeded(&[("last_reserved_ip.0", b"10.0.0.5"), (LOCK_NAME, b"")]);
    assert_eq!(Store::usable(&net, 2), Ok(()), "regular lock and cursor; cursor 1 not made yet");
    assert_eq!(Store::usable(&d.path().join("new/net"), 1), Ok(()), "ADD would create it");
    std::fs::write(d.path().join("plain"), "").unwrap();
    let under_file = d.path().join("plain/net");
    let why = Store::usable(&under_file, 1).unwrap_err();
    assert_eq!(why, format!("open {}: Not a directory (os error 20)", under_file.display()));
    std::os::unix::fs::symlink("/etc/hostname", net.join("last_reserved_ip.1")).unwrap();
    assert_eq!(Store::usable(&net, 1), Ok(()), "one range set: cursor 1 is not used");
    let why = Store::usable(&net, 2).unwrap_err();
    assert_eq!(why, format!("{}/last_reserved_ip.1 is a symbolic link, not a regular file", net.display()));
    std::fs::remove_file(net.join(LOCK_NAME)).unwrap();
    nix::unistd::mkfifo(&net.join(LOCK_NAME), Mode::from_bits_truncate(0o600)).unwrap();
    let why = Store::usable(&net, 1).unwrap_err();
    assert_eq!(why, format!("{}/lock is a FIFO, not a regular file", net.display()));
}

#[test]
fn check_and_status_share_the_lock_and_changes_wait_for_every_holder() {
    let (_d, net) = net_dir();
    drop(open(&net));
    let short = Duration::from_millis(20);
    let check1 = Store::open(&net, Access::Read, short).unwrap().unwrap();
    let check2 = Store::open(&net, Access::Read, short).unwrap().unwrap();
    for access in [Access::Change, Access::Add] {
        let e = Store::open(&net, access, short).err().unwrap();
        assert_eq!(e.code, code::TRY_AGAIN, "{access:?}");
        assert!(e.msg.starts_with(&format!("lock {}/lock: ", net.display())), "{}", e.msg);
    }
    drop((check1, check2));
    let del = Store::open(&net, Access::Change, short).unwrap().unwrap();
    let e = Store::open(&net, Access::Read, short).err().unwrap();
    assert_eq!(e.code, code::TRY_AGAIN, "CHECK waits for a DEL");
    drop(del);
}

#[test]
fn a_store_directory_removed_under_the_call_is_never_used_without_its_lock() {
    let (_d, net) = seeded(&[]);
    let dirf = File::open(&net).unwrap();
    std::fs::remove_dir(&net).unwrap();
    for access in [Access::Add, Access::Change] {
        let e = Store::open_lock(&dirf, &net, access).unwrap_err();
        assert_eq!(
            (e.code, e.msg),
            (code::IO, format!("open {}/lock: No such file or directory (os error 2)", net.display()))
        );
    }
    assert!(Store::open_lock(&dirf, &net, Access::Read).unwrap().is_none(), "CHECK: no lock to share");
}

#[test]
fn who_holds_an_address_that_is_no_reservation_file() {
    let (_d, net) = seeded(&[("10.0.0.2", b"c1\r\neth0")]);
    nix::unistd::mkfifo(&net.join("10.0.0.5"), Mode::from_bits_truncate(0o600)).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(net.join("10.0.0.6")).unwrap();
    let s = open(&net);
    assert_eq!(s.owner_of(ip("10.0.0.7")).unwrap(), None, "no file: nobody");
    assert_eq!(
        s.owner_of(ip("10.0.0.5")).unwrap(),
        Some(Owner::Foreign("not a regular file but a FIFO".into()))
    );
    let e = s.owner_of(ip("10.0.0.6")).unwrap_err();
    assert_eq!(
        (e.code, e.msg),
        (code::IO, format!("read {}/10.0.0.6: No such device or address (os error 6)", net.display()))
    );
    assert_eq!(
        s.owner_of(ip("10.0.0.2")).unwrap(),
        Some(Owner::Attachment { id: "c1".into(), ifname: "eth0".into() })
    );
}

#[test]
fn every_change_leaves_an_index_the_next_call_trusts() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    for (addr, id) in [("10.0.0.2", "c1"), ("10.0.0.3", "c2"), ("10.0.0.4", "c3")] {
        assert!(reserve(&mut s, addr, id));
    }
    s.finish();
    drop(s);
    // DEL of c2: found in the on-disk index, released from it
    let mut s = Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
    let held = s.held_exact(&att("c2", "eth0")).unwrap();
    assert_eq!((s.rebuilds, held.len()), (0, 1));
    assert!(held[0].0.is_some(), "an index slot");
    s.release(held[0].0, held[0].1).unwrap();
    s.finish();
    drop(s);
    let dirf = File::open(&net).unwrap();
    let idx = Index::open(dirf.as_fd(), false).unwrap();
    assert_eq!(idx.live(), 2);
    assert!(idx.lookup(Kind::Attachment, key_hash(Kind::Attachment, "c2", "eth0")).unwrap().is_empty());
    // One call reserves two addresses and releases one of them again (an ADD that meets
    // an earlier incarnation's reservation, or a rollback).
    let mut s = open(&net);
    assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("10.0.0.2")]);
    assert!(s.held_exact(&att("c2", "eth0")).unwrap().is_empty());
    assert!(reserve(&mut s, "10.0.0.5", "c4"));
    assert!(reserve(&mut s, "10.0.0.6", "c5"));
    s.release(None, ip("10.0.0.5")).unwrap();
    s.finish();
    drop(s);
    let mut s = open(&net);
    assert_eq!(ips(&s.held_exact(&att("c5", "eth0")).unwrap()), [ip("10.0.0.6")]);
    assert!(s.held_exact(&att("c4", "eth0")).unwrap().is_empty());
    assert_eq!(ips(&s.held_exact(&att("c3", "eth0")).unwrap()), [ip("10.0.0.4")]);
    assert_eq!(s.rebuilds, 0, "every index above was trusted");
}

#[test]
fn the_directory_is_stamped_one_second_in_the_past() {
    // A later change by anyone sets the mtime to the current time, which can then never
    // equal the stamp, even where timestamps have a resolution of one second.
    let (_d, net) = net_dir();
    let mut s = open(&net);
    assert!(reserve(&mut s, "10.0.0.2", "c1"));
    let before = std::time::SystemTime::now();
    s.finish();
    let after = std::time::SystemTime::now();
    let m = std::fs::metadata(&net).unwrap().modified().unwrap();
    let second = Duration::from_secs(1);
    assert!(before - second <= m && m <= after - second, "{m:?} not 1 s before {before:?} … {after:?}");
}

#[test]
fn an_index_damaged_during_a_call_gives_way_to_the_files() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    assert!(reserve(&mut s, "10.0.0.2", "c1"));
    assert!(reserve(&mut s, "10.0.0.3", "c2"));
    s.finish();
    drop(s);
    let mut s = Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
    assert_eq!(s.held_exact(&att("c1", "eth0")).unwrap().len(), 1, "index loaded");
    let f = std::fs::OpenOptions::new().write(true).open(net.join(INDEX_NAME)).unwrap();
    f.set_len(4096).unwrap(); // the table is gone
    let held = s.held_exact(&att("c1", "eth0")).unwrap();
    assert_eq!(held, [(None, ip("10.0.0.2"))], "from a scan");
    s.release(None, ip("10.0.0.2")).unwrap();
    assert_eq!(s.held_exact(&att("c2", "eth0")).unwrap(), [(None, ip("10.0.0.3"))]);
    s.finish();
    drop(s);
    let mut s = open(&net);
    assert_eq!(ips(&s.held_exact(&att("c2", "eth0")).unwrap()), [ip("10.0.0.3")]);
    assert!(s.held_exact(&att("c1", "eth0")).unwrap().is_empty());
    assert_eq!(s.rebuilds, 1, "the damaged index was not stamped as trusted");
}

#[test]
fn without_o_tmpfile_a_named_temp_file_is_linked_and_always_removed() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    assert!(s.held_exact(&att("c1", "eth0")).unwrap().is_empty(), "index loaded, as reserve does first");
    // The name a later call's scan recognises as a leftover (a killed call's) and removes.
    let tmp = format!(".host-local-tmp-{}", std::process::id());
    let p = s.pending_named(b"c1\r\neth0".to_vec()).unwrap();
    assert_eq!(std::fs::read(net.join(&tmp)).unwrap(), b"c1\r\neth0");
    drop(p);
    assert!(!net.join(&tmp).exists(), "an unused one is removed");
    let mut p = Some(s.pending_named(b"c1\r\neth0".to_vec()).unwrap());
    assert!(s.reserve(&mut p, ip("10.0.0.2"), &att("c1", "eth0")).unwrap());
    s.finish();
    assert_eq!(std::fs::read(net.join("10.0.0.2")).unwrap(), b"c1\r\neth0");
    assert_eq!(names(&net), [INDEX_NAME, "10.0.0.2", "lock"], "no temp file left");
}

/// An index that cannot be written (its temporary name taken by a directory here; a full
/// filesystem in practice): the call works from the files, publishes no index, and the next
/// call finds the reservations all the same.
#[test]
fn without_a_writable_index_the_call_works_from_the_files() {
    let (_d, net) = seeded(&[("10.0.0.3", b"c2\r\neth0")]);
    std::fs::create_dir_all(net.join(".host-local-index.tmp/x")).unwrap();
    let mut s = open(&net);
    assert!(reserve(&mut s, "10.0.0.2", "c1"));
    assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("10.0.0.2")]);
    assert_eq!(ips(&s.held_exact(&att("c2", "eth0")).unwrap()), [ip("10.0.0.3")]);
    s.finish();
    assert_eq!(names(&net), [".host-local-index.tmp", "10.0.0.2", "10.0.0.3", "lock"], "no index published");
    drop(s);
    let mut s = open(&net);
    assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("10.0.0.2")]);
}

/// A scan later in the same call (after an index read error, during an exhaustion
/// reclaim) removed the call's own pending temp file, and the next candidate's link failed.
#[test]
fn a_scan_during_the_call_keeps_its_own_named_temp_file() {
    let (_d, net) = seeded(&[(".host-local-tmp-1", b"stale")]);
    let mut s = open(&net);
    assert!(s.held_exact(&att("c1", "eth0")).unwrap().is_empty());
    assert!(!net.join(".host-local-tmp-1").exists(), "another process's is stale");
    let mut p = Some(s.pending_named(b"c1\r\neth0".to_vec()).unwrap());
    s.rebuild().unwrap();
    assert!(s.reserve(&mut p, ip("10.0.0.2"), &att("c1", "eth0")).unwrap());
    assert_eq!(std::fs::read(net.join("10.0.0.2")).unwrap(), b"c1\r\neth0");
}

/// A record is replaced by a new file, never rewritten in place: whoever opened the old one
/// reads it whole (where the filesystem has O_TMPFILE, as here).
#[test]
fn replace_file_puts_a_new_file_in_place() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("f"), b"the old record").unwrap();
    let old = File::open(d.path().join("f")).unwrap();
    let dirf = File::open(d.path()).unwrap();
    replace_file(dirf.as_fd(), "f", b"new").unwrap();
    assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"new");
    assert_eq!(std::io::read_to_string(old).unwrap(), "the old record");
    assert_eq!(names(d.path()), ["f"]);
}

#[test]
fn cursors_are_put_back_as_they_were() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    let cursor = net.join("last_reserved_ip.0");
    assert_eq!(s.cursor_snapshot(0), None);
    s.set_last_reserved(0, ip("10.0.0.5")).unwrap();
    let saved = s.cursor_snapshot(0);
    assert_eq!(saved.as_deref(), Some(&b"10.0.0.5"[..]));
    s.set_last_reserved(0, ip("10.0.0.9")).unwrap();
    s.restore_cursor(0, saved).unwrap();
    assert_eq!(std::fs::read(&cursor).unwrap(), b"10.0.0.5");
    s.restore_cursor(0, None).unwrap();
    assert!(!cursor.exists(), "no cursor before: none after");
}

#[test]
fn records_are_written_for_what_the_call_still_holds() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    s.note = note("/run/netns/x");
    assert!(reserve(&mut s, "10.0.0.2", "c1"));
    assert!(reserve(&mut s, "10.0.0.3", "c2"));
    s.release(None, ip("10.0.0.2")).unwrap();
    s.finish();
    assert_eq!(s.records().into_iter().map(|r| r.0).collect::<Vec<_>>(), [ip("10.0.0.3")]);
    let rec = s.record(ip("10.0.0.3")).unwrap();
    assert_eq!(
        (rec.path.as_str(), rec.ns, rec.boot),
        ("/run/netns/x", NsIdent { ino: 7, cookie: 8 }, boot_id().unwrap())
    );
    assert_eq!(Some(rec.file), s.file_id(ip("10.0.0.3")));
    assert!(s.record(ip("10.0.0.2")).is_none());
}

#[test]
fn reclaim_releases_what_is_judged_dead_and_keeps_the_rest_in_the_index() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    s.note = note("/run/netns/x");
    assert!(reserve(&mut s, "10.0.0.2", "c1"));
    assert!(reserve(&mut s, "2001:db8::2", "c1"));
    s.finish();
    drop(s);
    let mut s = open(&net);
    let v4 = s.file_id(ip("10.0.0.2"));
    let released = s.reclaim(|rec| (Some(rec.file) == v4).then(|| "gone".to_string())).unwrap();
    let c1 = Owner::Attachment { id: "c1".into(), ifname: "eth0".into() };
    assert_eq!(released, [(ip("10.0.0.2"), c1, "gone".to_string())]);
    s.finish();
    drop(s);
    assert!(!net.join("10.0.0.2").exists());
    let mut s = open(&net);
    assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("2001:db8::2")]);
    assert_eq!(s.rebuilds, 0);
    assert_eq!(s.records().into_iter().map(|r| r.0).collect::<Vec<_>>(), [ip("2001:db8::2")]);
}

#[test]
fn gc_removes_what_is_not_kept_with_its_record_and_stale_records() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    s.note = note("/run/netns/x");
    for (addr, id) in [("10.0.0.2", "c1"), ("10.0.0.3", "c2"), ("10.0.0.4", "c3")] {
        assert!(reserve(&mut s, addr, id));
    }
    s.finish();
    drop(s);
    // upstream released 10.0.0.3 and reserved it again: its record is for another file
    std::fs::remove_file(net.join("10.0.0.3")).unwrap();
    std::fs::write(net.join("10.0.0.3"), b"c2\r\neth0").unwrap();
    let mut s = Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
    let c1 = Owner::Attachment { id: "c1".into(), ifname: "eth0".into() };
    let (removed, errors) = s.retain(|o| *o != c1).unwrap();
    assert_eq!((removed, errors.len()), (vec![ip("10.0.0.2")], 0));
    s.finish();
    assert_eq!(names(&net), [INDEX_NAME, RECORDS_DIR, "10.0.0.3", "10.0.0.4", "lock"]);
    assert_eq!(s.records().into_iter().map(|r| r.0).collect::<Vec<_>>(), [ip("10.0.0.4")]);
}

#[test]
fn gc_of_an_upstream_store_leaves_an_index_even_when_it_removes_nothing() {
    let (_d, net) = seeded(&[("10.0.0.2", b"c1\r\neth0"), (LOCK_NAME, b"")]);
    let mut s = Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
    assert!(s.retain(|_| true).unwrap().0.is_empty());
    s.finish();
    drop(s);
    let mut s = open(&net);
    assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("10.0.0.2")]);
    assert_eq!(s.rebuilds, 0, "the index GC wrote is trusted");
}

#[test]
fn the_boot_marker_says_which_boot_last_dealt_with_earlier_boots() {
    let (_d, net) = net_dir();
    let mut s = open(&net);
    assert_eq!(s.boot(), boot_id());
    assert_eq!(s.records_boot(), None, "no records");
    s.note = note("/run/netns/x");
    assert!(reserve(&mut s, "10.0.0.2", "c1"));
    s.finish();
    assert_eq!(s.records_boot(), boot_id(), "a new records directory: nothing of earlier boots");
    let marker = net.join(RECORDS_DIR).join(BOOT_MARKER);
    std::fs::write(&marker, record::boot_marker(&[9; 16])).unwrap();
    assert_eq!(s.records_boot(), Some([9; 16]));
    s.set_records_boot();
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), record::boot_marker(&boot_id().unwrap()));
    std::fs::write(&marker, "junk").unwrap();
    assert_eq!(s.records_boot(), Some([0; 16]), "damaged: some earlier boot");
    std::fs::remove_file(&marker).unwrap();
    assert_eq!(s.records_boot(), Some([0; 16]), "missing: some earlier boot");
}

#[test]
fn a_records_directory_that_is_a_link_or_a_file_is_not_used() {
    let (d, net) = seeded(&[]);
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join(BOOT_MARKER), record::boot_marker(&[9; 16])).unwrap();
    std::os::unix::fs::symlink(&elsewhere, net.join(RECORDS_DIR)).unwrap();
    let mut s = open(&net);
    assert_eq!(s.records_boot(), None);
    s.note = note("/run/netns/x");
    assert!(reserve(&mut s, "10.0.0.2", "c1"));
    s.finish();
    assert!(s.records().is_empty());
    assert_eq!(names(&elsewhere), [BOOT_MARKER], "nothing written through the link");
    std::fs::remove_file(net.join(RECORDS_DIR)).unwrap();
    std::fs::write(net.join(RECORDS_DIR), record::boot_marker(&[9; 16])).unwrap();
    assert_eq!(s.records_boot(), None);
    assert!(s.record(ip("10.0.0.2")).is_none());
}

#[test]
fn reservation_content_is_upstreams_and_reads_back() {
    let a = AttachmentId::new("n", " c1 ", "eth0");
    assert_eq!(Owner::content_of(&a), "c1\r\neth0");
    assert_eq!(
        Owner::parse(Owner::content_of(&a).as_bytes()),
        Owner::Attachment { id: "c1".into(), ifname: "eth0".into() }
    );
}
