//! The verbs against the fake kernel: every behaviour of the plugin that does not need packets,
//! interleavings of verbs and lost answers included, and random sequences of verbs by several
//! attachments that must keep the invariants.

use super::*;
use crate::config::PortMapConf;
use crate::config::{Conf, Intent};
use crate::flow;
use crate::kernel::fake::{Fake, Fault};
use crate::layout::{self, LAYOUT_SET};
use crate::model::{Elem, Key, NsId, Owner, Set, Target};
use cni_common::netlink::nft::{NftElem, NftExpr};
use cni_common::spec::json;
use cni_common::spec::result::{CniResult, Interface, IpConfig};
use serde_json::json;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

/// An attachment of a test: its configuration and intent.
#[derive(Clone)]
struct Pod {
    conf: Conf,
    intent: Intent,
}

fn conf(v: serde_json::Value) -> Conf {
    let raw: PortMapConf = json::from_value(v).unwrap();
    Conf::from_raw(&raw).unwrap()
}

fn maps(ports: &[(u16, u16, &str)]) -> serde_json::Value {
    json!(ports
        .iter()
        .map(|(h, c, p)| json!({"hostPort": h, "containerPort": c, "protocol": p}))
        .collect::<Vec<_>>())
}

fn pod_with(
    net: &str,
    ctr: &str,
    ifname: &str,
    addrs: &[&str],
    extra: serde_json::Value,
    ports: &[(u16, u16, &str)],
) -> Pod {
    let mut v = extra;
    v["runtimeConfig"] = json!({"portMappings": maps(ports)});
    let conf = conf(v);
    let sandbox =
        Interface { name: ifname.into(), sandbox: format!("/run/netns/{ctr}"), ..Default::default() };
    let ips = addrs
        .iter()
        .map(|a| IpConfig { interface: Some(0), address: a.parse().unwrap(), gateway: None })
        .collect();
    let prev = CniResult { interfaces: vec![sandbox], ips, ..Default::default() };
    let ns = Some((NsId { ino: 1000 + ctr.len() as u64, cookie: 7 }, format!("/run/netns/{ctr}")));
    let (intent, _) = Intent::new(&conf, &prev, ifname, Owner::new(net, ctr, ifname), ns).unwrap();
    Pod { conf, intent }
}

fn pod(net: &str, ctr: &str, addr: &str, ports: &[(u16, u16, &str)]) -> Pod {
    pod_with(net, ctr, "eth0", &[addr], json!({}), ports)
}

fn alive(_: &NsId, _: &str) -> Option<String> {
    None
}

fn add(k: &Fake, p: &Pod) -> Result<Outcome> {
    flow::add(&mut k.clone(), &p.conf, &p.intent, &alive)
}

fn del(k: &Fake, p: &Pod) -> Result<Outcome> {
    flow::del(&mut k.clone(), &p.intent.owner, Some(&p.intent))
}

fn check(k: &Fake, p: &Pod) -> Result<()> {
    flow::check(
        &mut k.clone(),
        &p.conf,
        &p.intent,
        p.intent.netns.as_ref().map(|(id, _)| *id),
        &mut Vec::new(),
    )
}

/// Every element of the table, decoded, with its comment.
fn elements(k: &Fake) -> Vec<(Elem, Option<String>)> {
    let Some(t) = k.table() else { return Vec::new() };
    let mut out = Vec::new();
    for (name, set) in &t.sets {
        let Some(s) = Set::parse(name) else { continue };
        for e in set.elems.values() {
            out.push((
                Elem::decode(s, e).unwrap_or_else(|| panic!("undecodable element in {name}: {e:?}")),
                e.comment.clone(),
            ));
        }
    }
    out
}

/// Whether anything of attachment `o` is left.
fn traces(k: &Fake, o: &Owner) -> Vec<String> {
    elements(k)
        .into_iter()
        .filter(|(e, c)| {
            c.as_deref() == Some(o.tag.as_str())
                || matches!(e.key, Key::Claim(_, h) | Key::Attachment(h) | Key::Netns(h) if h == o.hash)
                || e.hash_data() == Some(o.hash)
        })
        .map(|(e, _)| e.to_string())
        .collect()
}

/// Whether the table's `localnet` guard holds the declared rules (the guard must outlive the
/// last attachment: `route_localnet` is never reset).
fn guard_intact(k: &Fake) -> bool {
    let Some(t) = k.table() else { return false };
    let d = layout::declaration(&Default::default(), &Default::default());
    let want: Vec<Vec<NftExpr>> = d
        .rules
        .iter()
        .filter(|r| r.chain == "localnet")
        .map(|r| cni_common::netlink::nft::listed(r.exprs.as_ref().unwrap()))
        .collect();
    let have: Option<Vec<Vec<NftExpr>>> = t
        .chains
        .iter()
        .find(|(n, _)| n == "localnet")
        .map(|(_, r)| r.iter().map(|r| r.exprs.clone()).collect());
    want.len() == 6 && have == Some(want)
}

fn dnat_target(k: &Fake, p: &Pod, i: usize) -> Option<String> {
    let key = Key::Dnat(p.intent.entries[i].host);
    elements(k).into_iter().find(|(e, _)| e.key == key).map(|(e, _)| e.data_text())
}

#[test]
fn add_check_del_leave_nothing() {
    let k = Fake::new();
    let a = pod_with(
        "n",
        "a",
        "eth0",
        &["10.0.0.5/24", "fd00::5/64"],
        json!({}),
        &[(8080, 80, "tcp"), (53, 53, "udp")],
    );
    let out = add(&k, &a).unwrap();
    assert_eq!(out.udp, BTreeSet::from([(Family::V4, 53), (Family::V6, 53)]));
    check(&k, &a).unwrap();
    assert_eq!(dnat_target(&k, &a, 0).as_deref(), Some("10.0.0.5 . 80"));
    let chains = k.table().unwrap().chains;
    // a repeated ADD changes nothing
    let g = k.generation();
    add(&k, &a).unwrap();
    assert_eq!(k.generation(), g, "identical elements are no-ops");
    let out = del(&k, &a).unwrap();
    assert_eq!(out.udp, BTreeSet::from([(Family::V4, 53), (Family::V6, 53)]));
    assert!(traces(&k, &a.intent.owner).is_empty(), "{:?}", traces(&k, &a.intent.owner));
    assert!(elements(&k).is_empty());
    // DEL is idempotent; CHECK now fails
    del(&k, &a).unwrap();
    assert!(check(&k, &a).is_err());
    // the table and its static part stay (never dropped: a concurrent ADD may rely on them),
    // the localnet guard with it
    assert_eq!(k.table().map(|t| t.chains), Some(chains), "every chain and rule as ADD left them");
    assert!(guard_intact(&k));
}

#[test]
fn del_removes_everything_whatever_its_configuration_says() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp"), (8443, 443, "tcp")]);
    add(&k, &a).unwrap();
    // no mappings at all (cnitool del without CAP_ARGS): everything goes
    flow::del(&mut k.clone(), &a.intent.owner, None).unwrap();
    assert!(elements(&k).is_empty(), "{:?}", elements(&k));
    // other mappings than ADD had
    add(&k, &a).unwrap();
    let other = pod("n", "a", "10.0.0.5/24", &[(9000, 90, "udp")]);
    del(&k, &other).unwrap();
    assert!(elements(&k).is_empty(), "{:?}", elements(&k));
}

#[test]
fn a_repeated_add_with_other_mappings_replaces_the_old_ones() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp"), (8443, 443, "tcp")]);
    add(&k, &a).unwrap();
    let a2 = pod("n", "a", "10.0.0.5/24", &[(8080, 8080, "tcp")]);
    add(&k, &a2).unwrap();
    check(&k, &a2).unwrap();
    assert!(check(&k, &a).is_err(), "the old mappings are gone");
    let ports: BTreeSet<u16> =
        elements(&k).iter().filter_map(|(e, _)| e.key.host_port()).map(|p| p.port).collect();
    assert_eq!(ports, BTreeSet::from([8080]));
    del(&k, &a2).unwrap();
    assert!(elements(&k).is_empty());
}

#[test]
fn conflicts_with_live_containers_are_refused_and_change_nothing() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    let before = k.table();
    let b = pod("n", "b", "10.0.0.6/24", &[(9090, 90, "tcp"), (8080, 80, "tcp")]);
    let e = add(&k, &b).unwrap_err();
    assert_eq!(e.code, 7, "{}", e.msg);
    assert!(e.msg.contains("tcp/8080") && e.msg.contains("container \"a\""), "{}", e.msg);
    assert_eq!(k.table(), before, "a refused ADD changes nothing");
    check(&k, &a).unwrap();
    // the same target address (a reused IP): still refused
    let c = pod("n", "c", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    assert_eq!(add(&k, &c).unwrap_err().code, 7);
}

