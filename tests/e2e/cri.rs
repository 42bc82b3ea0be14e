//! The Kubernetes path, kubelet → CRI → CNI: containerd 1.6's CRI plugin drives our plugins
//! with the Kubernetes "Network Plugins" page's conflists (conf-examples/k8s-*.conflist,
//! installed byte for byte), and this test plays the kubelet over CRI `runtime.v1`
//! (`cni_tests::cri`). Everything runs in a [`Sandbox`] (scratch host + outside netns, private
//! mount namespace) with a private containerd whose CNI bin dir holds our plugins behind
//! recorders, so the test also pins down what the CRI hands to each plugin.
//! docs/real-clients.md describes what is verified and what is not.

use cni_tests::clients::{
    cached_host_veth, cached_ip, shaped_rate_into, shaped_rate_out_of, wait_for, Containerd, HostSnapshot,
    PluginSet, Sandbox, HOST_ADDR,
};
use cni_tests::cri::{self, pb, Call, CriClient};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The image the sandboxes ("pause") and the containers run: busybox-static, built here.
const IMAGE: &str = "localhost/cni-tests/busybox:1";
/// The network name in the page's conflists.
const NET: &str = "k8s-pod-network";
/// The bridge and pod subnet of conf-examples/k8s-*.conflist.
const BRIDGE: &str = "cni0";
const POD_SUBNET_PREFIX: &str = "10.244.3.";
/// containerd's own loopback network (go-cni's `WithLoNetwork`).
const LO_NET: &str = "cni-loopback";
const HOST_PORT: u16 = 30080;
const CONTAINER_PORT: u16 = 8080;
const PAGE: &str = "hello from the container\n";
/// The annotations' values, and what they mean in bit/s: a different rate per direction, so
/// that limits applied the wrong way round show in the traffic.
const INGRESS_ANNOTATION: &str = "1M";
const INGRESS_BITS: u64 = 1_000_000;
const EGRESS_ANNOTATION: &str = "4M";
const EGRESS_BITS: u64 = 4_000_000;
/// What the CRI sends as the burst of an annotation-made limit (Go's math.MaxUint32).
const CRI_BURST: u64 = 4_294_967_295;

/// Which containerd plays the node's runtime.
#[derive(Clone, Debug)]
enum Runtime {
    /// Debian 12's containerd 1.6.20 (PATH), the page's conflists as they are (0.4.0).
    Debian16,
    /// containerd 2.4.2 built by scripts/install-peers.sh, the page's conflists at 1.1.0.
    V2(PathBuf),
}

impl Runtime {
    fn v2() -> Runtime {
        Runtime::V2(cri::peer_dir("containerd"))
    }
    /// The cniVersion the node's conflist declares.
    fn cni_version(&self) -> &'static str {
        match self {
            Runtime::Debian16 => "0.4.0",
            Runtime::V2(_) => "1.1.0",
        }
    }
    fn version_prefix(&self) -> &'static str {
        match self {
            Runtime::Debian16 => "1.6.",
            Runtime::V2(_) => "v2.4.2",
        }
    }
}

/// A node: the sandbox, a private containerd with its CRI on, a CRI client, the recorder log.
struct Node<'a> {
    sb: &'a Sandbox,
    rt: Runtime,
    ctrd: Containerd<'a>,
    cri: CriClient,
    calls: PathBuf,
    /// Sandboxes still to remove if the test fails half-way.
    live: Vec<String>,
}

/// The CRI plugin's configuration: our conflist dir and recorder bin dir, the local image as
/// sandbox image, runc with cgroupfs, no AppArmor/SELinux, streaming server on loopback.
fn cri_toml(sb: &Sandbox) -> String {
    format!(
        r#"  sandbox_image = "{IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
    conf_template = ""
"#,
        bin = sb.dir.join("cribin").display(),
        conf = sb.dir.join("criconf").display(),
    )
}

/// containerd 2.x's CRI configuration (version 3: the CRI split into the runtime, images and
/// grpc plugins), the same settings as [`cri_toml`].
fn cri_toml_v2(sb: &Sandbox) -> String {
    format!(
        r#"[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{IMAGE}"
[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{conf}"
    max_conf_num = 1
    conf_template = ""
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        bin = sb.dir.join("cribin").display(),
        conf = sb.dir.join("criconf").display(),
    )
}

impl<'a> Node<'a> {
    /// Install `conflist` (a file of conf-examples/, copied byte for byte; for containerd 2.x
    /// with its cniVersion set to 1.1.0), start containerd with its CRI, import the image and
    /// wait until the CRI reports the network ready.
    fn start(sb: &'a Sandbox, conflist: &str) -> Node<'a> {
        Node::start_on(sb, Runtime::Debian16, conflist)
    }

    fn start_on(sb: &'a Sandbox, rt: Runtime, conflist: &str) -> Node<'a> {
        let text = cri::example_at_version(conflist, rt.cni_version());
        Node::start_with(sb, rt, conflist, &text)
    }

    /// Like [`Node::start`] with the conflist `text` installed as `file`.
    fn start_with(sb: &'a Sandbox, rt: Runtime, file: &str, text: &str) -> Node<'a> {
        let conf_dir = sb.dir.join("criconf");
        std::fs::create_dir_all(&conf_dir).unwrap();
        std::fs::write(conf_dir.join(file), text).unwrap();
        let calls = sb.dir.join("calls");
        // The runtime calls these; bridge calls host-local, which stays the plain binary so
        // that bridge runs it in-process as on a real node (plugins/bridge/README.md).
        let bin = sb.dir.join("cribin");
        cri::install_recorders(
            &bin,
            &sb.dir.join("bin"),
            &calls,
            &["loopback", "bridge", "portmap", "bandwidth"],
        );
        std::os::unix::fs::symlink(sb.dir.join("bin/host-local"), bin.join("host-local")).unwrap();

        let rootfs = sb.dir.join("rootfs");
        let archive = sb.dir.join("image.tar");
        cri::build_image_archive(&rootfs, &archive, IMAGE, &["/bin/sleep", "2147483647"]);

        let ctrd = match &rt {
            Runtime::Debian16 => Containerd::start_with_cri(sb, &cri_toml(sb)),
            Runtime::V2(bin) => Containerd::start_v2(sb, bin, &cri_toml_v2(sb)),
        };
        ctrd.must(&["-n", "k8s.io", "images", "import", archive.to_str().unwrap()]);
        let cri = CriClient::connect(&ctrd.socket).expect("connect to the CRI");
        let mut node = Node { sb, rt, ctrd, cri, calls, live: Vec::new() };
        let v = node.cri.version().expect("CRI Version");
        assert_eq!(v.runtime_name, "containerd", "{v:?}");
        assert!(v.runtime_version.starts_with(node.rt.version_prefix()), "{:?}: {v:?}", node.rt);
        assert_eq!(v.runtime_api_version, "v1", "containerd serves CRI runtime.v1: {v:?}");
        node.wait_ready(true);
        assert!(node.cri.image_status(IMAGE).expect("ImageStatus").is_some(), "the CRI does not see {IMAGE}");
        node
    }

    /// The CRI's RuntimeReady and NetworkReady conditions (containerd 2.x adds a third,
    /// about deprecated settings, which says nothing about the network).
    fn readiness(&mut self) -> Vec<(String, bool, String)> {
        let mut c = self.cri.conditions().expect("CRI Status");
        c.retain(|(t, _, _)| t == "RuntimeReady" || t == "NetworkReady");
        c
    }

    /// NetworkReady (with RuntimeReady true), as the CRI's Status answers now.
    fn network_ready(&mut self) -> (bool, String) {
        let c = self.readiness();
        assert!(c.iter().any(|(t, ok, _)| t == "RuntimeReady" && *ok), "RuntimeReady: {c:?}");
        let (_, ok, why) =
            c.into_iter().find(|(t, _, _)| t == "NetworkReady").expect("a NetworkReady condition");
        (ok, why)
    }

    /// Wait (at most 30 s: the daemon loads its CNI config asynchronously) until both
    /// conditions are `ready`.
    fn wait_ready(&mut self, ready: bool) {
        let mut last = Vec::new();
        let ok = cni_tests::clients::poll(Duration::from_secs(30), || {
            last = self.readiness();
            (last.len() == 2 && last.iter().all(|(_, ok, _)| *ok == ready)).then_some(())
        });
        assert!(
            ok.is_some(),
            "the CRI's conditions are not all {ready} (network config not loaded?): {last:?}"
        );
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.ctrd.log).unwrap_or_default()
    }

    fn calls(&self) -> Vec<Call> {
        cri::recorded(&self.calls)
    }

    /// The pod's sandbox configuration as a kubelet would send it for attempt `attempt`.
    fn pod_config(&self, name: &str, uid: &str, attempt: u32, annotations: bool) -> pb::PodSandboxConfig {
        let logs = self.sb.dir.join("pods").join(format!("{uid}-{attempt}"));
        std::fs::create_dir_all(&logs).unwrap();
        let mut ann = HashMap::new();
        if annotations {
            ann.insert("kubernetes.io/ingress-bandwidth".to_string(), INGRESS_ANNOTATION.to_string());
            ann.insert("kubernetes.io/egress-bandwidth".to_string(), EGRESS_ANNOTATION.to_string());
        }
        pb::PodSandboxConfig {
            metadata: Some(pb::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: "default".into(),
                attempt,
            }),
            hostname: name.into(),
            log_directory: logs.to_string_lossy().into_owned(),
            port_mappings: vec![pb::PortMapping {
                protocol: pb::PROTOCOL_TCP,
                container_port: CONTAINER_PORT.into(),
                host_port: HOST_PORT.into(),
                host_ip: String::new(),
            }],
            labels: HashMap::from([("app".to_string(), name.to_string())]),
            annotations: ann,
            linux: Some(pb::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/pod{uid}", self.sb.cgroup_parent),
            }),
        }
    }

    /// RunPodSandbox; returns (sandbox id, pod IP from PodSandboxStatus).
    fn run_pod(&mut self, config: &pb::PodSandboxConfig) -> (String, String) {
        let id = self
            .cri
            .run_pod_sandbox(config)
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\ncontainerd log:\n{}", self.log()));
        self.live.push(id.clone());
        let st = self.cri.pod_sandbox_status(&id).expect("PodSandboxStatus");
        let status = st.status.expect("a status");
        assert_eq!(status.state, pb::SANDBOX_READY, "{status:?}");
        let ip = status.network.expect("network status").ip;
        (id, ip)
    }

    /// A busybox httpd container in the sandbox, serving /www on CONTAINER_PORT; waits until
    /// it answers on `ip`.
    fn run_web(&mut self, sandbox: &str, config: &pb::PodSandboxConfig, ip: &str) -> String {
        let c = pb::ContainerConfig {
            // container names must be unique while the older sandbox is around: a kubelet
            // counts restarts in the container's attempt
            metadata: Some(pb::ContainerMetadata {
                name: "web".into(),
                attempt: config.metadata.as_ref().map_or(0, |m| m.attempt),
            }),
            image: Some(pb::ImageSpec { image: IMAGE.into() }),
            command: ["/bin/httpd", "-f", "-p", &CONTAINER_PORT.to_string(), "-h", "/www"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            args: vec![],
            log_path: "web.log".into(),
        };
        let id = self.cri.create_container(sandbox, &c, config).expect("CreateContainer");
        self.cri.start_container(&id).expect("StartContainer");
        let st = self.cri.container_status(&id).expect("ContainerStatus");
        assert_eq!(st.state, pb::CONTAINER_RUNNING, "{st:?}");
        let url = format!("http://{ip}:{CONTAINER_PORT}/");
        wait_for("httpd in the pod", Duration::from_secs(20), || Sandbox::http_get(&self.sb.host, &url).ok());
        id
    }

    fn exec(&mut self, container: &str, cmd: &[&str]) -> String {
        let (rc, out, err) = self.cri.exec_sync(container, cmd, 30).expect("ExecSync");
        assert_eq!(rc, 0, "{cmd:?} in the pod: exit {rc}, stdout {out:?}, stderr {err:?}");
        out
    }

    fn stop(&mut self, id: &str) {
        self.cri.stop_pod_sandbox(id).unwrap_or_else(|e| panic!("StopPodSandbox: {e}\n{}", self.log()));
    }

    fn remove(&mut self, id: &str) {
        self.cri.remove_pod_sandbox(id).unwrap_or_else(|e| panic!("RemovePodSandbox: {e}\n{}", self.log()));
        self.live.retain(|x| x != id);
    }
}

impl Drop for Node<'_> {
    fn drop(&mut self) {
        // A failed test: take down what it left, through the CRI, before the daemon stops.
        for id in std::mem::take(&mut self.live) {
            let _ = self.cri.stop_pod_sandbox(&id);
            let _ = self.cri.remove_pod_sandbox(&id);
        }
        if std::thread::panicking() {
            eprintln!("--- containerd log ---\n{}", self.log());
            for c in self.calls() {
                eprintln!("call {}: {}", c.key, c.summary());
            }
        }
    }
}

/// host-local's reservations (files named after an address) in its default dataDir, which the
/// sandbox maps to scratch.
fn reservations(sb: &Sandbox) -> Vec<String> {
    let dir = sb.dir.join("cache/networks").join(NET);
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.retain(|n| n.parse::<std::net::IpAddr>().is_ok());
    v.sort();
    v
}

/// The result libcni cached for the pod's eth0 attachment (what containerd got from the chain).
fn cached(sb: &Sandbox, id: &str) -> Value {
    sb.cached(NET, id, "eth0")
        .unwrap_or_else(|| panic!("no libcni cache entry for {id}: {:?}", sb.cache_entries()))
}

/// The tbf on `dev` in the host netns: (rate in bytes/s, burst in bytes).
fn tbf(sb: &Sandbox, dev: &str) -> (u64, u64) {
    let out = sb.host.run("tc", &["-j", "qdisc", "show", "dev", dev]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("tc -j prints JSON");
    let q = v
        .as_array()
        .and_then(|a| a.iter().find(|q| q["kind"] == "tbf"))
        .unwrap_or_else(|| panic!("no tbf on {dev}: {v}"));
    (q["options"]["rate"].as_u64().expect("rate"), q["options"]["burst"].as_u64().expect("burst"))
}

/// Whether `text` mentions the address `ip` as a whole (not inside a longer address).
fn mentions_ip(text: &str, ip: &str) -> bool {
    text.match_indices(ip).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + ip.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_digit() || c == '.') && !after.is_some_and(|c| c.is_ascii_digit())
    })
}

