//! The verbs through the fake namespace and store: every failure point of ADD leaves the
//! container as it was, DEL after an ADD killed anywhere restores the link, CHECK, GC.

use crate::config::{Conf, LinkSettings, Sysctl};
use crate::kernel::fake::{Fake, MemStore};
use crate::kernel::Kernel;
use crate::{add, check, del, gc};
use cni_common::attachment::AttachmentId;
use cni_common::mac::Mac;
use cni_common::netlink::Link;
use cni_common::spec::result::{CniResult, Interface};
use std::path::PathBuf;

const FILE: &str = "c0ffee_eth0.json";

fn ns() -> Fake {
    let mut k = Fake::default();
    k.links.push(Link {
        index: 2,
        name: "eth0".into(),
        mtu: 1500,
        mac: Some([2, 0, 0, 0, 0, 9]),
        txqlen: 1000,
        ..Link::default()
    });
    k.sysctls.insert("net/ipv4/conf/eth0/arp_filter".into(), "0".into());
    k.sysctls.insert("net/core/somaxconn".into(), "4096".into());
    k
}

fn conf() -> Conf {
    Conf {
        sysctls: vec![
            Sysctl {
                key: "net.ipv4.conf.IFNAME.arp_filter".into(),
                path: "net/ipv4/conf/eth0/arp_filter".into(),
                value: "1".into(),
            },
            Sysctl {
                key: "net.core.somaxconn".into(),
                path: "net/core/somaxconn".into(),
                value: "512".into(),
            },
        ],
        link: LinkSettings {
            mac: Some(Mac([2, 0, 0, 0, 0, 0x42])),
            promisc: true,
            mtu: Some(1400),
            allmulti: Some(true),
            txqlen: Some(5),
        },
        data_dir: PathBuf::from("/run/cni/tuning"),
    }
}

