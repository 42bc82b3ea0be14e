//! The default network configurations the ecosystem's tools write (conf-examples/: Podman 4,
//! nerdctl, Nomad, kind, k3s, containerd, CRI-O), each run with **only our release tarball**
//! extracted into a scratch CNI bin dir, once through the harness's runner and once through
//! the tarball's own `cnitool`: ADD of two pods, traffic (gateway, pod to pod, pod to
//! an outside namespace, the host port from outside where the list has `portmap`), CHECK, DEL
//! (twice), and nothing left in the fake host.
//!
//! What is rewritten for a scratch run, and nothing else: the host-local ranges (subnets into
//! ranges of this test, a range's `gateway` to the first address of its new subnet) and a
//! scratch `dataDir`. Plugins, their order and every other key stay as the tool writes them.
//! Bridge names stay too: every list runs in its own fake host namespace.
//!
//! The tarball is `dist/cni-rs-linux-<arch>-v<version>.tgz` of scripts/release.sh, named by
//! `CNI_TEST_RELEASE_TARBALL`. These tests are `#[ignore]`d in the ordinary passes (there is no
//! tarball before release.sh ran); scripts/test.sh runs them right after release.sh with the
//! variable set. Run without it, they fail saying how to build it.

use cni_tests::chain::Chain;
use cni_tests::leaks::leaks;
use cni_tests::traffic::{fetch, Server};
use cni_tests::{result_ips, unique, workspace_root, Netns, TempDir};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

const TARBALL_ENV: &str = "CNI_TEST_RELEASE_TARBALL";

/// What release.sh packs into the tarball, sorted: every file must be there, nothing else.
const TARBALL_FILES: [&str; 12] = [
    "LICENSE",
    "README.md",
    "bandwidth",
    "bridge",
    "cni-migrate",
    "cnitool",
    "firewall",
    "host-local",
    "loopback",
    "portmap",
    "ptp",
    "tuning",
];

/// The host port every list with `portmap` maps to port 80 of the first pod.
const HOST_PORT: u16 = 8080;

static NET: AtomicU8 = AtomicU8::new(1);

/// The release tarball, or a failure saying how to get one.
fn tarball() -> PathBuf {
    let version = env!("CARGO_PKG_VERSION");
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let hint = format!(
        "build it with scripts/release.sh, then run {TARBALL_ENV}=$PWD/dist/cni-rs-linux-{arch}-v{version}.tgz \
         cargo test -p cni-tests --test conflists -- --ignored (scripts/test.sh does this after release.sh)"
    );
    let p = std::env::var_os(TARBALL_ENV).filter(|v| !v.is_empty()).unwrap_or_else(|| {
        panic!("{TARBALL_ENV} is not set: these tests run our release tarball alone; {hint}")
    });
    let p = PathBuf::from(p);
    assert!(p.is_file(), "{TARBALL_ENV}={} is not a file; {hint}", p.display());
    p
}

/// The tarball extracted into a scratch directory, the CNI bin dir of the run (as
/// `tar -C /opt/cni/bin -xzf …`): exactly release.sh's files, no upstream plugin beside them.
fn install_tarball() -> TempDir {
    let t = tarball();
    let dir = TempDir::new("relbin");
    let out = Command::new("tar").arg("-C").arg(dir.path()).arg("-xzf").arg(&t).output().expect("run tar");
    assert!(
        out.status.success(),
        "tar -xzf {} failed: {}",
        t.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, TARBALL_FILES, "the files of {}", t.display());
    dir
}

/// A fake host with an uplink `ext0` (10.250.<n>.1/24, fd01:<n>::1/64) to an `outside`
/// namespace (.2 / ::2), the tarball as CNI bin dir and a scratch host-local dataDir.
struct World {
    host: Netns,
    outside: Netns,
    n: u8,
    data: TempDir,
    bins: TempDir,
}

