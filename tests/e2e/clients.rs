//! Real clients: Podman 4 (CNI backend) and containerd 1.6 (`ctr run --cni`) drive our
//! bridge + host-local + portmap + bandwidth chain. Each test builds a [`Sandbox`] (scratch
//! host and outside netns, private mount namespace, scratch dirs), runs a busybox-static
//! container from a `--rootfs` (no image pull), talks to it over the network, removes it and
//! proves that nothing of the attachment is left — in the scratch host and on the machine.
//!
//! A runtime that cannot start fails the test. `CNI_CLIENTS_UPSTREAM=all` (or a list such as
//! `bridge`) swaps in Debian's Go plugins — only for working on the harness; see
//! docs/real-clients.md.

use cni_tests::clients::{
    cached_host_veth, cached_ip, poll, shaped_rate_into, shaped_rate_out_of, wait_for, Containerd,
    HostSnapshot, PluginSet, Podman, Sandbox, HOST_ADDR, HOST_ADDR6, OUTSIDE_ADDR,
};
use cni_tests::traffic::Server;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

const SUBNET: &str = "10.89.0.0/24";
const GATEWAY: &str = "10.89.0.1";
/// bits per second and bits, as the bandwidth plugin takes them: a different rate per
/// direction (into the container 4 Mbit/s, out of it 16 Mbit/s), so that limits applied the
/// wrong way round show in the traffic
const INGRESS_RATE: u64 = 4_000_000;
const EGRESS_RATE: u64 = 16_000_000;
const BURST: u64 = 800_000;

fn conflist(sb: &Sandbox, net: &str, bridge: &str) -> Value {
    conflist_on(sb, net, bridge, SUBNET, GATEWAY)
}

fn conflist_on(sb: &Sandbox, net: &str, bridge: &str, subnet: &str, gateway: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": net,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": sb.dir.join("data"),
                    "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
            {
                "type": "bandwidth",
                "ingressRate": INGRESS_RATE, "ingressBurst": BURST,
                "egressRate": EGRESS_RATE, "egressBurst": BURST
            }
        ]
    })
}

/// Whether `text` mentions the address `ip` (not as part of a longer address; an IPv4
/// address followed by `:port` counts).
fn mentions_ip(text: &str, ip: &str) -> bool {
    let v6 = ip.contains(':');
    text.match_indices(ip).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + ip.len()..].chars().next();
        let joins_before =
            |c: char| if v6 { c.is_ascii_hexdigit() || c == ':' } else { c.is_ascii_digit() || c == '.' };
        let joins_after = |c: char| if v6 { c.is_ascii_hexdigit() || c == ':' } else { c.is_ascii_digit() };
        !before.is_some_and(joins_before) && !after.is_some_and(joins_after)
    })
}

/// Everything an attachment adds to the scratch host, to compare against what is left.
struct HostView {
    links: BTreeSet<String>,
}

impl HostView {
    fn take(sb: &Sandbox) -> HostView {
        HostView { links: sb.host_links().into_iter().collect() }
    }
}

/// The attachment is gone: no veth/ifb, no qdisc, no firewall rule or element naming its
/// address, port or id, no IPAM reservation, no cache entry.
fn assert_attachment_gone(
    sb: &Sandbox,
    before: &HostView,
    bridge: &str,
    net: &str,
    ip: &str,
    tokens: &[&str],
    what: &str,
) {
    let mut expected = before.links.clone();
    expected.insert(bridge.to_string()); // the bridge stays, as with upstream
    let now: BTreeSet<String> = sb.host_links().into_iter().collect();
    assert_eq!(now, expected, "{what}: links left in the host netns");
    let q = sb.qdiscs();
    assert!(!q.contains("tbf") && !q.contains("ingress"), "{what}: qdiscs left: {q}");
    let fw = sb.firewall_text();
    assert!(!mentions_ip(&fw, ip), "{what}: firewall still mentions {ip}:\n{fw}");
    for t in tokens {
        assert!(!fw.contains(t), "{what}: firewall still mentions {t}:\n{fw}");
    }
    assert_eq!(sb.reservations(net), Vec::<String>::new(), "{what}: host-local reservation left");
    assert_eq!(sb.cache_entries(), Vec::<String>::new(), "{what}: libcni cache entry left");
}