/// Nothing of the sandbox `id` (address `ip`) is left in the host netns, the firewall, IPAM,
/// libcni's cache or /run/netns. `others` are sandboxes still running.
fn assert_sandbox_gone(
    sb: &Sandbox,
    before: &BTreeSet<String>,
    id: &str,
    ip: &str,
    others: usize,
    what: &str,
) {
    let links: BTreeSet<String> = sb.host_links().into_iter().collect();
    let mut expected = before.clone();
    expected.insert(BRIDGE.to_string()); // the bridge stays, as with upstream
    if others == 0 {
        assert_eq!(links, expected, "{what}: links left in the host netns");
        let q = sb.qdiscs();
        assert!(!q.contains("tbf") && !q.contains("ingress"), "{what}: qdiscs left: {q}");
        assert_eq!(reservations(sb), Vec::<String>::new(), "{what}: host-local reservations left");
        assert_eq!(sb.must("ls", &["-A", "/run/netns"]).trim(), "", "{what}: network namespaces left");
        let fw = sb.firewall_text();
        assert!(
            !fw.contains(&HOST_PORT.to_string()),
            "{what}: the host port is still in the firewall:\n{fw}"
        );
    }
    assert!(!reservations(sb).contains(&ip.to_string()), "{what}: {ip} still reserved");
    let fw = sb.firewall_text();
    assert!(!mentions_ip(&fw, ip), "{what}: the firewall still mentions {ip}:\n{fw}");
    assert!(!fw.contains(id) && !fw.contains(&id[..12]), "{what}: the firewall still mentions {id}:\n{fw}");
    let left: Vec<String> = sb.cache_entries().into_iter().filter(|e| e.contains(id)).collect();
    assert!(left.is_empty(), "{what}: libcni cache entries left: {left:?}");
}

/// The calls for sandbox `id` with CNI_COMMAND `cmd`, recorded after index `from`.
fn calls_for<'c>(calls: &'c [Call], from: usize, id: &str, cmd: &str) -> Vec<&'c Call> {
    calls[from.min(calls.len())..].iter().filter(|c| c.container_id() == id && c.command() == cmd).collect()
}

/// The CRI ran the page's chain (bridge, portmap, bandwidth when `bandwidth`) for `id` and,
/// as a network of its own, loopback on `lo`; each call succeeded.
fn assert_chain_calls(calls: &[&Call], id: &str, cmd: &str, chain: &[&str], version: &str, what: &str) {
    let list = || calls.iter().map(|c| c.summary()).collect::<Vec<_>>();
    let on_eth0: Vec<&str> = calls.iter().filter(|c| c.network() == NET).map(|c| c.plugin.as_str()).collect();
    let expect: Vec<&str> = if cmd == "DEL" { chain.iter().rev().copied().collect() } else { chain.to_vec() };
    assert_eq!(on_eth0, expect, "{what}: the chain's {cmd} calls for {id}: {:?}", list());
    let lo: Vec<&&Call> = calls.iter().filter(|c| c.network() == LO_NET).collect();
    assert_eq!(lo.len(), 1, "{what}: one loopback {cmd} for {id}: {:?}", list());
    assert_eq!(lo[0].plugin, "loopback");
    assert_eq!(lo[0].env("CNI_IFNAME"), Some("lo"), "{what}: loopback on lo");
    assert_eq!(lo[0].stdin["cniVersion"], "0.3.1", "{what}: containerd's loopback network is 0.3.1");
    for c in calls {
        assert_eq!(c.rc, Some(0), "{what}: {} failed: {}", c.summary(), c.stdout);
        if c.network() == NET {
            assert_eq!(c.env("CNI_IFNAME"), Some("eth0"), "{what}: {}", c.summary());
            assert_eq!(c.stdin["cniVersion"], version, "{what}: the conflist's cniVersion");
        }
    }
}

#[test]
fn cri_pod_with_host_port_and_bandwidth_annotations() {
    pod_with_host_port_and_bandwidth_annotations(Runtime::Debian16);
}

/// The same against containerd 2.4.2, the page's conflist at cniVersion 1.1.0.
#[test]
fn cri2_pod_with_host_port_and_bandwidth_annotations() {
    pod_with_host_port_and_bandwidth_annotations(Runtime::v2());
}