impl World {
    fn new() -> World {
        let bins = install_tarball();
        let n = NET.fetch_add(1, Ordering::Relaxed);
        let host = Netns::new("clh");
        let outside = Netns::new("clo");
        for ns in [&host, &outside] {
            ns.run("ip", &["link", "set", "lo", "up"]);
            ns.run(
                "sysctl",
                &["-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"],
            );
        }
        host.run(
            "ip",
            &["link", "add", "ext0", "type", "veth", "peer", "name", "up0", "netns", outside.name()],
        );
        host.run("ip", &["addr", "add", &format!("10.250.{n}.1/24"), "dev", "ext0"]);
        host.run("ip", &["addr", "add", &format!("fd01:{n}::1/64"), "dev", "ext0", "nodad"]);
        host.run("ip", &["link", "set", "ext0", "up"]);
        outside.run("ip", &["addr", "add", &format!("10.250.{n}.2/24"), "dev", "up0"]);
        outside.run("ip", &["addr", "add", &format!("fd01:{n}::2/64"), "dev", "up0", "nodad"]);
        outside.run("ip", &["link", "set", "up0", "up"]);
        World { host, outside, n, data: TempDir::new("cldata"), bins }
    }

    /// The pods' subnets as a router outside would reach them: 10.<n>.0.0/16, fd00:<n>::/32.
    fn route_pods_from_outside(&self) {
        let n = self.n;
        self.outside.run("ip", &["route", "add", &format!("10.{n}.0.0/16"), "via", &format!("10.250.{n}.1")]);
        self.outside
            .run("ip", &["-6", "route", "add", &format!("fd00:{n}::/32"), "via", &format!("fd01:{n}::1")]);
    }

    fn pod(&self) -> (Netns, String) {
        let ns = Netns::new("clp");
        ns.run("ip", &["link", "set", "lo", "up"]);
        (ns, unique("cl"))
    }
}

/// A conflist of conf-examples/, parsed.
fn example(file: &str) -> Value {
    let path = workspace_root().join("conf-examples").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The scratch rewrite of one plugin's host-local `ipam`: range set `k` gets subnet
/// 10.<n>.<k+1>.0/24 or fd00:<n>:<k+1>::/64 (same family as the tool's), a `gateway` becomes
/// the first address of it, and `dataDir` the scratch one.
fn rewrite_ipam(ipam: &mut Value, w: &World) {
    let n = w.n;
    if let Some(sets) = ipam.get_mut("ranges").and_then(Value::as_array_mut) {
        for (k, set) in sets.iter_mut().enumerate() {
            let k = k + 1;
            for r in set.as_array_mut().expect("a range set is a list") {
                let v6 = r["subnet"].as_str().expect("range subnet").contains(':');
                let (subnet, gw) = if v6 {
                    (format!("fd00:{n}:{k}::/64"), format!("fd00:{n}:{k}::1"))
                } else {
                    (format!("10.{n}.{k}.0/24"), format!("10.{n}.{k}.1"))
                };
                r["subnet"] = json!(subnet);
                if r.get("gateway").is_some() {
                    r["gateway"] = json!(gw);
                }
            }
        }
    } else if let Some(s) = ipam.get("subnet").and_then(Value::as_str) {
        // the single-range form
        let v6 = s.contains(':');
        ipam["subnet"] = json!(if v6 { format!("fd00:{n}:1::/64") } else { format!("10.{n}.1.0/24") });
    }
    ipam["dataDir"] = json!(w.data.str());
}

/// The list with its host-local entries rewritten for a scratch run (see the module doc).
fn scratch(list: &Value, w: &World) -> Value {
    let mut list = list.clone();
    for p in list["plugins"].as_array_mut().expect("plugins") {
        if p["ipam"]["type"] == "host-local" {
            rewrite_ipam(&mut p["ipam"], w);
        }
    }
    list
}

/// A (scratch) list as a chain on the tarball's binaries.
fn chain_of(list: &Value, w: &World) -> Chain {
    Chain {
        name: list["name"].as_str().expect("name").into(),
        version: list["cniVersion"].as_str().expect("cniVersion").into(),
        plugins: list["plugins"].as_array().expect("plugins").clone(),
        cni_path: w.bins.path().to_path_buf(),
    }
}

/// Who runs the list: the harness's runner (tests/src/chain.rs, libcni's semantics), or the
/// tarball's own `cnitool` with the list in a scratch NETCONFPATH under the tool's file name
/// and a scratch cache (CHECK and DEL then take the result from cnitool's cache, as libcni).
#[derive(Clone, Copy, Debug)]
enum Via {
    Runner,
    Cnitool,
}

struct Driver<'a> {
    via: Via,
    chain: Chain,
    w: &'a World,
    conf: TempDir,
    cache: TempDir,
}