#[test]
fn a_holder_whose_namespace_is_gone_is_replaced() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp"), (53, 53, "udp")]);
    add(&k, &a).unwrap();
    let b = pod("n", "b", "10.0.0.6/24", &[(8080, 80, "tcp")]);
    let gone = |_: &NsId, path: &str| {
        (path == "/run/netns/a").then(|| format!("its network namespace {path} no longer exists"))
    };
    let out = flow::add(&mut k.clone(), &b.conf, &b.intent, &gone).unwrap();
    assert_eq!(out.notes.len(), 1, "{:?}", out.notes);
    assert!(out.notes[0].contains("/run/netns/a no longer exists"), "{}", out.notes[0]);
    assert!(
        traces(&k, &a.intent.owner).is_empty(),
        "all of the stale holder's mappings go: {:?}",
        traces(&k, &a.intent.owner)
    );
    assert!(out.udp.contains(&(Family::V4, 53)), "its UDP port too");
    check(&k, &b).unwrap();
}

#[test]
fn attachments_of_one_container_share_a_host_port() {
    let k = Fake::new();
    let a1 = pod("n1", "ctr", "10.0.0.5/24", &[(18090, 80, "tcp")]);
    let a2 = pod_with("n2", "ctr", "eth1", &["10.1.0.5/24"], json!({}), &[(18090, 80, "tcp")]);
    add(&k, &a1).unwrap();
    add(&k, &a2).unwrap();
    check(&k, &a1).unwrap();
    check(&k, &a2).unwrap();
    assert_eq!(dnat_target(&k, &a1, 0).as_deref(), Some("10.0.0.5 . 80"), "the first stays active");
    let owner = elements(&k).into_iter().find(|(e, _)| matches!(e.key, Key::Owner(_))).unwrap().0;
    assert_eq!(owner.hash_data(), Some(crate::model::shared_hash("ctr")));
    // another container is refused
    assert_eq!(add(&k, &pod("n1", "other", "10.0.0.9/24", &[(18090, 80, "tcp")])).unwrap_err().code, 7);
    // a shared port's DNAT element led elsewhere: CHECK of either claimant fails (on a full read)
    let dnat = Key::Dnat(a1.intent.entries[0].host);
    let saved = k.table();
    k.edit(|t| {
        let set = t.as_mut().unwrap().sets.get_mut(&dnat.set().name()).unwrap();
        let e = set.elems.values_mut().next().unwrap();
        let hijacked =
            Elem::dnat(a1.intent.entries[0].host, Target { ip: "10.9.9.9".parse().unwrap(), port: 80 });
        e.data = hijacked.encode(None).data;
    });
    for p in [&a1, &a2] {
        let e = check(&k, p).unwrap_err();
        assert!(e.msg.contains("10.9.9.9"), "{}", e.msg);
    }
    k.edit(|t| *t = saved);
    // DEL of the active claimant: the other takes over and holds the port alone
    del(&k, &a1).unwrap();
    assert!(traces(&k, &a1.intent.owner).is_empty());
    assert_eq!(dnat_target(&k, &a2, 0).as_deref(), Some("10.1.0.5 . 80"));
    check(&k, &a2).unwrap();
    // and then a point-read DEL of the sole holder
    del(&k, &a2).unwrap();
    assert!(elements(&k).is_empty(), "{:?}", elements(&k));
}

#[test]
fn gc_removes_the_dead_of_its_network_only() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    let b = pod("n", "b", "10.0.0.6/24", &[(8081, 80, "udp")]);
    let c = pod("m", "c", "10.0.1.6/24", &[(8082, 80, "tcp")]);
    for p in [&a, &b, &c] {
        add(&k, p).unwrap();
    }
    let valid = BTreeSet::from([a.intent.owner.tag.clone()]);
    let out = flow::gc(&mut k.clone(), &crate::identity::portmap_net_prefix("n"), &valid).unwrap();
    assert_eq!(out.udp, BTreeSet::from([(Family::V4, 8081)]));
    check(&k, &a).unwrap();
    check(&k, &c).unwrap();
    assert!(traces(&k, &b.intent.owner).is_empty());
    // nothing valid: the network's last attachment goes, the table stays
    flow::gc(&mut k.clone(), &crate::identity::portmap_net_prefix("n"), &BTreeSet::new()).unwrap();
    assert!(traces(&k, &a.intent.owner).is_empty());
    check(&k, &c).unwrap();
    // and when GC removes the table's last attachment, the localnet guard stays with it
    flow::gc(&mut k.clone(), &crate::identity::portmap_net_prefix("m"), &BTreeSet::new()).unwrap();
    assert!(elements(&k).is_empty(), "{:?}", elements(&k));
    assert!(guard_intact(&k));
}

/// Issue 17, item 2: a GC whose valid list holds X, racing X's ADD (with a stale attachment in
/// the table), must not remove X's mapping.
#[test]
fn gc_racing_an_add_keeps_the_added_mapping() {
    for gc_first in [true, false] {
        let k = Fake::new();
        let stale = pod("n", "s", "10.0.0.4/24", &[(7000, 70, "tcp")]);
        add(&k, &stale).unwrap();
        let x = pod("n", "x", "10.0.0.5/24", &[(8080, 80, "tcp")]);
        let valid = BTreeSet::from([x.intent.owner.tag.clone()]);
        let prefix = crate::identity::portmap_net_prefix("n");
        if gc_first {
            // GC reads and plans, then X's ADD commits, then GC's transaction is processed
            let (k2, x2) = (k.clone(), x.clone());
            k.before_apply(move || add(&k2, &x2).map(|_| ()).unwrap());
            flow::gc(&mut k.clone(), &prefix, &valid).unwrap();
        } else {
            let (k2, v2, p2) = (k.clone(), valid.clone(), prefix.clone());
            k.before_apply(move || flow::gc(&mut k2.clone(), &p2, &v2).map(|_| ()).unwrap());
            add(&k, &x).unwrap();
        }
        check(&k, &x).unwrap();
        assert!(traces(&k, &stale.intent.owner).is_empty());
    }
}

#[test]
fn a_del_racing_a_second_claimant_leaves_the_right_holder() {
    // A2 joins A1's port while A1's DEL is between its read and its transaction
    let k = Fake::new();
    let a1 = pod("n1", "ctr", "10.0.0.5/24", &[(18090, 80, "tcp")]);
    let a2 = pod_with("n2", "ctr", "eth1", &["10.1.0.5/24"], json!({}), &[(18090, 80, "tcp")]);
    add(&k, &a1).unwrap();
    let (k2, p2) = (k.clone(), a2.clone());
    k.before_apply(move || add(&k2, &p2).map(|_| ()).unwrap());
    del(&k, &a1).unwrap();
    check(&k, &a2).unwrap();
    assert!(traces(&k, &a1.intent.owner).is_empty());
    assert_eq!(dnat_target(&k, &a2, 0).as_deref(), Some("10.1.0.5 . 80"));
}

/// The two claimants of a shared port withdrawn at once (each DEL, or a GC of one's network,
/// planned on a full read while the other's DEL commits): nothing of either is left, and the
/// port is free. A full plan holds only at the generation it read.
#[test]
fn both_claimants_of_a_shared_port_withdrawn_at_once_leave_nothing() {
    let a1 = pod("n1", "ctr", "10.0.0.5/24", &[(18090, 80, "tcp")]);
    let a2 = pod_with("n2", "ctr", "eth1", &["10.1.0.5/24"], json!({}), &[(18090, 80, "tcp")]);
    for gc in [false, true] {
        let k = Fake::new();
        add(&k, &a1).unwrap();
        add(&k, &a2).unwrap();
        let (k2, p2) = (k.clone(), a2.clone());
        if gc {
            k.before_apply(move || del(&k2, &p2).map(|_| ()).unwrap());
            let prefix = crate::identity::portmap_net_prefix("n1");
            flow::gc(&mut k.clone(), &prefix, &BTreeSet::new()).unwrap();
        } else {
            // a1's DEL by record fails (the port is shared), and the full plan meets a2's DEL
            k.before_apply(|| {});
            k.before_apply(move || del(&k2, &p2).map(|_| ()).unwrap());
            del(&k, &a1).unwrap();
        }
        k.clear_hooks();
        assert!(elements(&k).is_empty(), "gc: {gc}: {:?}", elements(&k));
        add(&k, &pod("n1", "other", "10.0.0.9/24", &[(18090, 80, "tcp")])).unwrap();
    }
}

#[test]
fn lost_answers_and_refused_transactions_are_read_again() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp"), (53, 53, "udp")]);
    // the transaction commits but its answer is lost (ENOBUFS): the next read shows it done
    k.fail_next([Fault::After(libc::ENOBUFS)]);
    let out = add(&k, &a).unwrap();
    assert!(out.udp.contains(&(Family::V4, 53)), "the lost attempt's UDP ports are still flushed");
    check(&k, &a).unwrap();
    // a read that fails for another reason than the table changing is CHECK's answer
    k.fail_reads([libc::EPERM]);
    let e = check(&k, &a).unwrap_err();
    assert!(e.msg.contains("Operation not permitted"), "{}", e.msg);
    // refused before anything (a receive deadline), then a generation that moved: both retried
    k.fail_next([Fault::Before(libc::ETIMEDOUT), Fault::Before(libc::ERESTART)]);
    del(&k, &a).unwrap();
    assert!(elements(&k).is_empty());
    // reads that fail transiently are retried too
    k.fail_reads([libc::EINTR, libc::ENOBUFS]);
    add(&k, &a).unwrap();
    check(&k, &a).unwrap();
}