fn pod_with_host_port_and_bandwidth_annotations(rt: Runtime) {
    let ver = rt.cni_version();
    let pod = cni_tests::unique("web");
    let uid = format!("{pod}-0000-4000-8000-000000000001");
    let tokens = [pod.as_str(), uid.as_str()];
    let machine = HostSnapshot::take(&tokens);
    let burst_problems = {
        let sb = Sandbox::new(PluginSet::from_env());
        let before: BTreeSet<String> = sb.host_links().into_iter().collect();
        let mut node = Node::start_on(&sb, rt.clone(), "k8s-hostport-bandwidth.conflist");
        let chain = ["bridge", "portmap", "bandwidth"];

        // ---- first sandbox of the pod
        let config = node.pod_config(&pod, &uid, 0, true);
        let (id, ip) = node.run_pod(&config);
        let res = cached(&sb, &id);
        assert_eq!(cached_ip(&res), ip, "PodSandboxStatus reports the IP of our result");
        assert!(ip.starts_with(POD_SUBNET_PREFIX), "{ip}");
        assert_eq!(reservations(&sb), vec![ip.clone()]);

        // what the CRI handed to the plugins
        let calls = node.calls();
        let adds = calls_for(&calls, 0, &id, "ADD");
        assert_chain_calls(&adds, &id, "ADD", &chain, ver, "RunPodSandbox");
        let by = |p: &str| *adds.iter().find(|c| c.plugin == p).unwrap();
        assert_eq!(
            by("portmap").stdin["runtimeConfig"]["portMappings"],
            json!([{"HostPort": HOST_PORT, "ContainerPort": CONTAINER_PORT, "Protocol": "tcp", "HostIP": ""}]),
            "portMappings as containerd sends them (capitalised keys)"
        );
        assert_eq!(
            by("bandwidth").stdin["runtimeConfig"]["bandwidth"],
            json!({"IngressRate": INGRESS_BITS, "IngressBurst": CRI_BURST, "EgressRate": EGRESS_BITS, "EgressBurst": CRI_BURST}),
            "bandwidth as containerd sends it for the {INGRESS_ANNOTATION}/{EGRESS_ANNOTATION} annotations"
        );
        // CNI_ARGS: the same pairs to every plugin of both networks, in varying order (a Go map)
        let want: BTreeSet<String> = [
            format!("K8S_POD_NAME={pod}"),
            "K8S_POD_NAMESPACE=default".to_string(),
            format!("K8S_POD_UID={uid}"),
            format!("K8S_POD_INFRA_CONTAINER_ID={id}"),
            "IgnoreUnknown=1".to_string(),
        ]
        .into();
        for c in &adds {
            let args: BTreeSet<String> =
                c.env("CNI_ARGS").unwrap_or("").split(';').map(str::to_string).collect();
            assert_eq!(args, want, "CNI_ARGS of {}", c.summary());
        }

        // the workload
        let web = node.run_web(&id, &config, &ip);
        let lo = node.exec(&web, &["/bin/ip", "-o", "link", "show", "lo"]);
        assert!(lo.contains(",UP") || lo.contains("<UP"), "lo is up in the pod: {lo}");
        let lo4 = node.exec(&web, &["/bin/ip", "-o", "-4", "addr", "show", "lo"]);
        assert!(lo4.contains("127.0.0.1/8"), "{lo4}");
        let eth0 = node.exec(&web, &["/bin/ip", "-o", "-4", "addr", "show", "eth0"]);
        assert!(eth0.contains(&format!("{ip}/24")), "{eth0}");

        // the host port: from outside, from the host (its address and 127.0.0.1), hairpin
        let via = format!("http://{HOST_ADDR}:{HOST_PORT}/");
        assert_eq!(
            Sandbox::http_get(&sb.outside, &via).as_deref(),
            Ok(PAGE),
            "from outside via the host port"
        );
        assert_eq!(Sandbox::http_get(&sb.host, &via).as_deref(), Ok(PAGE), "from the host via its address");
        let local = format!("http://127.0.0.1:{HOST_PORT}/");
        assert_eq!(Sandbox::http_get(&sb.host, &local).as_deref(), Ok(PAGE), "from the host via 127.0.0.1");
        let hairpin = node.exec(
            &web,
            &[
                "/bin/sh",
                "-c",
                &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {HOST_ADDR} {HOST_PORT}"),
            ],
        );
        assert!(
            hairpin.contains(PAGE.trim()),
            "hairpin: the pod reaches itself through the host port: {hairpin:?}"
        );

        // shaping: tbf on the host veth (traffic into the pod) and on the ifb (out of it)
        let veth = cached_host_veth(&res, BRIDGE);
        let ifbs: Vec<String> = sb.host_links().into_iter().filter(|l| l.starts_with("bwp")).collect();
        assert_eq!(ifbs.len(), 1, "one ifb for the pod's egress: {ifbs:?}");
        let (in_rate, in_burst) = tbf(&sb, &veth);
        let (out_rate, out_burst) = tbf(&sb, &ifbs[0]);
        assert_eq!((in_rate * 8, out_rate * 8), (INGRESS_BITS, EGRESS_BITS), "tbf rates: {}", sb.qdiscs());
        let into_pod = shaped_rate_into(&sb, HOST_PORT, in_burst, INGRESS_BITS);
        let out_of_pod = shaped_rate_out_of(&sb, HOST_PORT, out_burst, EGRESS_BITS);
        eprintln!(
            "shaping {INGRESS_ANNOTATION} in, {EGRESS_ANNOTATION} out: tbf bursts {in_burst} B (into the pod), \
             {out_burst} B (out of it); measured {into_pod:.0} bit/s into the pod, {out_of_pod:.0} bit/s out of it"
        );
        // Direction and order of magnitude, no timing bound: a loaded machine only makes a
        // transfer slower, never faster than its bucket lets it. Each direction stays under
        // 1.5x its own limit (the unshaped path carries hundreds of Mbit/s), so a limit missing
        // or applied to the other direction shows; and the direction limited 4x lower is
        // clearly the slower one.
        for (what, r, limit) in
            [("into the pod", into_pod, INGRESS_BITS), ("out of the pod", out_of_pod, EGRESS_BITS)]
        {
            assert!(r < 1.5 * limit as f64, "{what}: {r:.0} bit/s with a limit of {limit} bit/s: not shaped");
        }
        assert!(
            into_pod * 1.5 < out_of_pod,
            "into the pod ({INGRESS_ANNOTATION}) {into_pod:.0} bit/s is not clearly slower than out of it \
             ({EGRESS_ANNOTATION}) {out_of_pod:.0} bit/s: the limits are not applied per direction"
        );
        // Checked at the end, so that a wrong burst does not hide the rest of the test.
        let burst_problems: Vec<String> = [("into the pod", in_burst), ("out of the pod", out_burst)]
            .into_iter()
            .filter(|(_, b)| *b > 1 << 20)
            .map(|(what, b)| format!("the tbf burst {what} is {b} bytes"))
            .collect();

        // ---- StopPodSandbox: DEL with the netns; RemovePodSandbox: DEL again, netns ""
        let mark = node.calls().len();
        node.stop(&id);
        let calls = node.calls();
        let dels = calls_for(&calls, mark, &id, "DEL");
        assert_chain_calls(&dels, &id, "DEL", &chain, ver, "StopPodSandbox");
        for c in &dels {
            assert_ne!(
                c.env("CNI_NETNS").unwrap_or(""),
                "",
                "StopPodSandbox's DEL has the netns: {}",
                c.summary()
            );
        }
        assert!(by_net_has_prev(&dels), "StopPodSandbox's DEL carries prevResult");
        assert!(
            Sandbox::http_get(&sb.outside, &via).is_err(),
            "the host port is closed after StopPodSandbox"
        );
        let mark = calls.len();
        node.remove(&id);
        let calls = node.calls();
        let dels = calls_for(&calls, mark, &id, "DEL");
        assert_chain_calls(&dels, &id, "DEL", &chain, ver, "RemovePodSandbox");
        for c in &dels {
            assert_eq!(c.env("CNI_NETNS"), Some(""), "RemovePodSandbox's DEL: {}", c.summary());
            assert!(c.stdin.get("prevResult").is_none(), "no prevResult in the second DEL: {}", c.stdin);
        }
        assert_sandbox_gone(&sb, &before, &id, &ip, 0, "StopPodSandbox + RemovePodSandbox");

        // ---- the same pod again (attempt 1), stopped; attempt 2 runs; then attempt 1 is
        // removed (its second DEL must not touch attempt 2), as a kubelet does on restarts
        let config1 = node.pod_config(&pod, &uid, 1, true);
        let (id1, ip1) = node.run_pod(&config1);
        let veth1 = cached_host_veth(&cached(&sb, &id1), BRIDGE);
        assert_eq!(cached_ip(&cached(&sb, &id1)), ip1);
        node.run_web(&id1, &config1, &ip1);
        assert_eq!(Sandbox::http_get(&sb.outside, &via).as_deref(), Ok(PAGE), "attempt 1 via the host port");
        node.stop(&id1);
        let config2 = node.pod_config(&pod, &uid, 2, true);
        let (id2, ip2) = node.run_pod(&config2);
        assert_eq!(cached_ip(&cached(&sb, &id2)), ip2);
        node.run_web(&id2, &config2, &ip2);
        assert_eq!(Sandbox::http_get(&sb.outside, &via).as_deref(), Ok(PAGE), "attempt 2 via the host port");
        node.remove(&id1);
        assert_sandbox_gone(&sb, &before, &id1, &ip1, 1, "attempt 1 removed");
        assert!(sb.host.link(&veth1).is_none(), "attempt 1's veth {veth1} is left");
        let ifbs = sb.host_links().into_iter().filter(|l| l.starts_with("bwp")).count();
        assert_eq!(ifbs, 1, "attempt 2's ifb only");
        assert_eq!(
            Sandbox::http_get(&sb.outside, &via).as_deref(),
            Ok(PAGE),
            "attempt 2 still reached after attempt 1's RemovePodSandbox"
        );
        assert_eq!(reservations(&sb), vec![ip2.clone()]);
        node.stop(&id2);
        node.remove(&id2);
        assert_sandbox_gone(&sb, &before, &id2, &ip2, 0, "all attempts removed");
        assert!(node.cri.list_pod_sandbox().expect("ListPodSandbox").is_empty());
        let all = node.calls();
        let failed: Vec<String> = all.iter().filter(|c| c.rc != Some(0)).map(|c| c.summary()).collect();
        assert!(failed.is_empty(), "plugin calls failed: {failed:?}");
        let verbs: BTreeSet<&str> = all.iter().map(|c| c.command()).collect();
        match rt {
            Runtime::Debian16 => {
                assert_eq!(verbs, BTreeSet::from(["ADD", "DEL"]), "containerd 1.6 calls ADD and DEL only")
            }
            Runtime::V2(_) => {
                assert_eq!(
                    verbs,
                    BTreeSet::from(["ADD", "DEL", "STATUS"]),
                    "containerd 2.x calls ADD, DEL and STATUS"
                );
                assert_status_calls(&all, &chain);
            }
        }
        print_verbs(&rt, &all);
        drop(node);
        burst_problems
    };
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
    assert!(
        burst_problems.is_empty(),
        "{burst_problems:?}: with bandwidth annotations the CRI sends bursts of {CRI_BURST} bits \
         (MaxUint32, i.e. \"not set\"), which must give a default burst derived from the rate, at most 1 MiB"
    );
}

