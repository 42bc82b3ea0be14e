//! The conformance script of ptp's kernel seam: one sequence of calls through [`Kernel`], with
//! the answers and the state the kernel gives, run against [`super::fake::Fake`] (a unit test)
//! and against [`super::Real`] in a scratch pair of namespaces (a root test). The fake passes
//! only by modelling what the kernel does, not by recording calls: every change is read back
//! through the seam's own reads (`link`, `addrs`, `routes`, `sysctl_get`).
//!
//! What it covers: a veth pair with its peer in the other namespace (names, kind, MTU, which
//! end is up, each end naming the other); EEXIST for a taken host or container name (nothing
//! left behind); ENODEV for every change on an index that does not exist; addresses added,
//! added twice (EEXIST), deleted, deleted twice (EADDRNOTAVAIL), with and without the kernel's
//! subnet route; routes added, added twice (EEXIST, on the same or another device), on a link
//! that is down (ENETDOWN), through an unreachable gateway (ENETUNREACH for IPv4, EHOSTUNREACH
//! for IPv6), each read back with its device; sysctls written by `ctr_enable_ipv6` and `forward`
//! read back by value, one of a missing interface refused; a link taken down and up again with
//! `keep_addr_on_down` (the container's end: IPv6 addresses kept) and without it (the host's:
//! IPv6 addresses gone, IPv4 kept), the routes through it gone and the subnet routes back; one
//! end deleted taking the other and its sysctls with it.
//!
//! Route deletion is not in the seam (no verb deletes a route: they go with the veth) and is
//! not covered; neither is masquerading (nf_tables has its own kernel tests in cni-common).

use super::*;
use cni_common::netlink::SCOPE_LINK;

/// The host ends' names (scratch namespaces only; the prefix says whose they are).
pub const HOST: &str = "conform-h";
pub const HOST2: &str = "conform-h2";
/// The container ends' names.
pub const CTR: &str = "eth0";
pub const CTR2: &str = "eth1";
/// An index no link has.
const MISSING: u32 = 99_999;

/// A route as the script compares it: destination, gateway, the device's name, scope.
type Seen = (IpNet, Option<IpAddr>, String, u8);

/// The script's run: each disagreement with the kernel's answer, by step.
struct Run<'a> {
    k: &'a mut dyn Kernel,
    wrong: Vec<String>,
}

fn net(s: &str) -> IpNet {
    s.parse().expect("an address")
}

fn errno<T>(r: NlResult<T>) -> std::result::Result<T, i32> {
    r.map_err(|e| e.errno)
}

fn route(dst: &str, gw: Option<&str>, scope: Option<u8>) -> RouteWant {
    RouteWant {
        dst: net(dst),
        gw: gw.map(|g| g.parse().expect("an address")),
        src: None,
        scope,
        table: None,
        priority: None,
        mtu: None,
        advmss: None,
        append: false,
    }
}

fn seen(dst: &str, gw: Option<&str>, dev: &str, scope: u8) -> Seen {
    (net(dst), gw.map(|g| g.parse().expect("an address")), dev.to_string(), scope)
}

/// Only the script's own addresses: the kernel adds an IPv6 link-local one when a link comes up.
fn ours(a: &IpNet) -> bool {
    ["198.51.100.0/24", "192.0.2.0/24", "2001:db8::/32"].iter().any(|n| net(n).contains(a))
}

impl Run<'_> {
    fn want<T: std::fmt::Debug + PartialEq>(&mut self, step: &str, got: T, want: T) {
        if got != want {
            self.wrong.push(format!("{step}: got {got:?}, the kernel's answer is {want:?}"));
        }
    }

    fn link(&mut self, side: Side, name: &str) -> Link {
        match self.k.link(side, name) {
            Ok(Some(l)) => l,
            other => panic!("link {name} on {side:?}: {other:?} (the script cannot go on)"),
        }
    }

    /// The link's own addresses, sorted.
    fn addrs(&mut self, side: Side, index: u32) -> Vec<IpNet> {
        let mut a: Vec<IpNet> = self.k.addrs(side, index).expect("addrs").into_iter().filter(ours).collect();
        a.sort();
        a
    }

    /// The main table's routes to the script's addresses, by device name, sorted.
    fn routes(&mut self, side: Side) -> Vec<Seen> {
        let all = self.k.routes(side).expect("routes");
        let mut out = Vec::new();
        for r in all.into_iter().filter(|r| r.table == 254 && ours(&r.dst)) {
            let dev = match r.oif {
                Some(i) => self.k.link_by_index(side, i).expect("link by index").map(|l| l.name),
                None => None,
            };
            out.push((r.dst, r.gw, dev.unwrap_or_default(), r.scope));
        }
        out.sort();
        out
    }

    fn sysctl(&mut self, side: Side, key: &str) -> Option<String> {
        self.k.sysctl_get(side, key).ok()
    }
}