#[test]
fn podman_publishes_a_port_over_our_chain_and_leaves_nothing() {
    let net = cni_tests::unique("cnirt");
    let name = cni_tests::unique("ctr");
    let tokens = [net.as_str(), name.as_str()];
    let machine = HostSnapshot::take(&tokens);
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let bridge = cni_tests::unique("cbr");
        sb.write_conflist(&format!("10-{net}.conflist"), &conflist(&sb, &net, &bridge));
        let podman = Podman::new(&sb);
        let nets = podman.must(&["network", "ls", "--format", "{{.Name}}"]);
        assert!(nets.lines().any(|l| l == net), "podman does not list our network {net}: {nets}");

        let before = HostView::take(&sb);
        let fw_before = sb.firewall_text();
        assert!(!fw_before.contains("18080"));
        let (id, ip, _) = podman_httpd(&podman, &sb, &name, &net, 18080, &[]);
        assert!(ip.starts_with("10.89.0."), "{ip}");
        // the container's monitor (it runs CNI DEL when the container exits) is the node's
        sb.assert_confined("conmon");

        // what podman and our plugins recorded
        let cached = sb.cached(&net, &id, "eth0").expect("libcni cached the ADD result");
        assert_eq!(cached_ip(&cached), ip);
        assert_eq!(sb.reservations(&net), vec![ip.clone()]);
        let owner = std::fs::read_to_string(sb.dir.join("data").join(&net).join(&ip)).unwrap();
        assert!(owner.starts_with(&id), "reservation names the container: {owner:?}");

        // inside the container
        let addr = podman.must(&["exec", &name, "/bin/ip", "-o", "-4", "addr", "show", "dev", "eth0"]);
        assert!(addr.contains(&format!("{ip}/24")), "{addr}");
        let routes = podman.must(&["exec", &name, "/bin/ip", "route"]);
        assert!(routes.contains(&format!("default via {GATEWAY}")), "{routes}");

        // on the host: veth on the bridge, bandwidth's tbf on it and on an ifb
        let veth = cached_host_veth(&cached, &bridge);
        let link = sb.host.link(&veth).unwrap_or_else(|| panic!("host veth {veth} missing"));
        assert_eq!(link["master"], bridge.as_str(), "{link}");
        let q = sb.qdiscs();
        assert!(q.lines().any(|l| l.contains("tbf") && l.contains(&format!("dev {veth} "))), "{q}");
        let ifb: Vec<String> = sb.host_links().into_iter().filter(|l| l.starts_with("bwp")).collect();
        assert_eq!(ifb.len(), 1, "one ifb for ingress shaping: {ifb:?}");
        assert!(q.lines().any(|l| l.contains("tbf") && l.contains(&format!("dev {} ", ifb[0]))), "{q}");
        let on = |dev: &str| {
            q.lines().find(|l| l.contains("tbf") && l.contains(&format!("dev {dev} "))).unwrap_or("")
        };
        assert!(on(&veth).contains("rate 4Mbit") && on(&ifb[0]).contains("rate 16Mbit"), "{q}");
        let fw = sb.firewall_text();
        assert!(fw.contains("18080") && mentions_ip(&fw, &ip), "port mapping in the firewall:\n{fw}");

        // reach the container
        let page = "hello from the container\n";
        let direct = format!("http://{ip}:8080/");
        wait_for("httpd in the container", Duration::from_secs(20), || {
            Sandbox::http_get(&sb.host, &direct).ok()
        });
        let via_port = format!("http://{HOST_ADDR}:18080/");
        assert_eq!(
            Sandbox::http_get(&sb.outside, &via_port).as_deref(),
            Ok(page),
            "from outside via the host port"
        );
        assert_eq!(
            Sandbox::http_get(&sb.host, &via_port).as_deref(),
            Ok(page),
            "from the host via its address"
        );
        assert_eq!(
            Sandbox::http_get(&sb.host, "http://127.0.0.1:18080/").as_deref(),
            Ok(page),
            "from the host via 127.0.0.1"
        );
        // hairpin: the container reaches itself through the host port
        let hairpin = podman.must(&[
            "exec",
            &name,
            "/bin/sh",
            "-c",
            &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {HOST_ADDR} 18080"),
        ]);
        assert!(hairpin.contains(page.trim()), "hairpin through the host port: {hairpin:?}");

        // Shaped traffic through the host port, a different limit per direction. Direction and
        // order of magnitude only (a loaded machine only makes a transfer slower): each direction
        // stays under 1.5x its own limit and the one limited 4x lower is clearly the slower.
        let into = shaped_rate_into(&sb, 18080, BURST / 8, INGRESS_RATE);
        let out_of = shaped_rate_out_of(&sb, 18080, BURST / 8, EGRESS_RATE);
        eprintln!("podman: measured {into:.0} bit/s into the container, {out_of:.0} bit/s out of it");
        for (what, r, limit) in [("into", into, INGRESS_RATE), ("out of", out_of, EGRESS_RATE)] {
            assert!(r < 1.5 * limit as f64, "{what} the container: {r:.0} bit/s, limit {limit}: not shaped");
        }
        assert!(
            into * 1.5 < out_of,
            "into {into:.0} bit/s is not clearly slower than out of {out_of:.0} bit/s"
        );

        // A restart is a full DEL + ADD of the same attachment. host-local hands out the next
        // free address (round robin, as upstream), so the old one must be released and the
        // port mapping must follow the new one.
        podman.must(&["restart", "-t", "0", &name]);
        wait_for("httpd after the restart", Duration::from_secs(20), || {
            Sandbox::http_get(&sb.outside, &via_port).ok()
        });
        let old_ip = ip;
        let ip = podman.inspect(&name)["NetworkSettings"]["Networks"][&net]["IPAddress"]
            .as_str()
            .expect("IP after the restart")
            .to_string();
        assert_eq!(sb.reservations(&net), vec![ip.clone()], "only the new address is reserved");
        assert_eq!(sb.cache_entries().len(), 1, "one cache entry after the restart");
        assert_eq!(
            sb.host_links().iter().filter(|l| l.starts_with("bwp")).count(),
            1,
            "one ifb after the restart"
        );
        let fw = sb.firewall_text();
        assert!(old_ip == ip || !mentions_ip(&fw, &old_ip), "rules for the old address {old_ip} left:\n{fw}");

        podman.must(&["rm", "-f", "-t", "0", &name]);
        assert_eq!(podman.must(&["ps", "-a", "-q"]).trim(), "", "podman still lists containers");
        let short = &id[..12];
        assert_attachment_gone(&sb, &before, &bridge, &net, &ip, &[&id, short, "18080"], "podman rm");
        assert_eq!(sb.must("ls", &["-A", "/run/netns"]).trim(), "", "podman's netns is gone");
        assert!(Sandbox::http_get(&sb.outside, &via_port).is_err(), "the host port is closed");
        drop(podman);
    }
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}

