//! The verbs through the fake kernel: what ADD builds for ingress only, egress only and both;
//! every failure point of ADD (and a lost reply at each) rolls back or leaves only what DEL
//! removes; DEL after each partial ADD, twice, and with the container's namespace gone; CHECK
//! against each kind of drift, one at a time; GC over this network's, other networks' and
//! upstream's ifbs; resync; STATUS.

use cni_common::attachment::AttachmentId;
use cni_common::code;
use cni_common::netlink::tc::{
    self, FilterAction, Psched, Tbf, INGRESS_HANDLE, TCA_EGRESS_REDIR, TC_ACT_STOLEN,
};
use cni_common::netlink::Link;
use cni_common::spec::result::{CniResult, Interface};

use crate::config::{Limits, Shape};
use crate::flow;
use crate::identity::{ifb_group, IfbIdentity};
use crate::kernel::fake::{Fake, Fault, Op, Side, PSCHED};
use crate::kernel::Kernel;

const NET: &str = "kubenet";
const NETNS: &str = "/run/netns/pod";
const VETH: &str = "veth1234";

fn att() -> AttachmentId {
    AttachmentId::new(NET, "c0ffee", "eth0")
}

fn ifb() -> String {
    att().ifb_name()
}

fn psched() -> Psched {
    Psched::parse(PSCHED).unwrap()
}

/// The host veth of a pod, as bridge or ptp leaves it; its index.
fn pod(k: &mut Fake) -> u32 {
    k.veth(VETH, "eth0").0
}

fn prev() -> CniResult {
    CniResult {
        interfaces: vec![
            Interface { name: "cni0".into(), ..Default::default() },
            Interface { name: VETH.into(), ..Default::default() },
            Interface { name: "eth0".into(), sandbox: NETNS.into(), ..Default::default() },
        ],
        ..Default::default()
    }
}

const IN: Shape = Shape { rate: 8000, burst: Some(800) };
const OUT: Shape = Shape { rate: 16000, burst: Some(1600) };

fn both() -> Limits {
    Limits { ingress: Some(IN), egress: Some(OUT) }
}

fn ingress_only() -> Limits {
    Limits { ingress: Some(IN), egress: None }
}

fn egress_only() -> Limits {
    Limits { ingress: None, egress: Some(OUT) }
}

fn add(k: &mut Fake, l: &Limits) -> cni_common::Result<CniResult> {
    flow::add(k, &att(), l, prev())
}

fn check(k: &mut Fake, l: &Limits) -> cni_common::Result<()> {
    flow::check(k, &att(), l, &prev())
}

fn del(k: &mut Fake) -> cni_common::Result<()> {
    flow::del(k, &att())
}

fn tbf(s: &Shape) -> Tbf {
    Tbf::with_latency(s.rate_bytes(), s.burst_bytes(1500), crate::desired::LATENCY, &psched())
}

/// What the host holds: its links, and every qdisc and filter, as text.
fn host_state(k: &Fake) -> (Vec<String>, Vec<String>, Vec<String>) {
    let qdiscs = k
        .qdiscs
        .iter()
        .map(|q| {
            format!(
                "{} {} {} {:?}",
                k.links[&(Side::Host, q.ifindex)].name,
                q.kind,
                tc::handle_str(q.handle),
                q.tbf
            )
        })
        .collect();
    let filters = k.filters.iter().map(|f| format!("{f:?}")).collect();
    (k.host_names(), qdiscs, filters)
}

fn ifb_index(k: &Fake) -> u32 {
    k.host(&ifb()).expect("the ifb").index
}

/// A fake with the pod's veth and what ADD of `l` made on it; the veth's index.
fn added(l: &Limits) -> (Fake, u32) {
    let mut k = Fake::new();
    let veth = pod(&mut k);
    add(&mut k, l).unwrap();
    (k, veth)
}

// ---- ADD ----

#[test]
fn add_both_builds_two_buckets_the_ifb_and_one_redirect() {
    let mut k = Fake::new();
    let veth = pod(&mut k);
    let r = add(&mut k, &both()).unwrap();
    // The result: prevResult's interfaces and the ifb, with its MAC.
    assert_eq!(r.interfaces.len(), 4);
    let i = &r.interfaces[3];
    assert_eq!(i.name, ifb());
    assert!(i.sandbox.is_empty());
    assert_eq!(i.mac, cni_common::mac::Mac::text(k.host(&ifb()).unwrap().mac));
    assert!(!i.mac.is_empty());
    // The ifb: our name, the veth's MTU and queue length, our alias and group, up.
    let l = k.host(&ifb()).unwrap().clone();
    assert_eq!(l.kind.as_deref(), Some("ifb"));
    assert_eq!((l.mtu, l.txqlen, l.group), (1500, 1000, ifb_group(NET)));
    assert_eq!(l.alias.as_deref(), Some("cni-bandwidth net=kubenet ctr=c0ffee if=eth0"));
    assert!(l.up());
    // The buckets and the redirect.
    assert_eq!(k.qdiscs_of(veth), vec!["tbf 1:", "ingress ffff:"]);
    assert_eq!(k.qdiscs_of(l.index), vec!["tbf 1:"]);
    let root = |i: u32| k.qdiscs.iter().find(|q| q.ifindex == i && q.kind == "tbf").unwrap().tbf;
    assert_eq!(root(veth), Some(tbf(&IN)));
    assert_eq!(root(l.index), Some(tbf(&OUT)));
    assert_eq!(k.filters.len(), 1);
    let f = &k.filters[0];
    assert_eq!((f.ifindex, f.parent, f.prio, f.kind.as_str()), (veth, INGRESS_HANDLE, 1, "u32"));
    assert!(f.actions[0].is_egress_redirect_to(l.index));
    check(&mut k, &both()).unwrap();
    del(&mut k).unwrap();
    assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]));
}

