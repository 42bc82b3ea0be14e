//! The firewall plugin on a host running firewalld: firewalld 1.3 (Debian's, installed by
//! scripts/install-deps.sh) runs in the fake host's network namespace on a private system bus
//! (a dbus-daemon of the test's own, `DBUS_SYSTEM_BUS_ADDRESS` pointing at it), so it changes
//! nothing outside. Without the plugin firewalld rejects the pods' forwarded traffic and the
//! diagnosis names its chain; with it (default backend: firewalld, as upstream), the pods'
//! addresses are sources of the trusted zone and traffic flows; DEL removes them; upstream's
//! firewall (v1.10) and ours read each other's sources. The bus address is the process's
//! environment, which every plugin exec of that test inherits; the other tests set it on each
//! exec.
//!
//! Issue 37, finding 1: the same firewalld on a private bus with the system bus's own policy,
//! and a local user (uid 65534) sending signals to the plugin's connection while it waits
//! (`a_local_user_flooding_the_plugins_bus_connection_changes_nothing`); a bus that cannot be
//! asked fails the verb rather than switching backend.

use cni_tests::{wait_until, Exec, Netns, TempDir};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

struct Firewalld {
    children: Vec<Child>,
    bus: String,
    sock: PathBuf,
    _dir: TempDir,
}

/// The existing test's bus: everyone may do anything.
const OPEN_POLICY: &str = r#"<policy context="default"><allow user="*"/><allow own="*"/><allow send_type="method_call"/>
<allow send_destination="*"/><allow receive_sender="*"/></policy>"#;

