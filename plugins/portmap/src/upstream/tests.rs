use super::*;
use cni_common::spec::result::{Interface, IpConfig};
use cni_common::upstream::iptables::SAVED_FOR_TESTS;
use serde_json::json;

fn prev() -> CniResult {
    CniResult {
        interfaces: vec![
            Interface { name: "cbr9".into(), ..Default::default() },
            Interface { name: "eth0".into(), sandbox: "/run/netns/x".into(), ..Default::default() },
        ],
        ips: vec![IpConfig { interface: Some(1), address: "10.77.0.2/24".parse().unwrap(), gateway: None }],
        ..Default::default()
    }
}

fn spec(extra: Value) -> Spec {
    let mut c = json!({"runtimeConfig": {"portMappings": [
        {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 18081, "containerPort": 81, "protocol": "udp"}]}});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    Spec::from_json("swnet", "ctrA", "eth0", &c, Some(&prev())).unwrap()
}

#[test]
fn captured_upstream_state_is_complete() {
    let t = Table::parse(SAVED_FOR_TESTS);
    let s = spec(json!({}));
    assert_eq!(s.udp_ports(), vec![18081]);
    assert_eq!(missing_rule(&t, &s, Fam::V4), None);
    assert_eq!(missing_rule(&t, &s, Fam::V6), None, "no IPv6 address: nothing to check");
    // A mapping upstream did not make, or another container, is missing.
    let more = Spec::from_json(
        "swnet",
        "ctrA",
        "eth0",
        &json!({"runtimeConfig": {"portMappings": [{"hostPort": 9, "containerPort": 9, "protocol": "tcp"}]}}),
        Some(&prev()),
    )
    .unwrap();
    assert!(missing_rule(&t, &more, Fam::V4).unwrap().contains("--dport 9"));
    let nosnat = spec(json!({"snat": false}));
    assert_eq!(missing_rule(&t, &nosnat, Fam::V4), None, "extra mark rules do not hurt");
    let keep = HashSet::new();
    assert_eq!(dead_in(&t, "swnet", &keep), vec!["ctrA"]);
    assert!(dead_in(&t, "swnet", &HashSet::from(["ctrA"])).is_empty());
    assert_eq!(udp_ports_in(&t, "CNI-DN-6c848780a988c4f72c3ef"), vec![18081]);
}

#[test]
fn rules_in_upstream_order() {
    let s = spec(json!({}));
    let d = dnat_rules(&s, Fam::V4).unwrap();
    assert_eq!(d.chain, "CNI-DN-6c848780a988c4f72c3ef");
    assert_eq!(d.entries.len(), 2);
    assert_eq!(d.entries[0].join(" "), "-m comment --comment dnat name: \"swnet\" id: \"ctrA\" -m multiport -p tcp --destination-ports 18080 -j CNI-DN-6c848780a988c4f72c3ef");
    let rules: Vec<String> = d.rules.iter().map(|r| r.join(" ")).collect();
    assert_eq!(
        rules,
        vec![
            "-p tcp --dport 18080 -s 10.77.0.2/24 -j CNI-HOSTPORT-SETMARK",
            "-p tcp --dport 18080 -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK",
            "-p tcp --dport 18080 -j DNAT --to-destination 10.77.0.2:80",
            "-p udp --dport 18081 -s 10.77.0.2/24 -j CNI-HOSTPORT-SETMARK",
            "-p udp --dport 18081 -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK",
            "-p udp --dport 18081 -j DNAT --to-destination 10.77.0.2:81",
        ]
    );
    assert!(dnat_rules(&s, Fam::V6).is_none());
    // 16 ports of one protocol: two multiport rules; hostIP of the other family skipped.
    let many: Vec<Value> =
        (1..=16).map(|p| json!({"hostPort": 1000 + p, "containerPort": 80, "protocol": "tcp"})).collect();
    let mut c =
        json!({"runtimeConfig": {"portMappings": many}, "markMasqBit": 5, "externalSetMarkChain": ""});
    c["runtimeConfig"]["portMappings"]
        .as_array_mut()
        .unwrap()
        .push(json!({"hostPort": 7, "containerPort": 7, "protocol": "udp", "hostIP": "fd00::1"}));
    let s = Spec::from_json("n", "c", "eth0", &c, Some(&prev())).unwrap();
    let d = dnat_rules(&s, Fam::V4).unwrap();
    assert_eq!(d.entries.len(), 3, "tcp 15 + 1, udp 1 (ports of every mapping)");
    assert_eq!(d.rules.len(), 16 * 3);
    assert_eq!(s.mark(), "0x20/0x20");
    let p = plumbing_rules(&s);
    assert_eq!(p.len(), 5);
    assert!(p
        .iter()
        .any(|(c, a, first)| c == "POSTROUTING" && *first && a.last().unwrap() == "CNI-HOSTPORT-MASQ"));
    assert!(p.iter().any(|(c, a, _)| c == "CNI-HOSTPORT-SETMARK" && a.contains(&"0x20/0x20".to_string())));
    let ext =
        Spec::from_json("n", "c", "eth0", &json!({"externalSetMarkChain": "KUBE-MARK-MASQ"}), None).unwrap();
    assert_eq!(plumbing_rules(&ext).len(), 2, "no SETMARK/MASQ with an external chain");
}

