//! DEL, CHECK and GC through the [`Host`] seam with a fake node: our table in the fake kernel,
//! upstream's state of the attachment beside it. What only the end-to-end suites showed before:
//! CHECK judges upstream's form first, DEL and GC try every step and report every failure, a
//! table that cannot be opened leaves upstream's part to run.

use super::*;
use crate::kernel::fake::Fake;
use crate::model::NsId;
use crate::upstream::fake::{Fake as UpstreamFake, Fault, Op};
use crate::upstream::names::dnat_chain;
use crate::upstream::Spec;
use cni_common::spec::env::Env;
use cni_common::spec::{Command, Version};
use cni_common::upstream::iptables::Backend::{Legacy, Nft};
use serde_json::{json, Value};

#[derive(Default)]
struct FakeHost {
    table: Fake,
    /// `None`: nf_tables cannot be opened.
    tables_usable: bool,
    /// Upstream's iptables `nat` tables and nftables backend on the fake node.
    upstream: UpstreamFake,
    mark_fails: bool,
    /// What ran, in order.
    calls: Vec<&'static str>,
    flushed: Vec<(Family, u16)>,
}

impl FakeHost {
    fn new() -> FakeHost {
        FakeHost { tables_usable: true, ..FakeHost::default() }
    }
}

impl Host for FakeHost {
    fn tables(&mut self) -> Result<&mut dyn kernel::Kernel> {
        self.calls.push("tables");
        if !self.tables_usable {
            return Err(CniError::new(
                code::NOT_AVAILABLE,
                "nf_tables is not usable (netlink): EPROTONOSUPPORT",
            ));
        }
        Ok(&mut self.table)
    }
    fn upstream(&mut self) -> &mut dyn Upstream {
        self.calls.push("upstream");
        &mut self.upstream
    }
    fn mark_deleted(&mut self, _: &Owner) -> Result<()> {
        self.calls.push("mark");
        if self.mark_fails {
            return Err(CniError::new(code::TRY_AGAIN, "cannot mark: /run/cni/portmap is read-only"));
        }
        Ok(())
    }
    fn netns_now(&mut self, _: &Request) -> Result<Option<NsId>> {
        Ok(None)
    }
    fn localnet_on(&mut self, _: &CniResult) -> Vec<String> {
        Vec::new()
    }
    fn flush_udp(&mut self, ports: &BTreeSet<(Family, u16)>) {
        self.flushed.extend(ports.iter().copied());
    }
}

fn conf(ports: Value) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "n", "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": ports},
        "prevResult": {"cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/c1"}],
            "ips": [{"address": "10.0.0.5/24", "interface": 0}, {"address": "fd00::5/64", "interface": 0}]}
    })
}

fn request(command: Command, v: &Value) -> Request {
    let env = Env {
        command: Some(command),
        container_id: "c1".into(),
        netns: "/run/netns/c1".into(),
        ifname: "eth0".into(),
        args: String::new(),
        path: "/opt/cni/bin".into(),
        netns_override: true,
    };
    Request::new(env, serde_json::to_vec(v).unwrap(), &Version::ALL).expect("valid request")
}

fn web() -> Value {
    conf(json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 5353, "containerPort": 53, "protocol": "udp"}]))
}

/// Our state of the attachment, as ADD makes it, in `h`'s fake table.
fn add_ours(h: &mut FakeHost, v: &Value) {
    let req = request(Command::Add, v);
    let c = load(&req).unwrap();
    let prev = req.prev_result().unwrap().unwrap();
    let (intent, _) = Intent::new(&c, &prev, "eth0", owner(&req), None).unwrap();
    flow::add(&mut h.table, &c, &intent, &|_, _| None).unwrap();
}

fn has_ours(h: &FakeHost) -> bool {
    let tag = AttachmentId::new("n", "c1", "eth0").portmap_tag();
    h.table.table().is_some_and(|t| {
        t.sets.values().flat_map(|s| s.elems.values()).any(|e| e.comment.as_deref() == Some(tag.as_str()))
    })
}

/// Upstream's iptables form of the attachment `v` describes, made by upstream's ADD: IPv4 in
/// iptables-nft, IPv6 in iptables-legacy (a node that changed backends between the two).
fn upstreams_iptables(h: &FakeHost, v: &Value) -> Spec {
    let spec = Spec::from_request(&request(Command::Add, v)).unwrap();
    h.upstream.made_by_upstream(Nft, Family::V4, &spec);
    h.upstream.made_by_upstream(Legacy, Family::V6, &spec);
    spec
}

fn has_upstreams(h: &FakeHost) -> bool {
    let dn = dnat_chain("n", "c1");
    [(Nft, Family::V4), (Legacy, Family::V6)]
        .iter()
        .any(|(b, f)| h.upstream.nat(*b, *f).is_some_and(|t| t.has_chain(&dn)))
        || Family::BOTH.iter().any(|f| h.upstream.hostport(*f).is_some_and(|r| !r.is_empty()))
}