fn keep(dev: &str) -> String {
    sysctl::iface_key("ipv6", dev, "keep_addr_on_down")
}

fn disable(dev: &str) -> String {
    sysctl::iface_key("ipv6", dev, "disable_ipv6")
}

/// Run the script; every disagreement with the kernel's answers, empty when there is none.
pub fn run(k: &mut dyn Kernel) -> Vec<String> {
    let mut r = Run { k, wrong: Vec::new() };
    let (h, c) = pair(&mut r);
    missing_index(&mut r);
    sysctls(&mut r);
    let subnets = addresses(&mut r, &h, &c);
    routes(&mut r, &h, &c, &subnets);
    down_up(&mut r, &h, &c);
    teardown(&mut r, &h);
    r.wrong
}

/// The pair (host end, container end); taken names refused.
fn pair(r: &mut Run) -> (Link, Link) {
    // The pair: the host end up, the container's down, each naming the other.
    let none = r.k.link(Side::Host, HOST).map(|l| l.is_none());
    r.want("no host end before", none, Ok(true));
    let h = r.k.create_veth(HOST, CTR, Some(1400)).expect("create the pair");
    let c = r.link(Side::Container, CTR);
    r.want(
        "host end",
        (h.name.as_str(), h.kind.as_deref(), h.mtu, h.flags & 1),
        (HOST, Some("veth"), 1400, 1),
    );
    r.want("container end", (c.kind.as_deref(), c.mtu, c.flags & 1), (Some("veth"), 1400, 0));
    r.want("the container end's peer", c.link, Some(h.index));
    let h_again = r.link(Side::Host, HOST);
    r.want("the host end's peer", h_again.link, Some(c.index));
    let by_index = r.k.link_by_index(Side::Container, c.index).map(|l| l.map(|l| l.name));
    r.want("container end by index", by_index, Ok(Some(CTR.to_string())));

    // Taken names: EEXIST, nothing left behind.
    let taken_host = errno(r.k.create_veth(HOST, CTR2, None).map(drop));
    r.want("a taken host name", taken_host, Err(libc::EEXIST));
    let taken_ctr = errno(r.k.create_veth(HOST2, CTR, None).map(drop));
    r.want("a taken container name", taken_ctr, Err(libc::EEXIST));
    let left = (
        r.k.link(Side::Host, HOST2).map(|l| l.is_none()),
        r.k.link(Side::Container, CTR2).map(|l| l.is_none()),
    );
    r.want("nothing left by a refused pair", left, (Ok(true), Ok(true)));
    (h, c)
}

fn missing_index(r: &mut Run) {
    // A missing index: ENODEV for every change.
    let gone = r.k.link_by_index(Side::Host, MISSING).map(|l| l.is_none());
    r.want("link by a missing index", gone, Ok(true));
    let up = errno(r.k.link_up(Side::Host, MISSING));
    r.want("up a missing index", up, Err(libc::ENODEV));
    let down = errno(r.k.link_down(Side::Host, MISSING));
    r.want("down a missing index", down, Err(libc::ENODEV));
    let del = errno(r.k.link_del(Side::Host, MISSING));
    r.want("delete a missing index", del, Err(libc::ENODEV));
    let addr = errno(r.k.addr_add(Side::Host, MISSING, net("198.51.100.9/24"), false));
    r.want("address on a missing index", addr, Err(libc::ENODEV));
    let rt = errno(r.k.route_add(Side::Host, MISSING, &route("192.0.2.0/24", None, None)));
    r.want("route on a missing index", rt, Err(libc::ENODEV));
    let addrs = errno(r.k.addrs(Side::Host, MISSING));
    r.want("addresses of a missing index", addrs, Err(libc::ENODEV));
}

fn sysctls(r: &mut Run) {
    // Sysctls: written through the seam, read back by value.
    let before = (r.sysctl(Side::Container, &keep(CTR)), r.sysctl(Side::Host, "net/ipv4/ip_forward"));
    r.want("sysctls before", before, (Some("0".into()), Some("0".into())));
    r.k.ctr_enable_ipv6(CTR).expect("enable IPv6");
    let after = [disable("lo"), disable(CTR), keep(CTR)].map(|key| r.sysctl(Side::Container, &key));
    r.want("IPv6 on, addresses kept on down", after, [Some("0".into()), Some("0".into()), Some("1".into())]);
    let missing = r.k.ctr_enable_ipv6("conform-none").is_err();
    r.want("IPv6 on a missing interface", missing, true);
    let missing = r.sysctl(Side::Container, &keep("conform-none"));
    r.want("a missing interface's sysctl", missing, None);
    r.k.forward(true, false).expect("forward v4");
    let fwd = |r: &mut Run| {
        (r.sysctl(Side::Host, "net/ipv4/ip_forward"), r.sysctl(Side::Host, "net/ipv6/conf/all/forwarding"))
    };
    let v4 = fwd(r);
    r.want("IPv4 forwarding", v4, (Some("1".into()), Some("0".into())));
    r.k.forward(false, true).expect("forward v6");
    let both = fwd(r);
    r.want("both forwarding", both, (Some("1".into()), Some("1".into())));
}