#[test]
fn lenient_and_strict_parsing() {
    assert!(Spec::from_json("n", "c", "eth0", &json!({"markMasqBit": 40}), None).is_err());
    assert!(Spec::from_json(
        "n",
        "c",
        "eth0",
        &json!({"runtimeConfig": {"portMappings": [{"hostPort": 0}]}}),
        None
    )
    .is_err());
    let s = Spec::from_json("n", "c", "eth0", &json!({"snat": null}), None).unwrap();
    assert!(s.conf.snat() && s.mappings().is_empty() && s.v4.is_none());
}

// ---- DEL, CHECK and GC through the seam, against upstream's state in the fake node ----

use super::fake::{Fake, Fault, Op};
use cni_common::spec::env::Env;
use cni_common::spec::{Command, Version};
use cni_common::upstream::iptables::Backend::{Legacy, Nft};
use cni_common::{code, CniError, Request};

const DUAL: &[&str] = &["10.0.0.5/24", "fd00::5/64"];
const V4: &[&str] = &["10.0.0.5/24"];
const V6: &[&str] = &["fd00::5/64"];

/// A request for container `id` of network `net` with these container addresses, mapping
/// tcp 8080→80 and udp 5353→53 (GC: `valid` is the valid list's container ids).
fn req(cmd: Command, net: &str, id: &str, addrs: &[&str], valid: &[&str]) -> Request {
    let ips: Vec<Value> = addrs.iter().map(|a| json!({"address": a, "interface": 0})).collect();
    let mut v = json!({
        "cniVersion": "1.1.0", "name": net, "type": "portmap",
        "runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp"}]},
        "prevResult": {"cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}], "ips": ips}
    });
    if cmd == Command::Gc {
        let list: Vec<Value> = valid.iter().map(|c| json!({"containerID": c, "ifname": "eth0"})).collect();
        v["cni.dev/valid-attachments"] = json!(list);
        v.as_object_mut().unwrap().remove("prevResult");
    }
    let env = Env {
        command: Some(cmd),
        container_id: id.into(),
        netns: "/run/netns/x".into(),
        ifname: "eth0".into(),
        args: String::new(),
        path: "/opt/cni/bin".into(),
        netns_override: true,
    };
    Request::new(env, serde_json::to_vec(&v).unwrap(), &Version::ALL).expect("valid request")
}

fn spec_of(r: &Request) -> Spec {
    Spec::from_request(r).unwrap()
}

fn upstream_add(f: &Fake, backend: Backend, fam: Fam, spec: &Spec) {
    f.made_by_upstream(backend, fam, spec);
}

fn upstream_nft_add(f: &Fake, fam: Fam, spec: &Spec) {
    f.made_by_nft_backend(fam, spec);
}

fn has_chain(f: &Fake, backend: Backend, fam: Fam, chain: &str) -> bool {
    f.nat(backend, fam).is_some_and(|t| t.has_chain(chain))
}

/// Only the base chains, without a rule: nothing of upstream's portmap is left.
fn bare(f: &Fake, backend: Backend, fam: Fam) -> bool {
    f.nat(backend, fam).is_some_and(|t| t.rules.is_empty() && t.chains.len() == 4)
}

fn dn(net: &str, id: &str) -> String {
    names::dnat_chain(net, id)
}

#[test]
fn del_removes_the_iptables_form_in_each_backend_and_family_and_keeps_the_others() {
    let f = Fake::new();
    let c1 = spec_of(&req(Command::Add, "n", "c1", DUAL, &[]));
    let c2 = spec_of(&req(Command::Add, "n", "c2", DUAL, &[]));
    upstream_add(&f, Nft, Fam::V4, &c1);
    upstream_add(&f, Nft, Fam::V4, &c2);
    upstream_add(&f, Legacy, Fam::V6, &c1);
    del(&mut f.clone(), &req(Command::Del, "n", "c1", DUAL, &[])).unwrap();
    // IPv4 (iptables-nft): c1's chain and its entry rules gone, c2's and the shared chains kept
    assert!(!has_chain(&f, Nft, Fam::V4, &dn("n", "c1")));
    let t = f.nat(Nft, Fam::V4).unwrap();
    assert!(t
        .rules_in(names::HOSTPORT_DNAT)
        .all(|r| r.rule.target.as_deref() == Some(dn("n", "c2").as_str())));
    assert_eq!(missing_rule(&t, &c2, Fam::V4), None, "c2 whole");
    // IPv6 (iptables-legacy): c1 was the only one, the shared chains went with it
    assert!(bare(&f, Legacy, Fam::V6), "{:?}", f.nat(Legacy, Fam::V6));
    assert_eq!(f.flushed(), [(Fam::V4, 5353), (Fam::V6, 5353)], "c1's UDP flows forgotten");
    // the twin: c2 deleted too leaves IPv4 bare
    del(&mut f.clone(), &req(Command::Del, "n", "c2", DUAL, &[])).unwrap();
    assert!(bare(&f, Nft, Fam::V4), "{:?}", f.nat(Nft, Fam::V4));
}

