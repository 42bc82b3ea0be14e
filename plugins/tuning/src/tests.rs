//! The verbs through the fake namespace and store: every failure point of ADD leaves the
//! container as it was, DEL after an ADD killed anywhere restores the link, CHECK, GC.

use crate::config::{Conf, LinkSettings, Sysctl};
use crate::kernel::fake::Fake;
use crate::kernel::Kernel;
use crate::saved::Saved;
use crate::store::fake::MemStore;
use crate::store::Names;
use crate::{add, check, del, gc};
use cni_common::attachment::AttachmentId;
use cni_common::mac::Mac;
use cni_common::netlink::Link;
use cni_common::spec::result::{CniResult, Interface};
use std::path::PathBuf;

const FILE: &str = "c0ffee_eth0.json";

fn names() -> Names {
    Names::new("c0ffee", "eth0")
}

fn ns() -> Fake {
    let mut k = Fake::default();
    k.links.push(Link {
        index: 2,
        name: "eth0".into(),
        kind: Some("veth".into()),
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
    assert_eq!(
        del::run(Some(&mut k), &mut s, "eth0", &names()).unwrap(),
        Vec::<String>::new(),
        "nothing to say"
    );
    assert_eq!(k.links, before.links, "the link is as it was");
    assert!(s.files.is_empty());
    // idempotent; and with the namespace gone the file goes
    del::run(Some(&mut k), &mut s, "eth0", &names()).unwrap();
    run_add(&mut k, &mut s).unwrap();
    del::run(None, &mut s, "eth0", &names()).unwrap();
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
        del::run(Some(&mut k), &mut s, "eth0", &names()).unwrap();
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
    let saved = |net: &str| Saved { mtu: 1500, network: net.into(), ..Default::default() };
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

/// Issue 37.4: whatever is at the saved name that no tuning wrote (a FIFO, a link, a file that
/// does not decode) is removed and DEL succeeds; the link is not touched.
#[test]
fn del_removes_what_is_not_ours_at_the_name_and_succeeds() {
    for what in ["a FIFO", "a symbolic link", "a file that is no saved settings"] {
        let (mut k, mut s) = (ns(), MemStore::default());
        s.foreign.insert(FILE.into(), what.into());
        let notes = del::run(Some(&mut k), &mut s, "eth0", &names()).unwrap();
        assert_eq!(notes, vec![format!("{FILE} is {what}, not settings a tuning saved: removed")]);
        assert!(s.foreign.is_empty() && s.files.is_empty(), "{what}");
        assert_eq!((k.links.clone(), k.changes), (ns().links, 0), "{what}");
    }
}

/// Issue 37.4: the pod replaced its interface after ADD (a macvlan under the name): DEL
/// succeeds, leaves the new link as it is and removes the file.
#[test]
fn del_leaves_a_link_that_replaced_the_tuned_one_alone() {
    let (mut k, mut s) = (ns(), MemStore::default());
    run_add(&mut k, &mut s).unwrap();
    k.links[0] = Link { index: 9, kind: Some("macvlan".into()), mtu: 1400, ..ns().links[0].clone() };
    let replaced = k.links.clone();
    let changes = k.changes;
    let notes = del::run(Some(&mut k), &mut s, "eth0", &names()).unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with(&format!("eth0: {FILE} not restored: the link now called eth0 (ifindex 9")),
        "{notes:?}"
    );
    assert_eq!((k.links.clone(), k.changes), (replaced, changes), "not one setting applied");
    assert!(s.files.is_empty());
}

/// Issue 37.4: a setting the kernel refuses does not stop the others, and DEL succeeds once:
/// the file is gone, the retry has nothing to do.
#[test]
fn a_refused_setting_does_not_fail_del_and_the_rest_is_restored() {
    for n in 1..=5 {
        let (mut k, mut s) = (ns(), MemStore::default());
        run_add(&mut k, &mut s).unwrap();
        k.fail_at = Some(k.changes + n);
        let notes = del::run(Some(&mut k), &mut s, "eth0", &names()).unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("eth0: could not restore ") && notes[0].contains("injected"),
            "{notes:?}"
        );
        assert!(s.files.is_empty(), "refused change {n}");
        assert_eq!(k.changes, 7 + 5, "every setting was tried (refused change {n})");
        let mut differs = 0;
        let (now, was) = (&k.links[0], &ns().links[0]);
        differs += usize::from(now.mtu != was.mtu) + usize::from(now.mac != was.mac);
        differs += usize::from(now.flags != was.flags) + usize::from(now.txqlen != was.txqlen);
        assert_eq!(differs, 1, "only the refused setting stays tuned (refused change {n}): {now:?}");
        assert_eq!(
            del::run(Some(&mut k), &mut s, "eth0", &names()).unwrap(),
            Vec::<String>::new(),
            "said once"
        );
        assert_eq!(k.changes, 12, "the retry changes nothing");
    }
    // a value no link takes, in a file: left, the file removed
    let (mut k, mut s) = (ns(), MemStore::default());
    s.files.insert(FILE.into(), Saved { mtu: -1, ..Default::default() });
    let notes = del::run(Some(&mut k), &mut s, "eth0", &names()).unwrap();
    assert_eq!(notes, vec![format!("eth0: {FILE} not restored: saved mtu -1 is not valid")]);
    assert_eq!((k.changes, s.files.len()), (0, 0));
}

/// Issue 37.4: ids and ifnames with `_` that upstream's name confuses (`a_b` + `c`, `a` + `b_c`)
/// each get their own file, and each DEL restores its own link.
#[test]
fn attachments_whose_upstream_names_collide_keep_their_own_settings() {
    let link = |name: &str, mtu| Link {
        index: 2,
        name: name.into(),
        mtu,
        kind: Some("veth".into()),
        ..Link::default()
    };
    let (mut k1, mut k2) = (Fake::default(), Fake::default());
    k1.links.push(link("c", 1500));
    k2.links.push(link("b_c", 1400));
    let (n1, n2) = (Names::new("a_b", "c"), Names::new("a", "b_c"));
    assert_eq!(n1.upstream, n2.upstream);
    let mut s = MemStore::default();
    let c = Conf { sysctls: vec![], link: LinkSettings { mtu: Some(1300), ..Default::default() }, ..conf() };
    add::run(&mut k1, &mut s, &c, "c", &n1.ours, "net1", prev()).unwrap();
    add::run(&mut k2, &mut s, &c, "b_c", &n2.ours, "net1", prev()).unwrap();
    assert_eq!(s.files.len(), 2);
    del::run(Some(&mut k2), &mut s, "b_c", &n2).unwrap();
    del::run(Some(&mut k1), &mut s, "c", &n1).unwrap();
    assert_eq!((k1.links[0].mtu, k2.links[0].mtu), (1500, 1400));
    assert!(s.files.is_empty());
}

/// DEL after a switch from upstream: ours is looked for first, then upstream's exact name,
/// whose file (no identity) restores as upstream's DEL would.
#[test]
fn del_restores_from_a_file_at_upstreams_name() {
    let (mut k, mut s) = (ns(), MemStore::default());
    k.links[0].name = "e_0".into();
    k.links[0].mtu = 1300;
    s.files.insert("x_y_e_0.json".into(), Saved { mtu: 1500, ..Default::default() });
    let n = Names::new("x_y", "e_0");
    del::run(Some(&mut k), &mut s, "e_0", &n).unwrap();
    assert_eq!(s.loads, vec!["+x_y+e_0.json", "x_y_e_0.json"]);
    assert_eq!(k.links[0].mtu, 1500);
    assert!(s.files.is_empty());
    // ours wins when both are there; upstream's (maybe another attachment's) is left
    let (mut k, mut s) = (ns(), MemStore::default());
    k.links[0].name = "e_0".into();
    s.files.insert(
        "+x_y+e_0.json".into(),
        Saved { mtu: 1400, ifindex: Some(2), kind: Some("veth".into()), ..Default::default() },
    );
    s.files.insert("x_y_e_0.json".into(), Saved { mtu: 1500, ..Default::default() });
    del::run(Some(&mut k), &mut s, "e_0", &n).unwrap();
    assert_eq!(k.links[0].mtu, 1400);
    assert_eq!(s.files.keys().collect::<Vec<_>>(), vec!["x_y_e_0.json"]);
}

/// GC keeps both names of a valid attachment (an earlier build of ours wrote upstream's).
#[test]
fn gc_keeps_a_valid_attachments_files_under_either_name() {
    let mut s = MemStore::default();
    let saved = Saved { mtu: 1500, network: "net1".into(), ..Default::default() };
    for f in ["+a_b+c.json", "a_b_c.json", "+dead+c_d.json", "dead_c_d.json"] {
        s.files.insert(f.into(), saved.clone());
    }
    s.foreign.insert("fifo_eth0.json".into(), "a FIFO".into());
    let mut removed = gc::run(&mut s, "net1", &[AttachmentId::new("net1", "a_b", "c")]).unwrap();
    removed.sort();
    assert_eq!(removed, vec!["+dead+c_d.json", "dead_c_d.json"]);
    assert!(s.foreign.contains_key("fifo_eth0.json"), "not this network's: left");
}