/// The addresses of both ends; the host end's subnet routes.
fn addresses(r: &mut Run, h: &Link, c: &Link) -> Vec<Seen> {
    // Addresses; a route through a link that is down.
    for (a, noprefix) in [("198.51.100.2/24", true), ("2001:db8:1::2/64", true), ("2001:db8:5::2/64", false)]
    {
        let added = errno(r.k.addr_add(Side::Container, c.index, net(a), noprefix));
        r.want(&format!("add {a}"), added, Ok(()));
        let again = errno(r.k.addr_add(Side::Container, c.index, net(a), noprefix));
        r.want(&format!("add {a} again"), again, Err(libc::EEXIST));
    }
    let rt =
        errno(r.k.route_add(Side::Container, c.index, &route("198.51.100.1/32", None, Some(SCOPE_LINK))));
    r.want("route through a link that is down", rt, Err(libc::ENETDOWN));
    let no_routes = r.routes(Side::Container);
    r.want("no subnet route while down", no_routes, vec![]);
    for a in ["198.51.100.1/24", "2001:db8:1::1/64"] {
        let added = errno(r.k.addr_add(Side::Host, h.index, net(a), false));
        r.want(&format!("add {a} on the host end"), added, Ok(()));
    }
    let host_routes = r.routes(Side::Host);
    let subnets =
        vec![seen("198.51.100.0/24", None, HOST, SCOPE_LINK), seen("2001:db8:1::/64", None, HOST, 0)];
    r.want("the host end's subnet routes", host_routes, subnets.to_vec());
    let del = errno(r.k.addr_del(Side::Host, h.index, net("198.51.100.1/24")));
    r.want("delete an address", del, Ok(()));
    let del = errno(r.k.addr_del(Side::Host, h.index, net("198.51.100.1/24")));
    r.want("delete it again", del, Err(libc::EADDRNOTAVAIL));
    let host_routes = r.routes(Side::Host);
    r.want("its subnet route gone with it", host_routes, subnets[1..].to_vec());
    r.k.addr_add(Side::Host, h.index, net("198.51.100.1/24"), false).expect("address back");
    subnets
}

fn routes(r: &mut Run, h: &Link, c: &Link, subnets: &[Seen]) {
    // The container end up: routes, each with its device.
    r.k.link_up(Side::Container, c.index).expect("container end up");
    let up = r.link(Side::Container, CTR).flags & 1;
    r.want("container end up", up, 1);
    let ctr_routes = [
        ("198.51.100.1/32", None, Some(SCOPE_LINK)),
        ("192.0.2.0/24", Some("198.51.100.1"), None),
        ("2001:db8:1::1/128", None, None),
        ("2001:db8:2::/64", Some("2001:db8:1::1"), None),
    ];
    for (dst, gw, scope) in ctr_routes {
        let added = errno(r.k.route_add(Side::Container, c.index, &route(dst, gw, scope)));
        r.want(&format!("route {dst}"), added, Ok(()));
        let again = errno(r.k.route_add(Side::Container, c.index, &route(dst, gw, scope)));
        r.want(&format!("route {dst} again"), again, Err(libc::EEXIST));
    }
    let v4 = errno(r.k.route_add(Side::Container, c.index, &route("192.0.2.128/25", Some("10.9.9.9"), None)));
    r.want("IPv4 route through an unreachable gateway", v4, Err(libc::ENETUNREACH));
    let v6 = errno(r.k.route_add(
        Side::Container,
        c.index,
        &route("2001:db8:4::/64", Some("2001:db8:77::1"), None),
    ));
    r.want("IPv6 route through an unreachable gateway", v6, Err(libc::EHOSTUNREACH));
    let routes_up = vec![
        seen("192.0.2.0/24", Some("198.51.100.1"), CTR, 0),
        seen("198.51.100.1/32", None, CTR, SCOPE_LINK),
        seen("2001:db8:1::1/128", None, CTR, 0),
        seen("2001:db8:2::/64", Some("2001:db8:1::1"), CTR, 0),
        seen("2001:db8:5::/64", None, CTR, 0),
    ];
    let got = r.routes(Side::Container);
    r.want("the container's routes", got, routes_up);

    // A second pair: a host route on one device, the same destination on another is EEXIST.
    let h2 = r.k.create_veth(HOST2, CTR2, None).expect("a second pair");
    let to_pod = route("198.51.100.2/32", None, Some(SCOPE_LINK));
    let added = errno(r.k.route_add(Side::Host, h.index, &to_pod));
    r.want("host route to the pod", added, Ok(()));
    let elsewhere = errno(r.k.route_add(Side::Host, h2.index, &to_pod));
    r.want("the same host route on another device", elsewhere, Err(libc::EEXIST));
    let mut with_pod = vec![seen("198.51.100.2/32", None, HOST, SCOPE_LINK)];
    with_pod.extend(subnets.iter().cloned());
    with_pod.sort();
    let got = r.routes(Side::Host);
    r.want("the host's routes, each with its device", got, with_pod);
}

