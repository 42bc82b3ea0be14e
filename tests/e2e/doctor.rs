//! `cni-migrate doctor` (issue 39): the read-only report of a node, on a fake node in each state
//! it reports. The node is a scratch namespace (the kernel part acts in the namespace doctor
//! runs in) with our plugins, a conflist, libcni's cache and host-local's store in scratch
//! directories, named by doctor's flags. Every run is checked to change nothing: the
//! namespace's links, addresses, routes, ruleset, qdiscs and forwarding sysctls, and every file
//! of the four directories, are the same before and after.

use cni_tests::{bin, bridge_ns_state, cni_path_with, dir_state, Netns, TempDir};
use serde_json::{json, Value};
use std::path::Path;

const NET: &str = "drnet";
const SUBNET: &str = "10.77.0.0/24";

struct Node {
    host: Netns,
    bins: TempDir,
    conf: TempDir,
    cache: TempDir,
    data: TempDir,
}

impl Node {
    /// `bridge_extra`: keys merged into the bridge plugin's configuration.
    fn new(bridge_extra: Value) -> Node {
        let host = Netns::new("drh");
        host.run("ip", &["link", "set", "lo", "up"]);
        let n = Node {
            host,
            bins: cni_path_with(&["bridge", "host-local", "portmap", "loopback"]),
            conf: TempDir::new("drconf"),
            cache: TempDir::new("drcache"),
            data: TempDir::new("drdata"),
        };
        let mut bridge = json!({"type": "bridge", "bridge": "drbr0", "isGateway": true, "ipMasq": true,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]], "dataDir": n.data.str()}});
        for (k, v) in bridge_extra.as_object().unwrap() {
            bridge[k] = v.clone();
        }
        let list = json!({"cniVersion": "1.1.0", "name": NET, "plugins": [
            bridge, {"type": "portmap", "capabilities": {"portMappings": true}}]});
        std::fs::write(n.conf.join("10-drnet.conflist"), list.to_string()).unwrap();
        n
    }

    /// ADD a pod through our cnitool (libcni's cache in the node's cache directory).
    fn add(&self, id: &str, ctr: &Netns, port: u16) {
        let caps = json!({"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]});
        let out = self
            .host
            .command(bin("cnitool"))
            .args(["add", NET, ctr.path_str()])
            .env("CNI_PATH", self.bins.path())
            .env("NETCONFPATH", self.conf.path())
            .env("CNI_CACHE_DIR", self.cache.path())
            .env("CNI_CONTAINERID", id)
            .env("CNI_IFNAME", "eth0")
            .env("CAP_ARGS", caps.to_string())
            .output()
            .expect("run cnitool");
        assert!(out.status.success(), "ADD {id}: {}", String::from_utf8_lossy(&out.stderr));
        // the links' carrier, link-local addresses and routes come by themselves, later
        self.settle();
    }

    fn settle(&self) {
        for l in self.host.link_names().iter().filter(|l| *l != "lo") {
            self.host.settle(l);
        }
    }

    fn snapshot(&self) -> Snapshot {
        let dirs =
            [&self.bins, &self.conf, &self.cache, &self.data].iter().map(|d| dir_state(d.path())).collect();
        (bridge_ns_state(&self.host), dirs)
    }

    /// `cni-migrate doctor` in the node's namespace over its directories, text and `--json`:
    /// (exit status, text, document). Both runs change nothing and agree on the status.
    fn doctor(&self) -> (i32, String, Value) {
        let before = self.snapshot();
        let run = |json: bool| {
            let mut cmd = self.host.command(bin("cni-migrate"));
            cmd.arg("doctor");
            if json {
                cmd.arg("--json");
            }
            let out = cmd
                .arg("--bin-dir")
                .arg(self.bins.path())
                .arg("--conf-dir")
                .arg(self.conf.path())
                .arg("--data-dir")
                .arg(self.data.path())
                .arg("--cache-dir")
                .arg(self.cache.path())
                .output()
                .expect("run cni-migrate doctor");
            let code = out.status.code().expect("an exit status");
            (
                code,
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let (code, text, err) = run(false);
        eprintln!("--- cni-migrate doctor: exit {code}\n{text}{err}");
        let (jcode, jtext, jerr) = run(true);
        assert_eq!(jcode, code, "--json exits as the text report does: {jerr}");
        let doc: Value = serde_json::from_str(&jtext)
            .unwrap_or_else(|e| panic!("--json is one JSON document: {e}\n{jtext}"));
        assert!(code == 0 || code == 1, "doctor's own failure (exit {code}): {err}");
        assert_eq!(doc["healthy"], json!(code == 0), "{doc}");
        assert_eq!(doc["findings"].as_array().unwrap().is_empty(), code == 0, "{doc}");
        assert_unchanged(&before, &self.snapshot());
        (code, text, doc)
    }
}

type Snapshot = (String, Vec<Vec<(String, Vec<u8>)>>);

/// Fail naming what differs between two snapshots (lines of the namespace's state, files).
fn assert_unchanged(before: &Snapshot, after: &Snapshot) {
    let lines = |s: &str| s.lines().map(String::from).collect::<Vec<_>>();
    let (b, a) = (lines(&before.0), lines(&after.0));
    let gone: Vec<&String> = b.iter().filter(|l| !a.contains(l)).collect();
    let new: Vec<&String> = a.iter().filter(|l| !b.contains(l)).collect();
    assert!(
        gone.is_empty() && new.is_empty() && a.len() == b.len(),
        "doctor changed the namespace: gone {gone:?}, new {new:?}"
    );
    for (b, a) in before.1.iter().zip(&after.1) {
        let names = |d: &[(String, Vec<u8>)]| {
            d.iter().map(|(n, c)| format!("{n} ({} bytes)", c.len())).collect::<Vec<_>>()
        };
        assert!(a == b, "doctor changed a directory: before {:?}, after {:?}", names(b), names(a));
    }
}

/// The findings of a report with the given id.
fn findings<'a>(doc: &'a Value, id: &str) -> Vec<&'a Value> {
    doc["findings"].as_array().unwrap().iter().filter(|f| f["id"] == id).collect()
}

fn ids(doc: &Value) -> Vec<String> {
    doc["findings"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap().to_string()).collect()
}

fn kind_of(doc: &Value, name: &str) -> (String, Value) {
    let b = doc["binaries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .unwrap_or_else(|| panic!("{name} listed: {doc}"));
    (b["kind"].as_str().unwrap().to_string(), b["version"].clone())
}

/// Replace a plugin of the node's bin directory with a copy of `from`.
fn replace(node: &Node, name: &str, from: &Path) {
    let at = node.bins.join(name);
    std::fs::remove_file(&at).unwrap();
    std::fs::copy(from, &at).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
}

#[test]
fn a_healthy_node_exits_0_and_doctor_changes_nothing() {
    let node = Node::new(json!({}));
    let pod = Netns::new("drc");
    node.add("pod-a", &pod, 18100);
    let (code, text, doc) = node.doctor();
    assert_eq!(code, 0, "healthy: exit 0\n{text}");
    assert!(text.contains("healthy: nothing found"), "{text}");
    for p in ["bridge", "host-local", "portmap", "loopback"] {
        assert_eq!(kind_of(&doc, p).0, "ours", "{p}: {doc}");
    }
    let plugins = &doc["conflists"][0]["plugins"];
    let types: Vec<&str> = plugins.as_array().unwrap().iter().map(|p| p["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["bridge", "host-local", "portmap"], "the IPAM delegate is checked too");
    assert_eq!(plugins[0]["status"], "ok", "STATUS asked of a 1.1.0 list: {doc}");
    assert!(plugins[1]["version"]["supported"].as_array().unwrap().contains(&json!("1.1.0")), "{doc}");
    let tables = doc["tables"].to_string();
    assert!(
        tables.contains("inet cni_portmap") && tables.contains("inet cni_plugins_masquerade"),
        "{tables}"
    );
    assert_eq!(doc["sysctls"]["net.ipv4.ip_forward"], "1", "{doc}");
}

#[test]
fn binaries_of_someone_else_and_of_upstream_are_named() {
    let node = Node::new(json!({}));
    let scratch = TempDir::new("drscript");
    // a script under our name that even answers VERSION: someone else's
    let script = scratch.join("portmap");
    std::fs::write(
        &script,
        "#!/bin/sh\necho '{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"1.1.0\"]}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    replace(&node, "portmap", &script);
    // upstream v1.10.0 (the peers built by scripts/install-peers.sh) else Debian's 1.1.1
    let peers = Path::new("/work/ci-run/target/peers/plugins-v1.10.0/loopback");
    let (upstream, version) = if peers.is_file() {
        (peers.to_path_buf(), json!("v1.10.0"))
    } else {
        (cni_tests::upstream_bin("loopback"), Value::Null)
    };
    replace(&node, "loopback", &upstream);
    // Debian's 1.1.1 records no version in its build information
    std::fs::copy(cni_tests::upstream_bin("tuning"), node.bins.join("tuning")).unwrap();

    let (code, text, doc) = node.doctor();
    assert_eq!(code, 1, "{text}");
    assert_eq!(kind_of(&doc, "portmap").0, "foreign", "{doc}");
    assert_eq!(kind_of(&doc, "loopback"), ("upstream".into(), version), "{doc}");
    assert_eq!(kind_of(&doc, "tuning"), ("upstream".into(), Value::Null), "{doc}");
    assert_eq!(kind_of(&doc, "bridge").0, "ours", "{doc}");
    let foreign = findings(&doc, "binary-foreign");
    assert_eq!(foreign.len(), 1, "{doc}");
    assert!(
        foreign[0]["seen"].as_str().unwrap().contains("a script") && foreign[0]["severity"] == "error",
        "{doc}"
    );
    let up = findings(&doc, "binary-upstream");
    assert_eq!(up.len(), 2, "loopback and tuning: {doc}");
    assert!(
        up.iter().all(|f| f["severity"] == "warning" && f["fix"].as_str().unwrap().contains("install.sh")),
        "{doc}"
    );
    assert!(text.contains("error [binary-foreign]"), "{text}");
}

#[test]
fn a_conflist_naming_a_missing_plugin() {
    let node = Node::new(json!({}));
    let list = json!({"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "nosuch"}]});
    std::fs::write(node.conf.join("20-other.conflist"), list.to_string()).unwrap();
    let (code, text, doc) = node.doctor();
    assert_eq!(code, 1, "{text}");
    let f = findings(&doc, "plugin-missing");
    assert_eq!(f.len(), 1, "{doc}");
    assert!(f[0]["seen"].as_str().unwrap().contains("\"nosuch\""), "{doc}");
    assert!(text.contains("nosuch: MISSING"), "{text}");
}

#[test]
fn rules_and_reservations_of_pods_that_are_gone() {
    let node = Node::new(json!({}));
    let (alive, gone) = (Netns::new("drc"), Netns::new("drc"));
    node.add("alive", &alive, 18101);
    node.add("gone", &gone, 18102);
    let (code, text, _) = node.doctor();
    assert_eq!(code, 0, "both pods alive\n{text}");
    // the pod's namespace goes without DEL; and a reservation nobody has a record of
    drop(gone);
    // the kernel takes the pod's veth away with its namespace, asynchronously
    cni_tests::wait_until("the gone pod's veth to go", std::time::Duration::from_secs(10), || {
        node.host.link_names().iter().filter(|l| l.starts_with("veth")).count() == 1
    });
    std::fs::write(node.data.join(format!("{NET}/10.77.0.200")), "orphan\r\neth0").unwrap();
    let (code, text, doc) = node.doctor();
    assert_eq!(code, 1, "{text}");
    let rules = findings(&doc, "stale-pod-rules");
    assert_eq!(rules.len(), 2, "portmap's and bridge's masquerade of the gone pod: {doc}");
    assert!(rules.iter().all(|f| f["seen"].as_str().unwrap().contains(&format!("{NET}/gone/eth0"))), "{doc}");
    let res = findings(&doc, "stale-reservation");
    assert_eq!(res.len(), 2, "{doc}");
    assert!(
        res.iter().any(|f| f["seen"].as_str().unwrap().contains("container gone: its namespace")),
        "{doc}"
    );
    assert!(res.iter().any(|f| f["seen"].as_str().unwrap().contains("10.77.0.200")), "{doc}");
    assert!(!doc.to_string().contains("container alive"), "the live pod is no finding: {doc}");
}

#[test]
fn forwarding_off() {
    let node = Node::new(json!({}));
    let pod = Netns::new("drc");
    node.add("pod-a", &pod, 18103);
    node.host.run("sysctl", &["-qw", "net.ipv4.ip_forward=0"]);
    let (code, text, doc) = node.doctor();
    assert_eq!(code, 1, "{text}");
    assert_eq!(ids(&doc), ["ipv4-forwarding-off"], "{doc}");
}

#[test]
fn a_forward_drop_policy() {
    let node = Node::new(json!({}));
    let pod = Netns::new("drc");
    node.add("pod-a", &pod, 18104);
    node.host.run("iptables", &["-P", "FORWARD", "DROP"]);
    let (code, text, doc) = node.doctor();
    assert_eq!(code, 1, "{text}");
    let f = findings(&doc, "forward-drop");
    assert_eq!(f.len(), 1, "{doc}");
    assert!(
        f[0]["seen"].as_str().unwrap().contains(SUBNET) && f[0]["fix"].as_str().unwrap().contains("firewall"),
        "{doc}"
    );
}

#[test]
fn bridge_nf_call_iptables_off_where_the_conflist_needs_it() {
    let node = Node::new(json!({"bridgeNfCallIptables": true}));
    let key = "/proc/sys/net/bridge/bridge-nf-call-iptables";
    let present = node.host.try_run("cat", &[key]).status.success();
    if !present {
        // br_netfilter not loaded: ADD would fail (code 50), which doctor says
        let (code, text, doc) = node.doctor();
        assert_eq!(code, 1, "{text}");
        assert_eq!(findings(&doc, "br-netfilter-missing").len(), 1, "{doc}");
        return;
    }
    let pod = Netns::new("drc");
    node.add("pod-a", &pod, 18105);
    let (code, text, _) = node.doctor();
    assert_eq!(code, 0, "ADD set it: healthy\n{text}");
    node.host.run("sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=0"]);
    let (code, text, doc) = node.doctor();
    assert_eq!(code, 1, "{text}");
    assert_eq!(ids(&doc), ["bridge-nf-call-off"], "{doc}");
}

#[test]
fn portmap_table_without_the_localhost_guard() {
    let node = Node::new(json!({}));
    let pod = Netns::new("drc");
    node.add("pod-a", &pod, 18106);
    node.host.run("nft", &["flush", "chain", "inet", "cni_portmap", "localnet"]);
    node.host.run("nft", &["delete", "chain", "inet", "cni_portmap", "localnet"]);
    let (code, text, doc) = node.doctor();
    assert_eq!(code, 1, "{text}");
    assert_eq!(ids(&doc), ["portmap-guard-missing"], "{doc}");
    assert!(findings(&doc, "portmap-guard-missing")[0]["fix"].as_str().unwrap().contains("resync"), "{doc}");
}

#[test]
fn accept_ra_under_ipv6_forwarding() {
    let node = Node::new(json!({}));
    let pod = Netns::new("drc");
    node.add("pod-a", &pod, 18107);
    // an uplink whose default route came from a router advertisement
    node.host.run("ip", &["link", "add", "doctor-up0", "type", "veth", "peer", "name", "doctor-up1"]);
    for dev in ["doctor-up0", "doctor-up1"] {
        node.host.run("ip", &["link", "set", dev, "up"]);
    }
    node.host.run("ip", &["-6", "addr", "add", "2001:db8:77::2/64", "dev", "doctor-up0", "nodad"]);
    node.settle();
    node.host.run(
        "ip",
        &["-6", "route", "add", "default", "via", "2001:db8:77::1", "dev", "doctor-up0", "proto", "ra"],
    );
    let (code, text, _) = node.doctor();
    assert_eq!(code, 0, "without IPv6 forwarding accept_ra=1 takes the advertisements\n{text}");
    node.host.run("sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"]);
    node.host.run("sysctl", &["-qw", "net.ipv6.conf.doctor-up0.accept_ra=1"]);
    // forwarding adds the subnet-router anycast routes, of link-local prefixes once their DAD
    // is over: wait for every one before the snapshot
    let links: Vec<String> = node.host.link_names().into_iter().filter(|l| l != "lo").collect();
    cni_tests::wait_until(
        "the anycast routes of IPv6 forwarding",
        std::time::Duration::from_secs(10),
        || {
            let local =
                String::from_utf8(node.host.run("ip", &["-6", "route", "show", "table", "local"]).stdout)
                    .unwrap();
            links.iter().all(|l| local.contains(&format!("anycast fe80:: dev {l} ")))
                && local.contains("anycast 2001:db8:77:: dev doctor-up0 ")
        },
    );
    let (code, text, doc) = node.doctor();
    assert_eq!(code, 1, "{text}");
    assert_eq!(ids(&doc), ["accept-ra-ignored"], "{doc}");
    assert!(
        findings(&doc, "accept-ra-ignored")[0]["fix"].as_str().unwrap().contains("doctor-up0.accept_ra=2"),
        "{doc}"
    );
    node.host.run("sysctl", &["-qw", "net.ipv6.conf.doctor-up0.accept_ra=2"]);
    let (code, text, _) = node.doctor();
    assert_eq!(code, 0, "accept_ra=2 takes them under forwarding\n{text}");
}

#[test]
fn a_plugin_failing_status_and_bad_usage() {
    let node = Node::new(json!({}));
    // host-local's store is a regular file: no ADD could work, so STATUS fails
    let file = node.conf.join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let list = json!({"cniVersion": "1.1.0", "name": "broken", "plugins": [{"type": "bridge", "bridge": "drbr1",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.78.0.0/24"}]], "dataDir": file}}]});
    std::fs::write(node.conf.join("20-broken.conflist"), list.to_string()).unwrap();
    let (code, text, doc) = node.doctor();
    assert_eq!(code, 1, "{text}");
    let f = findings(&doc, "plugin-status-fails");
    assert_eq!(f.len(), 1, "{doc}");
    assert!(f[0]["seen"].as_str().unwrap().contains("code 50"), "{doc}");
    assert!(text.contains("STATUS fails"), "{text}");

    // its own failure is neither 0 nor 1, and says why
    let out = node.host.command(bin("cni-migrate")).args(["doctor", "--dry-run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown argument \"--dry-run\""));
}
