//! bandwidth, exec'd as a runtime would, chained after a veth plugin.
//!
//! Each test builds a fake host netns and container netns joined by a veth pair (made with
//! `ip`, as bridge or ptp would), hands bandwidth a bridge-like prevResult
//! (`[bridge, host veth, eth0 in the sandbox]`) and reads the kernel state back with `tc -j`.

use cni_tests::{ns_state, unique, Exec, Netns};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const NET: &str = "bwnet";

/// A container attached by a veth pair: `eth0` in `ctr`, `veth` in the host.
struct Pod {
    ctr: Netns,
    veth: String,
    id: String,
}

fn pod(host: &Netns) -> Pod {
    let ctr = Netns::new("bwc");
    let veth = unique("bwv");
    // No IPv6 link-local addresses appearing at some point later: ns_state snapshots must only
    // change through the plugin.
    for ns in [host, &ctr] {
        ns.run("sysctl", &["-qw", "net.ipv6.conf.default.disable_ipv6=1"]);
    }
    host.run("ip", &["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", ctr.name()]);
    host.run("ip", &["link", "set", &veth, "up"]);
    ctr.run("ip", &["link", "set", "eth0", "up"]);
    // Wait (bounded) for both ends to report carrier, which changes their flags.
    let up = |ns: &Netns, dev: &str| ns.link(dev).is_some_and(|l| l["operstate"] == "UP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(up(host, &veth) && up(&ctr, "eth0")) {
        assert!(Instant::now() < deadline, "veth pair {veth} did not come up");
        std::thread::sleep(Duration::from_millis(5));
    }
    Pod { id: unique("ctr-"), ctr, veth }
}

/// Delete the pods' namespaces and wait (bounded) until the kernel has destroyed their veth
/// pairs, which it does asynchronously.
fn remove_pods(host: &Netns, pods: Vec<Pod>) {
    let veths: Vec<String> = pods.iter().map(|p| p.veth.clone()).collect();
    drop(pods);
    let deadline = Instant::now() + Duration::from_secs(10);
    while veths.iter().any(|v| host.link(v).is_some()) {
        assert!(Instant::now() < deadline, "veths {veths:?} outlived their namespaces");
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Pod {
    /// What bridge would hand on: the bridge, the host veth, the container interface.
    fn prev(&self, host: &Netns) -> Value {
        let mac = host.link(&self.veth).unwrap()["address"].clone();
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "02:00:00:00:00:01"},
                {"name": self.veth, "mac": mac},
                {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": self.ctr.path_str()}
            ],
            "ips": [{"interface": 2, "address": "10.99.0.2/24", "gateway": "10.99.0.1"}]
        })
    }

    fn exec<'a>(&self, host: &'a Netns, cmd: &str) -> Exec<'a> {
        Exec::new("bandwidth").in_ns(host).attachment(
            cmd,
            &self.id,
            self.ctr.path_str(),
            "eth0",
            "/nonexistent",
        )
    }
}

/// A config of `version` for network `name` with `extra` keys (limits, runtimeConfig, prevResult).
fn conf(version: &str, name: &str, extra: Value) -> String {
    let mut v = json!({"cniVersion": version, "name": name, "type": "bandwidth"});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    v.to_string()
}

fn both(prev: Value) -> Value {
    json!({"ingressRate": 8_000_000, "ingressBurst": 800_000, "egressRate": 16_000_000,
           "egressBurst": 1_600_000, "prevResult": prev})
}

/// The ifb name upstream would use (sha512 via coreutils, independent of our code).
fn ifb_name(network: &str, id: &str) -> String {
    let mut child = std::process::Command::new("sha512sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha512sum");
    child.stdin.take().unwrap().write_all(format!("{network}{id}").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    format!("bwp{}", &String::from_utf8(out.stdout).unwrap()[..12])
}

fn tc_json(ns: &Netns, args: &[&str]) -> Value {
    let out = ns.run("tc", args);
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return json!([]);
    }
    serde_json::from_slice(&out.stdout).expect("tc -j prints JSON")
}

/// The qdiscs of `dev` as `tc -s -j -raw qdisc show` prints them.
fn qdiscs(ns: &Netns, dev: &str) -> Vec<Value> {
    tc_json(ns, &["-s", "-j", "-raw", "qdisc", "show", "dev", dev]).as_array().unwrap().clone()
}

fn tbf(ns: &Netns, dev: &str) -> Option<Value> {
    qdiscs(ns, dev).into_iter().find(|q| q["kind"] == "tbf" && q["root"] == true)
}

/// (rate B/s, burst B, limit B) of the root tbf, as tc prints them.
fn tbf_values(ns: &Netns, dev: &str) -> (u64, u64, u64) {
    let q = tbf(ns, dev).unwrap_or_else(|| panic!("no root tbf on {dev}: {:?}", qdiscs(ns, dev)));
    assert_eq!(q["handle"], "1:", "{q}");
    let o = &q["options"];
    (o["rate"].as_u64().unwrap(), o["burst"].as_u64().unwrap(), o["limit"].as_u64().unwrap())
}

fn has_ingress_qdisc(ns: &Netns, dev: &str) -> bool {
    qdiscs(ns, dev).iter().any(|q| q["kind"] == "ingress" && q["handle"] == "ffff:")
}