#[test]
fn del_of_upstreams_captured_state_keeps_the_bridges_masquerading() {
    for backend in [Nft, Legacy] {
        let f = Fake::new();
        f.seed_saved(backend, Fam::V4, SAVED_FOR_TESTS);
        let removed = remove(&mut f.clone(), "swnet", "ctrA").unwrap();
        assert!(removed);
        let t = f.nat(backend, Fam::V4).unwrap();
        let left: Vec<&str> = t.chains.iter().map(String::as_str).collect();
        assert_eq!(left, ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING", "CNI-6c848780a988c4f72c3ef534"]);
        assert_eq!(t.rules.len(), 3, "the bridge's jump and its two rules: {:?}", t.rules);
        assert!(!remove(&mut f.clone(), "swnet", "ctrA").unwrap(), "nothing the second time");
    }
}

#[test]
fn del_removes_the_nftables_backends_rules_of_the_container_and_a_table_it_empties() {
    let f = Fake::new();
    let c1 = spec_of(&req(Command::Add, "n", "c1", DUAL, &[]));
    let c2 = spec_of(&req(Command::Add, "n", "c2", V4, &[]));
    upstream_nft_add(&f, Fam::V4, &c1);
    upstream_nft_add(&f, Fam::V6, &c1);
    upstream_nft_add(&f, Fam::V4, &c2);
    del(&mut f.clone(), &req(Command::Del, "n", "c1", DUAL, &[])).unwrap();
    let v4 = f.hostport(Fam::V4).expect("c2 keeps the IPv4 table");
    assert_eq!(v4.len(), 4);
    assert!(v4.iter().all(|r| r.comment.as_deref() == Some("c2")));
    assert_eq!(f.hostport(Fam::V6), None, "emptied: dropped");
    assert_eq!(f.flushed(), [(Fam::V4, 5353), (Fam::V6, 5353)]);
    // another network's container of the same id is the same container for upstream's
    // nftables backend (its comment names no network): DEL of c2 anywhere removes it
    del(&mut f.clone(), &req(Command::Del, "other", "c2", V4, &[])).unwrap();
    assert_eq!(f.hostport(Fam::V4), None);
}

#[test]
fn del_is_idempotent_and_runs_no_tool_when_nothing_is_there() {
    let f = Fake::new();
    f.without_tool(Nft);
    f.without_tool(Legacy);
    let r = req(Command::Del, "n", "c1", DUAL, &[]);
    del(&mut f.clone(), &r).unwrap();
    del(&mut f.clone(), &r).unwrap();
    assert!(f.calls().iter().all(|op| matches!(op, Op::Locate | Op::HostportRead)), "{:?}", f.calls());
    assert!(f.flushed().is_empty());
    // iptables-nft's state goes over netlink: no tool needed either
    upstream_add(&f, Nft, Fam::V4, &spec_of(&r));
    del(&mut f.clone(), &r).unwrap();
    assert!(bare(&f, Nft, Fam::V4));
    del(&mut f.clone(), &r).unwrap();
    // a configuration upstream would refuse: removed all the same, only the flush is lost
    let mut bad = r.config.clone();
    bad["runtimeConfig"]["portMappings"][0]["hostPort"] = json!(0);
    let odd = Request::new(r.env.clone(), serde_json::to_vec(&bad).unwrap(), &Version::ALL).unwrap();
    let f = Fake::new();
    upstream_add(&f, Legacy, Fam::V4, &spec_of(&r));
    del(&mut f.clone(), &odd).unwrap();
    assert!(bare(&f, Legacy, Fam::V4));
    assert!(f.flushed().is_empty());
}

#[test]
fn del_tries_every_table_and_reports_every_failure() {
    let f = Fake::new();
    let r = req(Command::Del, "n", "c1", DUAL, &[]);
    let s = spec_of(&r);
    upstream_add(&f, Nft, Fam::V4, &s);
    upstream_add(&f, Legacy, Fam::V6, &s);
    upstream_nft_add(&f, Fam::V4, &s);
    let busy = CniError::new(code::TRY_AGAIN, "nf_tables: resource busy");
    f.fail([Fault::Refused(Op::Teardown, busy)]);
    let e = del(&mut f.clone(), &r).unwrap_err();
    assert!(
        e.msg.contains("remove upstream's port mappings") && e.msg.contains("resource busy"),
        "{}",
        e.msg
    );
    assert!(has_chain(&f, Nft, Fam::V4, &dn("n", "c1")), "the refused table unchanged");
    assert!(bare(&f, Legacy, Fam::V6), "the other table done");
    assert_eq!(f.hostport(Fam::V4), None, "the nftables backend done");
    assert!(f.flushed().is_empty(), "no flush while DEL fails");
    // the runtime's next DEL finishes
    del(&mut f.clone(), &r).unwrap();
    assert!(bare(&f, Nft, Fam::V4));

    // two tables fail: both reported
    let f = Fake::new();
    upstream_add(&f, Nft, Fam::V4, &s);
    upstream_add(&f, Legacy, Fam::V6, &s);
    f.fail([
        Fault::Refused(Op::Teardown, CniError::internal("nft busy")),
        Fault::Refused(Op::Restore, CniError::internal("restore one")),
        Fault::Refused(Op::Restore, CniError::internal("restore two")),
        Fault::Refused(Op::Restore, CniError::internal("restore three")),
    ]);
    let e = del(&mut f.clone(), &r).unwrap_err();
    assert!(e.msg.contains("nft busy") && e.msg.contains("restore three"), "{}", e.msg);
    assert!(has_chain(&f, Nft, Fam::V4, &dn("n", "c1")) && has_chain(&f, Legacy, Fam::V6, &dn("n", "c1")));
    // what was found cannot be had at all: DEL fails before touching anything
    f.fail([Fault::Refused(Op::Locate, CniError::internal("cannot read /proc/net/ip6_tables_names"))]);
    let e = del(&mut f.clone(), &r).unwrap_err();
    assert!(e.msg.contains("ip6_tables_names"), "{}", e.msg);
    assert!(has_chain(&f, Nft, Fam::V4, &dn("n", "c1")));
}

#[test]
fn a_legacy_restore_refused_is_tried_again_from_a_new_save() {
    let f = Fake::new();
    let r = req(Command::Del, "n", "c1", V6, &[]);
    upstream_add(&f, Legacy, Fam::V6, &spec_of(&r));
    f.fail([
        Fault::Refused(Op::Restore, CniError::internal("ip6tables-legacy-restore: line 3 failed")),
        Fault::Refused(Op::Restore, CniError::internal("ip6tables-legacy-restore: line 3 failed")),
    ]);
    del(&mut f.clone(), &r).unwrap();
    assert!(bare(&f, Legacy, Fam::V6));
    assert_eq!(f.calls().iter().filter(|op| **op == Op::Save).count(), 3, "a new save each time");
}

#[test]
fn a_lost_answer_leaves_nothing_half_done_and_the_next_del_finishes() {
    for op in [Op::Teardown, Op::Restore, Op::HostportDelete] {
        let f = Fake::new();
        let r = req(Command::Del, "n", "c1", DUAL, &[]);
        let s = spec_of(&r);
        upstream_add(&f, Nft, Fam::V4, &s);
        upstream_add(&f, Legacy, Fam::V6, &s);
        upstream_nft_add(&f, Fam::V4, &s);
        f.fail([Fault::Lost(op, CniError::new(code::TRY_AGAIN, "answer lost"))]);
        match del(&mut f.clone(), &r) {
            // a legacy restore is tried again from a new save, which shows it done
            Ok(()) => assert_eq!(op, Op::Restore),
            Err(e) => assert!(op != Op::Restore && e.msg.contains("answer lost"), "{op:?}: {}", e.msg),
        }
        // whatever the transaction was, it happened whole: no chain without its entry rules
        // or the reverse
        for (b, fam) in [(Nft, Fam::V4), (Legacy, Fam::V6)] {
            let t = f.nat(b, fam).unwrap();
            let chain = t.has_chain(&dn("n", "c1"));
            let entries = t.jumps(names::HOSTPORT_DNAT, &dn("n", "c1")).count();
            assert_eq!(entries, if chain { 2 } else { 0 }, "{op:?} {b:?} {fam:?}: {t:?}");
            assert_eq!(missing_rule(&t, &s, fam).is_none(), chain, "{op:?}: all or nothing");
        }
        let left = f.hostport(Fam::V4).map_or(0, |r| r.len());
        assert!(left == 0 || left == 4, "{op:?}: {left}");
        del(&mut f.clone(), &r).unwrap();
        assert!(bare(&f, Nft, Fam::V4) && bare(&f, Legacy, Fam::V6), "{op:?}");
        assert!(f.hostport(Fam::V4).is_none_or(|r| r.is_empty()), "{op:?}");
    }
}

#[test]
fn legacy_state_without_its_tool_is_reported_not_ignored() {
    let f = Fake::new();
    let r = req(Command::Del, "n", "c1", V6, &[]);
    upstream_add(&f, Legacy, Fam::V6, &spec_of(&r));
    f.without_tool(Legacy);
    let e = del(&mut f.clone(), &r).unwrap_err();
    assert!(e.msg.contains("ip6tables-legacy-save is not installed"), "{}", e.msg);
    assert!(has_chain(&f, Legacy, Fam::V6, &dn("n", "c1")));
    let e = check(&mut f.clone(), &req(Command::Check, "n", "c1", V6, &[])).unwrap_err();
    assert!(e.msg.contains("ip6tables-legacy-save"), "{}", e.msg);
}

#[test]
fn check_judges_upstreams_iptables_form_per_family_in_either_backend() {
    for (addrs, fams) in [(DUAL, &Fam::BOTH[..]), (V4, &[Fam::V4][..]), (V6, &[Fam::V6][..])] {
        for backend in [Nft, Legacy] {
            let f = Fake::new();
            let r = req(Command::Check, "n", "c1", addrs, &[]);
            let s = spec_of(&r);
            assert_eq!(check(&mut f.clone(), &r).unwrap(), Found::Absent, "nothing made by upstream");
            for fam in fams {
                upstream_add(&f, backend, *fam, &s);
            }
            assert_eq!(check(&mut f.clone(), &r).unwrap(), Found::Intact, "{addrs:?} {backend:?}");
            // a rule of the last family's DNAT chain gone: incomplete, naming the backend
            let fam = *fams.last().unwrap();
            let mut t = f.nat(backend, fam).unwrap();
            let i = t.rules.iter().position(|x| x.rule.target.as_deref() == Some("DNAT")).unwrap();
            t.rules.remove(i);
            let mut text = String::from("*nat\n");
            for c in &t.chains {
                text.push_str(&format!(":{c} - [0:0]\n"));
            }
            for x in &t.rules {
                let words: Vec<String> = x.words.iter().map(|w| iptables::quote_word(w).unwrap()).collect();
                text.push_str(&format!("-A {} {}\n", x.chain, words.join(" ")));
            }
            f.seed_saved(backend, fam, &format!("{text}COMMIT\n"));
            let e = check(&mut f.clone(), &r).unwrap_err();
            assert!(
                e.msg.contains(&format!("iptables, {} backend) are incomplete", backend.name()))
                    && e.msg.contains("DNAT --to-destination"),
                "{}",
                e.msg
            );
        }
    }
}

#[test]
fn check_of_a_dual_stack_container_needs_both_families() {
    let f = Fake::new();
    let r = req(Command::Check, "n", "c1", DUAL, &[]);
    upstream_add(&f, Nft, Fam::V4, &spec_of(&r));
    let e = check(&mut f.clone(), &r).unwrap_err();
    assert!(e.msg.contains("nothing for the IPv6 address fd00::5/64"), "{}", e.msg);
    // the IPv6 half in the other backend, or in the nftables backend: whole
    let g = Fake::new();
    upstream_add(&g, Legacy, Fam::V6, &spec_of(&r));
    upstream_add(&g, Nft, Fam::V4, &spec_of(&r));
    assert_eq!(check(&mut g.clone(), &r).unwrap(), Found::Intact);
    upstream_nft_add(&f, Fam::V6, &spec_of(&r));
    assert_eq!(check(&mut f.clone(), &r).unwrap(), Found::Intact);
    // the IPv4 half missing instead
    let f = Fake::new();
    upstream_add(&f, Legacy, Fam::V6, &spec_of(&r));
    let e = check(&mut f.clone(), &r).unwrap_err();
    assert!(e.msg.contains("nothing for the IPv4 address 10.0.0.5/24"), "{}", e.msg);
}

#[test]
fn check_counts_the_nftables_backends_rules_as_upstreams_check_does() {
    for (addrs, fam, masq) in [(V4, Fam::V4, 2), (V6, Fam::V6, 1)] {
        let r = req(Command::Check, "n", "c1", addrs, &[]);
        let f = Fake::new();
        upstream_nft_add(&f, fam, &spec_of(&r));
        assert_eq!(check(&mut f.clone(), &r).unwrap(), Found::Intact);
        assert_eq!(nft_backend_missing_in(&mut f.clone(), &spec_of(&r)).unwrap(), None);
        // one masquerade rule short
        let f = Fake::new();
        f.hostport_rule(fam, "hostports", "c1");
        f.hostport_rule(fam, "hostip_hostports", "c1");
        for _ in 1..masq {
            f.hostport_rule(fam, "masquerading", "c1");
        }
        let e = check(&mut f.clone(), &r).unwrap_err();
        assert!(e.msg.contains("cni_hostport masquerading"), "{}", e.msg);
        // one mapping short (another container's rules do not count)
        let f = Fake::new();
        f.hostport_rule(fam, "hostports", "c1");
        f.hostport_rule(fam, "hostports", "c2");
        for _ in 0..masq {
            f.hostport_rule(fam, "masquerading", "c1");
        }
        let e = check(&mut f.clone(), &r).unwrap_err();
        assert!(e.msg.contains("cni_hostport hostports"), "{}", e.msg);
        let why = nft_backend_missing_in(&mut f.clone(), &spec_of(&r)).unwrap().unwrap();
        assert!(why.contains("hostports"), "{why}");
    }
}

#[test]
fn check_reports_an_unreadable_table_instead_of_guessing() {
    let f = Fake::new();
    let r = req(Command::Check, "n", "c1", V4, &[]);
    upstream_add(&f, Nft, Fam::V4, &spec_of(&r));
    f.fail([Fault::Refused(Op::Save, CniError::new(code::TRY_AGAIN, "iptables-nft-save: lock held"))]);
    let e = check(&mut f.clone(), &r).unwrap_err();
    assert_eq!((e.code, e.msg.as_str()), (code::TRY_AGAIN, "iptables-nft-save: lock held"));
    f.fail([Fault::Refused(Op::HostportRead, CniError::internal("netlink: ENOBUFS"))]);
    assert!(check(&mut f.clone(), &r).is_err());
    assert_eq!(check(&mut f.clone(), &r).unwrap(), Found::Intact);
}

#[test]
fn check_without_mappings_or_nf_tables_reads_only_what_can_exist() {
    let f = Fake::new();
    let r = req(Command::Check, "n", "c1", V4, &[]);
    upstream_nft_add(&f, Fam::V4, &spec_of(&r));
    f.without_nf_tables();
    assert_eq!(check(&mut f.clone(), &r).unwrap(), Found::Absent);
    let mut none = r.config.clone();
    none["runtimeConfig"]["portMappings"] = json!([]);
    let r = Request::new(r.env.clone(), serde_json::to_vec(&none).unwrap(), &Version::ALL).unwrap();
    let g = Fake::new();
    assert_eq!(check(&mut g.clone(), &r).unwrap(), Found::Absent);
    assert!(g.calls().is_empty(), "no mappings: nothing read");
}

#[test]
fn gc_removes_the_dead_of_this_network_only_in_each_table() {
    let f = Fake::new();
    let dead = spec_of(&req(Command::Add, "n", "c1", DUAL, &[]));
    let live = spec_of(&req(Command::Add, "n", "c2", DUAL, &[]));
    let other = spec_of(&req(Command::Add, "m", "c3", DUAL, &[]));
    for (b, fam) in [(Nft, Fam::V4), (Legacy, Fam::V6)] {
        for s in [&dead, &live, &other] {
            upstream_add(&f, b, fam, s);
        }
    }
    upstream_nft_add(&f, Fam::V4, &dead);
    gc(&mut f.clone(), &req(Command::Gc, "n", "c9", &[], &["c2"])).unwrap();
    for (b, fam) in [(Nft, Fam::V4), (Legacy, Fam::V6)] {
        let t = f.nat(b, fam).unwrap();
        assert!(!t.has_chain(&dn("n", "c1")) && t.jumps(names::HOSTPORT_DNAT, &dn("n", "c1")).count() == 0);
        assert_eq!(missing_rule(&t, &live, fam), None, "the valid one kept ({b:?} {fam:?})");
        assert_eq!(missing_rule(&t, &other, fam), None, "another network's kept ({b:?} {fam:?})");
    }
    assert_eq!(f.flushed(), [(Fam::V4, 5353), (Fam::V6, 5353)]);
    assert_eq!(f.hostport(Fam::V4).map(|r| r.len()), Some(4), "the nftables backend is DEL's");
    // all dead: the shared chains go too
    gc(&mut f.clone(), &req(Command::Gc, "n", "c9", &[], &[])).unwrap();
    gc(&mut f.clone(), &req(Command::Gc, "m", "c9", &[], &[])).unwrap();
    assert!(bare(&f, Nft, Fam::V4) && bare(&f, Legacy, Fam::V6));
    // nothing left: GC reads the chain names and stops
    let before = f.calls().len();
    gc(&mut f.clone(), &req(Command::Gc, "n", "c9", &[], &[])).unwrap();
    assert_eq!(f.calls()[before..], [Op::Locate]);
}

#[test]
fn gc_keeps_the_shared_chains_a_live_attachment_uses() {
    for b in [Nft, Legacy] {
        let f = Fake::new();
        upstream_add(&f, b, Fam::V4, &spec_of(&req(Command::Add, "n", "c1", V4, &[])));
        upstream_add(&f, b, Fam::V4, &spec_of(&req(Command::Add, "m", "c2", V4, &[])));
        gc(&mut f.clone(), &req(Command::Gc, "n", "c9", &[], &[])).unwrap();
        let t = f.nat(b, Fam::V4).unwrap();
        for c in [names::HOSTPORT_DNAT, names::HOSTPORT_SETMARK, names::HOSTPORT_MASQ] {
            assert!(t.has_chain(c), "{b:?} {c}");
        }
        assert_eq!(t.jumps("PREROUTING", names::HOSTPORT_DNAT).count(), 1);
    }
}

#[test]
fn gc_goes_on_past_a_failing_table_and_reports_it() {
    let f = Fake::new();
    let s = spec_of(&req(Command::Add, "n", "c1", DUAL, &[]));
    upstream_add(&f, Nft, Fam::V4, &s);
    upstream_add(&f, Legacy, Fam::V6, &s);
    f.fail([Fault::Refused(Op::Save, CniError::internal("iptables-nft-save: killed"))]);
    let e = gc(&mut f.clone(), &req(Command::Gc, "n", "c9", &[], &[])).unwrap_err();
    assert!(
        e.msg.contains("GC of upstream's iptables port mappings") && e.msg.contains("killed"),
        "{}",
        e.msg
    );
    assert!(has_chain(&f, Nft, Fam::V4, &dn("n", "c1")));
    assert!(bare(&f, Legacy, Fam::V6), "the other table collected");
    assert_eq!(f.flushed(), [(Fam::V6, 5353)]);
    // a lost answer: the teardown happened; the next GC finds the rest
    f.fail([Fault::Lost(Op::Teardown, CniError::new(code::TRY_AGAIN, "answer lost"))]);
    assert!(gc(&mut f.clone(), &req(Command::Gc, "n", "c9", &[], &[])).is_err());
    assert!(!has_chain(&f, Nft, Fam::V4, &dn("n", "c1")));
    gc(&mut f.clone(), &req(Command::Gc, "n", "c9", &[], &[])).unwrap();
    assert!(bare(&f, Nft, Fam::V4));
    // the chain names cannot be read: GC fails, nothing touched
    let g = Fake::new();
    upstream_add(&g, Legacy, Fam::V4, &s);
    g.fail([Fault::Refused(Op::Locate, CniError::internal("nf_tables: EPERM"))]);
    assert!(gc(&mut g.clone(), &req(Command::Gc, "n", "c9", &[], &[])).is_err());
    assert!(has_chain(&g, Legacy, Fam::V4, &dn("n", "c1")));
}

#[test]
fn gc_tidies_the_shared_chains_upstreams_del_left_and_the_pre_0_7_form() {
    // upstream's own DEL leaves the shared chains behind: GC of any network takes them out
    for b in [Nft, Legacy] {
        let f = Fake::new();
        let r = req(Command::Del, "n", "c1", V4, &[]);
        upstream_add(&f, b, Fam::V4, &spec_of(&r));
        let mut s = Script::default();
        let t = f.nat(b, Fam::V4).unwrap();
        for line in teardown("n", "c1").script(&t).lines() {
            s.push(line);
        }
        f.seed(b, Fam::V4, &s);
        assert!(has_chain(&f, b, Fam::V4, names::HOSTPORT_DNAT));
        gc(&mut f.clone(), &req(Command::Gc, "m", "c9", &[], &[])).unwrap();
        assert!(bare(&f, b, Fam::V4), "{b:?}: {:?}", f.nat(b, Fam::V4));
    }
    // versions before 0.7: CNI-SN-… jumped to from CNI-HOSTPORT-SNAT, found by its comment
    for b in [Nft, Legacy] {
        let f = Fake::new();
        let sn = names::snat_chain("n", "c1");
        let mut s = Script::default();
        s.new_chain(names::HOSTPORT_SNAT);
        s.new_chain(&sn);
        s.append("POSTROUTING", &iptables::words(&["-j", names::HOSTPORT_SNAT]));
        let comment = names::snat_comment("n", "c1");
        s.append(
            names::HOSTPORT_SNAT,
            &iptables::words(&["-m", "comment", "--comment", &comment, "-j", &sn]),
        );
        s.append(&sn, &iptables::words(&["-s", "10.0.0.5/32", "-j", "MASQUERADE"]));
        f.seed(b, Fam::V4, &s);
        gc(&mut f.clone(), &req(Command::Gc, "n", "c9", &[], &["c1"])).unwrap();
        assert!(has_chain(&f, b, Fam::V4, &sn), "valid: kept");
        gc(&mut f.clone(), &req(Command::Gc, "n", "c9", &[], &[])).unwrap();
        assert!(bare(&f, b, Fam::V4), "{b:?}: {:?}", f.nat(b, Fam::V4));
        // DEL finds it as well
        f.seed(b, Fam::V4, &s);
        assert!(remove(&mut f.clone(), "n", "c1").unwrap());
        assert!(bare(&f, b, Fam::V4), "{b:?}: {:?}", f.nat(b, Fam::V4));
    }
}

#[test]
fn conditions_of_each_family_go_into_that_familys_entry_rules() {
    let mut c = json!({"runtimeConfig": {"portMappings": [
        {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]},
        "conditionsV4": ["-s", "192.0.2.0/24"], "conditionsV6": ["!", "-s", "2001:db8::/32"]});
    let mut p = prev();
    p.ips.push(IpConfig { interface: Some(1), address: "fd00::2/64".parse().unwrap(), gateway: None });
    let s = Spec::from_json("swnet", "ctrA", "eth0", &c, Some(&p)).unwrap();
    let v4 = dnat_rules(&s, Fam::V4).unwrap().entries[0].join(" ");
    let v6 = dnat_rules(&s, Fam::V6).unwrap().entries[0].join(" ");
    assert!(v4.contains("--destination-ports 18080 -s 192.0.2.0/24 -j CNI-DN-"), "{v4}");
    assert!(v6.contains("--destination-ports 18080 ! -s 2001:db8::/32 -j CNI-DN-"), "{v6}");
    // upstream's form without the conditions is not the form of this configuration
    let f = Fake::new();
    f.made_by_upstream(Legacy, Fam::V4, &s);
    f.made_by_upstream(Legacy, Fam::V6, &s);
    let t = f.nat(Legacy, Fam::V4).unwrap();
    assert_eq!(missing_rule(&t, &s, Fam::V4), None);
    c.as_object_mut().unwrap().remove("conditionsV4");
    let bare_conds = Spec::from_json("swnet", "ctrA", "eth0", &c, Some(&p)).unwrap();
    assert!(missing_rule(&t, &bare_conds, Fam::V4).unwrap().contains("CNI-HOSTPORT-DNAT lacks"));
}

#[test]
fn host_ips_masq_all_and_ipv6_shape_the_rules_as_upstream_does() {
    let mut p = prev();
    p.ips.push(IpConfig { interface: Some(1), address: "fd00::2/64".parse().unwrap(), gateway: None });
    let rules = |extra: Value, ports: Value, fam: Fam| -> Vec<String> {
        let mut c = json!({"runtimeConfig": {"portMappings": ports}});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        let s = Spec::from_json("swnet", "ctrA", "eth0", &c, Some(&p)).unwrap();
        dnat_rules(&s, fam).unwrap().rules.iter().map(|r| r.join(" ")).collect()
    };
    let one = |ip: &str| json!([{"hostPort": 80, "containerPort": 8080, "protocol": "tcp", "hostIP": ip}]);
    // a host IP is matched; the unspecified one is every address (no -d)
    let r = rules(json!({"snat": false}), one("192.0.2.1"), Fam::V4);
    assert_eq!(r, ["-p tcp --dport 80 -d 192.0.2.1 -j DNAT --to-destination 10.77.0.2:8080"]);
    let r = rules(json!({"snat": false}), one("0.0.0.0"), Fam::V4);
    assert_eq!(r, ["-p tcp --dport 80 -j DNAT --to-destination 10.77.0.2:8080"]);
    let r = rules(json!({"snat": false}), one("::"), Fam::V6);
    assert_eq!(r, ["-p tcp --dport 80 -j DNAT --to-destination [fd00::2]:8080"]);
    // the localhost mark only for IPv4 without masqAll
    let plain = json!([{"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}]);
    assert_eq!(rules(json!({}), plain.clone(), Fam::V4).len(), 3);
    let r = rules(json!({}), plain.clone(), Fam::V6);
    assert_eq!(
        r,
        [
            "-p tcp --dport 80 -s fd00::2/64 -j CNI-HOSTPORT-SETMARK",
            "-p tcp --dport 80 -j DNAT --to-destination [fd00::2]:8080"
        ]
    );
    let r = rules(json!({"masqAll": true}), plain.clone(), Fam::V4);
    assert_eq!(
        r,
        [
            "-p tcp --dport 80 -s 0.0.0.0/0 -j CNI-HOSTPORT-SETMARK",
            "-p tcp --dport 80 -j DNAT --to-destination 10.77.0.2:8080"
        ]
    );
    let r = rules(json!({"masqAll": true}), plain, Fam::V6);
    assert_eq!(r[0], "-p tcp --dport 80 -s ::/0 -j CNI-HOSTPORT-SETMARK");
}

#[test]
fn the_nftables_backends_count_takes_a_host_ip_only_in_its_family() {
    let mut p = prev();
    p.ips.push(IpConfig { interface: Some(1), address: "fd00::2/64".parse().unwrap(), gateway: None });
    let c = json!({"snat": false, "runtimeConfig": {"portMappings": [
        {"hostPort": 80, "containerPort": 80, "protocol": "tcp", "hostIP": "192.0.2.1"},
        {"hostPort": 81, "containerPort": 81, "protocol": "tcp", "hostIP": "192.0.2.2"},
        {"hostPort": 82, "containerPort": 82, "protocol": "tcp"}]}});
    let s = Spec::from_json("swnet", "ctrA", "eth0", &c, Some(&p)).unwrap();
    let f = Fake::new();
    for _ in 0..3 {
        f.hostport_rule(Fam::V4, "hostip_hostports", "ctrA");
    }
    f.hostport_rule(Fam::V6, "hostports", "ctrA");
    assert_eq!(nft_backend_missing_in(&mut f.clone(), &s).unwrap(), None, "3 for IPv4, 1 for IPv6");
    let g = Fake::new();
    for _ in 0..2 {
        g.hostport_rule(Fam::V4, "hostports", "ctrA");
    }
    g.hostport_rule(Fam::V6, "hostports", "ctrA");
    let why = nft_backend_missing_in(&mut g.clone(), &s).unwrap().unwrap();
    assert!(why.contains("ip cni_hostport hostports"), "{why}");
}