#[test]
fn a_table_that_never_stops_changing_is_code_11_and_changes_nothing() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    let before = k.table();
    k.fail_next(std::iter::repeat_n(Fault::Before(libc::ERESTART), flow::ATTEMPTS));
    let e = del(&k, &a).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN, "{}", e.msg);
    assert!(e.msg.contains("kept changing"), "{}", e.msg);
    assert_eq!(k.table(), before);
    check(&k, &a).unwrap();
}

/// A kernel that never answers (every read ends at the socket's receive deadline): code 11,
/// and the message says what the verb waited for rather than blaming a changing table.
#[test]
fn a_kernel_that_never_answers_is_code_11_naming_the_wait() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    let before = k.table();
    k.fail_reads(std::iter::repeat_n(libc::ETIMEDOUT, flow::ATTEMPTS));
    let e = del(&k, &a).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN, "{}", e.msg);
    assert!(e.msg.contains("the last attempt: read (injected): Connection timed out"), "{}", e.msg);
    assert!(!e.msg.contains("kept changing"), "{}", e.msg);
    assert_eq!(k.table(), before);
}

#[test]
fn a_verb_past_its_deadline_is_code_11_and_changes_nothing() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    let long_ago = Instant::now().checked_sub(DEADLINE * 2).unwrap();
    let e = run(&mut k.clone(), plan::add_scope(&a.intent, &a.conf.conditions), "add", long_ago, |s| {
        plan::add(s, &a.intent, &a.conf.conditions, &alive)
    })
    .unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN, "{}", e.msg);
    assert!(k.table().is_none() && k.commits() == 0);
}

/// A failure that is not the table changing (no permission, no memory, a kernel that
/// refuses the transaction) is reported at once with what failed, not retried into code 11.
#[test]
fn a_kernel_error_is_reported_at_once_and_changes_nothing() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    let b = pod("n", "b", "10.0.0.6/24", &[(9090, 90, "tcp")]);
    let reported = |e: CniError, what: &str| {
        assert_eq!(e.code, code::INTERNAL, "{}", e.msg);
        assert!(e.msg.contains(what), "{}", e.msg);
    };
    k.fail_reads([libc::EPERM]);
    reported(add(&k, &a).unwrap_err(), "could not install the port mappings");
    assert!(k.table().is_none());
    // refused on a point read's plan, and on a full read's
    k.fail_next([Fault::Before(libc::EPERM)]);
    reported(add(&k, &a).unwrap_err(), "could not install the port mappings");
    assert!(k.table().is_none());
    add(&k, &a).unwrap();
    add(&k, &b).unwrap();
    let before = k.table();
    k.fail_next([Fault::Before(libc::ENOMEM)]);
    let valid = BTreeSet::from([a.intent.owner.tag.clone()]);
    let prefix = crate::identity::portmap_net_prefix("n");
    reported(flow::gc(&mut k.clone(), &prefix, &valid).unwrap_err(), "garbage-collect");
    assert_eq!(k.table(), before);
    check(&k, &b).unwrap();
}

/// A transaction planned on a full read that the kernel still refuses as if the table had
/// changed (`EEXIST`, `ENOENT`, `EBUSY`: a change outside the generation's account) is planned
/// again three more times, then reported.
#[test]
fn a_full_plan_refused_without_a_new_generation_is_retried_three_times() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    let b = pod("n", "b", "10.0.0.6/24", &[(9090, 90, "tcp")]);
    let prefix = crate::identity::portmap_net_prefix("n");
    let only_a = BTreeSet::from([a.intent.owner.tag.clone()]);
    add(&k, &a).unwrap();
    add(&k, &b).unwrap();
    k.fail_next([Fault::Before(libc::EBUSY), Fault::Before(libc::EEXIST), Fault::Before(libc::ENOENT)]);
    flow::gc(&mut k.clone(), &prefix, &only_a).unwrap();
    assert!(traces(&k, &b.intent.owner).is_empty());
    add(&k, &b).unwrap();
    let before = k.table();
    k.fail_next(std::iter::repeat_n(Fault::Before(libc::EBUSY), 4));
    let e = flow::gc(&mut k.clone(), &prefix, &only_a).unwrap_err();
    assert_eq!(e.code, code::INTERNAL, "{}", e.msg);
    assert_eq!(k.table(), before);
    check(&k, &b).unwrap();
}

#[test]
fn a_flushed_hook_is_repaired_by_the_next_add() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    k.edit(|t| t.as_mut().unwrap().chains.iter_mut().find(|(n, _)| n == "prerouting").unwrap().1.clear());
    let e = check(&k, &a).unwrap_err();
    assert!(e.msg.contains("chain prerouting"), "{}", e.msg);
    let b = pod("n", "b", "10.0.0.6/24", &[(9090, 90, "tcp")]);
    add(&k, &b).unwrap();
    check(&k, &a).unwrap();
    check(&k, &b).unwrap();
}

#[test]
fn conditions_get_their_own_gate_chain_written_by_nft_once() {
    let k = Fake::new();
    let c = json!({"conditionsV4": ["ip", "daddr", "!=", "192.0.2.9"]});
    let a = pod_with("n", "a", "eth0", &["10.0.0.5/24"], c.clone(), &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    let gate = layout::gate_chain(Family::V4, &a.conf.conditions.v4);
    assert_eq!(k.scripts().len(), 1);
    assert!(k.scripts()[0].contains(&format!(
        "add rule inet cni_portmap {gate} meta nfproto ipv4 ip daddr != 192.0.2.9 jump hostports4"
    )));
    check(&k, &a).unwrap();
    let b = pod_with("n", "b", "eth0", &["10.0.0.6/24"], c, &[(8081, 80, "tcp")]);
    add(&k, &b).unwrap();
    assert_eq!(k.scripts().len(), 1, "the installed conditions are reused");
    // other conditions: a new gate chain, the old one removed, hooks switched in one transaction
    let d = pod("n", "d", "10.0.0.7/24", &[(8082, 80, "tcp")]);
    add(&k, &d).unwrap();
    let chains: Vec<String> = k.table().unwrap().chains.iter().map(|(n, _)| n.clone()).collect();
    assert!(chains.contains(&"gate4".to_string()) && !chains.contains(&gate), "{chains:?}");
    check(&k, &d).unwrap();
    assert!(check(&k, &a).is_err(), "a's conditions are no longer installed");
    // conditions nft refuses are code 7 and change nothing
    let k2 = Fake::new();
    let bad = pod_with(
        "n",
        "x",
        "eth0",
        &["10.0.0.5/24"],
        json!({"conditionsV4": ["nonsense-without-jump"]}),
        &[(1, 1, "tcp")],
    );
    k2.fail_next([]);
    let e = flow::add(&mut BadNft(k2.clone(), syntax_error()), &bad.conf, &bad.intent, &alive).unwrap_err();
    assert_eq!(e.code, 7, "{}", e.msg);
    assert!(k2.table().is_none());
    // nft missing (50) or timing out (11) is said as such, not blamed on the conditions
    for c in [code::NOT_AVAILABLE, code::TRY_AGAIN] {
        let mut nft = BadNft(k2.clone(), CniError::new(c, "nft: no answer"));
        let e = flow::add(&mut nft, &bad.conf, &bad.intent, &alive).unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (c, "nft: no answer"));
        assert!(k2.table().is_none());
    }
}

fn syntax_error() -> CniError {
    CniError::internal("nft transaction failed: Error: syntax error, unexpected newline")
}

/// A kernel whose nft fails every script with this error.
struct BadNft(Fake, CniError);

impl crate::kernel::Kernel for BadNft {
    fn read(&mut self, s: &Scope) -> std::result::Result<State, NlError> {
        self.0.read(s)
    }
    fn apply(
        &mut self,
        ops: &[cni_common::netlink::nft::NftOp],
        g: Option<u32>,
    ) -> std::result::Result<(), NlError> {
        self.0.apply(ops, g)
    }
    fn validate(&mut self, ops: &[cni_common::netlink::nft::NftOp]) -> std::result::Result<(), NlError> {
        self.0.validate(ops)
    }
    fn answers(&mut self) -> std::result::Result<(), NlError> {
        self.0.answers()
    }
    fn nft(&mut self, _: &str, _: bool) -> Result<()> {
        Err(self.1.clone())
    }
}