#[test]
fn check_judges_upstreams_form_first_and_never_reads_ours_then() {
    let mut h = FakeHost::new();
    upstreams_iptables(&h, &web());
    // our table has nothing of the attachment: judged on ours, CHECK would fail
    assert!(check_with(&mut h, &request(Command::Check, &web())).is_ok());
    assert_eq!(h.calls, ["upstream"], "upstream first, ours not read");
    // upstream's nftables backend, dual-stack: the same
    let mut h = FakeHost::new();
    let spec = Spec::from_request(&request(Command::Add, &web())).unwrap();
    for f in Family::BOTH {
        h.upstream.made_by_nft_backend(f, &spec);
    }
    assert!(check_with(&mut h, &request(Command::Check, &web())).is_ok());
    assert_eq!(h.calls, ["upstream"]);
    // upstream's configuration may be one ours refuses: still judged in upstream's form
    let mut h = FakeHost::new();
    let theirs =
        conf(json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "127.0.0.1"}]));
    upstreams_iptables(&h, &theirs);
    assert!(check_with(&mut h, &request(Command::Check, &theirs)).is_ok());
}

#[test]
fn check_reports_upstreams_incomplete_form_before_ours() {
    // upstream's IPv6 half lost: upstream's problem is the one reported, ours never read
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    let spec = Spec::from_request(&request(Command::Add, &web())).unwrap();
    h.upstream.made_by_upstream(Nft, Family::V4, &spec);
    let e = check_with(&mut h, &request(Command::Check, &web())).unwrap_err();
    assert!(e.msg.contains("nothing for the IPv6 address fd00::5/64"), "{}", e.msg);
    assert_eq!(h.calls, ["upstream"]);
}

#[test]
fn check_falls_back_to_ours_when_upstream_made_nothing() {
    let mut h = FakeHost::new();
    let e = check_with(&mut h, &request(Command::Check, &web())).unwrap_err();
    assert_eq!(h.calls.first(), Some(&"upstream"));
    assert!(h.calls.contains(&"tables"), "ours judged: {:?}", h.calls);
    assert_ne!(e.code, 0, "{}", e.msg);
    add_ours(&mut h, &web());
    check_with(&mut h, &request(Command::Check, &web())).expect("ours whole");
    // another container's upstream state is not this one's
    let other = Spec::from_json("n", "c2", "eth0", &web(), None).unwrap();
    let spec = Spec { v4: "10.0.0.6/24".parse().ok(), ..other };
    h.upstream.made_by_upstream(Nft, Family::V4, &spec);
    check_with(&mut h, &request(Command::Check, &web())).expect("ours whole, c2's upstream state ignored");
}

#[test]
fn check_reports_upstreams_unreadable_state_instead_of_judging_ours() {
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    upstreams_iptables(&h, &web());
    h.upstream
        .fail([Fault::Refused(Op::Save, CniError::new(code::TRY_AGAIN, "iptables-nft-save: lock held"))]);
    let e = check_with(&mut h, &request(Command::Check, &web())).unwrap_err();
    assert_eq!((e.code, e.msg.as_str()), (code::TRY_AGAIN, "iptables-nft-save: lock held"));
    assert_eq!(h.calls, ["upstream"]);
}

#[test]
fn del_removes_ours_and_upstreams_and_composes_their_errors() {
    // both there: both removed, UDP flows of our ports forgotten (and upstream's), marked first
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    upstreams_iptables(&h, &web());
    del_with(&mut h, &request(Command::Del, &web())).unwrap();
    assert_eq!(h.calls, ["mark", "tables", "upstream"]);
    assert!(!has_ours(&h) && !has_upstreams(&h));
    assert_eq!(h.flushed, [(Family::V4, 5353), (Family::V6, 5353)]);
    assert_eq!(h.upstream.flushed(), [(Family::V4, 5353), (Family::V6, 5353)]);

    // upstream's removal fails: ours is still removed, the error is upstream's
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    upstreams_iptables(&h, &web());
    h.upstream
        .fail([Fault::Refused(Op::Teardown, CniError::new(code::TRY_AGAIN, "nf_tables: resource busy"))]);
    let e = del_with(&mut h, &request(Command::Del, &web())).unwrap_err();
    assert!(!has_ours(&h), "ours removed although upstream's failed");
    assert_eq!(e.code, code::TRY_AGAIN);
    assert!(e.msg.contains("resource busy"), "{}", e.msg);
    assert!(has_upstreams(&h));
    del_with(&mut h, &request(Command::Del, &web())).expect("the retry finishes");
    assert!(!has_upstreams(&h));

    // ours fails (a lost answer on every attempt) and upstream's fails: both reported
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    upstreams_iptables(&h, &web());
    h.upstream.without_tool(Legacy);
    h.table.fail_reads([libc::EIO; 64]);
    let e = del_with(&mut h, &request(Command::Del, &web())).unwrap_err();
    assert!(e.msg.contains("ip6tables-legacy-save is not installed"), "{}", e.msg);
    assert!(
        e.msg.contains("could not delete the port mappings") && e.msg.contains("Input/output error"),
        "{}",
        e.msg
    );
    assert_eq!(e.code, code::INTERNAL, "neither says more than the other");
    assert_eq!(h.calls, ["mark", "tables", "upstream"], "every step tried");

    // ours fails, upstream's succeeds: ours reported, upstream's gone
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    upstreams_iptables(&h, &web());
    h.table.fail_reads([libc::EIO; 64]);
    let e = del_with(&mut h, &request(Command::Del, &web())).unwrap_err();
    assert!(e.msg.contains("could not delete the port mappings"), "{}", e.msg);
    assert!(!has_upstreams(&h));
}