#[test]
fn containerd_ctr_run_cni_deletes_with_an_empty_netns() {
    let net = cni_tests::unique("cnirt");
    let id = cni_tests::unique("ctr");
    // ctr runs the CNI plugins with CNI_CONTAINERID = <namespace>-<id>
    let full_id = format!("default-{id}");
    let tokens = [net.as_str(), id.as_str()];
    let machine = HostSnapshot::take(&tokens);
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let bridge = cni_tests::unique("cbr");
        // ctr 1.6 reads the first conflist in /etc/cni/net.d and runs plugins from
        // /opt/cni/bin: in the sandbox those are our scratch dirs.
        sb.write_conflist(&format!("10-{net}.conflist"), &conflist(&sb, &net, &bridge));
        sb.outside.run("ip", &["route", "add", SUBNET, "via", HOST_ADDR]);
        let mut ctrd = Containerd::start(&sb);

        let before = HostView::take(&sb);
        let rootfs = sb.dir.join("rootfs");
        let log = std::fs::File::create(sb.dir.join("ctr-run.log")).unwrap();
        let cgroup = format!("{}/{id}", sb.cgroup_parent);
        let mut run = ctrd
            .ctr_command(
                110,
                &[
                    "run",
                    "--cni",
                    "--null-io",
                    "--cgroup",
                    &cgroup,
                    "--rootfs",
                    rootfs.to_str().unwrap(),
                    &id,
                    "/bin/httpd",
                    "-f",
                    "-p",
                    "8080",
                    "-h",
                    "/www",
                ],
            )
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn ctr run");
        let ctr_log = || std::fs::read_to_string(sb.dir.join("ctr-run.log")).unwrap_or_default();
        let cached = wait_for("ctr run to set up the network", Duration::from_secs(60), || {
            if let Some(st) = run.try_wait().unwrap() {
                panic!("ctr run exited early ({st}): {}", ctr_log());
            }
            sb.cached(&net, &full_id, "eth0")
        });
        let ip = cached_ip(&cached);
        assert!(ip.starts_with("10.89.0."), "{ip}");
        assert_eq!(sb.reservations(&net), vec![ip.clone()]);
        let veth = cached_host_veth(&cached, &bridge);
        assert_eq!(sb.host.link(&veth).expect("host veth")["master"], bridge.as_str());
        assert_eq!(sb.host_links().iter().filter(|l| l.starts_with("bwp")).count(), 1, "ifb for ingress");

        // inside the container
        wait_for("the task to run", Duration::from_secs(30), || {
            ctrd.must(&["task", "ls"])
                .lines()
                .any(|l| l.starts_with(&id) && l.contains("RUNNING"))
                .then_some(())
        });
        let addr = ctrd.must(&[
            "task",
            "exec",
            "--exec-id",
            "chk",
            &id,
            "/bin/ip",
            "-o",
            "-4",
            "addr",
            "show",
            "dev",
            "eth0",
        ]);
        assert!(addr.contains(&format!("{ip}/24")), "{addr}");

        // traffic: into the container from the host and from outside (routed), and out of it
        // to the outside, masqueraded behind the host's address (bridge ipMasq)
        let url = format!("http://{ip}:8080/");
        let page = "hello from the container\n";
        wait_for("httpd in the container", Duration::from_secs(20), || {
            Sandbox::http_get(&sb.host, &url).ok()
        });
        assert_eq!(Sandbox::http_get(&sb.outside, &url).as_deref(), Ok(page), "from outside, routed");
        // one reply per connection: the peer address the outside sees
        let listener = Server::tcp4(&sb.outside, 9000, "outside");
        let mut last = String::new();
        let peer = poll(Duration::from_secs(20), || {
            let out = ctrd.ctr(&[
                "task",
                "exec",
                "--exec-id",
                &cni_tests::unique("nc"),
                &id,
                "/bin/sh",
                "-c",
                &format!("echo hi | nc -w 3 {OUTSIDE_ADDR} 9000"),
            ]);
            let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
            last =
                format!("{:?} stdout {got:?} stderr {:?}", out.status, String::from_utf8_lossy(&out.stderr));
            (!got.is_empty()).then_some(got)
        })
        .unwrap_or_else(|| panic!("the container cannot reach the outside; last try: {last}"));
        drop(listener);
        assert_eq!(peer, format!("outside {HOST_ADDR}"), "egress is masqueraded behind the host address");

        // Stop the task: ctr run (foreground) then calls CNI DEL with CNI_NETNS="" — the
        // task's netns is gone — and deletes the task.
        ctrd.must(&["task", "kill", "-s", "SIGKILL", &id]);
        let st = wait_for("ctr run to finish", Duration::from_secs(60), || run.try_wait().unwrap());
        assert!(!ctr_log().contains("network review"), "ctr's CNI DEL failed ({st}): {}", ctr_log());
        assert_eq!(ctrd.must(&["task", "ls", "-q"]).trim(), "", "task deleted");
        assert_attachment_gone(&sb, &before, &bridge, &net, &ip, &[&full_id], "ctr DEL with an empty netns");
        assert!(Sandbox::http_get(&sb.host, &url).is_err());

        ctrd.must(&["container", "delete", &id]);
        let shims = ctrd.shim_pids();
        ctrd.stop();
        for p in shims {
            wait_for("the shim to exit", Duration::from_secs(10), || {
                // gone, or a zombie waiting for init to reap it
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                (stat.is_empty() || stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
                    .then_some(())
            });
        }
        drop(ctrd);
    }
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}