/// The u32 rules (not hash tables) on the ingress qdisc of `dev`.
fn ingress_rules(ns: &Netns, dev: &str) -> Vec<Value> {
    tc_json(ns, &["-j", "filter", "show", "dev", dev, "parent", "ffff:"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["options"]["match"].is_object())
        .cloned()
        .collect()
}

fn ifbs(ns: &Netns) -> Vec<String> {
    ns.ip_json(&["link", "show", "type", "ifb"])
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["ifname"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn add_builds_both_buckets_and_one_redirect_then_del_leaves_nothing() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    host.run("ip", &["link", "set", &p.veth, "mtu", "1400"]);
    let before = ns_state(&host);
    let ctr_before = ns_state(&p.ctr);
    let c = conf("1.0.0", NET, both(p.prev(&host)));

    let r = p.exec(&host, "ADD").run(&c).ok();
    let ifb = ifb_name(NET, &p.id);
    assert_eq!(r["cniVersion"], "1.0.0");
    let ifaces = r["interfaces"].as_array().unwrap();
    assert_eq!(ifaces.len(), 4, "prevResult's three plus the ifb: {r}");
    assert_eq!(ifaces[..3], p.prev(&host)["interfaces"].as_array().unwrap()[..]);
    assert_eq!(ifaces[3]["name"], ifb.as_str());
    let link = host.link(&ifb).expect("ifb exists");
    assert_eq!(ifaces[3]["mac"], link["address"]);
    assert!(ifaces[3].get("sandbox").is_none());
    assert_eq!(r["ips"], p.prev(&host)["ips"]);

    // Into the container: tbf on the host veth. 8 Mbit/s = 1 MB/s, 800 kbit = 100 kB burst,
    // limit = 25 ms at the rate + burst.
    assert_eq!(tbf_values(&host, &p.veth), (1_000_000, 100_000, 125_000));
    // Out of the container: ingress qdisc, one match-all rule with a single redirect.
    assert!(has_ingress_qdisc(&host, &p.veth));
    let rules = ingress_rules(&host, &p.veth);
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!((&rules[0]["protocol"], &rules[0]["pref"]), (&json!("all"), &json!(1)));
    assert_eq!(rules[0]["options"]["match"], json!({"value": "0", "mask": "0", "offmask": "", "off": 0}));
    let acts = rules[0]["options"]["actions"].as_array().unwrap();
    assert_eq!(acts.len(), 1, "a single action (upstream adds a second): {acts:?}");
    assert_eq!(acts[0]["kind"], "mirred");
    assert_eq!((&acts[0]["direction"], &acts[0]["mirred_action"]), (&json!("egress"), &json!("redirect")));
    assert_eq!(acts[0]["to_dev"], ifb.as_str());
    assert_eq!(acts[0]["control_action"]["type"], "stolen");
    // The ifb: up, the veth's MTU, queue length 1000, owner recorded, shaped at 2 MB/s.
    assert!(host.link_is_up(&ifb));
    assert_eq!(link["mtu"], 1400);
    assert_eq!(link["txqlen"], 1000);
    assert_eq!(link["ifalias"], format!("cni-bandwidth net={NET} ctr={} if=eth0", p.id));
    assert_eq!(tbf_values(&host, &ifb), (2_000_000, 200_000, 250_000));
    // Nothing happens inside the container.
    assert_eq!(ns_state(&p.ctr), ctr_before);

    let final_conf = conf("1.0.0", NET, both(r.clone()));
    p.exec(&host, "CHECK").run(&final_conf).ok_silent();

    p.exec(&host, "DEL").run(&final_conf).ok_silent();
    assert_eq!(ns_state(&host), before, "DEL removes the ifb and both qdiscs on the host veth");
    p.exec(&host, "DEL").run(&final_conf).ok_silent();
    assert_eq!(ns_state(&host), before);
}

#[test]
fn ingress_only() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let before = ns_state(&host);
    let c = conf(
        "0.4.0",
        NET,
        json!({"ingressRate": 8_000_000, "ingressBurst": 800_000, "prevResult": p.prev(&host)}),
    );
    let r = p.exec(&host, "ADD").run(&c).ok();
    assert_eq!(r["interfaces"].as_array().unwrap().len(), 3, "no ifb: {r}");
    assert_eq!(tbf_values(&host, &p.veth), (1_000_000, 100_000, 125_000));
    assert!(!has_ingress_qdisc(&host, &p.veth));
    assert!(ifbs(&host).is_empty());
    p.exec(&host, "CHECK").run(&c).ok_silent();
    p.exec(&host, "DEL").run(&c).ok_silent();
    assert_eq!(ns_state(&host), before);
}

#[test]
fn egress_only() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let before = ns_state(&host);
    let c = conf(
        "1.1.0",
        NET,
        json!({"egressRate": 16_000_000, "egressBurst": 1_600_000, "prevResult": p.prev(&host)}),
    );
    let r = p.exec(&host, "ADD").run(&c).ok();
    let ifb = ifb_name(NET, &p.id);
    assert_eq!(r["interfaces"][3]["name"], ifb.as_str());
    assert!(tbf(&host, &p.veth).is_none(), "traffic into the container is not shaped");
    assert!(has_ingress_qdisc(&host, &p.veth));
    assert_eq!(ingress_rules(&host, &p.veth).len(), 1);
    assert_eq!(tbf_values(&host, &ifb), (2_000_000, 200_000, 250_000));
    p.exec(&host, "CHECK").run(&c).ok_silent();
    p.exec(&host, "DEL").run(&c).ok_silent();
    assert_eq!(ns_state(&host), before);
}