/// Whether the DEL calls of the pod network carry a prevResult.
fn by_net_has_prev(dels: &[&Call]) -> bool {
    dels.iter().filter(|c| c.network() == NET).all(|c| c.stdin.get("prevResult").is_some())
}

/// One of the page's two examples on its own, installed byte for byte: a pod with a hostPort
/// and both annotations gets only what the conflist asks for (the CRI passes a capability
/// only to the plugins that declare it), and Stop + Remove leave nothing.
fn page_example_alone(rt: Runtime, conflist: &str, chain: &[&str]) {
    let pod = cni_tests::unique("pex");
    let uid = format!("{pod}-0000-4000-8000-000000000002");
    let tokens = [pod.as_str(), uid.as_str()];
    let machine = HostSnapshot::take(&tokens);
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let before: BTreeSet<String> = sb.host_links().into_iter().collect();
        let mut node = Node::start_on(&sb, rt.clone(), conflist);
        let config = node.pod_config(&pod, &uid, 0, true);
        let (id, ip) = node.run_pod(&config);
        let res = cached(&sb, &id);
        assert_eq!(cached_ip(&res), ip, "PodSandboxStatus reports the IP of our result");
        let calls = node.calls();
        let adds = calls_for(&calls, 0, &id, "ADD");
        assert_chain_calls(&adds, &id, "ADD", chain, rt.cni_version(), conflist);
        node.run_web(&id, &config, &ip);

        let via = format!("http://{HOST_ADDR}:{HOST_PORT}/");
        let from_outside = Sandbox::http_get(&sb.outside, &via);
        let ifbs: Vec<String> = sb.host_links().into_iter().filter(|l| l.starts_with("bwp")).collect();
        if chain.contains(&"portmap") {
            assert_eq!(from_outside.as_deref(), Ok(PAGE), "{conflist}: the host port from outside");
        } else {
            assert!(from_outside.is_err(), "{conflist} has no portmap, yet the host port answers");
        }
        if chain.contains(&"bandwidth") {
            assert_eq!(ifbs.len(), 1, "{conflist}: one ifb: {ifbs:?}");
            let (in_rate, _) = tbf(&sb, &cached_host_veth(&res, BRIDGE));
            let (out_rate, _) = tbf(&sb, &ifbs[0]);
            assert_eq!(
                (in_rate * 8, out_rate * 8),
                (INGRESS_BITS, EGRESS_BITS),
                "{conflist}: {}",
                sb.qdiscs()
            );
        } else {
            assert!(ifbs.is_empty(), "{conflist} has no bandwidth, yet there is an ifb: {ifbs:?}");
            assert!(!sb.qdiscs().contains("tbf"), "{conflist}: tbf without bandwidth: {}", sb.qdiscs());
        }

        let mark = node.calls().len();
        node.stop(&id);
        node.remove(&id);
        let calls = node.calls();
        let dels = calls_for(&calls, mark, &id, "DEL");
        assert_eq!(dels.len(), 2 * (chain.len() + 1), "{conflist}: two DELs of each network: {dels:?}");
        assert_sandbox_gone(&sb, &before, &id, &ip, 0, conflist);
        drop(node);
    }
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}

#[test]
fn cri_page_hostport_example_alone() {
    page_example_alone(Runtime::Debian16, "k8s-hostport.conflist", &["bridge", "portmap"]);
}

#[test]
fn cri_page_bandwidth_example_alone() {
    page_example_alone(Runtime::Debian16, "k8s-bandwidth.conflist", &["bridge", "bandwidth"]);
}

#[test]
fn cri2_page_hostport_example_alone() {
    page_example_alone(Runtime::v2(), "k8s-hostport.conflist", &["bridge", "portmap"]);
}

#[test]
fn cri2_page_bandwidth_example_alone() {
    page_example_alone(Runtime::v2(), "k8s-bandwidth.conflist", &["bridge", "bandwidth"]);
}

/// containerd 2.x's STATUS calls: every plugin of the 1.1.0 list (not the 0.3.1 loopback
/// network), no container, the list's cniVersion, each answered 0.
fn assert_status_calls(all: &[Call], chain: &[&str]) {
    let st: Vec<&Call> = all.iter().filter(|c| c.command() == "STATUS").collect();
    assert!(!st.is_empty(), "no STATUS recorded");
    for c in &st {
        assert!(chain.contains(&c.plugin.as_str()), "STATUS of {}: not in the list", c.summary());
        assert_eq!(c.network(), NET, "STATUS of the pod network only: {}", c.summary());
        assert_eq!(c.stdin["cniVersion"], "1.1.0", "{}", c.summary());
        assert_eq!(c.container_id(), "", "STATUS names no container: {}", c.summary());
        assert_eq!(c.env("CNI_NETNS").unwrap_or(""), "", "STATUS has no netns: {}", c.summary());
        assert_eq!(c.rc, Some(0), "STATUS of {} failed: {}", c.summary(), c.stdout);
    }
    eprintln!("a STATUS call: env {:?}, stdin {}", st[0].env, st[0].stdin);
    // one round = the list in order
    let first: Vec<&str> = st.iter().take(chain.len()).map(|c| c.plugin.as_str()).collect();
    assert_eq!(first, chain, "a STATUS round runs the list in order");
}

/// What the runtime sent, in order, with consecutive repeats folded (for docs/real-clients.md).
fn print_verbs(rt: &Runtime, all: &[Call]) {
    let mut seq: Vec<(String, usize)> = Vec::new();
    for c in all {
        let k = format!("{} {}({})", c.command(), c.plugin, c.network());
        match seq.last_mut() {
            Some((last, n)) if *last == k => *n += 1,
            _ => seq.push((k, 1)),
        }
    }
    let text: Vec<String> =
        seq.into_iter().map(|(k, n)| if n > 1 { format!("{k} x{n}") } else { k }).collect();
    eprintln!("{rt:?} sent, in order: {}", text.join(", "));
}