#[test]
fn add_ingress_only_makes_no_ifb() {
    let mut k = Fake::new();
    let veth = pod(&mut k);
    let r = add(&mut k, &ingress_only()).unwrap();
    assert_eq!(r, prev(), "no ifb to report");
    assert_eq!(k.host_names(), vec![VETH]);
    assert_eq!(k.qdiscs_of(veth), vec!["tbf 1:"]);
    assert!(k.filters.is_empty());
    check(&mut k, &ingress_only()).unwrap();
    // CHECK of both on what ingress-only made: the ifb is missing.
    let e = check(&mut k, &both()).unwrap_err();
    assert_eq!(e.msg, format!("ifb {} not found", ifb()));
    del(&mut k).unwrap();
    assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]));
}

#[test]
fn add_egress_only_leaves_the_veth_root_alone() {
    let mut k = Fake::new();
    let veth = pod(&mut k);
    let r = add(&mut k, &egress_only()).unwrap();
    assert_eq!(r.interfaces.last().unwrap().name, ifb());
    assert_eq!(k.qdiscs_of(veth), vec!["ingress ffff:"]);
    assert_eq!(k.qdiscs_of(ifb_index(&k)), vec!["tbf 1:"]);
    check(&mut k, &egress_only()).unwrap();
    let e = check(&mut k, &both()).unwrap_err();
    assert_eq!(
        e.msg,
        format!("traffic into the container: no tbf qdisc 1: at the root of {VETH} (root qdisc: noqueue 0:)")
    );
    del(&mut k).unwrap();
    assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]));
}

#[test]
fn the_ifb_takes_the_veths_mtu_and_a_queue_of_at_least_1000() {
    for (txqlen, want) in [(0, 1000), (500, 1000), (5000, 5000)] {
        let mut k = Fake::new();
        let veth = pod(&mut k);
        let l = k.links.get_mut(&(Side::Host, veth)).unwrap();
        (l.mtu, l.txqlen) = (9000, txqlen);
        add(&mut k, &egress_only()).unwrap();
        let l = k.host(&ifb()).unwrap();
        assert_eq!((l.mtu, l.txqlen), (9000, want));
    }
}

/// Every changing call of ADD, failing in turn: the error is returned and the host is as
/// before (for every limit shape, with and without a leftover of an earlier ADD to replace:
/// the leftover's removal is not undone, it was to be replaced).
#[test]
fn every_failure_point_of_add_rolls_back() {
    for l in [both(), ingress_only(), egress_only()] {
        let mut clean = Fake::new();
        pod(&mut clean);
        let before = host_state(&clean);
        let mut probe = clean.clone();
        add(&mut probe, &l).unwrap();
        let total = probe.changes;
        assert!(total >= 1, "{l:?}");
        for n in 1..=total {
            let mut k = Fake { fail_at: Some(n), ..clean.clone() };
            let e = add(&mut k, &l).unwrap_err();
            assert_eq!(e.code, code::INTERNAL, "{l:?} at {n}: {}", e.msg);
            assert_eq!(host_state(&k), before, "{l:?}: failure at change {n} left something");
            // DEL after it is still fine, and a retried ADD builds it all.
            del(&mut k).unwrap();
            add(&mut k, &l).unwrap();
            check(&mut k, &l).unwrap();
        }
    }
}

#[test]
fn a_failed_add_over_a_leftover_leaves_only_what_del_removes() {
    let (base, _) = added(&both());
    let mut probe = base.clone();
    let start = probe.changes;
    add(&mut probe, &both()).unwrap();
    let total = probe.changes - start;
    assert!(total > 5, "{total}: the leftovers are cleared, then everything built again");
    for n in 1..=total {
        let mut k = Fake { fail_at: Some(start + n), ..base.clone() };
        add(&mut k, &both()).unwrap_err();
        del(&mut k).unwrap();
        assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]), "after a failure at {n}");
    }
}

/// A lost reply at each changing call of ADD: the change happened, ADD failed. What is left
/// is removed by DEL, and a retried ADD (a runtime retrying without DEL) replaces it.
#[test]
fn a_lost_reply_at_each_step_of_add_leaves_only_what_del_removes() {
    let ops = [Op::QdiscAddTbf, Op::CreateIfb, Op::QdiscAddIngress, Op::FilterAdd];
    for op in ops {
        for nth in 1..=2 {
            let mut k = Fake::new();
            pod(&mut k);
            k.faults.push((op, nth, Fault::LostReply));
            let r = add(&mut k, &both());
            if k.calls.get(&op).copied().unwrap_or(0) < nth {
                r.unwrap();
                continue;
            }
            let e = r.unwrap_err();
            assert!(e.msg.contains(&format!("{op:?}")), "{op:?} {nth}: {}", e.msg);
            let mut retried = k.clone();
            add(&mut retried, &both()).unwrap();
            check(&mut retried, &both()).unwrap();
            del(&mut k).unwrap();
            assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]), "{op:?} {nth}");
        }
    }
}

#[test]
fn the_undo_goes_on_when_one_of_its_steps_fails() {
    // The redirect fails; the undo's first step (the ingress qdisc) fails too: the ifb and the
    // root bucket are still removed.
    let mut k = Fake::new();
    let veth = pod(&mut k);
    k.fault(Op::FilterAdd, 1, Fault::Fail(libc::ENOMEM));
    k.fault(Op::QdiscDel, 1, Fault::Fail(libc::EBUSY));
    add(&mut k, &both()).unwrap_err();
    assert_eq!(k.host_names(), vec![VETH]);
    assert_eq!(k.qdiscs_of(veth), vec!["ingress ffff:"], "only the step that failed to undo is left");
    del(&mut k).unwrap();
    assert!(k.qdiscs.is_empty());
}