const SUBNET6: &str = "fd00:89::/64";
const GATEWAY6: &str = "fd00:89::1";

/// Start busybox httpd in a podman container publishing `host_port` -> 8080; returns
/// (id, IPv4, IPv6 — empty when the network has none).
fn podman_httpd(
    podman: &Podman,
    sb: &Sandbox,
    name: &str,
    net: &str,
    host_port: u16,
    extra: &[&str],
) -> (String, String, String) {
    let rootfs = sb.dir.join("rootfs");
    let port = format!("{host_port}:8080");
    let mut args = vec!["run", "-d"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--name",
        name,
        "--network",
        net,
        "-p",
        &port,
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--cgroup-parent",
        &sb.cgroup_parent,
        "--rootfs",
        rootfs.to_str().unwrap(),
        "/bin/httpd",
        "-f",
        "-p",
        "8080",
        "-h",
        "/www",
    ]);
    podman.must(&args);
    let info = podman.inspect(name);
    let n = &info["NetworkSettings"]["Networks"][net];
    (
        info["Id"].as_str().expect("id").to_string(),
        n["IPAddress"].as_str().unwrap_or_default().to_string(),
        n["GlobalIPv6Address"].as_str().unwrap_or_default().to_string(),
    )
}

/// HTTP GET from inside a podman container with busybox nc.
fn get_from_container(podman: &Podman, name: &str, addr: &str, port: u16) -> String {
    podman.must(&[
        "exec",
        name,
        "/bin/sh",
        "-c",
        &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {addr} {port}"),
    ])
}