impl<'a> Driver<'a> {
    fn new(via: Via, file: &str, list: &Value, w: &'a World) -> Driver<'a> {
        let conf = TempDir::new("clconf");
        std::fs::write(conf.join(file), serde_json::to_string_pretty(list).unwrap()).unwrap();
        Driver { via, chain: chain_of(list, w), w, conf, cache: TempDir::new("clcache") }
    }

    fn cnitool(&self, verb: &str, id: &str, pod: &Netns, caps: &Value) -> std::process::Output {
        self.w
            .host
            .command(self.w.bins.join("cnitool"))
            .args([verb, &self.chain.name, pod.path_str()])
            .env("CNI_PATH", self.w.bins.path())
            .env("NETCONFPATH", self.conf.path())
            .env("CNI_CACHE_DIR", self.cache.path())
            .env("CNI_CONTAINERID", id)
            .env("CNI_IFNAME", "eth0")
            .env("CAP_ARGS", caps.to_string())
            .output()
            .expect("run the tarball's cnitool")
    }

    fn add(&self, id: &str, pod: &Netns, caps: &Value) -> Value {
        let name = &self.chain.name;
        match self.via {
            Via::Runner => {
                self.chain
                    .add(id, pod.path_str(), "eth0", caps, Some(&self.w.host))
                    .unwrap_or_else(|s| panic!("{name}: ADD failed: {s:?}"))
                    .0
            }
            Via::Cnitool => {
                let out = self.cnitool("add", id, pod, caps);
                assert!(
                    out.status.success(),
                    "{name}: cnitool add: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let cached = self.cache.join("results").join(format!("{name}-{id}-eth0"));
                assert!(cached.is_file(), "{name}: cnitool cached no result at {}", cached.display());
                serde_json::from_slice(&out.stdout).expect("cnitool add prints the result")
            }
        }
    }

    /// CHECK through the list. libcni refuses CHECK below 0.4.0, and so does our cnitool
    /// (checked); the runner checks kind's 0.3.1 list at 1.0.0 with its 0.3.1 result instead,
    /// as after a runtime upgraded the list.
    fn check(&self, id: &str, pod: &Netns, caps: &Value, result: &Value) {
        let name = &self.chain.name;
        match self.via {
            Via::Runner => {
                let checked = if self.chain.version.as_str() < "0.4.0" {
                    Chain { version: "1.0.0".into(), ..self.chain.clone() }
                } else {
                    self.chain.clone()
                };
                for s in checked.check(id, pod.path_str(), "eth0", caps, result, Some(&self.w.host)) {
                    assert_eq!(s.out.code, 0, "{name}: CHECK {}: {}{}", s.plugin, s.out.stdout, s.out.stderr);
                }
            }
            Via::Cnitool => {
                let out = self.cnitool("check", id, pod, caps);
                let err = String::from_utf8_lossy(&out.stderr);
                if self.chain.version.as_str() < "0.4.0" {
                    // libcni's CheckNetworkList refuses, naming the version: so does ours
                    assert!(!out.status.success(), "{name}: cnitool check of a 0.3.x list succeeded");
                    assert!(err.contains("does not support the CHECK command"), "{name}: {err}");
                } else {
                    assert!(out.status.success(), "{name}: cnitool check: {err}");
                }
            }
        }
    }

    fn del(&self, id: &str, pod: &Netns, caps: &Value, result: &Value) {
        match self.via {
            Via::Runner => {
                self.chain.del(id, pod.path_str(), "eth0", caps, Some(result), Some(&self.w.host));
            }
            Via::Cnitool => {
                let out = self.cnitool("del", id, pod, caps);
                assert!(
                    out.status.success(),
                    "{}: cnitool del: {}",
                    self.chain.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// What a run expects beyond the defaults.
#[derive(Clone)]
struct Expect {
    /// Pods leave for the outside with the host's address (the main plugin's `ipMasq`);
    /// otherwise the outside routes the pod subnets back (the cluster's routing does that for
    /// kind and k3s, whose nodes masquerade with their own agents).
    masquerade: bool,
    /// runtimeConfig for the first pod beyond its port mapping (k3s: kubelet's bandwidth).
    caps_a: Value,
}

fn addr_of(result: &Value, v6: bool) -> Option<String> {
    result_ips(result).into_iter().find(|a| a.contains(':') == v6)
}

fn gateways(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["gateway"].as_str().map(str::to_string))
        .collect()
}

/// ADD two pods, traffic, CHECK, DEL twice, nothing left: once through the runner and once
/// through the tarball's cnitool, each in a fresh world made by `world` (which also prepares
/// the host as the tool would) from the tool's `file` (made scratch by `scratch`).
fn run_both(file: &str, list: &Value, world: impl Fn() -> World, expect: Expect) {
    for via in [Via::Runner, Via::Cnitool] {
        let w = world();
        let d = Driver::new(via, file, &scratch(list, &w), &w);
        run(&d, &expect);
    }
}

fn run(d: &Driver, expect: &Expect) {
    let (chain, w) = (&d.chain, d.w);
    let n = w.n;
    let has_portmap = chain.plugins.iter().any(|p| p["type"] == "portmap");
    let mut caps_a = expect.caps_a.clone();
    if has_portmap {
        caps_a["portMappings"] = json!([{"hostPort": HOST_PORT, "containerPort": 80, "protocol": "tcp"}]);
    }
    let caps_b = json!({});
    let (a, ida) = w.pod();
    let (b, idb) = w.pod();
    let ra = d.add(&ida, &a, &caps_a);
    let rb = d.add(&idb, &b, &caps_b);
    assert_eq!(ra["cniVersion"], json!(chain.version), "{}: the result's version", chain.name);
    let families: Vec<bool> = [false, true].into_iter().filter(|v6| addr_of(&ra, *v6).is_some()).collect();
    assert!(!families.is_empty(), "{}: no address in {ra}", chain.name);

    // the gateway (bridge's, on the host) answers each pod
    for (pod, r) in [(&a, &ra), (&b, &rb)] {
        for gw in gateways(r) {
            let out = pod.try_run("ping", &["-c1", "-W5", &gw]);
            assert!(
                out.status.success(),
                "{}: ping {gw} from a pod: {}",
                chain.name,
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
    if !expect.masquerade {
        w.route_pods_from_outside();
    }
    {
        let _pod_a = Server::tcp(&a, 80, "podA");
        let _outside = Server::tcp(&w.outside, 80, "outside");
        for &v6 in &families {
            let (pa, pb) = (addr_of(&ra, v6).unwrap(), addr_of(&rb, v6).unwrap());
            assert_eq!(fetch(&b, &pa, 80), format!("podA {pb}"), "{}: pod to pod", chain.name);
            let (far, near) = if v6 {
                (format!("fd01:{n}::2"), format!("fd01:{n}::1"))
            } else {
                (format!("10.250.{n}.2"), format!("10.250.{n}.1"))
            };
            let seen_as = if expect.masquerade { near } else { pa.clone() };
            assert_eq!(
                fetch(&a, &far, 80),
                format!("outside {seen_as}"),
                "{}: pod to the outside",
                chain.name
            );
        }
        if has_portmap {
            assert_eq!(
                fetch(&w.outside, &format!("10.250.{n}.1"), HOST_PORT),
                format!("podA 10.250.{n}.2"),
                "{}: the host port from outside",
                chain.name
            );
        }
    }

    for (id, pod, caps, r) in [(&ida, &a, &caps_a, &ra), (&idb, &b, &caps_b, &rb)] {
        d.check(id, pod, caps, r);
    }
    // DEL, and DEL again (a runtime retries)
    for _ in 0..2 {
        d.del(&ida, &a, &caps_a, &ra);
        d.del(&idb, &b, &caps_b, &rb);
    }
    let addrs: Vec<String> = result_ips(&ra).into_iter().chain(result_ips(&rb)).collect();
    let mut left = left_behind(chain, w, &[&a, &b], &[&ida, &idb], &addrs);
    // cnitool's cache (the runner keeps none)
    for e in std::fs::read_dir(d.cache.join("results")).into_iter().flatten().flatten() {
        left.push(format!("cached result {} left", e.path().display()));
    }
    assert_eq!(left, Vec::<String>::new(), "{} via {:?}", chain.name, d.via);
}

/// What DEL left: links in the host other than its own and the list's bridge, pod interfaces,
/// portmap elements, masquerade rules, reservations (leaks()), firewall rules naming a pod
/// address (nftables or either iptables), firewall records and tuning's saved state of the pods.
fn left_behind(chain: &Chain, w: &World, pods: &[&Netns], ids: &[&str], addrs: &[String]) -> Vec<String> {
    let mut keep = vec!["lo", "ext0"];
    let bridge_plugin = chain.plugins.iter().find(|p| p["type"] == "bridge");
    if let Some(p) = bridge_plugin {
        keep.push(p["bridge"].as_str().unwrap_or("cni0"));
    }
    let mut found = leaks(&w.host, &chain.name, w.data.path(), &keep);
    for pod in pods {
        let links = pod.link_names();
        if links != ["lo"] {
            found.push(format!("links {links:?} left in a pod"));
        }
    }
    let mut rules = String::from_utf8_lossy(&w.host.run("nft", &["list", "ruleset"]).stdout).into_owned();
    for save in ["iptables-legacy-save", "ip6tables-legacy-save"] {
        rules.push_str(&String::from_utf8_lossy(&w.host.try_run(save, &[]).stdout));
    }
    for a in addrs {
        for line in rules.lines().filter(|l| l.contains(&format!("{a} ")) || l.contains(&format!("{a}/"))) {
            found.push(format!("rule naming {a} left: {}", line.trim()));
        }
    }
    let records = Path::new("/var/lib/cni/firewall").join(&chain.name);
    for e in std::fs::read_dir(&records).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if ids.iter().any(|id| text.lines().any(|l| l == format!("ctr {id}"))) {
            found.push(format!("firewall record {} left", e.path().display()));
        }
    }
    for id in ids {
        let saved = Path::new("/run/cni/tuning").join(format!("{id}_eth0.json"));
        if saved.exists() {
            found.push(format!("tuning state {} left", saved.display()));
        }
    }
    found
}

/// Podman 4's CNI default (cni/87-podman-bridge.conflist): bridge with hairpin and a gateway
/// range, portmap, firewall (default backend), tuning (no keys).
#[test]
#[ignore = "needs scripts/release.sh's tarball: scripts/test.sh runs it after release.sh"]
fn podman_87_podman_bridge() {
    let f = "87-podman-bridge.conflist";
    run_both(f, &example(f), World::new, Expect { masquerade: true, caps_a: json!({}) });
}

/// nerdctl's default network (nerdctl-bridge.conflist): as Podman's, firewall with
/// `ingressPolicy: same-bridge`.
#[test]
#[ignore = "needs scripts/release.sh's tarball: scripts/test.sh runs it after release.sh"]
fn nerdctl_default_bridge() {
    let f = "nerdctl-bridge.conflist";
    run_both(f, &example(f), World::new, Expect { masquerade: true, caps_a: json!({}) });
}

/// Nomad's bridge network (cniVersion 0.4.0, loopback first inside the list, `forceAddress`,
/// firewall on iptables with Nomad's `NOMAD-ADMIN` chain, portmap with `snat`). Nomad creates
/// its admin chain with a rule accepting traffic to the bridge's subnet before the first ADD
/// (client/allocrunner/networking_iptables.go, ensureChainRule): so does the host here, and
/// our firewall's `CNI-FORWARD` must jump to it.
#[test]
#[ignore = "needs scripts/release.sh's tarball: scripts/test.sh runs it after release.sh"]
fn nomad_bridge() {
    let f = "nomad-bridge.conflist";
    let list = example(f);
    assert_eq!(list["plugins"][0]["type"], "loopback");
    let nomad_host = || {
        let w = World::new();
        let l = scratch(&list, &w);
        let subnet = l["plugins"][1]["ipam"]["ranges"][0][0]["subnet"].as_str().unwrap().to_string();
        let bridge = l["plugins"][1]["bridge"].as_str().unwrap().to_string();
        w.host.run("iptables", &["-t", "filter", "-N", "NOMAD-ADMIN"]);
        w.host.run(
            "iptables",
            &["-t", "filter", "-A", "NOMAD-ADMIN", "-o", &bridge, "-d", &subnet, "-j", "ACCEPT"],
        );
        w
    };
    for via in [Via::Runner, Via::Cnitool] {
        let w = nomad_host();
        let d = Driver::new(via, f, &scratch(&list, &w), &w);
        run(&d, &Expect { masquerade: true, caps_a: json!({}) });
        let fwd = w.host.run("iptables", &["-t", "filter", "-S", "CNI-FORWARD"]);
        assert!(
            String::from_utf8_lossy(&fwd.stdout).contains("-j NOMAD-ADMIN"),
            "CNI-FORWARD jumps to Nomad's admin chain: {}",
            String::from_utf8_lossy(&fwd.stdout)
        );
    }
}

/// kind's kindnetd conflist (0.3.1: ptp without ipMasq, host-local dual stack, portmap).
#[test]
#[ignore = "needs scripts/release.sh's tarball: scripts/test.sh runs it after release.sh"]
fn kind_kindnet() {
    let f = "kind-kindnet.conflist";
    run_both(f, &example(f), World::new, Expect { masquerade: false, caps_a: json!({}) });
}

/// containerd's 10-containerd-net.conflist (script/setup/install-cni): bridge with
/// `promiscMode`, dual stack, portmap.
#[test]
#[ignore = "needs scripts/release.sh's tarball: scripts/test.sh runs it after release.sh"]
fn containerd_10_containerd_net() {
    let f = "10-containerd-net.conflist";
    run_both(f, &example(f), World::new, Expect { masquerade: true, caps_a: json!({}) });
}

/// CRI-O's contrib/cni/10-crio-bridge.conflist: one bridge, dual stack, hairpin.
#[test]
#[ignore = "needs scripts/release.sh's tarball: scripts/test.sh runs it after release.sh"]
fn crio_10_crio_bridge() {
    let f = "10-crio-bridge.conflist";
    run_both(f, &example(f), World::new, Expect { masquerade: true, caps_a: json!({}) });
}

/// k3s's 10-flannel.conflist: `flannel` is not ours (nor upstream's plugins'): it is a
/// meta-plugin that reads flannel's subnet.env and delegates to `bridge`. The list runs with
/// flannel's entry replaced by exactly the delegate flannel-io/cni-plugin builds from k3s's
/// `delegate` keys (flannel_linux.go, doCmdAdd: `type` bridge, `ipMasq` = not flannel's
/// ipmasq (k3s runs flannel with it on), `mtu` of the backend (vxlan: 1450), `isGateway`,
/// host-local with the node's flannel subnet as range and the cluster network as route), then
/// k3s's portmap and bandwidth as written, with kubelet's bandwidth runtimeConfig (rates from
/// the pod's annotations, burst MaxInt32) for the first pod.
#[test]
#[ignore = "needs scripts/release.sh's tarball: scripts/test.sh runs it after release.sh"]
fn k3s_flannel_delegate_portmap_bandwidth() {
    let f = "k3s-10-flannel.conflist";
    let mut list = example(f);
    assert_eq!(list["plugins"][0]["type"], "flannel");
    let mut delegate = list["plugins"][0]["delegate"].clone();
    delegate["type"] = json!("bridge");
    delegate["ipMasq"] = json!(false);
    delegate["mtu"] = json!(1450);
    delegate["isGateway"] = json!(true);
    // flannel's ranges and route; scratch() moves the range into the test's 10.<n>.1.0/24,
    // and the cluster route is 10.<n>.0.0/16 below
    delegate["ipam"] = json!({"type": "host-local", "ranges": [[{"subnet": "10.42.0.0/24"}]],
                              "routes": [{"dst": "10.42.0.0/16"}]});
    list["plugins"][0] = delegate;
    let bandwidth = json!({"bandwidth": {"ingressRate": 10_000_000, "ingressBurst": 2_147_483_647_u64,
                                         "egressRate": 10_000_000, "egressBurst": 2_147_483_647_u64}});
    for via in [Via::Runner, Via::Cnitool] {
        let w = World::new();
        let mut l = scratch(&list, &w);
        l["plugins"][0]["ipam"]["routes"] = json!([{"dst": format!("10.{}.0.0/16", w.n)}]);
        let d = Driver::new(via, f, &l, &w);
        run(&d, &Expect { masquerade: false, caps_a: bandwidth.clone() });
    }
}

/// Every conflist of conf-examples/ that names a plugin names one of the tarball's, except
/// k3s's flannel (see above): the "runs on our tarball alone" claim covers the whole directory.
#[test]
#[ignore = "needs scripts/release.sh's tarball: scripts/test.sh runs it after release.sh"]
fn every_example_names_only_plugins_of_the_tarball() {
    let bins = install_tarball();
    let mut files: Vec<PathBuf> = std::fs::read_dir(workspace_root().join("conf-examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "conflist"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "{files:?}");
    for f in files {
        let list: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        for p in list["plugins"].as_array().unwrap() {
            let mut types = vec![p["type"].as_str().unwrap().to_string()];
            if let Some(t) = p["ipam"]["type"].as_str() {
                types.push(t.to_string());
            }
            for t in types {
                if t == "flannel" && f.ends_with("k3s-10-flannel.conflist") {
                    continue;
                }
                assert!(bins.join(&t).is_file(), "{}: plugin {t} is not in the tarball", f.display());
            }
        }
    }
}