#[test]
fn a_link_vanishing_during_add_fails_it_and_the_undo_copes() {
    // The pod went (its veth with it) between finding the veth and shaping it.
    let mut k = Fake::new();
    pod(&mut k);
    k.vanish_at(Op::QdiscAddTbf, 1, VETH);
    let e = add(&mut k, &both()).unwrap_err();
    assert!(e.msg.starts_with(&format!("shape traffic into the container on {VETH}")), "{}", e.msg);
    assert_eq!(host_state(&k), (vec![], vec![], vec![]));
    del(&mut k).unwrap();
    // Someone deleted the new ifb before its bucket was added: the undo's delete finds nothing,
    // the veth's bucket still goes.
    let mut k = Fake::new();
    pod(&mut k);
    k.vanish_at(Op::QdiscAddTbf, 2, &ifb());
    let e = add(&mut k, &both()).unwrap_err();
    assert!(e.msg.starts_with(&format!("shape traffic out of the container on {}", ifb())), "{}", e.msg);
    assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]));
    // A create answered EEXIST (another ADD of the same attachment got there first) fails this
    // one and leaves nothing of it.
    let mut k = Fake::new();
    pod(&mut k);
    k.fault(Op::CreateIfb, 1, Fault::Fail(libc::EEXIST));
    let e = add(&mut k, &egress_only()).unwrap_err();
    assert!(e.msg.starts_with("create ifb for traffic out of the container"), "{}", e.msg);
    assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]));
}

#[test]
fn add_errors_name_the_step() {
    let cases = [
        (Op::QdiscAddTbf, 1, format!("shape traffic into the container on {VETH}")),
        (Op::CreateIfb, 1, "create ifb for traffic out of the container".to_string()),
        (Op::QdiscAddTbf, 2, format!("shape traffic out of the container on {}", ifb())),
        (Op::QdiscAddIngress, 1, "QdiscAddIngress".to_string()),
        (Op::FilterAdd, 1, "FilterAdd".to_string()),
    ];
    for (op, nth, want) in cases {
        let mut k = Fake::new();
        pod(&mut k);
        k.faults.push((op, nth, Fault::Fail(libc::ENOMEM)));
        let e = add(&mut k, &both()).unwrap_err();
        assert!(e.msg.starts_with(&want), "{op:?}: {}", e.msg);
    }
}

#[test]
fn add_replaces_its_own_leftovers_and_upstreams_ifb() {
    // Its own: ADD again without DEL.
    let (mut k, veth) = added(&both());
    let first = host_state(&k);
    add(&mut k, &both()).unwrap();
    let (names, qdiscs, _) = host_state(&k);
    assert_eq!((names.len(), qdiscs.len()), (first.0.len(), first.1.len()));
    check(&mut k, &both()).unwrap();
    // A leftover bucket of other values is replaced too.
    let q = k.qdiscs.iter_mut().find(|q| q.ifindex == veth && q.kind == "tbf").unwrap();
    q.tbf.as_mut().unwrap().rate += 1;
    add(&mut k, &both()).unwrap();
    check(&mut k, &both()).unwrap();
    // Upstream's ifb of this attachment (no alias, group 0): replaced by ours.
    let mut k = Fake::new();
    let veth = pod(&mut k);
    let up = k.plant_ifb(&ifb(), None, 0);
    k.plant_filter(
        veth,
        1,
        FilterAction::Mirred { eaction: TCA_EGRESS_REDIR, ifindex: up, verdict: TC_ACT_STOLEN },
    );
    add(&mut k, &both()).unwrap();
    assert_ne!(ifb_index(&k), up);
    assert_eq!(k.host(&ifb()).unwrap().group, ifb_group(NET));
    assert_eq!(k.filters.len(), 1);
    check(&mut k, &both()).unwrap();
    // Without egress, a leftover ifb of ours goes and none is made.
    let (mut k, _) = added(&both());
    add(&mut k, &ingress_only()).unwrap();
    assert_eq!(k.host_names(), vec![VETH]);
    check(&mut k, &ingress_only()).unwrap();
}

#[test]
fn add_refuses_an_ifb_name_of_someone_else_before_changing_anything() {
    let other = AttachmentId::new(NET, "c0ffee", "net1");
    let cases: [(Link, String); 4] = [
        (
            Link { kind: Some("dummy".into()), ..Link::default() },
            format!("cannot create ifb: {} exists and is a dummy device, not an ifb", ifb()),
        ),
        (
            Link { kind: None, ..Link::default() },
            format!("cannot create ifb: {} exists and is a plain device, not an ifb", ifb()),
        ),
        (
            Link { kind: Some("ifb".into()), alias: Some("my own ifb".into()), ..Link::default() },
            format!("cannot create ifb: {} has an alias not written by this plugin", ifb()),
        ),
        (
            Link { kind: Some("ifb".into()), alias: Some(other.ifb_alias()), ..Link::default() },
            format!(
                "cannot create ifb: {} already shapes container c0ffee interface net1 of network kubenet (the ifb \
                 name is derived from network and container id only, so one container can have one egress-shaped \
                 interface per network)",
                ifb()
            ),
        ),
    ];
    for (link, want) in cases {
        let mut k = Fake::new();
        pod(&mut k);
        k.plant(Side::Host, Link { name: ifb(), ..link });
        let before = host_state(&k);
        let e = add(&mut k, &both()).unwrap_err();
        assert_eq!(e.code, code::INTERNAL);
        assert_eq!(e.msg, want);
        assert_eq!(host_state(&k), before);
        assert_eq!(k.changes, 0);
        // Ingress only needs no ifb: the foreign one is left alone.
        add(&mut k, &ingress_only()).unwrap();
        assert!(k.host(&ifb()).is_some());
        // DEL leaves it too.
        del(&mut k).unwrap();
        assert!(k.host(&ifb()).is_some());
    }
}

#[test]
fn an_alias_that_recorded_less_names_the_owner_as_far_as_it_goes() {
    for (alias, who) in [
        ("cni-bandwidth net=other ctr=x".to_string(), "container x of network other"),
        ("cni-bandwidth net=other".to_string(), "an attachment of network other"),
        ("cni-bandwidth net=other if=eth0".to_string(), "an attachment of network other"),
    ] {
        let mut k = Fake::new();
        pod(&mut k);
        k.plant_ifb(&ifb(), Some(&alias), 0);
        let e = add(&mut k, &egress_only()).unwrap_err();
        assert!(e.msg.contains(&format!("already shapes {who} (")), "{}", e.msg);
    }
}