#[test]
fn a_table_of_a_newer_layout_is_refused_by_name() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    k.edit(|t| {
        let s = t.as_mut().unwrap().sets.get_mut(LAYOUT_SET).unwrap();
        s.elems.clear();
        s.elems.insert(vec![0, 3], NftElem::new(vec![0, 3]));
    });
    let before = k.table();
    let e = add(&k, &pod("n", "b", "10.0.0.6/24", &[(9090, 90, "tcp")])).unwrap_err();
    assert!(e.msg.contains("inet cni_portmap") && e.msg.contains("[3]"), "{}", e.msg);
    assert_eq!(k.table(), before);
    // CHECK too: its point read cannot tell a newer layout from an earlier one, a full read can
    let e = check(&k, &a).unwrap_err();
    assert!(e.msg.contains("inet cni_portmap") && e.msg.contains("[3]"), "{}", e.msg);
    // and DEL and GC leave it alone (a newer build made it), saying why
    for e in [del(&k, &a).unwrap_err(), flow::gc(&mut k.clone(), "n,", &BTreeSet::new()).unwrap_err()] {
        assert!(e.msg.contains("inet cni_portmap") && e.msg.contains("[3]"), "{}", e.msg);
    }
    assert_eq!(k.table(), before);
}

/// The previous release's table (layout 1): no `layout` set, no `attachments` records, no
/// `localnet` guard, hooks through the `gates` verdict map, a `conditions` map. Made here from
/// this layout's by taking those apart.
fn make_layout_1(k: &Fake) {
    k.edit(|t| {
        let t = t.as_mut().unwrap();
        t.sets.remove(LAYOUT_SET);
        t.sets.remove(&Set::Attachments.name());
        t.chains.retain(|(n, _)| n != "localnet");
        let vmap = cni_common::netlink::nft::NftRule {
            table: layout::TABLE.into(),
            chain: String::new(),
            handle: 1,
            comment: None,
            exprs: vec![NftExpr::Other("fib".into()), NftExpr::Lookup { set: "gates".into() }],
        };
        for hook in ["prerouting", "output"] {
            let rules = &mut t.chains.iter_mut().find(|(n, _)| n == hook).unwrap().1;
            *rules = vec![cni_common::netlink::nft::NftRule { chain: hook.into(), ..vmap.clone() }];
        }
        // as 5fca5c6 declared them: `map gates { type nf_proto : verdict; }`,
        // `map conditions { type nf_proto : ipv6_addr; }`
        use cni_common::netlink::nft::{NftSetData, NftType};
        for (name, data) in
            [("gates", NftSetData::Verdict), ("conditions", NftSetData::Values(vec![NftType::Ipv6Addr]))]
        {
            let decl = cni_common::netlink::nft::NftSet {
                name: name.into(),
                key: vec![NftType::NfProto],
                data: Some(data),
                interval: false,
                id: 0,
            };
            t.sets.insert(name.into(), crate::kernel::fake::FakeSet { decl, elems: Default::default() });
        }
    });
}

/// Replace set `name` with one of the same name and another declaration (another program's, or
/// another build's), without elements.
fn retype(
    k: &Fake,
    name: &str,
    key: Vec<cni_common::netlink::nft::NftType>,
    data: Option<cni_common::netlink::nft::NftSetData>,
    interval: bool,
) {
    k.edit(|t| {
        let decl = cni_common::netlink::nft::NftSet { name: name.into(), key, data, interval, id: 0 };
        t.as_mut()
            .unwrap()
            .sets
            .insert(name.into(), crate::kernel::fake::FakeSet { decl, elems: Default::default() });
    });
}

/// Every verb on the table as it is: refused with code 999 naming the table and `parts`,
/// and nothing changed.
fn refused_by_every_verb(k: &Fake, a: &Pod, parts: &[&str]) {
    let before = k.table();
    let c = pod("n", "c", "10.0.0.7/24", &[(9090, 90, "tcp")]);
    let verbs = [
        ("ADD", add(k, &c).map(|_| ())),
        ("DEL", del(k, a).map(|_| ())),
        ("GC", flow::gc(&mut k.clone(), "n,", &BTreeSet::new()).map(|_| ())),
        ("CHECK", check(k, a)),
    ];
    for (verb, r) in verbs {
        let e = r.expect_err(verb);
        assert_eq!(e.code, 999, "{verb}: {}", e.msg);
        for p in std::iter::once(&"table inet cni_portmap").chain(parts) {
            assert!(e.msg.contains(p), "{verb}: {p:?} not in {}", e.msg);
        }
    }
    assert_eq!(k.table(), before, "nothing changed");
}