#[test]
fn runtime_config_and_static_precedence() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let before = ns_state(&host);
    // Kubernetes annotations arrive as runtimeConfig.bandwidth, here with containerd's
    // "no burst" of 2^32-1 bits for ingress: the default burst (100 ms at the rate) applies.
    let rt = json!({"bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 4_294_967_295u64,
                                  "egressRate": 4_000_000, "egressBurst": 400_000}});
    let c = conf(
        "1.0.0",
        NET,
        json!({"capabilities": {"bandwidth": true}, "runtimeConfig": rt, "prevResult": p.prev(&host)}),
    );
    let r = p.exec(&host, "ADD").run(&c).ok();
    assert_eq!(tbf_values(&host, &p.veth), (1_000_000, 100_000, 25_000 + 100_000));
    assert_eq!(tbf_values(&host, &ifb_name(NET, &p.id)), (500_000, 50_000, 62_500));
    p.exec(&host, "CHECK")
        .run(&conf("1.0.0", NET, json!({"runtimeConfig": rt, "prevResult": r})))
        .ok_silent();
    p.exec(&host, "DEL").run(&c).ok_silent();
    assert_eq!(ns_state(&host), before);

    // Static keys win: only ingress from the static config, runtimeConfig ignored entirely.
    let c = conf(
        "1.0.0",
        NET,
        json!({"ingressRate": 16_000_000, "ingressBurst": 800_000, "runtimeConfig": rt, "prevResult": p.prev(&host)}),
    );
    let r = p.exec(&host, "ADD").run(&c).ok();
    assert_eq!(tbf_values(&host, &p.veth), (2_000_000, 100_000, 150_000));
    assert!(ifbs(&host).is_empty(), "runtimeConfig's egress limit is ignored");
    assert_eq!(r["interfaces"].as_array().unwrap().len(), 3);
    p.exec(&host, "DEL").run(&c).ok_silent();
    assert_eq!(ns_state(&host), before);

    // A static burst keeps its meaning however large: 2^32-1 bits is 537 s at 8 Mbit/s, more
    // than the 274.9 s that 32-bit ticks can hold, so the largest bucket that fits is used.
    let c = conf(
        "1.0.0",
        NET,
        json!({"ingressRate": 8_000_000, "ingressBurst": 4_294_967_295u64, "prevResult": p.prev(&host)}),
    );
    let r = p.exec(&host, "ADD").run(&c).ok();
    assert_eq!(tbf_values(&host, &p.veth), (1_000_000, 274_877_906, 25_000 + 536_870_911));
    let mut chk: Value = serde_json::from_str(&c).unwrap();
    chk["prevResult"] = r;
    p.exec(&host, "CHECK").run(&chk.to_string()).ok_silent();
    p.exec(&host, "DEL").run(&c).ok_silent();
    assert_eq!(ns_state(&host), before);
}

/// Issue 12: containerd's CRI sends the `1M` annotations as a rate of 1 000 000 bit/s with a
/// burst of MaxUint32 bits, which means "not set". The installed buckets get the default burst
/// (100 ms at the rate, at least one full-size frame): 12 500 bytes, far below 1 MiB, so the
/// limit holds from the first kilobytes.
#[test]
fn the_cri_sentinel_burst_gets_a_default_derived_from_the_rate() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let before = ns_state(&host);
    let rt = json!({"bandwidth": {"IngressRate": 1_000_000, "IngressBurst": 4_294_967_295u64,
                                  "EgressRate": 1_000_000, "EgressBurst": 4_294_967_295u64}});
    let c = conf("0.4.0", NET, json!({"runtimeConfig": rt, "prevResult": p.prev(&host)}));
    let r = p.exec(&host, "ADD").run(&c).ok();
    let ifb = ifb_name(NET, &p.id);
    for dev in [p.veth.as_str(), ifb.as_str()] {
        let (rate, burst, limit) = tbf_values(&host, dev);
        assert_eq!((rate, burst, limit), (125_000, 12_500, 3_125 + 12_500), "{dev}");
        assert!(burst <= 1 << 20, "{dev}: burst {burst} B is more than 1 MiB");
    }
    let mut chk: Value = serde_json::from_str(&c).unwrap();
    chk["prevResult"] = r;
    p.exec(&host, "CHECK").run(&chk.to_string()).ok_silent();
    // A jumbo MTU: the bucket still holds one full-size frame.
    p.exec(&host, "DEL").run(&c).ok_silent();
    host.run("ip", &["link", "set", &p.veth, "mtu", "9000"]);
    let slow = json!({"bandwidth": {"ingressRate": 80_000, "ingressBurst": 4_294_967_295u64}});
    let c2 = conf("1.0.0", NET, json!({"runtimeConfig": slow, "prevResult": p.prev(&host)}));
    let r2 = p.exec(&host, "ADD").run(&c2).ok();
    assert_eq!(tbf_values(&host, &p.veth).1, 9_014);
    let mut chk: Value = serde_json::from_str(&c2).unwrap();
    chk["prevResult"] = r2;
    p.exec(&host, "CHECK").run(&chk.to_string()).ok_silent();
    p.exec(&host, "DEL").run(&c2).ok_silent();
    host.run("ip", &["link", "set", &p.veth, "mtu", "1500"]);
    assert_eq!(ns_state(&host), before);
}

#[test]
fn nothing_configured_passes_prev_result_through() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let before = ns_state(&host);
    for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let r = p.exec(&host, "ADD").run(&conf(v, NET, json!({"prevResult": p.prev(&host)}))).ok();
        assert_eq!(r["cniVersion"], v);
        assert_eq!(r["interfaces"], p.prev(&host)["interfaces"], "{v}");
        assert_eq!(r["ips"][0]["address"], "10.99.0.2/24");
        assert_eq!(r["ips"][0].get("version").is_some(), v < "1.0.0", "{v}: {r}");
        // limits all zero is "nothing" too
        let zero = json!({"ingressRate": 0, "egressBurst": 0, "prevResult": p.prev(&host)});
        p.exec(&host, "ADD").run(&conf(v, NET, zero)).ok();
    }
    assert_eq!(ns_state(&host), before);
}