#[test]
fn add_refuses_another_root_qdisc_on_the_veth_when_shaping_into_the_container() {
    let mut k = Fake::new();
    let veth = pod(&mut k);
    k.qdiscs.push(tc::Qdisc {
        ifindex: veth,
        handle: tc::handle(2, 0),
        parent: tc::TC_H_ROOT,
        kind: "htb".into(),
        tbf: None,
    });
    let before = host_state(&k);
    let e = add(&mut k, &both()).unwrap_err();
    assert_eq!(e.msg, format!("host veth {VETH} already has a root qdisc htb 2:: not replacing it"));
    assert_eq!(host_state(&k), before);
    // Egress only does not touch the root.
    add(&mut k, &egress_only()).unwrap();
    assert_eq!(k.qdiscs_of(veth), vec!["htb 2:", "ingress ffff:"]);
    // A tbf of another handle is someone else's too.
    let mut k = Fake::new();
    let veth = pod(&mut k);
    let t = tbf(&IN);
    k.qdiscs.push(tc::Qdisc {
        ifindex: veth,
        handle: tc::handle(3, 0),
        parent: tc::TC_H_ROOT,
        kind: "tbf".into(),
        tbf: Some(t),
    });
    assert!(add(&mut k, &ingress_only()).unwrap_err().msg.contains("root qdisc tbf 3:"));
}

#[test]
fn add_refuses_an_ingress_qdisc_with_someone_elses_filters() {
    let mirred =
        |ifindex| FilterAction::Mirred { eaction: TCA_EGRESS_REDIR, ifindex, verdict: TC_ACT_STOLEN };
    // A redirect to a device that exists, and a filter with another action.
    for action in [None, Some(FilterAction::Other("gact".into()))] {
        let mut k = Fake::new();
        let veth = pod(&mut k);
        let other = k.plant(Side::Host, Link { name: "eth1".into(), ..Link::default() });
        k.plant_filter(veth, 5, action.unwrap_or_else(|| mirred(other)));
        let before = host_state(&k);
        let e = add(&mut k, &both()).unwrap_err();
        assert_eq!(e.msg, format!("host veth {VETH} already has an ingress qdisc with filters of someone else: not replacing it"));
        assert_eq!(host_state(&k), before);
        // Ingress only does not need the ingress qdisc: built, and the foreign one stays.
        add(&mut k, &ingress_only()).unwrap();
        assert_eq!(k.qdiscs_of(veth), vec!["ingress ffff:", "tbf 1:"]);
        assert_eq!(k.filters.len(), 1);
        // DEL leaves it alone.
        del(&mut k).unwrap();
        assert_eq!(k.qdiscs_of(veth), vec!["ingress ffff:"]);
    }
    // A redirect into a device that is gone (index 0, or an index nothing has) is a leftover.
    for target in [0, 999] {
        let mut k = Fake::new();
        let veth = pod(&mut k);
        k.plant_filter(veth, 1, mirred(target));
        add(&mut k, &both()).unwrap();
        check(&mut k, &both()).unwrap();
        assert_eq!(k.filters.len(), 1);
    }
}

#[test]
fn add_finds_the_host_veth_through_the_container_end() {
    let mut k = Fake::new();
    let e = add(&mut k, &both()).unwrap_err();
    assert_eq!(e.msg, "container interface eth0 not found in CNI_NETNS");
    // Not a veth.
    let mut k = Fake::new();
    k.plant(Side::Container, Link { name: "eth0".into(), kind: Some("macvlan".into()), ..Link::default() });
    let e = add(&mut k, &both()).unwrap_err();
    assert_eq!(
        e.msg,
        "container interface eth0 is a macvlan device, not a veth: bandwidth only shapes veth-attached containers"
    );
    let mut k = Fake::new();
    k.plant(Side::Container, Link { name: "eth0".into(), ..Link::default() });
    assert!(add(&mut k, &both()).unwrap_err().msg.contains("is a plain device"));
    // A veth whose peer is not (or no longer) in the host namespace, or not its peer.
    let no_peer = "container interface eth0 has no veth peer in the host namespace";
    let breakers: [fn(&mut Fake, u32, u32); 6] = [
        |k, _, c| k.links.get_mut(&(Side::Container, c)).unwrap().link_netnsid = None,
        |k, _, c| k.links.get_mut(&(Side::Container, c)).unwrap().link = None,
        |k, h, _| drop(k.links.remove(&(Side::Host, h))),
        |k, h, _| k.links.get_mut(&(Side::Host, h)).unwrap().kind = Some("dummy".into()),
        |k, h, _| k.links.get_mut(&(Side::Host, h)).unwrap().link = Some(h),
        |k, h, _| k.links.get_mut(&(Side::Host, h)).unwrap().link_netnsid = None,
    ];
    for (i, br) in breakers.iter().enumerate() {
        let mut k = Fake::new();
        let (h, c) = k.veth(VETH, "eth0");
        br(&mut k, h, c);
        let e = add(&mut k, &both()).unwrap_err();
        assert_eq!(e.msg, no_peer, "case {i}");
        assert_eq!(k.changes, 0);
    }
}

#[test]
fn the_host_veth_must_be_listed_in_prev_result() {
    let mut k = Fake::new();
    pod(&mut k);
    let e = flow::add(&mut k, &att(), &both(), CniResult::default()).unwrap_err();
    assert_eq!(e.code, code::INVALID_CONFIG);
    assert!(e.msg.starts_with("prevResult lists no interfaces"), "{}", e.msg);
    let mut p = prev();
    p.interfaces.remove(1);
    p.interfaces.push(Interface { name: VETH.into(), sandbox: NETNS.into(), ..Default::default() });
    let e = flow::add(&mut k, &att(), &both(), p.clone()).unwrap_err();
    assert_eq!(e.msg, format!("the host end {VETH} of container interface eth0 is not among prevResult's host interfaces [cni0]"));
    assert_eq!(flow::check(&mut k, &att(), &both(), &p).unwrap_err().msg, e.msg);
    assert_eq!(k.changes, 0);
}