/// The guard on a table of the previous layout (sets, no version) changes nothing and says
/// why: upgrading it is the next ADD with host ports' work, which carries its elements over.
/// (Its twin, a bare table an nft script has just made, is completed: see
/// `the_guard_restored_with_conditions_writes_their_gate_chain_through_nft`.)
#[test]
fn the_guard_leaves_a_table_of_the_previous_layout_to_the_next_add_and_says_so() {
    let k = Fake::new();
    add(&k, &pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")])).unwrap();
    make_layout_1(&k);
    let before = k.table();
    let out = flow::guard(&mut k.clone(), &crate::config::Conditions::default()).unwrap();
    assert_eq!(k.table(), before, "nothing changed");
    assert!(out.notes.iter().any(|n| n.contains("the table is of the previous layout")), "{:?}", out.notes);
}

/// A table without the layout version is of layout 1 only when its sets are layout 1's with
/// layout 1's types and flags (or layout 2's, a table of this layout that lost its version):
/// a same-named set of another type, of other flags, or sets of both layouts at once make a
/// table of neither, which every verb refuses, saying what differs, and leaves as it is.
#[test]
fn an_unversioned_table_of_neither_layout_is_refused_saying_what_differs() {
    use cni_common::netlink::nft::{NftSetData, NftType::*};
    let k = Fake::new();
    let a = pod_with("n", "a", "eth0", &["10.0.0.5/24", "fd00::5/64"], json!({}), &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    make_layout_1(&k);
    let layout_1 = k.table();
    // `owner` keyed by an IPv4 address and a port
    retype(&k, "owner", vec![Ipv4Addr, InetService], Some(NftSetData::Values(vec![Ipv4Addr])), false);
    refused_by_every_verb(
        &k,
        &a,
        &[
            "no layout version",
            "(against layout 1, the nearer: set owner is `map ipv4_addr . inet_service : ipv4_addr` instead of \
             `map ipv6_addr . inet_proto . inet_service : ipv6_addr`)",
        ],
    );
    // `owner` of layout 1's types, but an interval map
    retype(
        &k,
        "owner",
        vec![Ipv6Addr, InetProto, InetService],
        Some(NftSetData::Values(vec![Ipv6Addr])),
        true,
    );
    refused_by_every_verb(
        &k,
        &a,
        &["set owner is `map ipv6_addr . inet_proto . inet_service : ipv6_addr flags interval,concat`"],
    );
    // `gates` a plain set rather than a verdict map
    k.edit(|t| *t = layout_1.clone());
    retype(&k, "gates", vec![NfProto], None, false);
    refused_by_every_verb(
        &k,
        &a,
        &["(against layout 1, the nearer: set gates is `set nf_proto` instead of `map nf_proto : verdict`)"],
    );
    // layout 1's sets with layout 2's records
    k.edit(|t| *t = layout_1.clone());
    retype(&k, "attachments", vec![Ipv6Addr], Some(NftSetData::Values(vec![Ipv6Addr])), false);
    refused_by_every_verb(
        &k,
        &a,
        &["(against layout 1, the nearer: set attachments is not one of its sets)"],
    );
    // the control: layout 1 as released is upgraded by the next ADD
    k.edit(|t| *t = layout_1.clone());
    check(&k, &a).unwrap();
    let c = pod("n", "c", "10.0.0.7/24", &[(9090, 90, "tcp")]);
    add(&k, &c).unwrap();
    check(&k, &a).unwrap();
    check(&k, &c).unwrap();
    // and a table of this layout that lost its version element gets it back (CHECK notes it)
    k.edit(|t| t.as_mut().unwrap().sets.get_mut(LAYOUT_SET).unwrap().elems.clear());
    let mut notes = Vec::new();
    flow::check(&mut k.clone(), &c.conf, &c.intent, None, &mut notes).unwrap();
    assert_eq!(
        notes,
        ["portmap: note: table inet cni_portmap lacks its layout version; its static part is not checked (the next \
          ADD writes it)"]
    );
    let d = pod("n", "d", "10.0.0.8/24", &[(9091, 90, "tcp")]);
    add(&k, &d).unwrap();
    assert_eq!(k.table().unwrap().sets[LAYOUT_SET].elems.len(), 1);
    check(&k, &d).unwrap();
}

/// A set of this layout's name with another shape in a table of this layout: the point reads
/// and the transactions planned on them meet keys that do not fit (`EINVAL`), the full read
/// that follows lists the set, and every verb refuses, naming it, and changes nothing.
#[test]
fn a_set_of_another_shape_in_a_table_of_this_layout_is_refused() {
    use cni_common::netlink::nft::{NftSetData, NftType::*};
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    retype(&k, "owner", vec![Ipv4Addr, InetService], Some(NftSetData::Values(vec![Ipv4Addr])), false);
    refused_by_every_verb(
        &k,
        &a,
        &["is of layout 2 but set owner is `map ipv4_addr . inet_service : ipv4_addr` instead of"],
    );
    // a key of another length: the point reads meet EINVAL (as the kernel answers a look-up
    // of a key that does not fit), and the full read that follows says why
    let k2 = Fake::new();
    add(&k2, &a).unwrap();
    retype(&k2, "owner", vec![Ipv6Addr, InetService], Some(NftSetData::Values(vec![Ipv4Addr])), false);
    refused_by_every_verb(&k2, &a, &["set owner is `map ipv6_addr . inet_service : ipv4_addr` instead of"]);
    // … in the records every verb's first read looks up
    let k3 = Fake::new();
    add(&k3, &a).unwrap();
    retype(&k3, "attachments", vec![Ipv4Addr], Some(NftSetData::Values(vec![Ipv6Addr])), false);
    refused_by_every_verb(&k3, &a, &["set attachments is `map ipv4_addr : ipv6_addr` instead of"]);
    // the fake answers as the kernel does: a set of one name and another shape is not made
    let op = cni_common::netlink::nft::NftOp::AddSet {
        family: layout::FAMILY,
        table: layout::TABLE.into(),
        set: layout::nft_set(Set::Owner, 1),
    };
    let e = crate::kernel::Kernel::apply(&mut k.clone(), &[op], None).unwrap_err();
    assert_eq!(e.errno, libc::EEXIST);
}

#[test]
fn the_previous_layout_is_upgraded_in_place_with_its_attachments() {
    let k = Fake::new();
    let a = pod_with("n", "a", "eth0", &["10.0.0.5/24", "fd00::5/64"], json!({}), &[(8080, 80, "tcp")]);
    let b = pod("n", "b", "10.0.0.6/24", &[(53, 53, "udp")]);
    add(&k, &a).unwrap();
    add(&k, &b).unwrap();
    check(&k, &a).unwrap();
    let notes_of = |p: &Pod| {
        let mut notes = Vec::new();
        let r = flow::check(&mut k.clone(), &p.conf, &p.intent, None, &mut notes);
        (r.map_err(|e| e.msg), notes)
    };
    assert_eq!(notes_of(&a), (Ok(()), vec![]), "a table of this layout: no note");
    make_layout_1(&k);
    // CHECK of a layout-1 attachment passes (its elements are what it needs), with a note for
    // its caller to print
    let earlier =
        "portmap: note: table inet cni_portmap is of an earlier layout; its static part is not checked \
                   (the next ADD upgrades it)";
    assert_eq!(notes_of(&a), (Ok(()), vec![earlier.to_string()]));
    // the note comes with a failing CHECK too
    let other = pod("n", "a", "10.0.0.5/24", &[(8081, 80, "tcp")]);
    let (r, notes) = notes_of(&other);
    assert!(r.is_err() && notes == [earlier], "{r:?} {notes:?}");
    // DEL of b on the old layout: elements only, no records written
    del(&k, &b).unwrap();
    assert!(traces(&k, &b.intent.owner).is_empty());
    assert!(!k.table().unwrap().sets.contains_key(LAYOUT_SET), "DEL does not upgrade");
    // the first ADD upgrades: version, records of every attachment, guard, retired maps gone
    let c = pod("n", "c", "10.0.0.7/24", &[(9090, 90, "tcp")]);
    add(&k, &c).unwrap();
    let t = k.table().unwrap();
    assert!(!t.sets.contains_key("gates") && !t.sets.contains_key("conditions"));
    assert!(t.chains.iter().any(|(n, _)| n == "localnet"));
    let records: Vec<(Elem, Option<String>)> =
        elements(&k).into_iter().filter(|(e, _)| matches!(e.key, Key::Attachment(_))).collect();
    assert_eq!(records.len(), 2, "{records:?}");
    let ra = records.iter().find(|(e, _)| e.key == Key::Attachment(a.intent.owner.hash)).unwrap();
    assert_eq!(ra.0.hash_data(), Some(a.intent.fingerprint()), "the record a's own ADD would write");
    assert_eq!(ra.1.as_deref(), Some(a.intent.owner.tag.as_str()));
    check(&k, &a).unwrap();
    check(&k, &c).unwrap();
    // and a's DEL now goes by its record
    del(&k, &a).unwrap();
    del(&k, &c).unwrap();
    assert!(elements(&k).is_empty(), "{:?}", elements(&k));
}

/// What ADD plans on its first read (the point read).
fn first_plan(k: &Fake, p: &Pod) -> Step {
    let s =
        crate::kernel::Kernel::read(&mut k.clone(), &plan::add_scope(&p.intent, &p.conf.conditions)).unwrap();
    plan::add(&s, &p.intent, &p.conf.conditions, &alive).unwrap()
}

fn deletes(p: &Plan, set: &str) -> bool {
    p.ops
        .iter()
        .any(|o| matches!(o, cni_common::netlink::nft::NftOp::DeleteElements { set: s, .. } if s == set))
}

/// A repeated ADD of an attachment (a runtime retrying, `podman restart` in a new namespace)
/// is planned from the point read: only adds when nothing changed, the netns record replaced
/// (guarded) when the namespace or its path did; other mappings need a full read.
#[test]
fn a_repeated_add_is_planned_from_the_point_read() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    let Step::Apply(p) = first_plan(&k, &a) else { panic!("the same ADD needs no full read") };
    assert!(!p.guarded && !deletes(&p, "netns"), "{p:?}");
    let mut moved = a.clone();
    moved.intent.netns = Some((NsId { ino: 4242, cookie: 9 }, "/run/netns/a".into()));
    let Step::Apply(p) = first_plan(&k, &moved) else { panic!("a new namespace needs no full read") };
    assert!(p.guarded && deletes(&p, "netns"), "{p:?}");
    add(&k, &moved).unwrap();
    check(&k, &moved).unwrap();
    assert!(check(&k, &a).is_err(), "recorded for the new namespace");
    let mut renamed = moved.clone();
    renamed.intent.netns = Some((NsId { ino: 4242, cookie: 9 }, "/var/run/netns/a".into()));
    add(&k, &renamed).unwrap();
    let rec = elements(&k).into_iter().find(|(e, _)| matches!(e.key, Key::Netns(_))).unwrap();
    assert_eq!(rec.1.as_deref(), Some("/var/run/netns/a"), "the path recorded is the new one");
    let other = pod("n", "a", "10.0.0.5/24", &[(9090, 80, "tcp")]);
    assert_eq!(first_plan(&k, &other), Step::ReadAll);
}

/// What DEL plans on its first read (the point read).
fn first_del_plan(k: &Fake, p: &Pod) -> Step {
    let s = crate::kernel::Kernel::read(&mut k.clone(), &plan::del_scope(&p.intent.owner)).unwrap();
    plan::del(&s, &p.intent.owner, Some(&p.intent)).unwrap()
}

/// DEL by the attachment's record: from the point read when its mappings are all the record
/// says it has (guarded, as every plan that deletes what it read); a part of them needs a full
/// read, and everything goes.
#[test]
fn a_del_is_planned_from_the_point_read_when_the_record_agrees() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp"), (8443, 443, "tcp")]);
    add(&k, &a).unwrap();
    let Step::Apply(p) = first_del_plan(&k, &a) else { panic!("the record agrees: no full read") };
    assert!(p.guarded && deletes(&p, "attachments") && deletes(&p, "netns") && deletes(&p, "hp4"), "{p:?}");
    let part = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    assert_eq!(first_del_plan(&k, &part), Step::ReadAll);
    del(&k, &part).unwrap();
    assert!(elements(&k).is_empty(), "{:?}", elements(&k));
    // a netns record left alone (its attachment's elements removed by hand): it goes, guarded
    add(&k, &a).unwrap();
    k.edit(|t| {
        for (name, set) in t.as_mut().unwrap().sets.iter_mut() {
            if Set::parse(name).is_some_and(|s| s != Set::Netns) {
                set.elems.clear();
            }
        }
    });
    let Step::Apply(p) = first_del_plan(&k, &a) else { panic!("no record: nothing else to read") };
    assert!(p.guarded && deletes(&p, "netns"), "{p:?}");
    del(&k, &a).unwrap();
    assert!(elements(&k).is_empty(), "{:?}", elements(&k));
}

/// CHECK of a sole holder decides on its point read; given a part of the attachment's
/// mappings it fails, naming why.
#[test]
fn check_decides_on_the_point_read_and_knows_the_mappings_added() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp"), (8443, 443, "tcp")]);
    add(&k, &a).unwrap();
    let s = crate::kernel::Kernel::read(&mut k.clone(), &plan::check_scope(&a.intent)).unwrap();
    let now = a.intent.netns.as_ref().map(|(id, _)| *id);
    assert_eq!(
        plan::check(&s, &a.intent, &a.conf.conditions, now, &mut Vec::new()).unwrap(),
        plan::Checked::Ok
    );
    let part = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    let e = check(&k, &part).unwrap_err();
    assert!(e.msg.contains("added with other port mappings"), "{}", e.msg);
}