#[test]
fn result_is_encoded_in_the_config_version() {
    let host = Netns::new("bwh");
    for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let p = pod(&host);
        let r = p.exec(&host, "ADD").run(&conf(v, NET, both(p.prev(&host)))).ok();
        assert_eq!(r["cniVersion"], v);
        assert_eq!(r["interfaces"][3]["name"], ifb_name(NET, &p.id).as_str());
        assert_eq!(r["ips"][0].get("version").is_some(), v < "1.0.0", "{v}: {r}");
        p.exec(&host, "DEL").run(&conf(v, NET, json!({}))).ok_silent();
        remove_pods(&host, vec![p]);
    }
    assert!(ifbs(&host).is_empty());
    // Versions before 0.3.0 have no interfaces in results: code 1, nothing touched.
    let p = pod(&host);
    let before = ns_state(&host);
    for v in ["0.1.0", "0.2.0"] {
        p.exec(&host, "ADD").run(&conf(v, NET, both(p.prev(&host)))).err(1);
    }
    assert_eq!(ns_state(&host), before);
    let vers = Exec::new("bandwidth").env("CNI_COMMAND", "VERSION").run("").ok();
    assert_eq!(vers["supportedVersions"], json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]));
}

#[test]
fn bad_input_is_refused_before_anything_changes() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let before = ns_state(&host);
    let prev = p.prev(&host);
    let cases: Vec<(Value, u64, &str)> = vec![
        (json!({"ingressRate": 1000, "prevResult": prev}), 7, "if rate is set, burst must also be set"),
        (json!({"egressBurst": 1000, "prevResult": prev}), 7, "if burst is set, rate must also be set"),
        (
            json!({"egressRate": 1000, "egressBurst": 34_359_738_360u64, "prevResult": prev}),
            7,
            "burst cannot be more than 4GB",
        ),
        (
            json!({"runtimeConfig": {"bandwidth": {"ingressRate": 1000}}, "prevResult": prev}),
            7,
            "runtimeConfig.bandwidth.ingressRate is 1000 bit/s",
        ),
        (json!({"ingressRate": "1M", "ingressBurst": 10, "prevResult": prev}), 6, "ingressRate"),
        (json!({"ingressRate": -5, "ingressBurst": 10, "prevResult": prev}), 6, "ingressRate"),
        (json!({"ingressRate": 8000, "ingressBurst": 800}), 7, "must be called as a chained plugin"),
        (
            json!({"ingressRate": 8000, "ingressBurst": 800, "prevResult": {"cniVersion": "1.0.0"}}),
            7,
            "no interfaces",
        ),
        (
            json!({"ingressRate": 8000, "ingressBurst": 800,
                   "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "veth-other"}, {"name": "eth0", "sandbox": p.ctr.path_str()}]}}),
            7,
            "is not among prevResult's host interfaces [veth-other]",
        ),
        (
            json!({"ingressRate": 8000, "ingressBurst": 800, "unshapedSubnets": ["10.0.0.0/8"], "prevResult": prev}),
            2,
            "unshapedSubnets",
        ),
    ];
    for (extra, code, text) in cases {
        let msg = p.exec(&host, "ADD").run(&conf("1.0.0", NET, extra.clone())).err(code);
        assert!(msg.contains(text), "{extra}: {msg}");
        assert_eq!(ns_state(&host), before, "{extra} changed the host");
    }
    // A container interface that is not a veth (an ifb stands in for macvlan & co).
    let ctr = Netns::new("bwc");
    ctr.run("ip", &["link", "add", "eth0", "type", "ifb"]);
    let e = Exec::new("bandwidth").in_ns(&host).attachment("ADD", "c9", ctr.path_str(), "eth0", "/x");
    let msg = e.run(&conf("1.0.0", NET, both(prev.clone()))).err(999);
    assert!(msg.contains("not a veth"), "{msg}");
    // The container interface does not exist.
    let e = Exec::new("bandwidth").in_ns(&host).attachment("ADD", "c9", p.ctr.path_str(), "eth7", "/x");
    let msg = e.run(&conf("1.0.0", NET, both(prev.clone()))).err(999);
    assert!(msg.contains("eth7 not found"), "{msg}");
    assert_eq!(ns_state(&host), before);
}

#[test]
fn picks_the_right_host_veth_among_several() {
    // plugins#260/#321: a prevResult listing several host veths.
    let host = Netns::new("bwh");
    let a = pod(&host);
    let b = pod(&host);
    let mut prev = b.prev(&host);
    prev["interfaces"].as_array_mut().unwrap().insert(1, json!({"name": a.veth}));
    let c =
        conf("1.0.0", NET, json!({"ingressRate": 8_000_000, "ingressBurst": 800_000, "prevResult": prev}));
    b.exec(&host, "ADD").run(&c).ok();
    assert!(tbf(&host, &b.veth).is_some());
    assert!(tbf(&host, &a.veth).is_none());
    b.exec(&host, "DEL").run(&c).ok_silent();
}

#[test]
fn check_sees_real_state() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let c = conf("1.0.0", NET, both(p.prev(&host)));
    let r = p.exec(&host, "ADD").run(&c).ok();
    let c = conf("1.0.0", NET, both(r));
    let ifb = ifb_name(NET, &p.id);
    p.exec(&host, "CHECK").run(&c).ok_silent();

    // CHECK with a different configured rate fails, naming both values.
    let other = c.replace("8000000", "4000000");
    let msg = p.exec(&host, "CHECK").run(&other).err(999);
    assert!(msg.contains("rate 1000000 B/s") && msg.contains("expected rate 500000 B/s"), "{msg}");

    // The bucket on the veth changed behind our back.
    host.run(
        "tc",
        &[
            "qdisc", "change", "dev", &p.veth, "root", "handle", "1:", "tbf", "rate", "8mbit", "burst",
            "100000", "latency", "50ms",
        ],
    );
    let msg = p.exec(&host, "CHECK").run(&c).err(999);
    assert!(msg.contains("traffic into the container") && msg.contains("limit"), "{msg}");
    host.run(
        "tc",
        &[
            "qdisc", "change", "dev", &p.veth, "root", "handle", "1:", "tbf", "rate", "8mbit", "burst",
            "100000", "latency", "25ms",
        ],
    );
    p.exec(&host, "CHECK").run(&c).ok_silent();

    // The redirect filter is gone.
    host.run("tc", &["filter", "del", "dev", &p.veth, "parent", "ffff:"]);
    let msg = p.exec(&host, "CHECK").run(&c).err(999);
    assert!(msg.contains("no u32 match-all filter"), "{msg}");

    // The ifb's bucket is gone, then the ifb.
    host.run("tc", &["qdisc", "del", "dev", &ifb, "root"]);
    let msg = p.exec(&host, "CHECK").run(&c).err(999);
    assert!(msg.contains("traffic out of the container: no tbf qdisc 1: at the root of"), "{msg}");
    host.run("ip", &["link", "del", &ifb]);
    let msg = p.exec(&host, "CHECK").run(&c).err(999);
    assert!(msg.contains("not found"), "{msg}");

    // CHECK needs prevResult.
    let msg =
        p.exec(&host, "CHECK").run(&conf("1.0.0", NET, json!({"ingressRate": 8, "ingressBurst": 8}))).err(7);
    assert!(msg.contains("chained plugin"), "{msg}");
    p.exec(&host, "DEL").run(&c).ok_silent();
}