#[test]
fn an_unreadable_clock_fails_add_check_and_status() {
    let mut k = Fake::new();
    pod(&mut k);
    k.psched = None;
    let e = add(&mut k, &both()).unwrap_err();
    assert_eq!(e.code, code::IO);
    assert!(e.msg.starts_with("read the packet scheduler clock: "), "{}", e.msg);
    assert_eq!(k.changes, 0);
    assert_eq!(check(&mut k, &both()).unwrap_err().code, code::IO);
    let e = flow::status(k.psched()).unwrap_err();
    assert_eq!(e.code, code::NOT_AVAILABLE);
    assert!(e.msg.starts_with("cannot read /proc/net/psched: "), "{}", e.msg);
    flow::status(Fake::new().psched()).unwrap();
}

// ---- DEL ----

#[test]
fn del_twice_and_del_of_nothing_succeed() {
    for l in [both(), ingress_only(), egress_only()] {
        let (mut k, _) = added(&l);
        del(&mut k).unwrap();
        let after = host_state(&k);
        del(&mut k).unwrap();
        assert_eq!(host_state(&k), after);
        assert_eq!(after, (vec![VETH.to_string()], vec![], vec![]));
    }
    let mut k = Fake::new();
    del(&mut k).unwrap();
}

/// ADD killed after its first `n` changes (nothing of its undo ran): the state is built by
/// carrying out the first `n` of ADD's steps; DEL removes all of it.
#[test]
fn del_after_each_partial_add_leaves_nothing() {
    use crate::plan::Step;
    let steps = |k: &Fake| {
        crate::plan::add_steps(&crate::desired::desired(&both(), k.host(VETH).unwrap(), &att(), &psched()))
    };
    let mut k = Fake::new();
    pod(&mut k);
    let total = steps(&k).len();
    assert_eq!(total, 5);
    for n in 0..=total {
        let mut k = Fake::new();
        let veth = pod(&mut k);
        let mut ifb_ix = 0;
        for s in steps(&k).iter().take(n) {
            match s {
                Step::VethTbf(t) => k.qdisc_add_tbf(veth, tc::handle(1, 0), tc::TC_H_ROOT, t).unwrap(),
                Step::CreateIfb(spec) => ifb_ix = k.create_ifb(spec).unwrap().index,
                Step::IfbTbf(t) => k.qdisc_add_tbf(ifb_ix, tc::handle(1, 0), tc::TC_H_ROOT, t).unwrap(),
                Step::Ingress => k.qdisc_add_ingress(veth).unwrap(),
                Step::Redirect => k.filter_add_redirect(veth, INGRESS_HANDLE, 1, ifb_ix).unwrap(),
            }
        }
        assert_eq!(k.qdiscs.len() + k.host_names().len() + k.filters.len(), 1 + n, "{n} steps applied");
        del(&mut k).unwrap();
        assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]), "killed after {n}");
        del(&mut k).unwrap();
    }
}

#[test]
fn del_with_the_namespace_gone_removes_the_ifb() {
    let (mut k, veth) = added(&both());
    // The namespace went, and with it the veth pair and its qdiscs.
    k.ns_gone = true;
    let c = k.links.keys().find(|(s, _)| *s == Side::Container).copied().unwrap();
    k.links.remove(&c);
    k.links.remove(&(Side::Host, veth));
    k.qdiscs.retain(|q| q.ifindex != veth);
    k.filters.clear();
    k.calls.clear();
    del(&mut k).unwrap();
    assert!(k.host_names().is_empty());
    assert!(k.qdiscs.is_empty());
    assert_eq!(k.calls.get(&Op::CtrLink), None, "no container to look into");
}

#[test]
fn del_with_the_container_end_gone_but_the_namespace_there_removes_the_ifb() {
    let (mut k, _) = added(&both());
    let c = k.links.keys().find(|(s, _)| *s == Side::Container).copied().unwrap();
    k.links.get_mut(&c).unwrap().name = "eth9".into();
    del(&mut k).unwrap();
    assert!(k.host(&ifb()).is_none());
}

#[test]
fn del_whose_namespace_cannot_be_entered_still_removes_the_ifb_and_says_why() {
    let (mut k, _) = added(&both());
    k.ns_error = true;
    let e = del(&mut k).unwrap_err();
    assert!(e.msg.contains("cannot enter CNI_NETNS"), "{}", e.msg);
    assert!(k.host(&ifb()).is_none());
}

#[test]
fn del_collects_every_error_and_tries_every_step() {
    // The look-up of the ifb fails: the root bucket still goes, the ifb is deleted on the
    // second look-up; the ingress qdisc, whose redirect then cannot be told ours, is left for
    // the next DEL (the redirect points nowhere by then).
    let (mut k, veth) = added(&both());
    k.fault(Op::LinkByName, 1, Fault::Fail(libc::ENOBUFS));
    let e = del(&mut k).unwrap_err();
    assert!(e.msg.contains("LinkByName"), "{}", e.msg);
    assert_eq!(k.qdiscs_of(veth), vec!["ingress ffff:"]);
    assert!(k.host(&ifb()).is_none());
    del(&mut k).unwrap();
    assert!(k.qdiscs_of(veth).is_empty());
    // Clearing the veth fails: the ifb still goes.
    let (mut k, _) = added(&both());
    k.fault(Op::QdiscDel, 1, Fault::Fail(libc::EBUSY));
    let e = del(&mut k).unwrap_err();
    assert!(e.msg.contains("QdiscDel"), "{}", e.msg);
    assert!(k.host(&ifb()).is_none());
    // Deleting the ifb fails: said, with its name.
    let (mut k, _) = added(&both());
    k.fault(Op::LinkDel, 1, Fault::Fail(libc::EBUSY));
    let e = del(&mut k).unwrap_err();
    assert!(e.msg.starts_with(&format!("delete ifb {}", ifb())), "{}", e.msg);
    // The ifb vanished (GC got there first) between the look-up and the delete: fine.
    let (mut k, _) = added(&both());
    k.vanish_at(Op::LinkDel, 1, &ifb());
    del(&mut k).unwrap();
    assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]));
}