/// A repeated ADD planned on a full read (here: a hook to repair) leaves what it already has
/// as it is: its UDP port's target did not change, so its conntrack entries are not flushed.
#[test]
fn a_repeated_add_on_a_full_read_changes_nothing_it_has() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(53, 53, "udp")]);
    add(&k, &a).unwrap();
    k.edit(|t| t.as_mut().unwrap().chains.iter_mut().find(|(n, _)| n == "prerouting").unwrap().1.clear());
    let before = elements(&k);
    let out = add(&k, &a).unwrap();
    assert!(out.udp.is_empty(), "{out:?}");
    assert_eq!(elements(&k), before);
    check(&k, &a).unwrap();
}

/// A table mangled outside the plugin (restored from a dump without element comments, the
/// attachment's claims deleted by hand): DEL still removes everything of the attachment, by its hash.
#[test]
fn del_goes_by_hash_when_comments_or_claims_are_lost() {
    let k = Fake::new();
    let a = pod_with("n", "a", "eth0", &["10.0.0.5/24"], json!({"snat": false}), &[(8080, 80, "tcp")]);
    let b = pod_with("n", "b", "eth0", &["10.0.0.6/24"], json!({"snat": false}), &[(9090, 90, "tcp")]);
    let strip = |k: &Fake| {
        k.edit(|t| {
            for set in t.as_mut().unwrap().sets.values_mut() {
                set.elems.values_mut().for_each(|e| e.comment = None);
            }
        })
    };
    let ah = a.intent.owner.hash;
    let mine = move |e: &NftElem| matches!(Elem::decode(Set::Claims, e), Some(Elem { key: Key::Claim(_, h), .. }) if h == ah);
    let drop_claims = |k: &Fake| {
        k.edit(|t| t.as_mut().unwrap().sets.get_mut("claims").unwrap().elems.retain(|_, e| !mine(e)))
    };
    for mangle in [&strip as &dyn Fn(&Fake), &|k: &Fake| (strip(k), drop_claims(k)).0] {
        add(&k, &a).unwrap();
        add(&k, &b).unwrap();
        mangle(&k);
        flow::del(&mut k.clone(), &a.intent.owner, None).unwrap();
        assert!(traces(&k, &a.intent.owner).is_empty(), "{:?}", traces(&k, &a.intent.owner));
        assert!(dnat_target(&k, &a, 0).is_none());
        assert_eq!(dnat_target(&k, &b, 0).as_deref(), Some("10.0.0.6 . 90"));
        flow::del(&mut k.clone(), &b.intent.owner, None).unwrap();
        assert!(elements(&k).is_empty(), "{:?}", elements(&k));
    }
}

/// A full plan keeps the records it finds: the attachment's record is what its ADD wrote, even
/// when some of its elements no longer say whose they are (masquerade elements' comments
/// lost), so CHECK still passes.
#[test]
fn a_full_plan_keeps_the_records_it_finds() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    k.edit(|t| {
        for (name, set) in t.as_mut().unwrap().sets.iter_mut() {
            if matches!(Set::parse(name), Some(Set::Net(..))) {
                set.elems.values_mut().for_each(|e| e.comment = None);
            }
        }
    });
    flow::gc(&mut k.clone(), &crate::identity::portmap_net_prefix("m"), &BTreeSet::new()).unwrap();
    check(&k, &a).unwrap();
}

/// Records of an attachment that claims nothing (its mappings removed by hand) are cleaned by
/// the next full plan.
#[test]
fn records_without_claims_are_removed_by_the_next_full_plan() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    let b = pod("m", "b", "10.0.0.6/24", &[(9090, 90, "tcp")]);
    add(&k, &a).unwrap();
    add(&k, &b).unwrap();
    k.edit(|t| {
        for (name, set) in t.as_mut().unwrap().sets.iter_mut() {
            if Set::parse(name).is_some_and(|s| !matches!(s, Set::Attachments | Set::Netns)) {
                set.elems.retain(|_, e| e.comment.as_deref() != Some(a.intent.owner.tag.as_str()));
            }
        }
    });
    assert_eq!(traces(&k, &a.intent.owner).len(), 2, "its records");
    let valid = BTreeSet::from([a.intent.owner.tag.clone()]);
    flow::gc(&mut k.clone(), &crate::identity::portmap_net_prefix("n"), &valid).unwrap();
    assert!(traces(&k, &a.intent.owner).is_empty(), "{:?}", traces(&k, &a.intent.owner));
    check(&k, &b).unwrap();
}

/// `cni-migrate to-upstream`: the table goes only when no attachment holds anything in it.
#[test]
fn an_unused_table_is_dropped_and_a_used_one_kept() {
    let k = Fake::new();
    flow::drop_if_unused(&mut k.clone()).unwrap();
    assert!(k.table().is_none(), "no table: nothing to do");
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    let before = k.table();
    flow::drop_if_unused(&mut k.clone()).unwrap();
    assert_eq!(k.table(), before, "a's mapping keeps it");
    check(&k, &a).unwrap();
    // records alone (an attachment's elements gone, its records left) hold nothing
    k.edit(|t| {
        let t = t.as_mut().unwrap();
        for (name, set) in t.sets.iter_mut() {
            if Set::parse(name).is_some_and(|s| !matches!(s, Set::Attachments | Set::Netns)) {
                set.elems.clear();
            }
        }
    });
    assert!(!elements(&k).is_empty());
    // an ADD between its read and its transaction keeps the table
    let (k2, b) = (k.clone(), pod("n", "b", "10.0.0.6/24", &[(9090, 90, "tcp")]));
    let b2 = b.clone();
    k.before_apply(move || add(&k2, &b2).map(|_| ()).unwrap());
    flow::drop_if_unused(&mut k.clone()).unwrap();
    check(&k, &b).unwrap();
    del(&k, &b).unwrap();
    flow::drop_if_unused(&mut k.clone()).unwrap();
    assert!(k.table().is_none());
}

/// The benchmark's floor sends `plan::add_ops`/`plan::del_ops` bare: they are what ADD and DEL
/// of a sole holder commit.
#[test]
fn the_bare_transactions_are_what_add_and_del_commit() {
    let k = Fake::new();
    let a = pod_with("n", "a", "eth0", &["10.0.0.5/24", "fd00::5/64"], json!({}), &[(8080, 80, "tcp")]);
    let b = pod("n", "b", "10.0.0.6/24", &[(53, 53, "udp"), (9090, 90, "tcp")]);
    add(&k, &a).unwrap();
    let mut kk = k.clone();
    crate::kernel::Kernel::apply(&mut kk, &plan::add_ops(&b.intent), None).unwrap();
    let bare = elements(&k);
    del(&k, &b).unwrap();
    add(&k, &b).unwrap();
    assert_eq!(elements(&k), bare, "add_ops commits what ADD does");
    check(&k, &b).unwrap();
    crate::kernel::Kernel::apply(&mut kk, &plan::del_ops(&b.intent), None).unwrap();
    assert!(traces(&k, &b.intent.owner).is_empty(), "{:?}", traces(&k, &b.intent.owner));
    check(&k, &a).unwrap();
}

#[test]
fn thousands_of_mappings_in_one_transaction_each_way() {
    let k = Fake::new();
    let ports: Vec<(u16, u16, &str)> =
        (0..3_000u16).map(|i| (10_000 + i, 20_000 + i, if i % 2 == 0 { "tcp" } else { "udp" })).collect();
    let a = pod_with("n", "a", "eth0", &["10.0.0.5/24", "fd00::5/64"], json!({}), &ports);
    let c0 = k.commits();
    add(&k, &a).unwrap();
    assert_eq!(k.commits() - c0, 1, "one transaction");
    check(&k, &a).unwrap();
    assert_eq!(dnat_target(&k, &a, 0).as_deref(), Some("10.0.0.5 . 20000"));
    let out = del(&k, &a).unwrap();
    assert_eq!(out.udp.len(), 3_000, "1 500 UDP ports in both families");
    assert!(elements(&k).is_empty());
}

#[test]
fn status_dry_runs_the_layout() {
    let mut k = Fake::new();
    flow::status(&mut k, &conf(json!({})), None).unwrap();
    assert!(k.table().is_none(), "nothing committed");
    let with = conf(json!({"conditionsV6": ["ip6", "saddr", "!=", "fd00::1"]}));
    flow::status(&mut k, &with, None).unwrap();
    assert!(k.table().is_none());
    assert_eq!(k.scripts().len(), 1, "checked by nft -c");
}

/// A kernel that counts STATUS's dry runs and can stop answering.
struct Counting(Fake, usize, bool);

impl crate::kernel::Kernel for Counting {
    fn read(&mut self, s: &Scope) -> std::result::Result<State, NlError> {
        self.0.read(s)
    }
    fn apply(
        &mut self,
        ops: &[cni_common::netlink::nft::NftOp],
        g: Option<u32>,
    ) -> std::result::Result<(), NlError> {
        self.0.apply(ops, g)
    }
    fn validate(&mut self, ops: &[cni_common::netlink::nft::NftOp]) -> std::result::Result<(), NlError> {
        self.1 += 1;
        self.0.validate(ops)
    }
    fn answers(&mut self) -> std::result::Result<(), NlError> {
        if self.2 {
            Ok(())
        } else {
            Err(NlError::new("nftables generation", libc::EPROTONOSUPPORT))
        }
    }
    fn nft(&mut self, script: &str, check: bool) -> Result<()> {
        self.0.nft(script, check)
    }
}