#[test]
fn del_without_netns_and_after_the_container_is_gone() {
    let host = Netns::new("bwh");
    let before = ns_state(&host);
    let p = pod(&host);
    let with_veth = ns_state(&host);
    let c = conf("1.0.0", NET, both(p.prev(&host)));
    p.exec(&host, "ADD").run(&c).ok();
    let ifb = ifb_name(NET, &p.id);

    // Empty CNI_NETNS: the ifb (found by name) goes; the veth's qdiscs cannot be attributed.
    let e = Exec::new("bandwidth").in_ns(&host).attachment("DEL", &p.id, "", "eth0", "/x");
    e.run(&c).ok_silent();
    assert!(host.link(&ifb).is_none());
    assert!(tbf(&host, &p.veth).is_some());
    // Another DEL with the netns takes the veth's qdiscs (the redirect points nowhere now).
    p.exec(&host, "DEL").run(&c).ok_silent();
    assert_eq!(ns_state(&host), with_veth);

    // The container's netns vanished (with it the veth pair): DEL still removes the ifb.
    p.exec(&host, "ADD").run(&c).ok();
    let path = p.ctr.path_str().to_string();
    let id = p.id.clone();
    remove_pods(&host, vec![p]);
    let e = Exec::new("bandwidth").in_ns(&host).attachment("DEL", &id, &path, "eth0", "/x");
    e.run(&c).ok_silent();
    e.run(&c).ok_silent();
    assert_eq!(ns_state(&host), before);
    // DEL of something never added, without prevResult or limits.
    let e = Exec::new("bandwidth").in_ns(&host).attachment("DEL", "never", "", "eth0", "/x");
    e.run(&conf("1.0.0", NET, json!({}))).ok_silent();
}

/// Regression: when CNI_NETNS could not be opened (the skeleton lets such a DEL through: the
/// container may be gone), DEL returned at once and never removed the ifb. It now collects the
/// error and goes on.
#[test]
fn del_removes_the_ifb_even_when_the_netns_cannot_be_opened() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let c = conf("1.0.0", NET, both(p.prev(&host)));
    p.exec(&host, "ADD").run(&c).ok();
    let ifb = ifb_name(NET, &p.id);
    assert!(host.link(&ifb).is_some());
    // A namespace file of another kind: not something DEL can enter.
    let e = Exec::new("bandwidth").in_ns(&host).attachment("DEL", &p.id, "/proc/self/ns/uts", "eth0", "/x");
    let msg = e.run(&c).err(5);
    assert!(msg.contains("/proc/self/ns/uts"), "{msg}");
    assert!(host.link(&ifb).is_none(), "the ifb was left behind");
    // With the real netns the host veth's qdiscs go too.
    p.exec(&host, "DEL").run(&c).ok_silent();
    assert!(tbf(&host, &p.veth).is_none() && !has_ingress_qdisc(&host, &p.veth));
}