#[test]
fn del_clears_the_veth_of_upstreams_shaping_and_its_ifb() {
    let mut k = Fake::new();
    let veth = pod(&mut k);
    let up = k.plant_ifb(&ifb(), None, 0);
    k.qdiscs.push(tc::Qdisc {
        ifindex: veth,
        handle: tc::handle(1, 0),
        parent: tc::TC_H_ROOT,
        kind: "tbf".into(),
        tbf: Some(tbf(&IN)),
    });
    k.plant_filter(
        veth,
        1,
        FilterAction::Mirred { eaction: TCA_EGRESS_REDIR, ifindex: up, verdict: TC_ACT_STOLEN },
    );
    del(&mut k).unwrap();
    assert_eq!(host_state(&k), (vec![VETH.to_string()], vec![], vec![]));
}

#[test]
fn del_leaves_another_root_qdisc_alone() {
    let mut k = Fake::new();
    let veth = pod(&mut k);
    k.qdiscs.push(tc::Qdisc {
        ifindex: veth,
        handle: tc::handle(1, 0),
        parent: tc::TC_H_ROOT,
        kind: "htb".into(),
        tbf: None,
    });
    k.qdiscs.push(tc::Qdisc {
        ifindex: veth,
        handle: tc::handle(2, 0),
        parent: tc::TC_H_ROOT,
        kind: "tbf".into(),
        tbf: None,
    });
    del(&mut k).unwrap();
    assert_eq!(k.qdiscs_of(veth), vec!["htb 1:", "tbf 2:"]);
    assert_eq!(k.calls.get(&Op::QdiscDel), None);
}

// ---- CHECK ----

fn drifted(l: &Limits, drift: impl FnOnce(&mut Fake, u32, u32)) -> String {
    let (mut k, veth) = added(l);
    let ifb = k.host(&ifb()).map_or(0, |l| l.index);
    check(&mut k, l).unwrap();
    drift(&mut k, veth, ifb);
    check(&mut k, l).unwrap_err().msg
}

fn root_of(k: &mut Fake, index: u32) -> &mut Tbf {
    k.qdiscs.iter_mut().find(|q| q.ifindex == index && q.kind == "tbf").unwrap().tbf.as_mut().unwrap()
}

#[test]
fn check_finds_each_bucket_value_drifted() {
    let p = psched();
    let describe =
        |t: &Tbf| format!("rate {} B/s, burst {} B, limit {} B", t.rate, t.burst_bytes(&p), t.limit);
    for (dir, dev) in [("into", VETH.to_string()), ("out of", ifb())] {
        let want = if dir == "into" { tbf(&IN) } else { tbf(&OUT) };
        let pick = |veth: u32, ifb: u32| if dir == "into" { veth } else { ifb };
        let drifts: [fn(&mut Tbf); 3] = [|t| t.rate += 1, |t| t.buffer += 1000, |t| t.limit -= 1];
        for (i, d) in drifts.iter().enumerate() {
            let mut got = want;
            d(&mut got);
            let msg = drifted(&both(), |k, veth, ifb| *root_of(k, pick(veth, ifb)) = got);
            assert_eq!(
                msg,
                format!(
                    "traffic {dir} the container: tbf on {dev} has {}, expected {}",
                    describe(&got),
                    describe(&want)
                ),
                "drift {i}"
            );
        }
        let msg = drifted(&both(), |k, veth, ifb| {
            k.qdiscs.iter_mut().find(|q| q.ifindex == pick(veth, ifb) && q.kind == "tbf").unwrap().tbf = None
        });
        assert_eq!(msg, format!("traffic {dir} the container: cannot read the tbf parameters of {dev}"));
    }
}

#[test]
fn check_finds_a_root_qdisc_replaced_or_missing() {
    let msg = drifted(&both(), |k, veth, _| {
        let q = k.qdiscs.iter_mut().find(|q| q.ifindex == veth && q.kind == "tbf").unwrap();
        (q.kind, q.tbf) = ("fq_codel".into(), None);
    });
    assert_eq!(
        msg,
        format!(
            "traffic into the container: no tbf qdisc 1: at the root of {VETH} (root qdisc: fq_codel 1:)"
        )
    );
    let msg = drifted(&both(), |k, veth, _| {
        k.qdiscs.iter_mut().find(|q| q.ifindex == veth && q.kind == "tbf").unwrap().handle = tc::handle(2, 0);
    });
    assert!(msg.ends_with("(root qdisc: tbf 2:)"), "{msg}");
    let msg = drifted(&egress_only(), |k, _, ifb| k.qdiscs.retain(|q| q.ifindex != ifb));
    assert_eq!(
        msg,
        format!(
            "traffic out of the container: no tbf qdisc 1: at the root of {} (root qdisc: noqueue 0:)",
            ifb()
        )
    );
    // A tbf 1: under another parent is not the root one.
    let msg = drifted(&ingress_only(), |k, veth, _| {
        k.qdiscs.iter_mut().find(|q| q.ifindex == veth && q.kind == "tbf").unwrap().parent = tc::handle(5, 1);
    });
    assert!(msg.ends_with("(root qdisc: noqueue 0:)"), "{msg}");
}

#[test]
fn check_finds_the_ifb_missing_down_or_someone_elses() {
    let msg = drifted(&both(), |k, _, ifb| k.link_del(ifb).unwrap());
    assert_eq!(msg, format!("ifb {} not found", ifb()));
    let msg = drifted(&both(), |k, _, ifb| k.links.get_mut(&(Side::Host, ifb)).unwrap().flags = 0);
    assert_eq!(msg, format!("ifb {} is down", ifb()));
    let msg = drifted(&both(), |k, _, ifb| {
        k.links.get_mut(&(Side::Host, ifb)).unwrap().alias = Some("cni-bandwidth net=other".into())
    });
    assert!(msg.starts_with(&format!("{} already shapes an attachment of network other", ifb())), "{msg}");
}