fn down_up(r: &mut Run, h: &Link, c: &Link) {
    // Down and up with keep_addr_on_down (the container's end): every address stays, the
    // routes through the link go, the subnet route of an address comes back.
    let ctr_addrs = vec![net("198.51.100.2/24"), net("2001:db8:1::2/64"), net("2001:db8:5::2/64")];
    r.k.link_down(Side::Container, c.index).expect("container end down");
    let kept = r.addrs(Side::Container, c.index);
    r.want("addresses kept while down (keep_addr_on_down)", kept, ctr_addrs.clone());
    let routes_down = r.routes(Side::Container);
    r.want("no route through a link that is down", routes_down, vec![]);
    r.k.link_up(Side::Container, c.index).expect("container end up again");
    let kept = r.addrs(Side::Container, c.index);
    r.want("addresses kept after up", kept, ctr_addrs);
    let back = r.routes(Side::Container);
    r.want("only the subnet route back", back, vec![seen("2001:db8:5::/64", None, CTR, 0)]);

    // Without it (the host's end): the IPv6 address goes, IPv4 stays.
    let unset = r.sysctl(Side::Host, &keep(HOST));
    r.want("the host end keeps nothing", unset, Some("0".into()));
    r.k.link_down(Side::Host, h.index).expect("host end down");
    r.k.link_up(Side::Host, h.index).expect("host end up");
    let left = r.addrs(Side::Host, h.index);
    r.want("the host end's addresses after down and up", left, vec![net("198.51.100.1/24")]);
    let got = r.routes(Side::Host);
    r.want("the host's routes after down and up", got, vec![seen("198.51.100.0/24", None, HOST, SCOPE_LINK)]);
}

fn teardown(r: &mut Run, h: &Link) {
    // One end deleted takes the other, its routes and its sysctls.
    let del = errno(r.k.link_del(Side::Host, h.index));
    r.want("delete the host end", del, Ok(()));
    let peer = r.k.link(Side::Container, CTR).map(|l| l.is_none());
    r.want("the container end went with it", peer, Ok(true));
    let key = r.sysctl(Side::Container, &keep(CTR));
    r.want("and its sysctls", key, None);
    let again = errno(r.k.link_del(Side::Host, h.index));
    r.want("delete it again", again, Err(libc::ENODEV));
    let c2 = r.link(Side::Container, CTR2).index;
    let del = errno(r.k.link_del(Side::Container, c2));
    r.want("delete the second pair from the container's end", del, Ok(()));
    let host2 = r.k.link(Side::Host, HOST2).map(|l| l.is_none());
    r.want("its host end went with it", host2, Ok(true));
    let got = r.routes(Side::Host);
    r.want("no route left", got, vec![]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_answers_the_script_as_the_kernel_does() {
        let wrong = run(&mut fake::Fake::new());
        assert!(wrong.is_empty(), "the fake disagrees with the kernel:\n{}", wrong.join("\n"));
    }

    /// A new network namespace for the calling thread; root only (fails loudly otherwise).
    fn unshare_net() {
        // SAFETY: unshare(2) with a flag; affects only the calling thread's namespaces.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            panic!(
                "unshare(CLONE_NEWNET): {}; this kernel test needs root (CAP_SYS_ADMIN)",
                std::io::Error::last_os_error()
            );
        }
    }

    /// Root: the same script through netlink and /proc/sys, in a scratch host namespace (this
    /// test's thread) and a scratch container namespace (made on a helper thread, kept by its
    /// handle).
    #[test]
    fn the_kernel_answers_the_script_in_scratch_namespaces() {
        let wrong = std::thread::spawn(|| {
            unshare_net();
            let ctr = std::thread::spawn(|| {
                unshare_net();
                NetNs::current().expect("the helper thread's namespace")
            })
            .join()
            .expect("helper thread");
            let mut k = Real::new(Some(&ctr)).expect("netlink sockets");
            run(&mut k)
        })
        .join()
        .expect("the script's thread");
        assert!(wrong.is_empty(), "the kernel disagrees with the script:\n{}", wrong.join("\n"));
    }
}