/// Issue 21: a firewall reload cuts every running pod's host ports and masquerading (Debian's
/// `/etc/nftables.conf` starts with `flush ruleset`), and no runtime notices. Three pods
/// through the CRI with a TCP and a UDP hostPort each and the page's masquerading, the third
/// also shaped (and its ifb deleted by someone as well) → `nft flush ruleset` in the node's
/// namespace → CHECK fails, nothing is forwarded or masqueraded → scripts/migrate.sh resync rebuilds
/// from containerd's libcni cache → every port reached from outside, egress masqueraded, CHECK
/// passes → a second resync changes nothing (`nft -j list ruleset` identical).
#[test]
fn cri_pods_survive_a_firewall_reload_through_resync() {
    use cni_tests::clients::OUTSIDE_ADDR;
    use cni_tests::traffic::{fetch_udp, Server, UdpServer};
    const TCP_PORT: u16 = 30180;
    const UDP_PORT: u16 = 30190;
    const POD_UDP: u16 = 5353;
    const OUTSIDE_PORT: u16 = 9000;
    let tag = cni_tests::unique("rsy");
    let tokens = [tag.as_str()];
    let machine = HostSnapshot::take(&tokens);
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let mut node = Node::start(&sb, "k8s-hostport-bandwidth.conflist");
        let _outside = Server::tcp4(&sb.outside, OUTSIDE_PORT, "outside");
        struct Pod {
            name: String,
            id: String,
            web: String,
            caps: Value,
            netns: String,
            _udp: UdpServer,
        }
        let mut pods = Vec::new();
        for i in 0..3u16 {
            let name = format!("{tag}-{i}");
            let uid = format!("{tag}-0000-4000-8000-00000000002{i}");
            let mut config = node.pod_config(&name, &uid, 0, i == 2);
            config.port_mappings = vec![
                pb::PortMapping {
                    protocol: pb::PROTOCOL_TCP,
                    container_port: CONTAINER_PORT.into(),
                    host_port: (TCP_PORT + i).into(),
                    host_ip: String::new(),
                },
                pb::PortMapping {
                    protocol: pb::PROTOCOL_UDP,
                    container_port: POD_UDP.into(),
                    host_port: (UDP_PORT + i).into(),
                    host_ip: String::new(),
                },
            ];
            let (id, ip) = node.run_pod(&config);
            let web = node.run_web(&id, &config, &ip);
            node.exec(&web, &["/bin/sh", "-c", &format!("echo {name} > /www/who")]);
            // busybox has no UDP server: a responder in the pod's namespace, through its pause process
            let st = node.cri.pod_sandbox_status(&id).expect("PodSandboxStatus");
            let info: Value = serde_json::from_str(st.info.get("info").expect("verbose info")).unwrap();
            let pid = info["pid"].as_u64().unwrap_or_else(|| panic!("no sandbox pid in {info}"));
            let udp = UdpServer::start_at(Path::new(&format!("/proc/{pid}/ns/net")), POD_UDP, &name);
            let cache = cached(&sb, &id);
            // libcni 1.1 (containerd 1.6) caches no netns: the result's sandbox names it
            let netns = cache["result"]["interfaces"]
                .as_array()
                .and_then(|a| a.iter().find_map(|i| i["sandbox"].as_str().filter(|s| !s.is_empty())))
                .expect("a sandbox in the cached result")
                .to_string();
            pods.push(Pod { name, id, web, caps: cache["capabilityArgs"].clone(), netns, _udp: udp });
        }
        // What each pod gives: (TCP host port from outside, UDP host port from outside, whom
        // the outside sees when the pod connects to it).
        let probe = |node: &mut Node, sport: u16| -> Vec<(String, String, String)> {
            let mut out = Vec::new();
            for (i, p) in pods.iter().enumerate() {
                let i = i as u16;
                let tcp = Sandbox::http_get(&sb.outside, &format!("http://{HOST_ADDR}:{}/who", TCP_PORT + i))
                    .unwrap_or_default();
                let udp = fetch_udp(&sb.outside, HOST_ADDR, UDP_PORT + i, sport + i);
                let cmd = format!("nc -w 3 {OUTSIDE_ADDR} {OUTSIDE_PORT} </dev/null");
                let (_, seen, _) =
                    node.cri.exec_sync(&p.web, &["/bin/sh", "-c", &cmd], 30).expect("ExecSync");
                out.push((tcp.trim().to_string(), udp, seen.trim().to_string()));
            }
            out
        };
        let working: Vec<(String, String, String)> = pods
            .iter()
            .map(|p| (p.name.clone(), format!("{} {OUTSIDE_ADDR}", p.name), format!("outside {HOST_ADDR}")))
            .collect();
        // CHECK of the pod network's chain, as libcni runs it: our cnitool in the node, with
        // containerd's cache (prevResult) and the capability arguments containerd passed.
        let check = |p: &Pod| -> Result<(), String> {
            let out = sb
                .command(120, cni_tests::bin("cnitool").to_str().unwrap())
                .args(["check", NET, &p.netns])
                .env("CNI_CONTAINERID", &p.id)
                .env("CNI_IFNAME", "eth0")
                .env("NETCONFPATH", sb.dir.join("criconf"))
                .env("CNI_PATH", sb.dir.join("bin"))
                .env("CAP_ARGS", p.caps.to_string())
                .output()
                .expect("run cnitool");
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        };
        let resync = || {
            let out = sb
                .command(300, cni_tests::workspace_root().join("scripts/migrate.sh").to_str().unwrap())
                .args(["resync", "--cni-bin-dir", sb.dir.join("bin").to_str().unwrap()])
                .env("CNI_MIGRATE", cni_tests::bin("cni-migrate"))
                .output()
                .expect("run scripts/migrate.sh resync");
            let text =
                format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            eprintln!("--- scripts/migrate.sh resync:\n{text}");
            (out.status.code(), text)
        };
        let ruleset = || String::from_utf8(sb.host.run("nft", &["-j", "list", "ruleset"]).stdout).unwrap();

        assert_eq!(probe(&mut node, 41000), working, "before the reload");
        for p in &pods {
            check(p).unwrap_or_else(|e| panic!("CHECK {} before the reload: {e}", p.name));
        }

        // ---- the firewall reload, and an ifb of the shaped pod deleted by someone
        sb.host.run("nft", &["flush", "ruleset"]);
        let ifb = cached(&sb, &pods[2].id)["result"]["interfaces"]
            .as_array()
            .and_then(|a| a.iter().find_map(|i| i["name"].as_str().filter(|n| n.starts_with("bwp"))))
            .expect("the shaped pod's ifb in its result")
            .to_string();
        sb.host.run("ip", &["link", "del", &ifb]);
        for p in &pods {
            let e = check(p).expect_err("CHECK must fail after the reload");
            assert!(!e.trim().is_empty(), "CHECK {} says why", p.name);
        }
        let cut = probe(&mut node, 42000);
        for (got, want) in cut.iter().zip(&working) {
            assert_ne!(got.0, want.0, "after the reload the TCP host port is cut: {cut:?}");
            assert_eq!((got.1.as_str(), got.2.as_str()), ("", ""), "UDP and egress cut: {cut:?}");
        }

        // ---- resync
        let (code, text) = resync();
        assert_eq!(code, Some(10), "something was rebuilt: exit 10\n{text}");
        for p in &pods {
            for part in ["bridge", "portmap"] {
                let line = format!("{NET}/{}/eth0: {part}: repaired", p.id);
                assert!(text.contains(&line), "{line}:\n{text}");
            }
        }
        let shaped = format!("{NET}/{}/eth0: bandwidth: repaired", pods[2].id);
        assert!(text.contains(&shaped), "{shaped}:\n{text}");
        assert!(text.contains(" 0 failed"), "{text}");
        assert_eq!(
            probe(&mut node, 43000),
            working,
            "after resync: every port from outside, egress masqueraded"
        );
        for p in &pods {
            check(p).unwrap_or_else(|e| panic!("CHECK {} after resync: {e}", p.name));
        }

        // ---- a second resync changes nothing
        let before = ruleset();
        let (code, text) = resync();
        assert_eq!(code, Some(0), "everything intact: exit 0\n{text}");
        assert_eq!(ruleset(), before, "the second resync changed the ruleset");

        for p in &pods {
            node.stop(&p.id);
            node.remove(&p.id);
        }
        assert!(node.cri.list_pod_sandbox().expect("ListPodSandbox").is_empty());
        assert_eq!(reservations(&sb), Vec::<String>::new(), "host-local reservations left");
        drop(node);
    }
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}