#[test]
fn del_goes_on_when_the_mark_or_our_table_cannot_be_had_and_says_so() {
    // the mark cannot be made: everything is still deleted, and DEL reports it (the runtime retries)
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    upstreams_iptables(&h, &web());
    h.mark_fails = true;
    let e = del_with(&mut h, &request(Command::Del, &web())).unwrap_err();
    assert!(e.msg.contains("cannot mark"), "{}", e.msg);
    assert!(!has_ours(&h) && !has_upstreams(&h));

    // nf_tables cannot be opened: nothing of ours can exist; upstream's part still runs, DEL succeeds
    let mut h = FakeHost::new();
    h.tables_usable = false;
    upstreams_iptables(&h, &web());
    del_with(&mut h, &request(Command::Del, &web())).unwrap();
    assert!(!has_upstreams(&h));

    // nothing anywhere: DEL is idempotent
    let mut h = FakeHost::new();
    del_with(&mut h, &request(Command::Del, &web())).unwrap();
    del_with(&mut h, &request(Command::Del, &web())).unwrap();
    assert!(h.flushed.is_empty() && h.upstream.flushed().is_empty());
}

#[test]
fn gc_runs_upstreams_part_and_ours_and_reports_both() {
    let gc_conf = |valid: Value| {
        let mut v = web();
        v["cni.dev/valid-attachments"] = valid;
        v["cniVersion"] = json!("1.1.0");
        v
    };
    // our attachment not in the valid list: collected; upstream's failure reported, ours still done
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    upstreams_iptables(&h, &web());
    h.upstream.fail([Fault::Refused(Op::Save, CniError::internal("ip6tables-legacy-save: no such table"))]);
    let e = gc_with(&mut h, &request(Command::Gc, &gc_conf(json!([])))).unwrap_err();
    assert!(e.msg.contains("no such table"), "{}", e.msg);
    assert!(!has_ours(&h));
    assert_eq!(h.calls, ["upstream", "tables"]);
    // one of upstream's two tables was collected, the failing one is the next GC's
    assert!(has_upstreams(&h));
    gc_with(&mut h, &request(Command::Gc, &gc_conf(json!([])))).unwrap();
    assert!(!has_upstreams(&h));

    // in the valid list: kept, ours and upstream's
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    upstreams_iptables(&h, &web());
    gc_with(&mut h, &request(Command::Gc, &gc_conf(json!([{"containerID": "c1", "ifname": "eth0"}]))))
        .unwrap();
    assert!(has_ours(&h) && has_upstreams(&h));
}

#[test]
fn del_and_gc_refuse_a_hostile_configuration_before_touching_anything() {
    // a condition that would end an nft statement: refused (code 7) on DEL and GC as on ADD,
    // before the mark, our table or upstream's state is touched
    let hostile = |mut v: Value| {
        v["conditionsV4"] = json!(["ip daddr 1.1.1.1; flush ruleset"]);
        v
    };
    let mut h = FakeHost::new();
    add_ours(&mut h, &web());
    upstreams_iptables(&h, &web());
    let e = del_with(&mut h, &request(Command::Del, &hostile(web()))).unwrap_err();
    assert_eq!(e.code, code::INVALID_CONFIG, "{}", e.msg);
    assert!(h.calls.is_empty(), "nothing touched: {:?}", h.calls);
    assert!(has_ours(&h) && has_upstreams(&h));
    assert!(h.upstream.calls().is_empty());

    let mut gc = hostile(web());
    gc["cni.dev/valid-attachments"] = json!([]);
    gc["cniVersion"] = json!("1.1.0");
    let e = gc_with(&mut h, &request(Command::Gc, &gc)).unwrap_err();
    assert_eq!(e.code, code::INVALID_CONFIG, "{}", e.msg);
    assert!(h.calls.is_empty(), "nothing touched: {:?}", h.calls);
    assert!(has_ours(&h) && has_upstreams(&h));
    assert!(h.upstream.calls().is_empty());
}

#[test]
fn the_plugin_names_itself_portmap_in_its_about_banner() {
    // CNI_COMMAND unset: the banner on stderr names the plugin, nothing on stdout
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let rc = cni_common::skel::run_with(&Portmap, |_| None, &mut std::io::empty(), &mut stdout, &mut stderr);
    assert_eq!(rc, 0);
    assert!(stdout.is_empty());
    let banner = String::from_utf8(stderr).unwrap();
    assert!(banner.starts_with("CNI portmap plugin "), "{banner}");
}