fn prev() -> CniResult {
    CniResult {
        interfaces: vec![Interface {
            name: "eth0".into(),
            mac: "02:00:00:00:00:09".into(),
            sandbox: "/x".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn run_add(k: &mut Fake, s: &mut MemStore) -> cni_common::Result<CniResult> {
    add::run(k, s, &conf(), "eth0", FILE, "net1", prev())
}

#[test]
fn add_tunes_saves_and_del_restores() {
    let (mut k, mut s) = (ns(), MemStore::default());
    let before = k.clone();
    let r = run_add(&mut k, &mut s).unwrap();
    assert_eq!(r.interfaces[0].mac, "02:00:00:00:00:42", "the result has the new MAC");
    let l = k.link("eth0").unwrap().unwrap();
    assert_eq!(
        (l.mtu, l.txqlen, l.promisc(), l.allmulti(), l.mac),
        (1400, 5, true, true, Some([2, 0, 0, 0, 0, 0x42]))
    );
    assert_eq!(k.sysctls["net/core/somaxconn"], "512");
    let saved = &s.files[FILE];
    assert_eq!(
        (saved.mtu, saved.txqlen, saved.promisc, saved.allmulti, saved.mac.as_str()),
        (1500, Some(1000), Some(false), Some(false), "02:00:00:00:00:09")
    );
    check::run(&mut k, &conf(), "eth0").unwrap();
    // A second ADD keeps what was there before the first.
    run_add(&mut k, &mut s).unwrap();
    assert_eq!(s.files[FILE].mtu, 1500);
    del::run(Some(&mut k), &mut s, "eth0", FILE).unwrap();
    assert_eq!(k.links, before.links, "the link is as it was");
    assert!(s.files.is_empty());
    // idempotent; and with the namespace gone the file goes
    del::run(Some(&mut k), &mut s, "eth0", FILE).unwrap();
    run_add(&mut k, &mut s).unwrap();
    del::run(None, &mut s, "eth0", FILE).unwrap();
    assert!(s.files.is_empty());
}

#[test]
fn every_failure_point_of_add_leaves_the_container_as_it_was() {
    let (mut k, mut s) = (ns(), MemStore::default());
    run_add(&mut k, &mut s).unwrap();
    let total = k.changes;
    assert_eq!(total, 7, "two sysctls, five link settings");
    for n in 1..=total {
        let mut k = Fake { fail_at: Some(n), ..ns() };
        let mut s = MemStore::default();
        let before = ns();
        assert!(run_add(&mut k, &mut s).is_err(), "failure at {n}");
        assert_eq!(k.links, before.links, "failure at {n}");
        assert_eq!(k.sysctls, before.sysctls, "failure at {n}");
        assert!(s.files.is_empty(), "failure at {n}: {:?}", s.files);
    }
    // The file cannot be written: nothing of the link changes, the sysctls are put back.
    let (mut k, mut s) = (ns(), MemStore { fail_save: true, ..Default::default() });
    assert!(run_add(&mut k, &mut s).is_err());
    assert_eq!((k.links.clone(), k.sysctls.clone()), (ns().links, ns().sysctls));
}

#[test]
fn del_after_an_add_killed_anywhere_restores_the_link() {
    for n in 1..=7 {
        let mut k = Fake { crash_at: Some(n), ..ns() };
        let mut s = MemStore::default();
        let killed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = run_add(&mut k, &mut s);
        }));
        assert!(killed.is_err());
        k.crash_at = None;
        del::run(Some(&mut k), &mut s, "eth0", FILE).unwrap();
        assert_eq!(k.links, ns().links, "killed at {n}");
        assert!(s.files.is_empty());
    }
}

#[test]
fn a_missing_link_or_sysctl_fails_before_anything_changes() {
    let mut k = ns();
    k.links.clear();
    let mut s = MemStore::default();
    assert!(run_add(&mut k, &mut s).unwrap_err().msg.contains("eth0"));
    let mut k = ns();
    k.sysctls.remove("net/core/somaxconn");
    assert!(run_add(&mut k, &mut s).is_err());
    assert_eq!(k.changes, 0);
    assert!(s.files.is_empty());
}

#[test]
fn check_compares_every_setting() {
    type Tamper = fn(&mut Fake);
    let cases: [(&str, Tamper); 6] = [
        ("somaxconn", |k| *k.sysctls.get_mut("net/core/somaxconn").unwrap() = "1".into()),
        ("Ethernet", |k| k.links[0].mac = Some([2, 0, 0, 0, 0, 1])),
        ("promisc", |k| k.links[0].flags &= !0x100),
        ("MTU", |k| k.links[0].mtu = 1500),
        ("all-multicast", |k| k.links[0].flags &= !0x200),
        ("Transmit Queue", |k| k.links[0].txqlen = 1),
    ];
    for (part, tamper) in cases {
        let (mut k, mut s) = (ns(), MemStore::default());
        run_add(&mut k, &mut s).unwrap();
        tamper(&mut k);
        let e = check::run(&mut k, &conf(), "eth0").unwrap_err();
        assert!(e.msg.contains(part), "{part}: {}", e.msg);
    }
    // promisc not configured: a promiscuous link fails CHECK, as upstream
    let mut k = ns();
    k.links[0].flags |= 0x100;
    let plain = Conf { sysctls: vec![], link: LinkSettings::default(), data_dir: PathBuf::new() };
    assert!(check::run(&mut k, &plain, "eth0").is_err());
}

#[test]
fn gc_removes_only_this_networks_files_of_dead_attachments() {
    let mut s = MemStore::default();
    let saved = |net: &str| crate::saved::Saved { mtu: 1500, network: net.into(), ..Default::default() };
    s.files.insert("live_eth0.json".into(), saved("net1"));
    s.files.insert("dead_eth0.json".into(), saved("net1"));
    s.files.insert("other_eth0.json".into(), saved("net2"));
    s.files.insert("upstream_eth0.json".into(), saved(""));
    let removed = gc::run(&mut s, "net1", &[AttachmentId::new("net1", "live", "eth0")]).unwrap();
    assert_eq!(removed, vec!["dead_eth0.json"]);
    assert_eq!(s.files.len(), 3);
}

/// Mutation triage (issue 28): the link is read, its file loaded and its settings changed only
/// when some link setting is asked for, each one alone counting; sysctls alone leave a missing
/// link alone.
#[test]
fn the_link_is_needed_only_when_a_link_setting_is_asked_for() {
    let none = LinkSettings { mac: None, promisc: false, mtu: None, allmulti: None, txqlen: None };
    assert!(!none.any());
    let each = [
        LinkSettings { mac: Some(Mac([2, 0, 0, 0, 0, 1])), ..none.clone() },
        LinkSettings { promisc: true, ..none.clone() },
        LinkSettings { mtu: Some(1400), ..none.clone() },
        LinkSettings { allmulti: Some(false), ..none.clone() },
        LinkSettings { txqlen: Some(0), ..none.clone() },
    ];
    for l in &each {
        assert!(l.any(), "{l:?}");
    }
    // Sysctls only, and the interface is not there: ADD sets them and touches no file.
    let mut k = ns();
    k.links.clear();
    let mut s = MemStore::default();
    let c = Conf { link: none, ..conf() };
    add::run(&mut k, &mut s, &c, "eth0", FILE, "net1", prev()).unwrap();
    assert_eq!(k.sysctls["net/core/somaxconn"], "512");
    assert!(s.files.is_empty());
    // One link setting, and the interface is not there: refused before anything changes.
    let mut k = ns();
    k.links.clear();
    let c = Conf { link: each[2].clone(), ..conf() };
    let e = add::run(&mut k, &mut s, &c, "eth0", FILE, "net1", prev()).unwrap_err();
    assert!(e.msg.contains("no such link"), "{}", e.msg);
    assert_eq!(k.sysctls, ns().sysctls);
}

/// A failed ADD puts back exactly what it changed, once each: a failure at the n-th change
/// costs n - 1 restoring calls, not a restore of every setting after every change.
#[test]
fn the_undo_of_a_failed_add_restores_each_change_once() {
    for n in 1..=7 {
        let mut k = Fake { fail_at: Some(n), ..ns() };
        let mut s = MemStore::default();
        assert!(run_add(&mut k, &mut s).is_err());
        assert_eq!(k.changes, n + (n - 1), "failure at change {n}");
        assert_eq!((k.links.clone(), k.sysctls.clone()), (ns().links, ns().sysctls), "failure at {n}");
    }
}
