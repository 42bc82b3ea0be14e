//! The firewall plugin on a host running firewalld: firewalld 1.3 (Debian's, installed by
//! scripts/install-deps.sh) runs in the fake host's network namespace on a private system bus
//! (a dbus-daemon of the test's own, `DBUS_SYSTEM_BUS_ADDRESS` pointing at it), so it changes
//! nothing outside. Without the plugin firewalld rejects the pods' forwarded traffic and the
//! diagnosis names its chain; with it (default backend: firewalld, as upstream), the pods'
//! addresses are sources of the trusted zone and traffic flows; DEL removes them; upstream's
//! firewall (v1.10) and ours read each other's sources. One test in this binary: the bus
//! address is the process's environment, which every plugin exec inherits.

use cni_tests::{wait_until, Exec, Netns, TempDir};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Firewalld {
    children: Vec<Child>,
    bus: String,
    _dir: TempDir,
}

impl Firewalld {
    fn start(host: &Netns) -> Firewalld {
        for tool in ["dbus-daemon", "firewalld", "firewall-cmd"] {
            assert!(
                cni_common::upstream::iptables::find_tool(tool).is_some(),
                "{tool} missing: scripts/install-deps.sh installs dbus and firewalld"
            );
        }
        let dir = TempDir::new("fwd");
        let sock = dir.join("bus");
        let conf = dir.join("bus.conf");
        std::fs::write(
            &conf,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>system</type><listen>unix:path={}</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="*"/><allow own="*"/><allow send_type="method_call"/>
<allow send_destination="*"/><allow receive_sender="*"/></policy></busconfig>"#,
                sock.display()
            ),
        )
        .unwrap();
        let bus = format!("unix:path={}", sock.display());
        let mut children = Vec::new();
        let quiet = |c: &mut Command| {
            c.stdout(Stdio::null()).stderr(Stdio::null());
        };
        let mut d = host.command("dbus-daemon");
        d.args(["--nofork", "--nopidfile", "--config-file"]).arg(&conf);
        quiet(&mut d);
        children.push(d.spawn().expect("start dbus-daemon"));
        wait_until("the private bus socket", Duration::from_secs(20), || sock.exists());
        let mut f = host.command("firewalld");
        f.args(["--nofork", "--nopid"]).env("DBUS_SYSTEM_BUS_ADDRESS", &bus);
        quiet(&mut f);
        children.push(f.spawn().expect("start firewalld"));
        let fw = Firewalld { children, bus, _dir: dir };
        wait_until("firewalld on the private bus", Duration::from_secs(60), || fw.cmd(host, &["--state"]).0);
        fw
    }

    fn cmd(&self, host: &Netns, args: &[&str]) -> (bool, String) {
        let out = host
            .command("firewall-cmd")
            .args(args)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus)
            .output()
            .expect("run firewall-cmd");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Firewalld {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn pings(from: &Netns, to: &str) -> bool {
    from.try_run("ping", &["-c", "1", "-W", "2", to]).status.success()
}

fn upstream_firewall() -> PathBuf {
    let out = Command::new(cni_tests::workspace_root().join("scripts/install-peers.sh"))
        .args(["--print-dir", "plugins"])
        .output()
        .expect("run scripts/install-peers.sh");
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("firewall");
    assert!(p.is_file(), "upstream firewall v1.10 missing at {}: run scripts/install-peers.sh", p.display());
    p
}

#[test]
fn pods_get_through_firewalld() {
    let host = Netns::new("fwdh");
    let outside = Netns::new("fwdo");
    host.run("ip", &["link", "set", "lo", "up"]);
    host.run("ip", &["link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", outside.name()]);
    host.run("ip", &["addr", "add", "192.0.2.1/24", "dev", "up0"]);
    host.run("ip", &["link", "set", "up0", "up"]);
    outside.run("ip", &["addr", "add", "192.0.2.2/24", "dev", "eth0"]);
    outside.run("ip", &["link", "set", "eth0", "up"]);
    let fw = Firewalld::start(&host);
    // the uplink in a zone of its own, as on a server: forwarding from unzoned pods is rejected
    assert!(fw.cmd(&host, &["--zone=external", "--change-interface=up0"]).0);
    // the only test of this binary, before any plugin runs: every exec inherits the bus address
    std::env::set_var("DBUS_SYSTEM_BUS_ADDRESS", &fw.bus);

    let path = cni_tests::cni_path_with(&["bridge", "host-local", "firewall"]);
    let data = TempDir::new("fwdd");
    let net = format!("fwd-{}", std::process::id());
    let chain = |with: bool| {
        let mut plugins =
            vec![json!({"type": "bridge", "bridge": "fwdbr0", "isGateway": true, "ipMasq": true,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.78.0.0/24"}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": data.str()}})];
        if with {
            plugins.push(json!({"type": "firewall"}));
        }
        cni_tests::chain::Chain {
            name: net.clone(),
            version: "1.0.0".into(),
            plugins,
            cni_path: path.path().to_path_buf(),
        }
    };
    let subnet: ipnet::IpNet = "10.78.0.0/24".parse().unwrap();

    let bare = chain(false);
    let p0 = Netns::new("fwdp");
    let (r0, _) = bare.add("ctr-bare", p0.path_str(), "eth0", &json!({}), Some(&host)).expect("ADD");
    assert!(!pings(&p0, "192.0.2.2"), "firewalld must reject the pod's traffic without the firewall plugin");
    let d = std::thread::scope(|s| {
        s.spawn(|| {
            host.enter_current_thread();
            cni_common::forward_drop::diagnose(subnet)
        })
        .join()
        .unwrap()
    });
    let msg = d.message(subnet, "add the firewall plugin").expect("firewalld's reject is found");
    assert!(msg.contains("inet firewalld"), "{msg}");
    bare.del("ctr-bare", p0.path_str(), "eth0", &json!({}), Some(&r0), Some(&host));

    let with = chain(true);
    let a = Netns::new("fwda");
    let (ra, _) = with.add("ctr-a", a.path_str(), "eth0", &json!({}), Some(&host)).expect("ADD");
    let addr = ra["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    let (_, sources) = fw.cmd(&host, &["--zone=trusted", "--list-sources"]);
    assert!(sources.contains(&format!("{addr}/32")), "{sources}");
    assert!(pings(&a, "192.0.2.2"), "the pod gets out through firewalld");
    for s in with.check("ctr-a", a.path_str(), "eth0", &json!({}), &ra, Some(&host)) {
        assert_eq!(s.out.code, 0, "CHECK {}: {}", s.plugin, s.out.stdout);
    }
    // upstream's CHECK finds our source
    let fw_conf = || -> Value {
        json!({"cniVersion": "1.0.0", "name": net, "type": "firewall", "backend": "firewalld", "prevResult": ra.clone()})
    };
    let up = upstream_firewall();
    Exec::new(up.to_str().unwrap())
        .in_ns(&host)
        .attachment("CHECK", "ctr-a", a.path_str(), "eth0", "/nonexistent")
        .env("DBUS_SYSTEM_BUS_ADDRESS", &fw.bus)
        .run_json(&fw_conf())
        .ok_silent();
    with.del("ctr-a", a.path_str(), "eth0", &json!({}), Some(&ra), Some(&host));
    let (_, after) = fw.cmd(&host, &["--zone=trusted", "--list-sources"]);
    assert!(!after.contains(&addr), "DEL removes the source: {after}");
    // upstream's ADD, our CHECK and DEL
    Exec::new(up.to_str().unwrap())
        .in_ns(&host)
        .attachment("ADD", "ctr-a", a.path_str(), "eth0", "/nonexistent")
        .env("DBUS_SYSTEM_BUS_ADDRESS", &fw.bus)
        .run_json(&fw_conf())
        .ok();
    let ours =
        Exec::new("firewall").in_ns(&host).attachment("CHECK", "ctr-a", a.path_str(), "eth0", "/nonexistent");
    ours.run_json(&fw_conf()).ok_silent();
    Exec::new("firewall")
        .in_ns(&host)
        .attachment("DEL", "ctr-a", a.path_str(), "eth0", "/nonexistent")
        .run_json(&fw_conf())
        .ok_silent();
    let (_, gone) = fw.cmd(&host, &["--zone=trusted", "--list-sources"]);
    assert!(!gone.contains(&addr), "{gone}");

    // same-bridge with firewalld: the sources, and upstream's isolation chains where its
    // `iptables` would put them (iptables-nft's tables here)
    let mut sb = fw_conf();
    sb["ingressPolicy"] = json!("same-bridge");
    let ours = |verb: &str| {
        Exec::new("firewall")
            .in_ns(&host)
            .attachment(verb, "ctr-a", a.path_str(), "eth0", "/nonexistent")
            .run_json(&sb)
    };
    ours("ADD").ok();
    let v4 = String::from_utf8_lossy(&host.run("iptables-nft", &["-S"]).stdout).into_owned();
    assert!(v4.contains("-A CNI-ISOLATION-STAGE-1 -i fwdbr0 ! -o fwdbr0"), "{v4}");
    assert!(!v4.contains("CNI-FORWARD"), "firewalld's sources, not CNI-FORWARD: {v4}");
    ours("CHECK").ok_silent();
    ours("DEL").ok_silent();
    let (_, none) = fw.cmd(&host, &["--zone=trusted", "--list-sources"]);
    assert!(!none.contains(&addr), "{none}");
}

/// Issue 37 with firewalld: Podman's default conflist (`bridge, portmap, firewall, tuning`)
/// with a host port, on a host where firewalld (its nftables backend, Debian's default) owns
/// the forward hook and the uplink is in the `external` zone. firewalld accepts forwarded
/// connections conntrack marks as DNATed itself (`ct status dnat accept` in `filter_FORWARD`,
/// before any zone; `--ctstate RELATED,ESTABLISHED,DNAT` in its iptables backend), so the
/// plugin adds nothing for them: the pod's addresses join `trusted` as before and the host
/// port answers the outside in both families. This test sets no process environment: every
/// exec gets the private bus address itself (the other test of this binary sets it for its
/// own execs), so nothing can reach the machine's own bus.
#[test]
fn a_host_port_passes_firewalld_without_a_rule_of_ours() {
    let host = Netns::new("dnatfh");
    let outside = Netns::new("dnatfo");
    host.run("ip", &["link", "set", "lo", "up"]);
    host.run("ip", &["link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", outside.name()]);
    host.run("ip", &["addr", "add", "192.0.2.1/24", "dev", "up0"]);
    host.run("ip", &["addr", "add", "2001:db8:1::1/64", "dev", "up0", "nodad"]);
    host.run("ip", &["link", "set", "up0", "up"]);
    outside.run("ip", &["link", "set", "lo", "up"]);
    outside.run("ip", &["addr", "add", "192.0.2.2/24", "dev", "eth0"]);
    outside.run("ip", &["addr", "add", "2001:db8:1::2/64", "dev", "eth0", "nodad"]);
    outside.run("ip", &["link", "set", "eth0", "up"]);
    host.run("sysctl", &["-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"]);
    let fw = Firewalld::start(&host);
    assert!(fw.cmd(&host, &["--zone=external", "--change-interface=up0"]).0);

    let text =
        std::fs::read_to_string(cni_tests::workspace_root().join("conf-examples/87-podman-bridge.conflist"))
            .expect("conf-examples/87-podman-bridge.conflist");
    let list: Value = serde_json::from_str(&text).expect("Podman's conflist is JSON");
    let mut plugins = list["plugins"].as_array().expect("plugins").clone();
    let types: Vec<&str> = plugins.iter().map(|p| p["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["bridge", "portmap", "firewall", "tuning"], "Podman's default list");
    let data = TempDir::new("dnatfd");
    plugins[0]["bridge"] = json!("dnfbr0");
    plugins[0]["ipam"]["ranges"] = json!([[{"subnet": "10.89.3.0/24"}], [{"subnet": "2001:db8:89:3::/64"}]]);
    plugins[0]["ipam"]["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
    plugins[0]["ipam"]["dataDir"] = json!(data.str());
    let path = cni_tests::cni_path_with(&["bridge", "host-local", "portmap", "firewall", "tuning"]);
    let chain = cni_tests::chain::Chain {
        name: format!("dnatfw-{}", std::process::id()),
        version: list["cniVersion"].as_str().unwrap().into(),
        plugins,
        cni_path: path.path().to_path_buf(),
    };
    let caps = json!({"portMappings": [{"hostPort": 18081, "containerPort": 8081, "protocol": "tcp"}]});
    let pod = Netns::new("dnatfp");
    // one plugin exec of the list, with the private bus
    let exec = |i: usize, verb: &str, prev: Option<&Value>| {
        let plugin = chain.cni_path.join(chain.plugin_type(i));
        Exec::new(plugin.to_str().unwrap())
            .in_ns(&host)
            .attachment(verb, "dnat-fw", pod.path_str(), "eth0", chain.cni_path.to_str().unwrap())
            .env("DBUS_SYSTEM_BUS_ADDRESS", &fw.bus)
            .run(&chain.request(i, &caps, prev))
    };
    let mut result: Option<Value> = None;
    for i in 0..chain.plugins.len() {
        result = Some(exec(i, "ADD", result.as_ref()).ok());
    }
    let result = result.unwrap();
    let addrs: Vec<String> =
        cni_tests::result_ips(&result).iter().map(|a| a.split('/').next().unwrap().to_string()).collect();
    assert_eq!(addrs.len(), 2, "{result}");
    let (_, sources) = fw.cmd(&host, &["--zone=trusted", "--list-sources"]);
    for a in &addrs {
        assert!(sources.contains(a.as_str()), "{a} a trusted source: {sources}");
    }
    let _srv = cni_tests::traffic::Server::tcp(&pod, 8081, "dnfpod");
    assert_eq!(cni_tests::traffic::fetch(&outside, "192.0.2.1", 18081), "dnfpod 192.0.2.2");
    assert_eq!(cni_tests::traffic::fetch(&outside, "2001:db8:1::1", 18081), "dnfpod 2001:db8:1::2");
    assert!(pings(&pod, "192.0.2.2"), "the pod reaches the outside");
    // firewalld's backend writes no iptables rule of ours: the DNAT accept is firewalld's own
    let v4 = String::from_utf8_lossy(&host.run("iptables-nft", &["-S"]).stdout).into_owned();
    assert!(!v4.contains("CNI-FORWARD"), "{v4}");
    let ruleset = String::from_utf8_lossy(&host.run("nft", &["list", "table", "inet", "firewalld"]).stdout)
        .into_owned();
    assert!(ruleset.contains("ct status dnat accept"), "firewalld's own DNAT accept: {ruleset}");
    for i in 0..chain.plugins.len() {
        let out = exec(i, "CHECK", Some(&result));
        assert_eq!(out.code, 0, "CHECK {}: {}", chain.plugin_type(i), out.stdout);
    }
    for i in (0..chain.plugins.len()).rev() {
        exec(i, "DEL", Some(&result)).ok_silent();
    }
    let (_, after) = fw.cmd(&host, &["--zone=trusted", "--list-sources"]);
    for a in &addrs {
        assert!(!after.contains(a.as_str()), "DEL removes {a}: {after}");
    }
}