#[test]
fn podman_two_dual_stack_containers_on_one_bridge() {
    let net = cni_tests::unique("cnids");
    let (a, b) = (cni_tests::unique("cta"), cni_tests::unique("ctb"));
    let tokens = [net.as_str(), a.as_str(), b.as_str()];
    let machine = HostSnapshot::take(&tokens);
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let bridge = cni_tests::unique("cbr");
        let mut conf = conflist(&sb, &net, &bridge);
        let ipam = &mut conf["plugins"][0]["ipam"];
        ipam["ranges"].as_array_mut().unwrap().push(json!([{"subnet": SUBNET6, "gateway": GATEWAY6}]));
        ipam["routes"].as_array_mut().unwrap().push(json!({"dst": "::/0"}));
        sb.write_conflist(&format!("10-{net}.conflist"), &conf);
        let podman = Podman::new(&sb);
        let before = HostView::take(&sb);

        let (id_a, a4, a6) = podman_httpd(&podman, &sb, &a, &net, 18081, &[]);
        // b with a static address (podman passes CNI_ARGS IP=…, host-local honours it) and a
        // static MAC (CNI_ARGS MAC=…, bridge sets it)
        let (id_b, b4, b6) = podman_httpd(
            &podman,
            &sb,
            &b,
            &net,
            18082,
            &["--ip", "10.89.0.50", "--mac-address", "02:00:0a:59:00:32"],
        );
        assert_eq!(b4, "10.89.0.50", "podman --ip");
        let link = podman.must(&["exec", &b, "/bin/ip", "-o", "link", "show", "dev", "eth0"]);
        assert!(link.contains("02:00:0a:59:00:32"), "podman --mac-address: {link}");
        assert!(a6.starts_with("fd00:89::") && b6.starts_with("fd00:89::"), "IPv6 addresses: {a6:?} {b6:?}");
        let mut all = vec![a4.clone(), a6.clone(), b4.clone(), b6.clone()];
        all.sort();
        let mut reserved = sb.reservations(&net);
        reserved.sort();
        assert_eq!(reserved, all, "one v4 and one v6 reservation per container");
        let inside = podman.must(&["exec", &a, "/bin/ip", "-o", "-6", "addr", "show", "dev", "eth0"]);
        assert!(inside.contains(&format!("{a6}/64")), "{inside}");

        let page = "hello from the container\n";
        for ip in [&a4, &b4] {
            let url = format!("http://{ip}:8080/");
            wait_for("httpd", Duration::from_secs(20), || Sandbox::http_get(&sb.host, &url).ok());
        }
        for port in [18081, 18082] {
            for host in [HOST_ADDR.to_string(), format!("[{HOST_ADDR6}]")] {
                let url = format!("http://{host}:{port}/");
                let got = wait_for(&format!("{url} from outside"), Duration::from_secs(20), || {
                    Sandbox::http_get(&sb.outside, &url).ok()
                });
                assert_eq!(got, page, "{url}");
            }
        }
        // container to container across the bridge, both families
        assert!(get_from_container(&podman, &a, &b4, 8080).contains(page.trim()), "a -> b over IPv4");
        let v6 = wait_for("a -> b over IPv6", Duration::from_secs(20), || {
            let r = podman.run(&[
                "exec",
                &a,
                "/bin/sh",
                "-c",
                &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {b6} 8080"),
            ]);
            let s = String::from_utf8_lossy(&r.stdout).into_owned();
            s.contains(page.trim()).then_some(s)
        });
        assert!(v6.contains("200 OK"), "{v6}");

        // removing a leaves b alone
        podman.must(&["rm", "-f", "-t", "0", &a]);
        let fw = sb.firewall_text();
        for ip in [&a4, &a6] {
            assert!(!mentions_ip(&fw, ip), "rules for {ip} of the removed container left:\n{fw}");
        }
        assert!(!fw.contains("18081") && !fw.contains(&id_a), "a's port mapping left:\n{fw}");
        let mut reserved = sb.reservations(&net);
        reserved.sort();
        let mut bs = vec![b4.clone(), b6.clone()];
        bs.sort();
        assert_eq!(reserved, bs, "only b's addresses stay reserved");
        assert_eq!(sb.cache_entries().len(), 1);
        assert!(
            Sandbox::http_get(&sb.outside, &format!("http://{HOST_ADDR}:18081/")).is_err(),
            "a's port is closed"
        );
        for host in [HOST_ADDR.to_string(), format!("[{HOST_ADDR6}]")] {
            let url = format!("http://{host}:18082/");
            assert_eq!(
                Sandbox::http_get(&sb.outside, &url).as_deref(),
                Ok(page),
                "b still published at {url}"
            );
        }

        podman.must(&["rm", "-f", "-t", "0", &b]);
        assert_attachment_gone(&sb, &before, &bridge, &net, &b4, &[&id_b, "18082"], "podman rm of both");
        let fw = sb.firewall_text();
        assert!(!mentions_ip(&fw, &b6), "rules for {b6} left:\n{fw}");
        drop(podman);
    }
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}