#[test]
fn add_replaces_its_own_leftovers_but_not_foreign_state() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let c = conf("1.0.0", NET, both(p.prev(&host)));
    p.exec(&host, "ADD").run(&c).ok();
    // A runtime retrying ADD without DEL: the leftovers are replaced, not duplicated.
    p.exec(&host, "ADD").run(&c).ok();
    assert_eq!(ifbs(&host), vec![ifb_name(NET, &p.id)]);
    assert_eq!(ingress_rules(&host, &p.veth).len(), 1);
    p.exec(&host, "CHECK").run(&conf("1.0.0", NET, both(p.prev(&host)))).ok_silent();
    p.exec(&host, "DEL").run(&c).ok_silent();

    // Someone else's root qdisc on the veth is not replaced.
    host.run("tc", &["qdisc", "add", "dev", &p.veth, "root", "handle", "5:", "htb"]);
    let before = ns_state(&host);
    let msg = p.exec(&host, "ADD").run(&c).err(999);
    assert!(msg.contains("already has a root qdisc htb 5:"), "{msg}");
    assert_eq!(ns_state(&host), before);
    // Same for another attachment's ifb with our name (same container, other interface).
    host.run("tc", &["qdisc", "del", "dev", &p.veth, "root"]);
    let ifb = ifb_name(NET, &p.id);
    host.run("ip", &["link", "add", &ifb, "type", "ifb"]);
    host.run("ip", &["link", "set", &ifb, "alias", &format!("cni-bandwidth net={NET} ctr={} if=net1", p.id)]);
    let before = ns_state(&host);
    let msg = p.exec(&host, "ADD").run(&c).err(999);
    assert!(msg.contains("already shapes container") && msg.contains("interface net1"), "{msg}");
    assert_eq!(ns_state(&host), before);
    // …and DEL of this attachment leaves it to its owner.
    p.exec(&host, "DEL").run(&c).ok_silent();
    assert!(host.link(&ifb).is_some());
}

#[test]
fn gc_removes_only_this_networks_dead_attachments() {
    let host = Netns::new("bwh");
    let before = ns_state(&host);
    let (a, b, other) = (pod(&host), pod(&host), pod(&host));
    for (p, net) in [(&a, "neta"), (&b, "neta"), (&other, "netb")] {
        p.exec(&host, "ADD").run(&conf("1.1.0", net, both(p.prev(&host)))).ok();
    }
    // ifbs made by upstream (no owner record, so no network): a live one — its pod's veth
    // still redirects into it — is never touched; a dead one (nothing redirects into it) goes
    // with the first GC, whichever network's.
    let upstream = ifb_name("neta", "upstream-ctr");
    host.run("ip", &["link", "add", &upstream, "type", "ifb"]);
    host.run("ip", &["link", "add", "upveth", "type", "veth", "peer", "name", "upveth1"]);
    host.run("tc", &["qdisc", "add", "dev", "upveth", "ingress"]);
    host.run(
        "tc",
        &[
            "filter", "add", "dev", "upveth", "parent", "ffff:", "protocol", "all", "u32", "match", "u32",
            "0", "0",
        ]
        .into_iter()
        .chain(["action", "mirred", "egress", "redirect", "dev", upstream.as_str()])
        .collect::<Vec<_>>(),
    );
    let dead_upstream = ifb_name("netb", "upstream-dead");
    host.run("ip", &["link", "add", &dead_upstream, "type", "ifb"]);
    let gc = |net: &str, valid: Value| {
        let c = json!({"cniVersion": "1.1.0", "name": net, "type": "bandwidth", "cni.dev/valid-attachments": valid});
        Exec::new("bandwidth").in_ns(&host).env("CNI_COMMAND", "GC").env("CNI_PATH", "/x").run(&c.to_string())
    };
    // b's attachment is gone; a's stays. other is netb's: untouched even though not listed.
    gc("neta", json!([{"containerID": a.id, "ifname": "eth0"}])).ok_silent();
    let mut have = ifbs(&host);
    have.sort();
    let mut want = vec![ifb_name("neta", &a.id), ifb_name("netb", &other.id), upstream.clone()];
    want.sort();
    assert_eq!(have, want);
    // Same container id, another interface name: a different attachment, so a's ifb goes.
    gc("neta", json!([{"containerID": a.id, "ifname": "net1"}])).ok_silent();
    assert!(host.link(&ifb_name("neta", &a.id)).is_none());
    // An empty list means nothing is alive.
    gc("netb", json!([])).ok_silent();
    assert_eq!(ifbs(&host), vec![upstream.clone()]);
    gc("netb", json!([])).ok_silent();

    host.run("ip", &["link", "del", "upveth"]);
    host.run("ip", &["link", "del", &upstream]);
    for p in [&a, &b, &other] {
        p.exec(&host, "DEL").run(&conf("1.1.0", "neta", json!({}))).ok_silent();
    }
    remove_pods(&host, vec![a, b, other]);
    assert_eq!(ns_state(&host), before, "DEL and GC leave nothing");
}

/// GC and DEL of one attachment in either order, and its shaping partly removed by someone
/// else first: whatever is already gone is success, and nothing is left (the churn suite races
/// them for real).
#[test]
fn gc_and_del_each_succeed_on_what_the_other_removed() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    let with_veth = ns_state(&host);
    let c = conf("1.1.0", NET, both(p.prev(&host)));
    let gc = || {
        let c =
            json!({"cniVersion": "1.1.0", "name": NET, "type": "bandwidth", "cni.dev/valid-attachments": []});
        Exec::new("bandwidth").in_ns(&host).env("CNI_COMMAND", "GC").env("CNI_PATH", "/x").run(&c.to_string())
    };
    let ifb = ifb_name(NET, &p.id);
    // GC first (the attachment's DEL has started, so it is not valid any more), then DEL.
    p.exec(&host, "ADD").run(&c).ok();
    gc().ok_silent();
    assert!(host.link(&ifb).is_none(), "GC removes the ifb");
    p.exec(&host, "DEL").run(&c).ok_silent();
    assert_eq!(ns_state(&host), with_veth);
    // DEL first, then GC.
    p.exec(&host, "ADD").run(&c).ok();
    p.exec(&host, "DEL").run(&c).ok_silent();
    gc().ok_silent();
    assert_eq!(ns_state(&host), with_veth);
    // The qdiscs and the ifb removed by someone else between ADD and DEL.
    p.exec(&host, "ADD").run(&c).ok();
    host.run("tc", &["qdisc", "del", "dev", &p.veth, "root"]);
    host.run("tc", &["qdisc", "del", "dev", &p.veth, "ingress"]);
    host.run("ip", &["link", "del", &ifb]);
    p.exec(&host, "DEL").run(&c).ok_silent();
    gc().ok_silent();
    assert_eq!(ns_state(&host), with_veth);
}