#[test]
fn check_finds_the_redirect_missing_or_elsewhere() {
    let msg = drifted(&both(), |k, _, _| k.filters.clear());
    assert_eq!(
        msg,
        format!("no u32 match-all filter on {VETH} ffff: redirecting to {} (found 0 filter(s))", ifb())
    );
    let msg = drifted(&both(), |k, veth, _| k.qdiscs.retain(|q| !(q.ifindex == veth && q.kind == "ingress")));
    assert_eq!(msg, format!("no ingress qdisc ffff: on {VETH}"));
    // A qdisc with the handle ffff: that is not the ingress one is not it.
    let msg = drifted(&egress_only(), |k, veth, _| {
        k.qdiscs.retain(|q| q.ifindex != veth);
        k.filters.clear();
        k.qdiscs.push(tc::Qdisc {
            ifindex: veth,
            handle: INGRESS_HANDLE,
            parent: tc::TC_H_ROOT,
            kind: "prio".into(),
            tbf: None,
        });
    });
    assert_eq!(msg, format!("no ingress qdisc ffff: on {VETH}"));
    let other = |k: &mut Fake| k.plant(Side::Host, Link { name: "eth1".into(), ..Link::default() });
    let drifts: [fn(&mut tc::Filter, u32); 6] = [
        |f, o| {
            f.actions =
                vec![FilterAction::Mirred { eaction: TCA_EGRESS_REDIR, ifindex: o, verdict: TC_ACT_STOLEN }]
        },
        |f, _| f.actions = vec![FilterAction::Other("gact".into())],
        |f, _| f.kind = "matchall".into(),
        |f, _| f.match_all = false,
        |f, _| f.protocol = 0x0800,
        |f, _| {
            if let FilterAction::Mirred { eaction, .. } = &mut f.actions[0] {
                *eaction = 2; // mirror, not redirect
            }
        },
    ];
    for (i, d) in drifts.iter().enumerate() {
        let msg = drifted(&both(), |k, _, _| {
            let o = other(k);
            d(&mut k.filters[0], o);
        });
        assert_eq!(
            msg,
            format!("no u32 match-all filter on {VETH} ffff: redirecting to {} (found 1 filter(s))", ifb()),
            "{i}"
        );
    }
    // Another filter beside ours does not matter.
    let (mut k, veth) = added(&both());
    k.plant_filter(veth, 9, FilterAction::Other("gact".into()));
    check(&mut k, &both()).unwrap();
}

#[test]
fn no_limits_want_nothing_and_check_compares_nothing() {
    // flow::check is only called with limits (the plugin returns earlier); the desired state
    // of no limits is nothing to compare.
    let (mut k, _) = added(&ingress_only());
    let s = flow::shaped(&mut k, &att(), &prev(), &Limits::default()).unwrap();
    assert_eq!(s.desired, crate::desired::Desired::default());
    crate::shape::check(&mut k, &s.veth, &s.desired, &att(), &s.psched).unwrap();
}

// ---- GC ----

#[test]
fn gc_keeps_valid_attachments_other_networks_and_upstreams_in_use() {
    let mut k = Fake::new();
    let veth = pod(&mut k);
    add(&mut k, &both()).unwrap();
    let keep = ifb();
    let gone = AttachmentId::new(NET, "vanished", "eth0");
    k.plant_ifb(&gone.ifb_name(), Some(&gone.ifb_alias()), gone.ifb_group());
    // An ADD killed before its alias was written: this network's group, no alias.
    let killed = AttachmentId::new(NET, "killed", "eth0");
    k.plant_ifb(&killed.ifb_name(), None, ifb_group(NET));
    let retried = AttachmentId::new(NET, "retried", "eth0");
    k.plant_ifb(&retried.ifb_name(), None, ifb_group(NET));
    // Another network's.
    let other = AttachmentId::new("othernet", "x", "eth0");
    k.plant_ifb(&other.ifb_name(), Some(&other.ifb_alias()), other.ifb_group());
    let other_nameless = AttachmentId::new("othernet", "y", "eth0");
    k.plant_ifb(&other_nameless.ifb_name(), None, ifb_group("othernet"));
    // Someone's ifb with an alias we did not write, and a bwp dummy.
    k.plant_ifb("bwpfeedfeedfeed", Some("hand made"), ifb_group(NET));
    k.plant(
        Side::Host,
        Link {
            name: "bwp000000000000".into(),
            kind: Some("dummy".into()),
            group: ifb_group(NET),
            ..Link::default()
        },
    );
    // Upstream's: one in use (a redirect into it), one dead.
    let used = k.plant_ifb("bwp0123456789ab", None, 0);
    let (v2, _) = k.veth("veth2", "eth0x");
    k.plant_filter(
        v2,
        1,
        FilterAction::Mirred { eaction: TCA_EGRESS_REDIR, ifindex: used, verdict: TC_ACT_STOLEN },
    );
    k.plant_ifb("bwpaaaaaaaaaaaa", None, 0);
    // Our alias-less retried one of the same valid attachment: its ADD is being retried.
    let valid = vec![att(), retried.clone()];
    flow::gc(&mut k, NET, &valid).unwrap();
    let mut left = k.host_names();
    left.sort();
    let mut want = vec![
        keep,
        retried.ifb_name(),
        other.ifb_name(),
        other_nameless.ifb_name(),
        "bwpfeedfeedfeed".into(),
        "bwp000000000000".into(),
        "bwp0123456789ab".into(),
        VETH.into(),
        "veth2".into(),
    ];
    want.sort();
    assert_eq!(left, want);
    check(&mut k, &both()).unwrap();
    assert_eq!(k.qdiscs_of(veth), vec!["tbf 1:", "ingress ffff:"]);
    // With nothing valid, this network's ifb goes too; upstream's in use still stays.
    flow::gc(&mut k, NET, &[]).unwrap();
    assert!(k.host(&ifb()).is_none());
    assert!(k.host("bwp0123456789ab").is_some());
}