/// With a certificate directory, the dry run runs once per layout: later STATUS calls only see
/// nf_tables answer; a kernel that stops answering fails STATUS even though the layout was
/// certified; a layout with conditions (applied by `nft`, which may vanish) dry-runs every time.
#[test]
fn status_dry_runs_once_per_layout_then_reads() {
    let dir = std::env::temp_dir().join(format!("portmap-status-{}", std::process::id()));
    let certs = dir.join("status");
    let mut k = Counting(Fake::new(), 0, true);
    let plain = conf(json!({}));
    for _ in 0..3 {
        flow::status(&mut k, &plain, Some(&certs)).unwrap();
    }
    let certified = cni_common::nsident::cookie_here() != 0;
    assert_eq!(k.1, if certified { 1 } else { 3 }, "dry runs (certified: {certified})");
    let with = conf(json!({"conditionsV6": ["ip6", "saddr", "!=", "fd00::1"]}));
    flow::status(&mut k, &with, Some(&certs)).unwrap();
    flow::status(&mut k, &with, Some(&certs)).unwrap();
    assert_eq!(k.1, if certified { 3 } else { 5 }, "conditions need nft at every call: never certified");
    assert_eq!(k.0.scripts().len(), 2, "checked by nft -c each time");
    assert!(k.0.table().is_none(), "nothing committed");
    k.2 = false;
    let e = flow::status(&mut k, &plain, Some(&certs)).unwrap_err();
    assert_eq!(e.code, code::NOT_AVAILABLE, "{}", e.msg);
    assert!(e.msg.contains("cannot hold the portmap rules"), "{}", e.msg);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A kernel without nf_tables' nat or fib support: every transaction is refused.
struct NoNat(Fake);

impl crate::kernel::Kernel for NoNat {
    fn read(&mut self, s: &Scope) -> std::result::Result<State, NlError> {
        self.0.read(s)
    }
    fn apply(
        &mut self,
        _: &[cni_common::netlink::nft::NftOp],
        _: Option<u32>,
    ) -> std::result::Result<(), NlError> {
        Err(NlError::new("nftables transaction", libc::EOPNOTSUPP))
    }
    fn validate(&mut self, _: &[cni_common::netlink::nft::NftOp]) -> std::result::Result<(), NlError> {
        Err(NlError::new("nftables validation", libc::EOPNOTSUPP))
    }
    fn answers(&mut self) -> std::result::Result<(), NlError> {
        self.0.answers()
    }
    fn nft(&mut self, _: &str, _: bool) -> Result<()> {
        Err(CniError::new(code::NOT_AVAILABLE, "nft binary not found"))
    }
}

#[test]
fn status_is_50_only_when_no_add_could_work() {
    // nf_tables that cannot hold the layout: 50, naming why
    let e = flow::status(&mut NoNat(Fake::new()), &conf(json!({})), None).unwrap_err();
    assert_eq!(e.code, code::NOT_AVAILABLE, "{}", e.msg);
    assert!(e.msg.contains("cannot hold the portmap rules"), "{}", e.msg);
    // conditions that need nft, without nft: 50 too
    let with = conf(json!({"conditionsV4": ["ip", "saddr", "!=", "192.0.2.1"]}));
    let mut k = NoNat(Fake::new());
    assert_eq!(flow::status(&mut k, &with, None).unwrap_err().code, code::NOT_AVAILABLE);
    // conditions nft -c refuses: 50, naming why
    let e = flow::status(&mut BadNft(Fake::new(), syntax_error()), &with, None).unwrap_err();
    assert_eq!(e.code, code::NOT_AVAILABLE, "{}", e.msg);
    assert!(e.msg.contains("cannot hold the portmap rules") && e.msg.contains("syntax error"), "{}", e.msg);
    // a healthy kernel: ready, whatever the table holds (a full table of conflicts is ADD's
    // business, not STATUS's)
    let k = Fake::new();
    add(&k, &pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")])).unwrap();
    flow::status(&mut k.clone(), &conf(json!({})), None).unwrap();
}

// ---- random sequences ----

/// xorshift64*: reproducible randomness without a crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The attachments of the random test: (network, container, ifname, address, host ports).
/// Containers `c0`/`c1` have two attachments each on two networks with the same ports (shared);
/// the rest compete for ports 1–4.
fn cast() -> Vec<Pod> {
    let mut v = Vec::new();
    for (i, (net, ctr, ifn)) in
        [("n1", "c0", "eth0"), ("n2", "c0", "eth1"), ("n1", "c1", "eth0"), ("n2", "c1", "eth1")]
            .iter()
            .enumerate()
    {
        let addr = format!("10.{}.0.{}/24", i % 2, 10 + i / 2);
        v.push(pod_with(net, ctr, ifn, &[&addr], json!({}), &[(1, 80, "tcp"), (2, 53, "udp")]));
    }
    for i in 0..4u16 {
        let addr = format!("10.0.1.{}/24", 10 + i);
        let ports = [(1 + i, 80, "tcp"), (5 + i % 2, 443, "tcp")];
        v.push(pod_with("n1", &format!("x{i}"), "eth0", &[&addr], json!({"masqAll": i == 3}), &ports));
    }
    v
}

/// What must hold: each live attachment passes CHECK; nothing of a removed one is left;
/// the `owner` element of every port names a live claimant.
fn invariants(k: &Fake, pods: &[Pod], live: &BTreeSet<usize>, ctx: &str) {
    for (i, p) in pods.iter().enumerate() {
        if live.contains(&i) {
            check(k, p).unwrap_or_else(|e| panic!("{ctx}: live attachment {i} fails CHECK: {}", e.msg));
        } else {
            let left = traces(k, &p.intent.owner);
            assert!(left.is_empty(), "{ctx}: removed attachment {i} left {left:?}");
        }
    }
}

/// Whether ADD of `i` must be refused given the live attachments (a host port held by a live
/// attachment of another container).
fn refused(pods: &[Pod], live: &BTreeSet<usize>, i: usize) -> bool {
    let me = &pods[i].intent;
    live.iter().filter(|j| **j != i).any(|j| {
        let o = &pods[*j].intent;
        o.owner.container != me.owner.container && o.ports().any(|p| me.ports().any(|q| q == p))
    })
}

#[derive(Clone, Copy, Debug)]
enum Verb {
    Add(usize),
    Del(usize),
    Gc(&'static str),
    Check(usize),
}

fn random_verb(r: &mut Rng, n: usize) -> Verb {
    match r.below(10) {
        0..=3 => Verb::Add(r.below(n)),
        4..=6 => Verb::Del(r.below(n)),
        7 => Verb::Gc(if r.below(2) == 0 { "n1" } else { "n2" }),
        _ => Verb::Check(r.below(n)),
    }
}

/// Run `v` and update the model. A GC's valid list is the live set, plus `extra` (an ADD that
/// started before the GC took its list and commits while the GC runs).
fn step(k: &Fake, pods: &[Pod], live: &Rc<RefCell<BTreeSet<usize>>>, v: Verb, extra: Option<usize>) {
    match v {
        Verb::Add(i) => {
            let res = add(k, &pods[i]);
            // what ran meanwhile has completed: the model is current
            let must_refuse = refused(pods, &live.borrow(), i);
            match res {
                Ok(_) => {
                    assert!(!must_refuse, "ADD {i} succeeded over a live holder");
                    live.borrow_mut().insert(i);
                }
                Err(e) => {
                    assert!(must_refuse, "ADD {i} failed: {}", e.msg);
                    assert_eq!(e.code, 7, "{}", e.msg);
                }
            }
        }
        Verb::Del(i) => {
            del(k, &pods[i]).unwrap_or_else(|e| panic!("DEL {i}: {}", e.msg));
            live.borrow_mut().remove(&i);
        }
        Verb::Gc(net) => {
            let valid: BTreeSet<String> =
                live.borrow().iter().chain(extra.iter()).map(|i| pods[*i].intent.owner.tag.clone()).collect();
            flow::gc(&mut k.clone(), &crate::identity::portmap_net_prefix(net), &valid).unwrap();
            let gone: Vec<usize> = live
                .borrow()
                .iter()
                .copied()
                .filter(|i| {
                    pods[*i].intent.owner.tag.starts_with(&format!("{net},"))
                        && !valid.contains(&pods[*i].intent.owner.tag)
                })
                .collect();
            for i in gone {
                live.borrow_mut().remove(&i);
            }
        }
        Verb::Check(i) => {
            let ok = check(k, &pods[i]).is_ok();
            assert_eq!(ok, live.borrow().contains(&i), "CHECK {i}");
        }
    }
}

/// Random sequences of ADD, DEL, GC and CHECK by eight attachments (shared ports, conflicts,
/// masqAll), each verb possibly interleaved with another that commits between its read and
/// its transaction, and lost answers: the invariants hold after every verb.
#[test]
fn random_interleavings_keep_the_invariants() {
    let pods = cast();
    for seed in 1..=24u64 {
        let k = Fake::new();
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let live = Rc::new(RefCell::new(BTreeSet::new()));
        for n in 0..60 {
            let v = random_verb(&mut r, pods.len());
            let mut extra = None;
            if r.below(4) == 0 {
                // a concurrent verb commits between this one's read and its transaction
                let w = random_verb(&mut r, pods.len());
                // a runtime runs one verb at a time per attachment
                let same = |a: Verb, b: Verb| match (a, b) {
                    (
                        Verb::Add(i) | Verb::Del(i) | Verb::Check(i),
                        Verb::Add(j) | Verb::Del(j) | Verb::Check(j),
                    ) => i == j,
                    _ => false,
                };
                if same(v, w) {
                    step(&k, &pods, &live, v, None);
                    invariants(&k, &pods, &live.borrow(), &format!("seed {seed}, step {n}: {v:?}"));
                    continue;
                }
                let inner_extra = match (v, w) {
                    (Verb::Add(i), Verb::Gc(_)) => Some(i),
                    _ => None,
                };
                if let (Verb::Gc(_), Verb::Add(j)) = (v, w) {
                    extra = Some(j);
                }
                let (k2, p2, l2) = (k.clone(), pods.clone(), live.clone());
                k.before_apply(move || step(&k2, &p2, &l2, w, inner_extra));
            }
            if r.below(8) == 0 {
                k.fail_next([Fault::After(libc::ENOBUFS)]);
            }
            step(&k, &pods, &live, v, extra);
            // a concurrent verb only runs if this one reached the kernel with a transaction
            k.clear_hooks();
            invariants(&k, &pods, &live.borrow(), &format!("seed {seed}, step {n}: {v:?}"));
        }
    }
}

#[test]
fn point_reads_stay_small() {
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    let many = pod("n", "m", "10.0.0.6/24", &(1..=500).map(|p| (p, p, "tcp")).collect::<Vec<_>>());
    for p in [&a, &many] {
        let Scope::Point { keys, chains, rules } = plan::add_scope(&p.intent, &p.conf.conditions) else {
            unreachable!()
        };
        assert_eq!(keys.len(), 2, "the record and the netns record, whatever the mappings");
        assert_eq!(chains.len(), 8, "every chain but masquerade4/6 (their rules follow the prefix lengths)");
        assert!(!rules, "no rule dump");
        let Scope::Point { keys, rules, .. } = plan::del_scope(&p.intent.owner) else { unreachable!() };
        assert_eq!((keys.len(), rules), (2, false));
    }
}

/// An ADD into an intact table reads no rule; a flushed hook is seen by its chain's reference
/// count, and the ADD repairs it on a full read.
#[test]
fn point_reads_see_a_missing_jump() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    let s =
        crate::kernel::Kernel::read(&mut k.clone(), &plan::add_scope(&a.intent, &a.conf.conditions)).unwrap();
    assert!(s.found.rules.is_empty());
    assert!(s.found.hooked(), "{:?}", s.found.uses);
    k.edit(|t| t.as_mut().unwrap().chains.iter_mut().find(|(n, _)| n == "output").unwrap().1.clear());
    let s =
        crate::kernel::Kernel::read(&mut k.clone(), &plan::add_scope(&a.intent, &a.conf.conditions)).unwrap();
    assert!(!s.found.hooked(), "gate4 has one jump, not two");
    let b = pod("n", "b", "10.0.0.6/24", &[(9090, 90, "tcp")]);
    add(&k, &b).unwrap();
    check(&k, &a).unwrap();
}

/// issue 27 finding 2: after a ruleset flush, the guard comes back for an attachment without
/// host ports (flow::guard), CHECK's reader names what is missing, and an intact table is
/// neither read in full nor written.
#[test]
fn the_guard_comes_back_without_host_ports_after_a_flush() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    assert!(guard_intact(&k));
    // `nft flush ruleset`: the table is gone
    k.edit(|t| *t = None);
    let conds = crate::config::Conditions::default();
    let missing = flow::guard_missing(&mut k.clone(), &conds).unwrap();
    assert_eq!(missing, ["table inet cni_portmap does not exist"]);
    flow::guard(&mut k.clone(), &conds).unwrap();
    assert!(guard_intact(&k));
    assert!(elements(&k).is_empty(), "the static part only: {:?}", elements(&k));
    assert!(flow::guard_missing(&mut k.clone(), &conds).unwrap().is_empty());
    let (g, commits) = (k.generation(), k.commits());
    flow::guard(&mut k.clone(), &conds).unwrap();
    assert_eq!((k.generation(), k.commits()), (g, commits), "intact: nothing written");
    // a guard chain emptied by hand is refilled, and reported before
    k.edit(|t| {
        let t = t.as_mut().unwrap();
        t.chains.iter_mut().find(|(n, _)| n == "localnet").unwrap().1.clear();
    });
    assert_eq!(
        flow::guard_missing(&mut k.clone(), &conds).unwrap(),
        ["chain localnet does not hold the rules of this layout (0 rules found, 6 declared)"]
    );
    flow::guard(&mut k.clone(), &conds).unwrap();
    assert!(guard_intact(&k));
}

/// With user conditions, the guard's setup after a flush includes the gate chain, which only
/// nft can write: the guard's plan carries that script, and the guard itself then completes the
/// table the script made (found by the CI mutation sample: before, the bare table the script
/// left was taken for one of the previous layout and the `localnet` guard was not restored
/// until an ADD with host ports came).
#[test]
fn the_guard_restored_with_conditions_writes_their_gate_chain_through_nft() {
    let k = Fake::new();
    let c = json!({"conditionsV4": ["ip", "daddr", "!=", "192.0.2.9"]});
    let a = pod_with("n", "a", "eth0", &["10.0.0.5/24"], c, &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    let gate = layout::gate_chain(Family::V4, &a.conf.conditions.v4);
    k.edit(|t| *t = None);
    let before = k.scripts().len();
    flow::guard(&mut k.clone(), &a.conf.conditions).unwrap();
    assert!(guard_intact(&k));
    assert_eq!(k.scripts().len(), before + 1, "the gate chain written by nft");
    let chains: Vec<String> = k.table().unwrap().chains.iter().map(|(n, _)| n.clone()).collect();
    assert!(chains.contains(&gate), "{chains:?}");
    add(&k, &a).unwrap();
    check(&k, &a).unwrap();
}

/// The guard restored after a flush while another verb rebuilds the table between the guard's
/// read and its transaction: the guard's setup holds only at the generation it read, so it is
/// planned again on the new table (nothing to do) instead of adding the static part's rules a
/// second time.
#[test]
fn the_guard_restored_while_an_add_rebuilds_the_table_is_planned_again() {
    let k = Fake::new();
    let a = pod("n", "a", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    add(&k, &a).unwrap();
    let intact = k.table();
    k.edit(|t| *t = None);
    let conds = crate::config::Conditions::default();
    let (k2, a2) = (k.clone(), a.clone());
    k.before_apply(move || add(&k2, &a2).map(|_| ()).unwrap());
    flow::guard(&mut k.clone(), &conds).unwrap();
    k.clear_hooks();
    assert!(guard_intact(&k));
    check(&k, &a).unwrap();
    let shape = |t: Option<crate::kernel::fake::Table>| -> Vec<(String, usize)> {
        t.expect("a table").chains.into_iter().map(|(n, r)| (n, r.len())).collect()
    };
    assert_eq!(shape(k.table()), shape(intact), "the chains ADD made, no rule twice");
}

/// One pod on several networks, one address in turn (issue 39 item 3): a pod dies without DEL,
/// host-local's liveness reclaim gives its address to the next pod, whose ADD must take the
/// masquerade elements keyed by that address (container address and port, no owner in the
/// key): GC of the dead attachment then leaves them, and the new pod's CHECK passes.
#[test]
fn an_address_reused_after_a_death_without_del_keeps_its_masquerade_elements_through_gc() {
    let k = Fake::new();
    let dead = pod("n", "dead", "10.0.0.5/24", &[(8080, 80, "tcp")]);
    let new = pod("n", "new", "10.0.0.5/24", &[(8081, 80, "tcp")]);
    add(&k, &dead).unwrap();
    add(&k, &new).unwrap();
    check(&k, &new).unwrap();
    let valid = BTreeSet::from([new.intent.owner.tag.clone()]);
    flow::gc(&mut k.clone(), &crate::identity::portmap_net_prefix("n"), &valid).unwrap();
    check(&k, &new).unwrap_or_else(|e| panic!("the new pod after GC of the dead one: {}", e.msg));
    assert!(traces(&k, &dead.intent.owner).is_empty(), "{:?}", traces(&k, &dead.intent.owner));
}