#[test]
fn podman_tears_down_when_the_container_exits_by_itself() {
    // No `podman rm`: conmon runs `podman container cleanup` when the process exits, which
    // calls CNI DEL from another process with podman's saved configuration.
    let net = cni_tests::unique("cniex");
    let name = cni_tests::unique("cte");
    let tokens = [net.as_str(), name.as_str()];
    let machine = HostSnapshot::take(&tokens);
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let bridge = cni_tests::unique("cbr");
        sb.write_conflist(&format!("10-{net}.conflist"), &conflist(&sb, &net, &bridge));
        let podman = Podman::new(&sb);
        let before = HostView::take(&sb);
        let rootfs = sb.dir.join("rootfs");
        // the container lives until the test removes /tmp/go in its rootfs
        std::fs::write(rootfs.join("tmp/go"), "").unwrap();
        podman.must(&[
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            &net,
            "-p",
            "18083:8080",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--cgroup-parent",
            &sb.cgroup_parent,
            "--rootfs",
            rootfs.to_str().unwrap(),
            "/bin/sh",
            "-c",
            "while [ -e /tmp/go ]; do sleep 0.1; done",
        ]);
        let info = podman.inspect(&name);
        let id = info["Id"].as_str().expect("id").to_string();
        let ip = info["NetworkSettings"]["Networks"][&net]["IPAddress"].as_str().expect("IP").to_string();
        assert_eq!(sb.reservations(&net), vec![ip.clone()]);
        assert!(sb.firewall_text().contains("18083"));
        std::fs::remove_file(rootfs.join("tmp/go")).unwrap();
        wait_for("the container to exit", Duration::from_secs(30), || {
            let st = podman.must(&["ps", "-a", "--format", "{{.State}}"]);
            st.to_lowercase().contains("exited").then_some(())
        });
        wait_for("podman's cleanup to release the attachment", Duration::from_secs(30), || {
            (sb.reservations(&net).is_empty() && sb.cache_entries().is_empty()).then_some(())
        });
        assert_attachment_gone(&sb, &before, &bridge, &net, &ip, &[&id, "18083"], "exit + podman cleanup");
        podman.must(&["rm", &name]);
        drop(podman);
    }
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}