/// A 1.1.0 list like the page's hostport example, with a pool of one address, and
/// `reportExhaustionInStatus` as given.
fn one_address_list(report_exhaustion: bool) -> String {
    let mut ipam = json!({
        "type": "host-local",
        "subnet": "10.244.3.0/24",
        "rangeStart": "10.244.3.10",
        "rangeEnd": "10.244.3.10",
        "routes": [{ "dst": "0.0.0.0/0" }]
    });
    if report_exhaustion {
        ipam["reportExhaustionInStatus"] = json!(true);
    }
    serde_json::to_string_pretty(&json!({
        "name": NET,
        "cniVersion": "1.1.0",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": true, "ipam": ipam},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    }))
    .unwrap()
}

/// containerd 2.x runs STATUS of the list on every CRI `Status` call and turns a failure into
/// `NetworkReady=false` with the plugin's message. Our policy (docs/real-clients.md): a full
/// pool keeps the node ready by default — the pod that does not fit fails its ADD, the running
/// pod keeps running — and with `reportExhaustionInStatus` the node goes not-ready with
/// host-local's message and comes back ready as soon as an address is free again.
#[test]
fn cri2_status_drives_network_ready_and_follows_our_exhaustion_policy() {
    let rt = Runtime::v2();
    for report in [false, true] {
        let tag = cni_tests::unique("sts");
        let tokens = [tag.as_str()];
        let machine = HostSnapshot::take(&tokens);
        {
            let sb = Sandbox::new(PluginSet::from_env());
            let before: BTreeSet<String> = sb.host_links().into_iter().collect();
            let mut node = Node::start_with(&sb, rt.clone(), "10-one.conflist", &one_address_list(report));
            let mark = node.calls().len();
            assert_eq!(node.network_ready(), (true, " ".to_string()), "a healthy node");
            let calls = node.calls();
            let status: Vec<&Call> = calls[mark..].iter().filter(|c| c.command() == "STATUS").collect();
            let plugins: Vec<&str> = status.iter().map(|c| c.plugin.as_str()).collect();
            assert_eq!(plugins, ["bridge", "portmap"], "one CRI Status = STATUS of the list, in order");
            assert_status_calls(&calls, &["bridge", "portmap"]);

            // the one address taken
            let a = format!("{tag}-a");
            let ca = node.pod_config(&a, &format!("{a}-0000-4000-8000-000000000031"), 0, false);
            let (ida, ipa) = node.run_pod(&ca);
            assert_eq!(ipa, "10.244.3.10");
            let (ready, why) = node.network_ready();
            eprintln!("reportExhaustionInStatus={report}, pool full: NetworkReady={ready} {why:?}");
            let full_status: Vec<Call> = node
                .calls()
                .into_iter()
                .filter(|c| c.command() == "STATUS" && c.plugin == "bridge")
                .collect();
            let last = full_status.last().expect("a STATUS of bridge after the ADD");
            if report {
                assert!(!ready, "reportExhaustionInStatus: the full pool makes NetworkReady false");
                assert!(why.starts_with("NetworkPluginNotReady "), "{why}");
                assert_eq!(last.rc, Some(1), "bridge's STATUS fails: {}", last.stdout);
                let err: Value = serde_json::from_str(&last.stdout).expect("a CNI error on stdout");
                assert_eq!(err["code"], 50, "{err}");
                let msg = err["msg"].as_str().unwrap_or("");
                assert!(why.contains(msg), "the CRI passes our message on: {why:?} vs {err}");
                assert!(why.contains("10.244.3.10"), "the message names the range set: {why}");
            } else {
                assert_eq!((ready, last.rc), (true, Some(0)), "a full pool keeps the node ready: {why}");
            }
            // the pod that does not fit fails; the running one is untouched
            let b = format!("{tag}-b");
            let cb = node.pod_config(&b, &format!("{b}-0000-4000-8000-000000000032"), 0, false);
            let err = node.cri.run_pod_sandbox(&cb).expect_err("no address left for a second pod");
            assert!(err.to_string().contains("no IP addresses available"), "{err}");
            assert_eq!(node.cri.list_pod_sandbox().expect("ListPodSandbox").len(), 1, "{err}");
            // STATUS follows: free again as soon as the pod is gone
            node.stop(&ida);
            node.remove(&ida);
            assert_eq!(node.network_ready(), (true, " ".to_string()), "the address is free again");
            assert_sandbox_gone(&sb, &before, &ida, &ipa, 0, "the pod removed");
            let failed: Vec<String> = node
                .calls()
                .iter()
                .filter(|c| c.rc != Some(0) && !(c.command() == "STATUS" && report))
                .filter(|c| c.command() != "ADD")
                .map(|c| c.summary())
                .collect();
            assert!(failed.is_empty(), "calls failed: {failed:?}");
            print_verbs(&rt, &node.calls());
            drop(node);
        }
        HostSnapshot::assert_unchanged_since(&machine, &tokens);
    }
}

/// containerd 2.x restarted while a pod runs: the pod keeps its address, its host port and
/// its shaping (nothing of ours runs again for it), the CRI still knows it, and a later
/// StopPodSandbox + RemovePodSandbox cleans everything.
#[test]
fn cri2_restart_with_a_running_pod() {
    let rt = Runtime::v2();
    let pod = cni_tests::unique("rst");
    let uid = format!("{pod}-0000-4000-8000-000000000041");
    let tokens = [pod.as_str(), uid.as_str()];
    let machine = HostSnapshot::take(&tokens);
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let before: BTreeSet<String> = sb.host_links().into_iter().collect();
        let mut node = Node::start_on(&sb, rt.clone(), "k8s-hostport-bandwidth.conflist");
        let config = node.pod_config(&pod, &uid, 0, true);
        let (id, ip) = node.run_pod(&config);
        let web = node.run_web(&id, &config, &ip);
        let via = format!("http://{HOST_ADDR}:{HOST_PORT}/");
        assert_eq!(Sandbox::http_get(&sb.outside, &via).as_deref(), Ok(PAGE), "before the restart");
        let qdiscs = sb.qdiscs();
        let fw = sb.firewall_text();
        let reserved = reservations(&sb);

        let mark = node.calls().len();
        node.ctrd.restart();
        node.cri = CriClient::connect(&node.ctrd.socket).expect("reconnect to the CRI");
        node.wait_ready(true);
        let st = node.cri.pod_sandbox_status(&id).expect("PodSandboxStatus after the restart");
        let status = st.status.expect("a status");
        assert_eq!(status.state, pb::SANDBOX_READY, "{status:?}");
        assert_eq!(status.network.expect("network").ip, ip, "the same address after the restart");
        let after: Vec<String> =
            node.calls()[mark..].iter().filter(|c| c.command() != "STATUS").map(|c| c.summary()).collect();
        assert!(after.is_empty(), "the restart ran no ADD/DEL/CHECK: {after:?}");
        assert_eq!(
            Sandbox::http_get(&sb.outside, &via).as_deref(),
            Ok(PAGE),
            "the host port after the restart"
        );
        assert_eq!(
            Sandbox::http_get(&sb.host, &format!("http://{ip}:{CONTAINER_PORT}/")).as_deref(),
            Ok(PAGE),
            "the pod's address after the restart"
        );
        let hostname = node.exec(&web, &["/bin/busybox", "hostname"]);
        assert_eq!(hostname.trim(), pod, "ExecSync after the restart");
        assert_eq!(sb.qdiscs(), qdiscs, "shaping unchanged by the restart");
        assert_eq!(sb.firewall_text(), fw, "the firewall unchanged by the restart");
        assert_eq!(reservations(&sb), reserved);

        let mark = node.calls().len();
        node.stop(&id);
        node.remove(&id);
        let calls = node.calls();
        let dels = calls_for(&calls, mark, &id, "DEL");
        assert_eq!(dels.len(), 2 * 4, "two DELs of each network after the restart: {dels:?}");
        assert_sandbox_gone(&sb, &before, &id, &ip, 0, "Stop + Remove after the restart");
        print_verbs(&rt, &node.calls());
        drop(node);
    }
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}

/// Point the sandbox's plugin dir at upstream's v1.10.0 plugins (scripts/install-peers.sh
/// plugins), for the runs that compare a caller's view of ours with upstream's.
fn use_upstream_v1_10(sb: &Sandbox) {
    let dir = cri::peer_dir("plugins");
    for p in cni_tests::clients::PLUGINS {
        let dst = sb.dir.join("bin").join(p);
        let _ = std::fs::remove_file(&dst);
        std::os::unix::fs::symlink(dir.join(p), &dst).unwrap();
    }
}

/// A program of cri-tools (crictl, critest) against the node's CRI socket, in the sandbox.
fn cri_tool(node: &Node, tool: &str, secs: u64) -> std::process::Command {
    let bin = cri::peer_dir("cri-tools").join(tool);
    let sock = format!("unix://{}", node.ctrd.socket.display());
    let mut c = node.sb.command(secs, bin.to_str().unwrap());
    c.args(["--runtime-endpoint", &sock, "--image-endpoint", &sock]);
    c
}

fn crictl(node: &Node, args: &[&str]) -> String {
    let out =
        cri_tool(node, "crictl", 120).args(["--timeout", "60s"]).args(args).output().expect("run crictl");
    assert!(
        out.status.success(),
        "crictl {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.log().lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A dual-stack 1.1.0 list: the page's bridge + portmap with an IPv4 and an IPv6 range.
fn dual_stack_list() -> String {
    serde_json::to_string_pretty(&json!({
        "name": NET,
        "cniVersion": "1.1.0",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": true, "hairpinMode": true,
             "ipam": {"type": "host-local",
                      "ranges": [[{"subnet": "10.244.3.0/24"}], [{"subnet": "fd00:244:3::/64"}]],
                      "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    }))
    .unwrap()
}

/// crictl (cri-tools v1.37.0) against containerd 2.4.2: a dual-stack pod with a port mapping
/// bound to the host's address (hostIP) and one on every address, created, inspected, used
/// and removed with crictl's own commands; both families reach the pod through its ports, the
/// hostIP-bound port only on that address; stopp + rmp leave nothing.
#[test]
fn crictl_dual_stack_pod_with_host_ip_port_mappings() {
    let rt = Runtime::v2();
    let pod = cni_tests::unique("ctl");
    let uid = format!("{pod}-0000-4000-8000-000000000051");
    let tokens = [pod.as_str(), uid.as_str()];
    let machine = HostSnapshot::take(&tokens);
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let before: BTreeSet<String> = sb.host_links().into_iter().collect();
        let node = Node::start_with(&sb, rt.clone(), "10-dual.conflist", &dual_stack_list());
        let logs = sb.dir.join("pods").join(&uid);
        std::fs::create_dir_all(&logs).unwrap();
        let pod_json = sb.dir.join("pod.json");
        std::fs::write(
            &pod_json,
            json!({
                "metadata": {"name": pod, "uid": uid, "namespace": "default", "attempt": 0},
                "hostname": pod,
                "log_directory": logs,
                "port_mappings": [
                    {"protocol": 0, "container_port": CONTAINER_PORT, "host_port": HOST_PORT, "host_ip": HOST_ADDR},
                    {"protocol": 0, "container_port": CONTAINER_PORT, "host_port": HOST_PORT + 1}
                ],
                "linux": {"cgroup_parent": format!("{}/pod{uid}", sb.cgroup_parent)}
            })
            .to_string(),
        )
        .unwrap();
        let ctr_json = sb.dir.join("ctr.json");
        std::fs::write(
            &ctr_json,
            json!({
                "metadata": {"name": "web"},
                "image": {"image": IMAGE},
                "command": ["/bin/httpd", "-f", "-p", CONTAINER_PORT.to_string(), "-h", "/www"],
                "log_path": "web.log"
            })
            .to_string(),
        )
        .unwrap();
        let id = crictl(&node, &["runp", pod_json.to_str().unwrap()]);
        let ctr = crictl(&node, &["create", &id, ctr_json.to_str().unwrap(), pod_json.to_str().unwrap()]);
        crictl(&node, &["start", &ctr]);
        let inspect: Value =
            serde_json::from_str(&crictl(&node, &["inspectp", "-o", "json", &id])).expect("JSON");
        let ip4 = inspect["status"]["network"]["ip"].as_str().expect("an IP").to_string();
        let extra = inspect["status"]["network"]["additionalIps"].as_array().cloned().unwrap_or_default();
        let ip6 = extra
            .iter()
            .find_map(|a| a["ip"].as_str().filter(|s| s.contains(':')))
            .unwrap_or_else(|| panic!("no IPv6 in the pod's status: {inspect}"))
            .to_string();
        assert!(ip4.starts_with(POD_SUBNET_PREFIX), "{ip4}");
        assert!(ip6.starts_with("fd00:244:3:"), "{ip6}");
        let res = cached(&sb, &id);
        let ips: Vec<&str> =
            res["result"]["ips"].as_array().unwrap().iter().filter_map(|i| i["address"].as_str()).collect();
        assert!(ips.iter().any(|a| a.starts_with(&format!("{ip4}/"))), "{ips:?}");
        assert!(ips.iter().any(|a| a.starts_with(&format!("{ip6}/"))), "{ips:?}");
        let addrs = crictl(&node, &["exec", &ctr, "/bin/ip", "-o", "addr", "show", "eth0"]);
        assert!(addrs.contains(&ip4) && addrs.contains(&ip6), "{addrs}");
        let page = |url: String| {
            wait_for(&url, Duration::from_secs(20), || {
                Sandbox::http_get(&sb.outside, &url).ok().filter(|p| p == PAGE)
            })
        };
        page(format!("http://{HOST_ADDR}:{HOST_PORT}/"));
        page(format!("http://{HOST_ADDR}:{}/", HOST_PORT + 1));
        page(format!("http://[{}]:{}/", cni_tests::clients::HOST_ADDR6, HOST_PORT + 1));
        for url in [format!("http://[{ip6}]:{CONTAINER_PORT}/"), format!("http://{ip4}:{CONTAINER_PORT}/")] {
            assert_eq!(
                Sandbox::http_get(&sb.host, &url).as_deref(),
                Ok(PAGE),
                "the pod's own address from the host"
            );
        }
        assert!(
            Sandbox::http_get(&sb.host, &format!("http://127.0.0.1:{HOST_PORT}/")).is_err(),
            "the port bound to hostIP {HOST_ADDR} must not answer on 127.0.0.1"
        );
        assert!(
            Sandbox::http_get(
                &sb.outside,
                &format!("http://[{}]:{HOST_PORT}/", cni_tests::clients::HOST_ADDR6)
            )
            .is_err(),
            "the port bound to hostIP {HOST_ADDR} must not answer on the host's IPv6 address"
        );
        let calls = node.calls();
        let adds = calls_for(&calls, 0, &id, "ADD");
        let pm = adds.iter().find(|c| c.plugin == "portmap").expect("portmap ADD");
        assert_eq!(
            pm.stdin["runtimeConfig"]["portMappings"],
            json!([
                {"HostPort": HOST_PORT, "ContainerPort": CONTAINER_PORT, "Protocol": "tcp", "HostIP": HOST_ADDR},
                {"HostPort": HOST_PORT + 1, "ContainerPort": CONTAINER_PORT, "Protocol": "tcp", "HostIP": ""}
            ]),
            "what crictl's pod config becomes"
        );
        crictl(&node, &["stop", &ctr]);
        crictl(&node, &["rm", &ctr]);
        crictl(&node, &["stopp", &id]);
        crictl(&node, &["rmp", &id]);
        assert_eq!(crictl(&node, &["pods", "-q"]), "", "no pods left");
        assert_sandbox_gone(&sb, &before, &id, &ip4, 0, "crictl stopp + rmp");
        assert!(!sb.firewall_text().contains(&ip6), "the firewall still names {ip6}");
        let failed: Vec<String> =
            node.calls().iter().filter(|c| c.rc != Some(0)).map(|c| c.summary()).collect();
        assert!(failed.is_empty(), "calls failed: {failed:?}");
        print_verbs(&rt, &node.calls());
        drop(node);
    }
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}

/// The images critest's Networking specs name, built here from busybox-static (no registry is
/// reachable): what each stands in for is in docs/real-clients.md.
const CRITEST_BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.29-2";
const CRITEST_NGINX: &str = "registry.k8s.io/e2e-test-images/nginx:1.14-2";

/// critest's Networking group (DNS config, hostname, port mapping with only a container port,
/// with a host port) against containerd 2.4.2 on `plugins`; returns the specs that passed.
fn critest_networking(upstream: bool) -> BTreeSet<String> {
    let rt = Runtime::v2();
    let sb = Sandbox::new(PluginSet::from_env());
    if upstream {
        use_upstream_v1_10(&sb);
    }
    let before: BTreeSet<String> = sb.host_links().into_iter().collect();
    // A node as Kubernetes runs it: kube-proxy's chains (tests/src/kubeproxy.rs, one service).
    // The page's hostport list names its KUBE-MARK-MASQ as externalSetMarkChain: upstream's
    // portmap fails ADD without that chain and relies on KUBE-POSTROUTING to masquerade the
    // marked 127.0.0.1 host-port traffic (ours masquerades on its own, without marks).
    cni_tests::kubeproxy::load(&sb.host, 1);
    let mut node = Node::start_on(&sb, rt.clone(), "k8s-hostport.conflist");
    // critest's commands: top (the busybox image's default container), hostname, cat
    let rootfs = sb.dir.join("rootfs");
    for a in ["top", "hostname"] {
        let _ = std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(a));
    }
    for (tag, cmd) in [
        (CRITEST_BUSYBOX, vec!["/bin/sh"]),
        (CRITEST_NGINX, vec!["/bin/httpd", "-f", "-p", "80", "-h", "/www"]),
    ] {
        let archive = sb.dir.join(format!("{}.tar", tag.rsplit('/').next().unwrap()));
        cri::build_image_archive(&rootfs, &archive, tag, &cmd);
        node.ctrd.must(&["-n", "k8s.io", "images", "import", archive.to_str().unwrap()]);
    }
    let report = sb.dir.join("critest.json");
    let out = cri_tool(&node, "critest", 900)
        .args(["--ginkgo.focus", "Networking", "--ginkgo.no-color", "--ginkgo.timeout", "10m"])
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .output()
        .expect("run critest");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default())
        .unwrap_or_else(|e| panic!("no critest JSON report ({e}):\n{text}"));
    let mut passed = BTreeSet::new();
    let mut other = Vec::new();
    for spec in
        v.as_array().into_iter().flatten().flat_map(|s| s["SpecReports"].as_array().into_iter().flatten())
    {
        let name = spec["LeafNodeText"].as_str().unwrap_or("").to_string();
        if spec["LeafNodeType"] != "It" {
            continue;
        }
        match spec["State"].as_str() {
            Some("passed") => {
                passed.insert(name);
            }
            Some("skipped") | Some("pending") => {}
            s => other.push(format!("{name}: {s:?} {}", spec["Failure"]["Message"])),
        }
    }
    let which = if upstream { "upstream v1.10.0" } else { "ours" };
    eprintln!("critest Networking on {which}: passed {passed:?}");
    assert!(other.is_empty() && out.status.success(), "critest on {which}: {other:?}\n{text}");
    assert!(passed.len() >= 4, "critest ran too few Networking specs on {which}: {passed:?}\n{text}");
    assert!(node.cri.list_pod_sandbox().expect("ListPodSandbox").is_empty(), "critest left pods");
    // its pods (no cgroup parent) had their cgroups at the root the node shows: below the node's
    assert!(
        !node_k8s_io_cgroups(&sb).is_empty(),
        "critest's pods left no k8s.io below node {}'s cgroups",
        sb.name
    );
    let ls = sb.host_links().into_iter().filter(|l| !before.contains(l) && l != BRIDGE).collect::<Vec<_>>();
    assert!(ls.is_empty(), "critest on {which} left links: {ls:?}");
    assert_eq!(reservations(&sb), Vec::<String>::new(), "critest on {which} left reservations");
    print_verbs(&rt, &node.calls());
    passed
}

/// The `k8s.io` cgroups containerd makes as the parent of pods whose caller gives no cgroup
/// parent (critest with the cgroupfs driver, the kubelet without QoS cgroups): at the root of
/// the node's cgroup namespace, i.e. below the node's cgroups (removed with the node), one per
/// hierarchy.
fn node_k8s_io_cgroups(sb: &Sandbox) -> Vec<PathBuf> {
    sb.cgroup_dirs().into_iter().map(|d| d.join("k8s.io")).filter(|d| d.is_dir()).collect()
}

/// critest's Networking conformance specs pass on our plugins exactly as on upstream's v1.10.0.
#[test]
fn critest_networking_passes_as_on_upstream() {
    let tokens = ["create-PodSandbox-with"];
    let machine = HostSnapshot::take(&tokens);
    let ours = critest_networking(false);
    let upstream = critest_networking(true);
    assert_eq!(ours, upstream, "critest's Networking specs: ours vs upstream v1.10.0");
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}

/// The kubelet's view of the node's runtime, from its log at -v=4: the last "Container runtime
/// status" line (it lists RuntimeReady and NetworkReady).
fn kubelet_runtime_status(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().rev().find(|l| l.contains("Container runtime status")).map(str::to_string)
}

/// A real kubelet (k8s.io/kubernetes v1.37.2, standalone: no API server) runs a static pod
/// through containerd 2.4.2's CRI and the page's hostPort + bandwidth conflist at 1.1.0: the
/// pod is reached through its host port and shaped at 1 Mbit/s both ways by the annotations,
/// the kubelet reports the network ready, and removing the manifest leaves nothing.
///
/// Isolation: the kubelet runs in the sandbox's node (network, mount and UTS namespaces and a
/// cgroup subtree of its own, checked); its root, pod logs, /var/log/containers and the kernel
/// settings it writes (`/proc/sys/vm/overcommit_memory`, `kernel/panic`, `kernel/panic_on_oops`,
/// `vm/panic_on_oom`, `kernel/keys/root_max*`) are scratch files bind-mounted in that node's
/// mount namespace only; its cgroups per QoS class and node allocatable enforcement are off.
#[test]
fn kubelet_static_pod_with_host_port_and_bandwidth_annotations() {
    let rt = Runtime::v2();
    let kubelet = cri::peer_dir("kubelet").join("kubelet");
    let pod = cni_tests::unique("kub");
    let tokens = [pod.as_str()];
    let machine = HostSnapshot::take(&tokens);
    let sysctls = ["vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops"];
    let kubelet_dir_before = Path::new("/var/lib/kubelet").exists();
    let sysctls_before: Vec<String> =
        sysctls.iter().map(|k| std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap()).collect();
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let before: BTreeSet<String> = sb.host_links().into_iter().collect();
        let mut node = Node::start_on(&sb, rt.clone(), "k8s-hostport-bandwidth.conflist");
        let k = sb.dir.join("kubelet");
        let manifests = k.join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        // /var/lib/kubelet (device-plugins/, pki/ are fixed paths, whatever --root-dir says) and
        // /var/log are the node's scratch directories (cni_tests::node::SCRATCH_PATHS)
        for s in [
            "vm/overcommit_memory",
            "vm/panic_on_oom",
            "kernel/panic",
            "kernel/panic_on_oops",
            "kernel/keys/root_maxkeys",
            "kernel/keys/root_maxbytes",
        ] {
            let f = k.join(format!("sysctl-{}", s.replace('/', "-")));
            std::fs::write(&f, std::fs::read_to_string(format!("/proc/sys/{s}")).unwrap()).unwrap();
            sb.must("mount", &["--bind", f.to_str().unwrap(), &format!("/proc/sys/{s}")]);
        }
        let config = k.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {manifests}
fileCheckFrequency: 2s
syncFrequency: 5s
containerRuntimeEndpoint: unix://{sock}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
protectKernelDefaults: false
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
podLogsDir: {logs}
resolvConf: \"\"
localStorageCapacityIsolation: false
",
                manifests = manifests.display(),
                sock = node.ctrd.socket.display(),
                logs = k.join("podlogs").display(),
            ),
        )
        .unwrap();
        let log = k.join("kubelet.log");
        let logf = std::fs::File::create(&log).unwrap();
        let mut child = sb
            .command(3600, kubelet.to_str().unwrap())
            .arg(format!("--config={}", config.display()))
            .arg(format!("--root-dir={}", k.join("root").display()))
            .arg(format!("--cert-dir={}", k.join("pki").display()))
            .arg(format!("--hostname-override={pod}"))
            .arg("--v=4")
            .stdin(std::process::Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("spawn kubelet");
        // The child is `timeout`, which runs the kubelet: SIGTERM, which `timeout` passes on
        // to it (and follows with SIGKILL 5 s later: `-k 5`). A SIGKILL to `timeout` itself
        // would orphan the kubelet, which then holds the sandbox's mount namespace (and
        // whatever namespace mounts propagated into it) until its own hour is up.
        struct Kill<'c>(&'c mut std::process::Child);
        impl Drop for Kill<'_> {
            fn drop(&mut self) {
                // SAFETY: kill(2) on the `timeout` this test spawned and has not reaped.
                unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
                let _ = self.0.wait();
            }
        }
        let guard = Kill(&mut child);
        let klog = || std::fs::read_to_string(&log).unwrap_or_default();
        let mut last = None;
        let ready = cni_tests::clients::poll(Duration::from_secs(120), || {
            last = kubelet_runtime_status(&log);
            last.as_deref().filter(|l| l.contains("NetworkReady=true")).map(str::to_string)
        });
        assert!(ready.is_some(), "the kubelet never saw NetworkReady=true: {last:?}\n{}", klog());
        // the kubelet and the runtime run in the node: its namespaces, its cgroups
        sb.assert_confined("kubelet");
        sb.assert_confined("containerd");

        // the static pod: hostPort, the page's annotations at 1M both ways, busybox httpd
        let manifest = manifests.join("web.yaml");
        std::fs::write(
            &manifest,
            format!(
                "apiVersion: v1
kind: Pod
metadata:
  name: {pod}
  namespace: default
  annotations:
    kubernetes.io/ingress-bandwidth: 1M
    kubernetes.io/egress-bandwidth: 1M
spec:
  containers:
  - name: web
    image: {IMAGE}
    imagePullPolicy: Never
    command: [\"/bin/httpd\", \"-f\", \"-p\", \"{CONTAINER_PORT}\", \"-h\", \"/www\"]
    ports:
    - containerPort: {CONTAINER_PORT}
      hostPort: {HOST_PORT}
"
            ),
        )
        .unwrap();
        let via = format!("http://{HOST_ADDR}:{HOST_PORT}/");
        let up = cni_tests::clients::poll(Duration::from_secs(180), || {
            Sandbox::http_get(&sb.outside, &via).ok().filter(|p| p == PAGE)
        });
        assert!(up.is_some(), "the static pod never answered on its host port\n{}", klog());
        let pods = node.cri.list_pod_sandbox().expect("ListPodSandbox");
        assert_eq!(pods.len(), 1, "{pods:?}");
        let id = pods[0].id.clone();
        // the pod's cgroups are the node's too (its cgroup namespace): /k8s.io/<id> below them
        let pod_cgroups: Vec<PathBuf> =
            node_k8s_io_cgroups(&sb).into_iter().filter(|d| d.join(&id).is_dir()).collect();
        assert!(!pod_cgroups.is_empty(), "no cgroup of pod {id} below node {}'s cgroups", sb.name);
        let res = cached(&sb, &id);
        let ip = cached_ip(&res);
        let calls = node.calls();
        let adds = calls_for(&calls, 0, &id, "ADD");
        assert_chain_calls(&adds, &id, "ADD", &["bridge", "portmap", "bandwidth"], "1.1.0", "kubelet");
        let bw = adds.iter().find(|c| c.plugin == "bandwidth").unwrap();
        assert_eq!(
            bw.stdin["runtimeConfig"]["bandwidth"],
            json!({"IngressRate": 1_000_000, "IngressBurst": CRI_BURST, "EgressRate": 1_000_000, "EgressBurst": CRI_BURST}),
            "what the kubelet's annotations become"
        );
        let veth = cached_host_veth(&res, BRIDGE);
        let ifbs: Vec<String> = sb.host_links().into_iter().filter(|l| l.starts_with("bwp")).collect();
        assert_eq!(ifbs.len(), 1, "{ifbs:?}");
        let (in_rate, in_burst) = tbf(&sb, &veth);
        let (out_rate, out_burst) = tbf(&sb, &ifbs[0]);
        assert_eq!((in_rate * 8, out_rate * 8), (1_000_000, 1_000_000), "{}", sb.qdiscs());
        let into_pod = shaped_rate_into(&sb, HOST_PORT, in_burst, 1_000_000);
        let out_of_pod = shaped_rate_out_of(&sb, HOST_PORT, out_burst, 1_000_000);
        eprintln!("kubelet pod at 1M both ways: measured {into_pod:.0} bit/s into it, {out_of_pod:.0} bit/s out of it");
        for (what, r) in [("into the pod", into_pod), ("out of the pod", out_of_pod)] {
            assert!(r < 1.5e6, "{what}: {r:.0} bit/s with a limit of 1 Mbit/s: not shaped");
        }
        let st = kubelet_runtime_status(&log).unwrap_or_default();
        assert!(st.contains("RuntimeReady=true") && st.contains("NetworkReady=true"), "{st}");

        // the manifest removed: the kubelet stops the pod; nothing of ours is left
        std::fs::remove_file(&manifest).unwrap();
        let gone = cni_tests::clients::poll(Duration::from_secs(180), || {
            let c = node.calls();
            (calls_for(&c, 0, &id, "DEL").len() >= 4).then_some(())
        });
        assert!(
            gone.is_some(),
            "the kubelet did not stop the pod after the manifest was removed\n{}",
            klog()
        );
        let links = cni_tests::clients::poll(Duration::from_secs(60), || {
            let l: BTreeSet<String> = sb.host_links().into_iter().collect();
            (l.len() == before.len() + 1).then_some(())
        });
        assert!(links.is_some(), "links left: {:?}", sb.host_links());
        assert!(Sandbox::http_get(&sb.outside, &via).is_err(), "the host port still answers");
        assert_eq!(reservations(&sb), Vec::<String>::new(), "reservations left");
        let fw = sb.firewall_text();
        assert!(!mentions_ip(&fw, &ip) && !fw.contains(&HOST_PORT.to_string()), "firewall left:\n{fw}");
        assert!(!sb.qdiscs().contains("tbf"), "{}", sb.qdiscs());
        let left: Vec<String> = sb.cache_entries().into_iter().filter(|e| e.contains(&id)).collect();
        assert!(left.is_empty(), "libcni cache entries left: {left:?}");
        let failed: Vec<String> =
            node.calls().iter().filter(|c| c.rc != Some(0)).map(|c| c.summary()).collect();
        assert!(failed.is_empty(), "calls failed: {failed:?}");
        print_verbs(&rt, &node.calls());
        drop(guard);
        // the kubelet's own sandboxes are the CRI's to remove now that it is gone
        for p in node.cri.list_pod_sandbox().expect("ListPodSandbox") {
            node.live.push(p.id);
        }
        drop(node);
    }
    let sysctls_after: Vec<String> =
        sysctls.iter().map(|k| std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap()).collect();
    assert_eq!(sysctls_after, sysctls_before, "the kubelet changed the machine's kernel settings");
    assert_eq!(
        Path::new("/var/lib/kubelet").exists(),
        kubelet_dir_before,
        "the kubelet made or removed the machine's /var/lib/kubelet"
    );
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}