#[test]
fn gc_removes_an_ifb_whose_add_was_killed_before_the_alias_was_written() {
    // The kernel applies the device group in the create request, the alias only afterwards:
    // an ADD killed in between leaves an ifb that only the group attributes to its network.
    let host = Netns::new("bwh");
    let before = ns_state(&host);
    let (a, b) = (pod(&host), pod(&host));
    a.exec(&host, "ADD").run(&conf("1.1.0", "neta", both(a.prev(&host)))).ok();
    b.exec(&host, "ADD").run(&conf("1.1.0", "netb", both(b.prev(&host)))).ok();
    let (ifa, ifb) = (ifb_name("neta", &a.id), ifb_name("netb", &b.id));
    for i in [&ifa, &ifb] {
        host.run("ip", &["link", "set", "dev", i, "alias", ""]);
        assert!(host.link(i).unwrap().get("ifalias").is_none(), "alias removed");
    }
    let gc = |net: &str| {
        let c =
            json!({"cniVersion": "1.1.0", "name": net, "type": "bandwidth", "cni.dev/valid-attachments": []});
        Exec::new("bandwidth").in_ns(&host).env("CNI_COMMAND", "GC").env("CNI_PATH", "/x").run(&c.to_string())
    };
    gc("neta").ok_silent();
    assert!(host.link(&ifa).is_none(), "neta's alias-less ifb is in neta's group: removed");
    assert!(host.link(&ifb).is_some(), "netb's is in netb's group: untouched by neta's GC");
    gc("netb").ok_silent();
    assert!(host.link(&ifb).is_none());
    for p in [&a, &b] {
        p.exec(&host, "DEL").run(&conf("1.1.0", "neta", json!({}))).ok_silent();
    }
    remove_pods(&host, vec![a, b]);
    assert_eq!(ns_state(&host), before);
}

/// STATUS and a refused GC change nothing of a live attachment's shaping; a GC that lists it
/// keeps it, one that does not removes its ifb.
#[test]
fn status_and_gc_verbs() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    p.exec(&host, "ADD").run(&conf("1.1.0", NET, both(p.prev(&host)))).ok();
    let ifb = ifb_name(NET, &p.id);
    let shaped = ns_state(&host);
    assert!(shaped.contains(&ifb) && shaped.contains("tbf"), "{shaped}");
    let global =
        |cmd: &str| Exec::new("bandwidth").in_ns(&host).env("CNI_COMMAND", cmd).env("CNI_PATH", "/x");
    global("STATUS").run(&conf("1.1.0", NET, json!({}))).ok_silent();
    assert_eq!(ns_state(&host), shaped, "STATUS changed the host");
    // GC needs 1.1.0 and the list: refused, nothing touched.
    global("GC").run(&conf("1.1.0", NET, json!({}))).err(7);
    global("GC").run(&conf("1.0.0", NET, json!({"cni.dev/valid-attachments": []}))).err(1);
    assert_eq!(ns_state(&host), shaped, "a refused GC changed the host");
    let listed = json!({"cni.dev/valid-attachments": [{"containerID": p.id, "ifname": "eth0"}]});
    global("GC").run(&conf("1.1.0", NET, listed)).ok_silent();
    assert_eq!(ns_state(&host), shaped, "GC removed a live attachment's shaping");
    global("GC").run(&conf("1.1.0", NET, json!({"cni.dev/valid-attachments": []}))).ok_silent();
    assert!(host.link(&ifb).is_none(), "GC kept the ifb of an attachment it was not given");
    p.exec(&host, "DEL").run(&conf("1.1.0", NET, json!({}))).ok_silent();
    remove_pods(&host, vec![p]);
}