#[test]
fn podman_two_networks_share_a_published_port() {
    // `podman run --network n1,n2 -p 18090:8080`: Podman runs each network's chain with the same
    // portMappings. Both ADDs must succeed; disconnecting the first network keeps the port
    // working through the second; removing the container leaves nothing.
    let (net1, net2) = (cni_tests::unique("cnirt"), cni_tests::unique("cnirt"));
    let name = cni_tests::unique("ctr");
    let tokens = [net1.as_str(), net2.as_str(), name.as_str()];
    let machine = HostSnapshot::take(&tokens);
    {
        let sb = Sandbox::new(PluginSet::from_env());
        let (br1, br2) = (cni_tests::unique("cbr"), cni_tests::unique("cbr"));
        sb.write_conflist(&format!("10-{net1}.conflist"), &conflist_on(&sb, &net1, &br1, SUBNET, GATEWAY));
        sb.write_conflist(
            &format!("11-{net2}.conflist"),
            &conflist_on(&sb, &net2, &br2, "10.90.0.0/24", "10.90.0.1"),
        );
        let podman = Podman::new(&sb);
        let before: BTreeSet<String> = sb.host_links().into_iter().collect();
        let nets = format!("{net1},{net2}");
        let (id, _, _) = podman_httpd(&podman, &sb, &name, &nets, 18090, &[]);
        let info = podman.inspect(&name);
        let ip_of = |net: &str| {
            info["NetworkSettings"]["Networks"][net]["IPAddress"]
                .as_str()
                .unwrap_or_else(|| panic!("no IP for {net} in inspect: {}", info["NetworkSettings"]))
                .to_string()
        };
        let (ip1, ip2) = (ip_of(&net1), ip_of(&net2));
        assert!(ip1.starts_with("10.89.0.") && ip2.starts_with("10.90.0."), "{ip1} {ip2}");

        let page = "hello from the container\n";
        let via_port = format!("http://{HOST_ADDR}:18090/");
        wait_for("httpd through the host port", Duration::from_secs(20), || {
            Sandbox::http_get(&sb.outside, &via_port).ok()
        });
        assert_eq!(Sandbox::http_get(&sb.outside, &via_port).as_deref(), Ok(page));
        let fw = sb.firewall_text();
        assert!(mentions_ip(&fw, &ip1) && mentions_ip(&fw, &ip2), "both claims recorded:\n{fw}");

        // CNI DEL of the first network only: the port now leads to the second address
        podman.must(&["network", "disconnect", &net1, &name]);
        assert_eq!(
            Sandbox::http_get(&sb.outside, &via_port).as_deref(),
            Ok(page),
            "still reachable through the second network"
        );
        let fw = sb.firewall_text();
        assert!(!mentions_ip(&fw, &ip1), "nothing of the first network left:\n{fw}");
        assert!(fw.contains("18090") && mentions_ip(&fw, &ip2), "{fw}");

        podman.must(&["rm", "-f", "-t", "0", &name]);
        let fw = sb.firewall_text();
        for t in [id.as_str(), &id[..12], "18090", &ip1, &ip2] {
            assert!(!fw.contains(t), "firewall still mentions {t}:\n{fw}");
        }
        assert!(Sandbox::http_get(&sb.outside, &via_port).is_err(), "the host port is closed");
        let mut expected = before.clone();
        expected.extend([br1.clone(), br2.clone()]); // the bridges stay, as with upstream
        assert_eq!(sb.host_links().into_iter().collect::<BTreeSet<_>>(), expected, "links left");
        assert_eq!(sb.cache_entries(), Vec::<String>::new(), "libcni cache entries left");
        drop(podman);
    }
    HostSnapshot::assert_unchanged_since(&machine, &tokens);
}