#[test]
fn gc_keeps_an_ifb_whose_alias_names_a_valid_attachment_only_under_its_name() {
    // An ifb aliased for a valid attachment but under another name is not that attachment's.
    let mut k = Fake::new();
    let a = att();
    k.plant_ifb("bwp111111111111", Some(&a.ifb_alias()), a.ifb_group());
    flow::gc(&mut k, NET, std::slice::from_ref(&a)).unwrap();
    assert!(k.host_names().is_empty());
    // And one of a valid attachment's network and container, but another interface, goes.
    let mut k = Fake::new();
    let other_if = AttachmentId::new(NET, "c0ffee", "net1");
    k.plant_ifb(&a.ifb_name(), Some(&other_if.ifb_alias()), a.ifb_group());
    flow::gc(&mut k, NET, &[a]).unwrap();
    assert!(k.host_names().is_empty());
}

#[test]
fn gc_and_del_each_succeed_on_what_the_other_removed() {
    let gone = AttachmentId::new(NET, "vanished", "eth0");
    let mut k = Fake::new();
    k.plant_ifb(&gone.ifb_name(), Some(&gone.ifb_alias()), gone.ifb_group());
    k.plant_ifb("bwpaaaaaaaaaaaa", None, 0);
    // Both vanish between GC's listing and its deletes.
    k.vanish_at(Op::LinkDel, 1, &gone.ifb_name());
    k.vanish_at(Op::LinkDel, 2, "bwpaaaaaaaaaaaa");
    flow::gc(&mut k, NET, &[]).unwrap();
    assert!(k.host_names().is_empty());
    // A delete that fails otherwise is reported, with the name; the rest still goes.
    let mut k = Fake::new();
    k.plant_ifb(&gone.ifb_name(), Some(&gone.ifb_alias()), gone.ifb_group());
    k.plant_ifb("bwpaaaaaaaaaaaa", None, 0);
    k.fault(Op::LinkDel, 1, Fault::Fail(libc::EBUSY));
    let e = flow::gc(&mut k, NET, &[]).unwrap_err();
    assert!(e.msg.starts_with(&format!("GC: delete ifb {}", gone.ifb_name())), "{}", e.msg);
    assert_eq!(k.host_names(), vec![gone.ifb_name()]);
    // Upstream's failing delete is reported too.
    let mut k = Fake::new();
    k.plant_ifb("bwpaaaaaaaaaaaa", None, 0);
    k.fault(Op::LinkDel, 1, Fault::Fail(libc::EBUSY));
    let e = flow::gc(&mut k, NET, &[]).unwrap_err();
    assert!(e.msg.starts_with("GC: delete upstream's ifb bwpaaaaaaaaaaaa"), "{}", e.msg);
    // Listing fails: an error.
    let mut k = Fake::new();
    k.fault(Op::Links, 1, Fault::Fail(libc::ENOBUFS));
    flow::gc(&mut k, NET, &[]).unwrap_err();
    let mut k = Fake::new();
    k.plant_ifb("bwpaaaaaaaaaaaa", None, 0);
    k.fault(Op::Links, 2, Fault::Fail(libc::ENOBUFS));
    flow::gc(&mut k, NET, &[]).unwrap_err();
}

#[test]
fn gc_keeps_upstreams_ifb_of_a_valid_attachment_even_unused() {
    let mut k = Fake::new();
    let a = AttachmentId::new(NET, "up", "eth0");
    k.plant_ifb(&a.ifb_name(), None, 0);
    let lookalikes = ["bwp0123456789aB", "bwp0123456789a", "xyz0123456789ab"];
    for n in lookalikes {
        k.plant_ifb(n, None, 0);
    }
    k.plant_ifb("bwpbbbbbbbbbbbb", None, 7);
    k.plant(
        Side::Host,
        Link { name: "bwpcccccccccccc".into(), kind: Some("dummy".into()), ..Link::default() },
    );
    assert_eq!(crate::upstream::gc(&mut k, NET, std::slice::from_ref(&a)).unwrap(), Vec::<String>::new());
    assert_eq!(k.calls.get(&Op::Qdiscs), None, "nothing to judge: no redirect read");
    assert!(k.host(&a.ifb_name()).is_some());
    assert_eq!(crate::upstream::gc(&mut k, NET, &[]).unwrap(), vec![a.ifb_name()]);
    assert_eq!(k.host_names().len(), lookalikes.len() + 2);
}

// ---- resync ----

#[test]
fn resync_rebuilds_what_is_missing() {
    let (mut k, _) = added(&both());
    assert_eq!(flow::resync(&mut k, &att(), &both(), &prev(), false).unwrap(), None);
    let i = ifb_index(&k);
    k.link_del(i).unwrap();
    let before = host_state(&k);
    let dry = flow::resync(&mut k, &att(), &both(), &prev(), true).unwrap();
    assert_eq!(dry, Some(format!("ifb {} not found", ifb())));
    assert_eq!(host_state(&k), before);
    let done = flow::resync(&mut k, &att(), &both(), &prev(), false).unwrap();
    assert_eq!(done, dry);
    check(&mut k, &both()).unwrap();
    // A rebuild that fails is an error; one whose comparison afterwards fails says so.
    let mut k = Fake::new();
    pod(&mut k);
    k.fault(Op::QdiscAddTbf, 1, Fault::Fail(libc::EIO));
    let e = flow::resync(&mut k, &att(), &ingress_only(), &prev(), false).unwrap_err();
    assert!(e.msg.starts_with(&format!("shape traffic into the container on {VETH}")), "{}", e.msg);
    let mut k = Fake::new();
    pod(&mut k);
    // The fourth qdisc listing is the comparison after the rebuild (CHECK's, then ADD's two).
    k.fault(Op::Qdiscs, 4, Fault::Fail(libc::ENOBUFS));
    let e = flow::resync(&mut k, &att(), &ingress_only(), &prev(), false).unwrap_err();
    assert!(e.msg.starts_with("still missing after rebuilding it: "), "{}", e.msg);
    check(&mut k, &ingress_only()).unwrap();
}