/// Upstream's Go plugin and ours, same config: identical buckets; upstream's state is removed
/// by our DEL, including the qdiscs upstream's own DEL leaves.
#[test]
fn same_buckets_as_upstream_and_our_del_cleans_up_after_it() {
    let upstream = std::path::Path::new("/usr/lib/cni/bandwidth");
    assert!(
        upstream.is_file(),
        "upstream plugin missing: scripts/install-deps.sh installs containernetworking-plugins"
    );
    let host = Netns::new("bwh");
    let before = ns_state(&host);
    let (ours, theirs) = (pod(&host), pod(&host));
    ours.exec(&host, "ADD").run(&conf("1.0.0", NET, both(ours.prev(&host)))).ok();
    let up = Exec::new(upstream.to_str().unwrap()).in_ns(&host).attachment(
        "ADD",
        &theirs.id,
        theirs.ctr.path_str(),
        "eth0",
        "/usr/lib/cni",
    );
    let r = up.run(&conf("1.0.0", NET, both(theirs.prev(&host)))).ok();
    let their_ifb = ifb_name(NET, &theirs.id);
    assert_eq!(r["interfaces"][3]["name"], their_ifb.as_str(), "upstream names its ifb like we do");
    assert_eq!(tbf_values(&host, &ours.veth), tbf_values(&host, &theirs.veth));
    assert_eq!(tbf_values(&host, &ifb_name(NET, &ours.id)), tbf_values(&host, &their_ifb));
    let raw = |dev: &str| tbf(&host, dev).unwrap()["options"]["burst_raw"].clone();
    assert_eq!(raw(&ours.veth), raw(&theirs.veth), "same buffer in ticks");

    // Our CHECK accepts upstream's state; our DEL removes all of it.
    let theirs_exec = |cmd: &str| theirs.exec(&host, cmd);
    theirs_exec("CHECK").run(&conf("1.0.0", NET, both(r.clone()))).ok_silent();
    theirs_exec("DEL").run(&conf("1.0.0", NET, both(r))).ok_silent();
    assert!(host.link(&their_ifb).is_none());
    assert!(tbf(&host, &theirs.veth).is_none() && !has_ingress_qdisc(&host, &theirs.veth));
    ours.exec(&host, "DEL").run(&conf("1.0.0", NET, json!({}))).ok_silent();
    remove_pods(&host, vec![ours, theirs]);
    assert_eq!(ns_state(&host), before);
}

// ---- traffic ----

/// Send `bytes` over TCP from a thread in `from` to a listener in `to` at `addr`; the time from
/// just before connecting until the receiver has read everything.
fn timed_transfer(from: &Netns, to: &Netns, addr: SocketAddr, bytes: usize) -> Duration {
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let receiver = s.spawn(move || {
            to.enter_current_thread();
            let l = TcpListener::bind(addr).expect("bind receiver");
            ready_tx.send(()).unwrap();
            let (mut conn, _) = l.accept().expect("accept");
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = 0;
            loop {
                match conn.read(&mut buf).expect("read") {
                    0 => break,
                    n => got += n,
                }
            }
            (got, Instant::now())
        });
        ready_rx.recv().expect("receiver ready");
        let sender = s.spawn(move || {
            from.enter_current_thread();
            let start = Instant::now();
            let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
            let chunk = vec![0x5au8; 64 * 1024];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(chunk.len());
                c.write_all(&chunk[..n]).expect("write");
                left -= n;
            }
            c.shutdown(std::net::Shutdown::Write).unwrap();
            start
        });
        let start = sender.join().expect("sender");
        let (got, end) = receiver.join().expect("receiver");
        assert_eq!(got, bytes, "everything arrived");
        end - start
    })
}

/// Payload rate of one transfer of `bytes` from `from` to `to` (bytes per second).
fn rate(from: &Netns, to: &Netns, addr: &str, bytes: usize) -> f64 {
    bytes as f64 / timed_transfer(from, to, addr.parse().unwrap(), bytes).as_secs_f64()
}

/// Real traffic with a different rate per direction: each direction far below the same path
/// unshaped, and the direction with the lower limit clearly the slower one, so limits applied
/// the wrong way round (or to one direction only) fail. Direction and order of magnitude only:
/// no absolute timing is asserted (the rates are printed; timings belong in scripts/bench*).
#[test]
fn each_direction_is_shaped_to_its_own_rate() {
    let host = Netns::new("bwh");
    let p = pod(&host);
    host.run("ip", &["addr", "add", "10.99.0.1/24", "dev", &p.veth]);
    p.ctr.run("ip", &["addr", "add", "10.99.0.2/24", "dev", "eth0"]);
    let (into_addr, out_addr) = ("10.99.0.2:5201", "10.99.0.1:5202");
    // The same path before the plugin runs.
    let unshaped_into = rate(&host, &p.ctr, into_addr, 8_000_000);
    let unshaped_out = rate(&p.ctr, &host, out_addr, 8_000_000);
    // Into the container 2 Mbit/s (250 kB/s), out of it 8 Mbit/s (1 MB/s): 4x apart, 256 kbit
    // (32 kB) bursts. Each transfer lasts about two seconds at its nominal rate.
    let c = conf(
        "1.0.0",
        NET,
        json!({"ingressRate": 2_000_000, "ingressBurst": 256_000, "egressRate": 8_000_000,
               "egressBurst": 256_000, "prevResult": p.prev(&host)}),
    );
    p.exec(&host, "ADD").run(&c).ok();
    let into = rate(&host, &p.ctr, into_addr, 500_000);
    let out = rate(&p.ctr, &host, out_addr, 2_000_000);
    eprintln!(
        "payload rates (B/s): unshaped into {unshaped_into:.0}, out {unshaped_out:.0}; \
         shaped into {into:.0} (limit 250000), out {out:.0} (limit 1000000)"
    );
    assert!(
        into * 10.0 < unshaped_into,
        "into the container: {into:.0} B/s shaped vs {unshaped_into:.0} unshaped"
    );
    assert!(
        out * 10.0 < unshaped_out,
        "out of the container: {out:.0} B/s shaped vs {unshaped_out:.0} unshaped"
    );
    assert!(
        into * 2.0 < out,
        "ingressRate is 4x below egressRate, yet into the container ran at {into:.0} B/s and out of it at \
         {out:.0} B/s: the limits are not applied per direction"
    );
    p.exec(&host, "DEL").run(&c).ok_silent();
    let after = rate(&host, &p.ctr, into_addr, 8_000_000);
    assert!(after > into * 10.0, "DEL left the limit in place: {after:.0} B/s");
}