/// The system bus's own policy: every `<policy>` of Debian's /usr/share/dbus-1/system.conf as
/// it stands (everyone may connect and send signals, no one owns names or calls methods but
/// the bus's), and firewalld's own file (root owns its name, everyone may call it), so the
/// private bus says yes and no exactly as a node's system bus does.
fn system_policy() -> String {
    let conf = std::fs::read_to_string("/usr/share/dbus-1/system.conf")
        .expect("/usr/share/dbus-1/system.conf (the dbus package; scripts/install-deps.sh)");
    let mut out = String::new();
    let mut rest = conf.as_str();
    while let Some(start) = rest.find("<policy ") {
        let end = rest[start..].find("</policy>").expect("a closed <policy>") + start + "</policy>".len();
        out.push_str(&rest[start..end]);
        out.push('\n');
        rest = &rest[end..];
    }
    assert!(out.contains(r#"<deny own="*"/>"#) && out.contains(r#"<allow send_type="signal"/>"#), "{out}");
    let fwd = "/usr/share/dbus-1/system.d/FirewallD.conf";
    assert!(std::path::Path::new(fwd).is_file(), "{fwd} missing: scripts/install-deps.sh installs firewalld");
    out + &format!("<include>{fwd}</include>")
}

impl Firewalld {
    fn start(host: &Netns) -> Firewalld {
        Firewalld::start_with(host, OPEN_POLICY)
    }

    /// firewalld on a private bus whose policy is `policy` (`<policy>` elements, `<include>`s).
    fn start_with(host: &Netns, policy: &str) -> Firewalld {
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
{policy}</busconfig>"#,
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
        let fw = Firewalld { children, bus, sock, _dir: dir };
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

// ---- issue 37, finding 1: a local user on the system bus ----------------------------------

/// A D-Bus message's byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Little,
    Big,
}

fn pad(b: &mut Vec<u8>, to: usize) {
    while !b.len().is_multiple_of(to) {
        b.push(0);
    }
}

/// A message in byte order `order`: `kind`, header fields (code, signature `o`/`s`/`u`, value)
/// and at most one string argument.
fn dbus_message(
    order: Order,
    kind: u8,
    serial: u32,
    fields: &[(u8, u8, &str)],
    arg: Option<&str>,
) -> Vec<u8> {
    let u = |v: u32| match order {
        Order::Little => v.to_le_bytes(),
        Order::Big => v.to_be_bytes(),
    };
    let mut body = Vec::new();
    if let Some(a) = arg {
        body.extend_from_slice(&u(a.len() as u32));
        body.extend_from_slice(a.as_bytes());
        body.push(0);
    }
    let mut f = Vec::new();
    for (code, sig, v) in fields {
        pad(&mut f, 8);
        f.extend_from_slice(&[*code, 1, *sig, 0]);
        if *sig == b'u' {
            f.extend_from_slice(&u(v.parse().unwrap()));
        } else {
            f.extend_from_slice(&u(v.len() as u32));
            f.extend_from_slice(v.as_bytes());
            f.push(0);
        }
    }
    if arg.is_some() {
        pad(&mut f, 8);
        f.extend_from_slice(&[8, 1, b'g', 0, 1, b's', 0]);
    }
    let mut m = vec![if order == Order::Little { b'l' } else { b'B' }, kind, 0, 1];
    m.extend_from_slice(&u(body.len() as u32));
    m.extend_from_slice(&u(serial));
    m.extend_from_slice(&u(f.len() as u32));
    m.extend_from_slice(&f);
    pad(&mut m, 8);
    m.extend_from_slice(&body);
    m
}

fn u32_in(order: Order, b: &[u8], at: usize) -> u32 {
    let four: [u8; 4] = b[at..at + 4].try_into().unwrap();
    match order {
        Order::Little => u32::from_le_bytes(four),
        Order::Big => u32::from_be_bytes(four),
    }
}

/// One whole message from `r`, by its own byte order.
fn read_message(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut m = vec![0u8; 16];
    r.read_exact(&mut m)?;
    let order = if m[0] == b'B' { Order::Big } else { Order::Little };
    let rest = (u32_in(order, &m, 12) as usize).next_multiple_of(8) + u32_in(order, &m, 4) as usize;
    m.resize(16 + rest, 0);
    r.read_exact(&mut m[16..])?;
    Ok(m)
}

/// What the tests need of a message read: type, REPLY_SERIAL, ERROR_NAME, first argument as a
/// string (when the body starts with one) and as a u32.
#[derive(Debug)]
struct Seen {
    kind: u8,
    reply_serial: Option<u32>,
    error: Option<String>,
    body_u32: Option<u32>,
    body_str: Option<String>,
}

fn seen(m: &[u8]) -> Seen {
    let order = if m[0] == b'B' { Order::Big } else { Order::Little };
    let flen = u32_in(order, m, 12) as usize;
    let fields = &m[16..16 + flen];
    let (mut reply_serial, mut error, mut sig) = (None, None, String::new());
    let mut at = 0;
    while at < fields.len() {
        at = at.next_multiple_of(8);
        if at >= fields.len() {
            break;
        }
        let code = fields[at];
        let t = fields[at + 2];
        at += 4;
        match t {
            b'u' => {
                if code == 5 {
                    reply_serial = Some(u32_in(order, fields, at));
                }
                at += 4;
            }
            b'g' => {
                let n = fields[at] as usize;
                sig = String::from_utf8_lossy(&fields[at + 1..at + 1 + n]).into_owned();
                at += n + 2;
            }
            _ => {
                let n = u32_in(order, fields, at) as usize;
                if code == 4 {
                    error = Some(String::from_utf8_lossy(&fields[at + 4..at + 4 + n]).into_owned());
                }
                at += n + 5;
            }
        }
    }
    let body = &m[(16 + flen).next_multiple_of(8)..];
    let body_u32 = (body.len() >= 4).then(|| u32_in(order, body, 0));
    let body_str = sig.starts_with('s').then(|| {
        let n = u32_in(order, body, 0) as usize;
        String::from_utf8_lossy(&body[4..4 + n]).into_owned()
    });
    Seen { kind: m[1], reply_serial, error, body_u32, body_str }
}

/// What the hostile user sends to each connection the plugin makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flood {
    /// One signal in big-endian order.
    BigEndian,
    /// 70 ordinary (little-endian) signals.
    Seventy,
}

/// A client of the bus running as uid 65534 (nobody): `socat` under `setpriv`, its stdio the
/// test's way to the connection it made, so the bus authenticates the connection as nobody's
/// (its peer credentials). Messages it receives are read on a thread and handed over.
struct Hostile {
    child: Child,
    to: std::process::ChildStdin,
    from: mpsc::Receiver<Vec<u8>>,
    serial: u32,
    name: String,
}

impl Hostile {
    fn connect(bus: &Path) -> Hostile {
        for tool in ["setpriv", "socat"] {
            assert!(
                cni_common::upstream::iptables::find_tool(tool).is_some(),
                "{tool} missing: scripts/install-deps.sh installs util-linux and socat"
            );
        }
        let mut child = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "socat", "STDIO"])
            .arg(format!("UNIX-CONNECT:{}", bus.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start socat as nobody");
        let mut to = child.stdin.take().unwrap();
        let mut out = child.stdout.take().unwrap();
        to.write_all(b"\0AUTH EXTERNAL 3635353334\r\n").unwrap(); // "65534"
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            out.read_exact(&mut b).expect("the bus's answer to nobody's AUTH");
            line.push(b[0]);
        }
        assert!(line.starts_with(b"OK "), "the bus refused nobody: {}", String::from_utf8_lossy(&line));
        to.write_all(b"BEGIN\r\n").unwrap();
        let (tx, from) = mpsc::channel();
        std::thread::spawn(move || {
            while let Ok(m) = read_message(&mut out) {
                if tx.send(m).is_err() {
                    break;
                }
            }
        });
        let mut h = Hostile { child, to, from, serial: 0, name: String::new() };
        let hello = h.call("Hello", None);
        h.name = hello.body_str.expect("a unique name");
        // the bus sees this connection as nobody's
        let uid = h.call("GetConnectionUnixUser", Some(&h.name.clone()));
        assert_eq!(uid.body_u32, Some(65534), "{uid:?}");
        h
    }

    /// A method of the bus itself; its return (an error fails the test).
    fn call(&mut self, member: &str, arg: Option<&str>) -> Seen {
        self.serial += 1;
        let serial = self.serial;
        let fields = [
            (1, b'o', "/org/freedesktop/DBus"),
            (2, b's', "org.freedesktop.DBus"),
            (3, b's', member),
            (6, b's', "org.freedesktop.DBus"),
        ];
        self.to.write_all(&dbus_message(Order::Little, 1, serial, &fields, arg)).unwrap();
        loop {
            let m =
                self.from.recv_timeout(Duration::from_secs(60)).expect("the bus answers nobody within 60 s");
            let s = seen(&m);
            if s.kind == 3 {
                panic!(
                    "the bus refused one of nobody's messages: {}: {s:?}",
                    s.error.as_deref().unwrap_or_default()
                );
            }
            if s.kind == 2 && s.reply_serial == Some(serial) {
                return s;
            }
        }
    }

    /// A METHOD_RETURN to `dest` naming serial `of` that `dest` never asked nobody for: the
    /// error the bus answers it with (a reply is delivered only to the caller it answers).
    fn forge_reply(&mut self, dest: &str, of: u32) -> String {
        self.serial += 1;
        let serial = self.serial;
        let of = of.to_string();
        let fields = [(6, b's', dest), (5, b'u', of.as_str())];
        self.to.write_all(&dbus_message(Order::Little, 2, serial, &fields, Some("forged"))).unwrap();
        loop {
            let m =
                self.from.recv_timeout(Duration::from_secs(60)).expect("the bus answers nobody within 60 s");
            let s = seen(&m);
            assert_ne!(s.kind, 2, "nobody got a return for a reply: {s:?}");
            if s.kind == 3 && s.reply_serial == Some(serial) {
                return s.error.unwrap_or_default();
            }
        }
    }

    /// Send `flood` to `dest`, then wait until the bus has dealt with all of it: the bus handles
    /// one connection's messages in order, so when the answer to a later call of ours comes
    /// back, every signal is in `dest`'s queue, and none was refused (a refusal would have come
    /// back first).
    fn flood(&mut self, dest: &str, flood: Flood) {
        let (order, n) = match flood {
            Flood::BigEndian => (Order::Big, 1),
            Flood::Seventy => (Order::Little, 70),
        };
        let mut all = Vec::new();
        for _ in 0..n {
            self.serial += 1;
            let fields = [
                (1, b'o', "/org/example/Hostile"),
                (2, b's', "org.example.Hostile"),
                (3, b's', "Poke"),
                (6, b's', dest),
            ];
            all.extend(dbus_message(order, 4, self.serial, &fields, Some("you are not firewalld's")));
        }
        self.to.write_all(&all).unwrap();
        self.call("GetId", None);
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The plugin's way to the bus: a pass-through of every byte, both ways, in order, whose only
/// act is to hold back the plugin's first call after `Hello` until the hostile user's flood to
/// the unique name the bus just gave it has been dealt with by the bus. So every call the
/// plugin makes meets the flood before its reply, every time (the bus answers GetNameOwner
/// itself, faster than any sender reacting to `NameOwnerChanged` could be sure to beat).
struct Gate {
    path: PathBuf,
    /// Connections the plugin made whose flood landed.
    flooded: Arc<AtomicUsize>,
    flood: Arc<Mutex<Flood>>,
}

impl Gate {
    fn start(dir: &TempDir, bus: PathBuf, hostile: Hostile) -> Gate {
        let path = dir.join("gate");
        let listener = UnixListener::bind(&path).expect("bind the gate");
        let flooded = Arc::new(AtomicUsize::new(0));
        let flood = Arc::new(Mutex::new(Flood::BigEndian));
        let hostile = Arc::new(Mutex::new(hostile));
        let (f2, fl2) = (flooded.clone(), flood.clone());
        std::thread::spawn(move || {
            for plugin in listener.incoming() {
                let Ok(plugin) = plugin else { break };
                let (bus, hostile, flooded, flood) = (bus.clone(), hostile.clone(), f2.clone(), fl2.clone());
                std::thread::spawn(move || Gate::relay(plugin, &bus, &hostile, &flooded, &flood));
            }
        });
        Gate { path, flooded, flood }
    }

    fn address(&self) -> String {
        format!("unix:path={}", self.path.display())
    }

    fn relay(
        mut plugin: UnixStream,
        bus: &Path,
        hostile: &Mutex<Hostile>,
        flooded: &AtomicUsize,
        flood: &Mutex<Flood>,
    ) {
        let mut up = UnixStream::connect(bus).expect("connect to the private bus");
        let (named_tx, named) = mpsc::channel();
        // bus -> plugin: the AUTH answer, the Hello reply (the unique name), then everything
        let (mut up_r, mut plugin_w) = (up.try_clone().unwrap(), plugin.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut line = Vec::new();
            let mut b = [0u8; 1];
            while !line.ends_with(b"\r\n") {
                if up_r.read_exact(&mut b).is_err() {
                    return;
                }
                line.push(b[0]);
            }
            if plugin_w.write_all(&line).is_err() {
                return;
            }
            let Ok(hello) = read_message(&mut up_r) else { return };
            let name = seen(&hello).body_str;
            if plugin_w.write_all(&hello).is_err() {
                return;
            }
            let _ = named_tx.send(name);
            let _ = std::io::copy(&mut up_r, &mut plugin_w);
            let _ = plugin_w.shutdown(std::net::Shutdown::Write);
        });
        // plugin -> bus: the AUTH lines up to BEGIN, the Hello call, then hold
        let mut seen_bytes = Vec::new();
        let mut buf = [0u8; 4096];
        let after_begin = loop {
            let n = match plugin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            seen_bytes.extend_from_slice(&buf[..n]);
            if let Some(at) = seen_bytes.windows(7).position(|w| w == b"BEGIN\r\n") {
                let end = at + 7;
                up.write_all(&buf[..n - (seen_bytes.len() - end)]).unwrap();
                break seen_bytes[end..].to_vec();
            }
            up.write_all(&buf[..n]).unwrap();
        };
        let mut rest = std::io::Cursor::new(after_begin).chain(plugin.try_clone().unwrap());
        let Ok(hello) = read_message(&mut rest) else { return };
        up.write_all(&hello).unwrap();
        let Ok(Some(name)) = named.recv_timeout(Duration::from_secs(60)) else { return };
        let kind = *flood.lock().unwrap();
        hostile.lock().unwrap().flood(&name, kind);
        flooded.fetch_add(1, Ordering::SeqCst);
        let _ = std::io::copy(&mut rest, &mut up);
        let _ = up.shutdown(std::net::Shutdown::Write);
    }
}

fn nft_ruleset(host: &Netns) -> String {
    String::from_utf8_lossy(&host.run("nft", &["list", "ruleset"]).stdout).into_owned()
}

/// Issue 37, finding 1. A local user (uid 65534) on a bus with the system bus's policy sends
/// signals to the unique name of each connection the plugin makes, while the plugin waits for
/// its reply: one big-endian signal, then (second round) 70 ordinary ones. Before the fix the
/// plugin read a big-endian message as little-endian (an error of the call) and gave up after
/// 64 messages that were not its reply: ADD and CHECK failed with code 11, STATUS said firewalld
/// did not own its name (code 50), and an ADD without `backend` wrote its rules into nf_tables
/// instead of firewalld's zone. Now every verb succeeds with firewalld, every time.
#[test]
fn a_local_user_flooding_the_plugins_bus_connection_changes_nothing() {
    let host = Netns::new("dbush");
    host.run("ip", &["link", "set", "lo", "up"]);
    let pod = cni_tests::PodNetns::new("dbusp");
    let fw = Firewalld::start_with(&host, &system_policy());
    let mut hostile = Hostile::connect(&fw.sock);
    // what the client trusts of the bus: a reply nobody forges is refused, never delivered
    let owner = hostile.call("GetNameOwner", Some("org.fedoraproject.FirewallD1")).body_str.unwrap();
    assert_eq!(hostile.forge_reply(&owner, 2), "org.freedesktop.DBus.Error.AccessDenied");
    let dir = TempDir::new("dbusg");
    let gate = Gate::start(&dir, fw.sock.clone(), hostile);
    let net = format!("dbus-{}", std::process::id());
    let conf = |backend: Option<&str>| {
        let mut c = json!({"cniVersion": "1.1.0", "name": net, "type": "firewall",
            "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "cni0"}],
                "ips": [{"address": "10.89.0.5/24"}]}});
        if let Some(b) = backend {
            c["backend"] = json!(b);
        }
        c
    };
    let verb = |v: &str, c: &Value| {
        Exec::new("firewall")
            .in_ns(&host)
            .attachment(v, "ctr-dbus", pod.path(), "eth0", "/nonexistent")
            .env("DBUS_SYSTEM_BUS_ADDRESS", &gate.address())
            .run_json(c)
    };
    let sources = || fw.cmd(&host, &["--zone=trusted", "--list-sources"]).1;
    for flood in [Flood::BigEndian, Flood::Seventy] {
        *gate.flood.lock().unwrap() = flood;
        let before = gate.flooded.load(Ordering::SeqCst);
        // `backend` set, then no `backend` key: firewalld, because it owns its name, whatever
        // nobody sends
        for backend in [Some("firewalld"), None] {
            let add = verb("ADD", &conf(backend));
            assert_eq!(add.code, 0, "{flood:?}: ADD {backend:?}: {}", add.stdout);
            let now = sources();
            assert!(
                now.contains("10.89.0.5/32"),
                "{flood:?}: ADD {backend:?} put no source in trusted: {now}"
            );
            let rules = nft_ruleset(&host);
            assert!(
                !rules.contains("CNI-FORWARD"),
                "{flood:?}: ADD {backend:?} wrote into nf_tables:\n{rules}"
            );
            for c in [conf(None), conf(Some("firewalld"))] {
                let check = verb("CHECK", &c);
                assert_eq!(check.code, 0, "{flood:?}: CHECK {c}: {}", check.stdout);
                let status = verb("STATUS", &c);
                assert_eq!(status.code, 0, "{flood:?}: STATUS {c}: {}", status.stdout);
            }
            verb("DEL", &conf(backend)).ok_silent();
            assert!(!sources().contains("10.89.0.5"), "{flood:?}: DEL removed the source: {}", sources());
        }
        // every connection the verbs made was flooded before its first call was let through:
        // with `backend` set ADD, CHECK, STATUS, DEL connect once each, without it they first
        // ask who owns firewalld's name on a connection of its own (CHECK and STATUS run twice)
        let made = gate.flooded.load(Ordering::SeqCst) - before;
        assert!(made >= (1 + 3 + 3 + 1) + (2 + 3 + 3 + 2), "{flood:?}: only {made} connections flooded");
    }
}

/// A bus that cannot be asked (here: one that accepts and hangs up) is a failure of the verb,
/// code 11, never "firewalld is not running": before the fix an ADD without `backend` then
/// wrote its rules into nf_tables and STATUS succeeded. A host without a bus socket at all
/// still gets the nftables backend.
#[test]
fn a_bus_that_cannot_be_asked_fails_the_verb_and_never_switches_backend() {
    let host = Netns::new("dbusb");
    let pod = cni_tests::PodNetns::new("dbusq");
    let dir = TempDir::new("dbusb");
    let broken = dir.join("hangs-up");
    let listener = UnixListener::bind(&broken).unwrap();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            drop(c);
        }
    });
    let c = json!({"cniVersion": "1.1.0", "name": format!("dbusb-{}", std::process::id()), "type": "firewall",
        "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "cni0"}],
            "ips": [{"address": "10.89.1.5/24"}]}});
    let verb = |v: &str, bus: &Path| {
        Exec::new("firewall")
            .in_ns(&host)
            .attachment(v, "ctr-dbusb", pod.path(), "eth0", "/nonexistent")
            .env("DBUS_SYSTEM_BUS_ADDRESS", &format!("unix:path={}", bus.display()))
            .run_json(&c)
    };
    for v in ["ADD", "CHECK", "STATUS"] {
        let msg = verb(v, &broken).err(11);
        assert!(msg.contains("who owns org.fedoraproject.FirewallD1"), "{v}: {msg}");
    }
    let rules = nft_ruleset(&host);
    assert!(!rules.contains("CNI-FORWARD"), "nothing written into nf_tables:\n{rules}");
    // no socket there at all: no system bus, so no firewalld: nftables, as before
    let none = dir.join("no-bus");
    verb("ADD", &none).ok();
    assert!(nft_ruleset(&host).contains("10.89.1.5"), "the nftables backend:\n{}", nft_ruleset(&host));
    verb("DEL", &none).ok_silent();
}
