//! `portmap`: host port forwarding for a chained attachment, with nftables sets and maps.
//!
//! The rules never grow with the number of mappings (see [`ruleset`] for the layout); every
//! verb changes the kernel in one atomic `nft -f` transaction. ADD first tries a transaction
//! that only adds elements (a few milliseconds whatever the number of attached containers);
//! when that fails — table missing, other conditions installed, a host port claimed by another
//! attachment, or this attachment's old elements differing — the slow path reads the table,
//! explains conflicts by naming the holder, and rebuilds what is needed in one transaction.

mod config;
mod ruleset;

use cni_common::conntrack::{self, CtFamily};
use cni_common::netlink::{Family, Netlink, RouteKind, TABLE_MAIN};
use cni_common::nft::Nft;
use cni_common::spec::result::CniResult;
use cni_common::{code, sysctl, CniError, Plugin, Request, Result};
use config::{container_addrs, Conf, Fam, Proto, RawConf};
use ruleset::{Elem, Entry, Listed, Listing, Owner, FAMILY, TABLE};
use std::collections::HashSet;
use std::fs::File;
use std::net::IpAddr;

/// Serialises the slow paths and GC of concurrent invocations (the fast paths need no lock:
/// the kernel checks the claims). Machine-wide, like the xtables lock, but only held while
/// reading the table and committing one transaction.
const LOCK_PATH: &str = "/run/cni/portmap.lock";
/// How often a slow path is retried when the table changed between reading and committing.
const SLOW_ATTEMPTS: usize = 3;

struct Portmap;

fn load(req: &Request) -> Result<Conf> {
    let raw: RawConf = req.plugin_config()?;
    let conf = Conf::from_raw(raw)?;
    for n in &conf.notes {
        eprintln!("{n}");
    }
    Ok(conf)
}

fn owner(req: &Request) -> Owner {
    Owner::new(req.network(), &req.env.container_id, &req.env.ifname)
}

fn lock() -> Result<nix::fcntl::Flock<File>> {
    let dir = std::path::Path::new(LOCK_PATH).parent().expect("has a parent");
    std::fs::create_dir_all(dir).map_err(|e| CniError::io(format!("create {}: {e}", dir.display())))?;
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_PATH)
        .map_err(|e| CniError::io(format!("open {LOCK_PATH}: {e}")))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| CniError::io(format!("lock {LOCK_PATH}: {e}")))
}

fn listing(nft: &Nft) -> Result<Option<Listing>> {
    Ok(nft.list_table(FAMILY, TABLE)?.map(|l| ruleset::parse_listing(&l)))
}

/// The elements this attachment needs, from the config and prevResult.
fn plan(conf: &Conf, prev: &CniResult, ifname: &str, owner: &Owner) -> Result<(Vec<Entry>, Vec<Elem>)> {
    let (v4, v6) = container_addrs(prev, ifname);
    let entries = ruleset::entries(conf, v4, v6)?;
    let elems = ruleset::elements(conf, &entries, owner);
    Ok((entries, elems))
}

/// The slow ADD path: read the table, refuse foreign claims, rebuild the static part and
/// apply this attachment's changes, all in one transaction.
fn slow_add(nft: &Nft, conf: &Conf, elems: &[Elem], owner: &Owner, fast_err: CniError) -> Result<()> {
    let _lock = lock()?;
    let mut last = fast_err;
    for _ in 0..SLOW_ATTEMPTS {
        let l = listing(nft)?.unwrap_or_default();
        // Claims held by someone else: refuse, naming the holder.
        for e in elems {
            let Some(x) = l.find(&e.set, &e.key) else { continue };
            let foreign = match e.set.as_str() {
                "owner" => x.data != e.data,
                "hp4" | "hip4" | "hp6" | "hip6" => x.comment.as_deref() != Some(owner.tag.as_str()),
                _ => false, // masquerade elements may be shared (same container address)
            };
            if foreign {
                let what = describe_key(e);
                return Err(CniError::config(format!(
                    "host port {what} is already mapped by {}: refusing to shadow it",
                    ruleset::describe_holder(x.comment.as_deref())
                ))
                .with_details(format!("conflicting element: {} {{ {} }}", x.set, x.key)));
            }
        }
        let want: HashSet<&Elem> = elems.iter().collect();
        let stale: Vec<&Listed> = l.owned_by(owner).filter(|x| !want.contains(&x.elem())).collect();
        let add: Vec<&Elem> = elems
            .iter()
            .filter(|e| match l.find(&e.set, &e.key) {
                Some(x) => x.data != e.data || stale.iter().any(|s| s.set == e.set && s.key == e.key),
                None => true,
            })
            .collect();
        let mut script = ruleset::setup_script(conf, &l.gate_chains());
        script.push_str(&ruleset::change_script(&add, &stale, &owner.tag));
        match nft.apply(&script) {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
    }
    if !conf.conditions_v4.is_empty() || !conf.conditions_v6.is_empty() {
        if let Err(e) = nft.check(&ruleset::conditions_probe_script(conf)) {
            return Err(CniError::config(format!(
                "conditionsV4/conditionsV6 are not valid nft syntax: {}",
                e.msg.trim_start_matches("nft check failed: ")
            )));
        }
    }
    Err(last.context("portmap: could not install the port mappings"))
}

/// "tcp/8080 on 192.0.2.1" style text for an element key.
fn describe_key(e: &Elem) -> String {
    let parts: Vec<&str> = e.key.split(" . ").collect();
    let text = match parts.as_slice() {
        [addr, proto, port] => {
            let any = *addr == "::ffff:0.0.0.0" || *addr == "::";
            let fam = if addr.starts_with("::ffff:") || addr.contains('.') { "IPv4" } else { "IPv6" };
            let addr = addr.trim_start_matches("::ffff:");
            if any {
                format!("{proto}/{port} (all {fam} addresses)")
            } else {
                format!("{proto}/{port} on {addr}")
            }
        }
        [proto, port] => format!("{proto}/{port}"),
        _ => e.key.clone(),
    };
    text
}

/// `route_localnet=1` on the interface that routes to the container, so that connections to
/// 127.0.0.1:<hostPort> can be DNATed out of the host (as upstream does).
fn enable_route_localnet(ctr: IpAddr) -> Result<()> {
    let mut nl = Netlink::new().map_err(CniError::from)?;
    let routes = nl.routes(Some(Family::V4)).map_err(CniError::from)?;
    let best = routes
        .iter()
        .filter(|r| r.table == TABLE_MAIN && r.kind == RouteKind::Unicast && r.dst.contains(&ctr))
        .max_by_key(|r| r.dst.prefix_len());
    let Some(oif) = best.and_then(|r| r.oif.or_else(|| r.nexthops.first().and_then(|h| h.oif))) else {
        eprintln!("portmap: note: no route to {ctr} in the host; route_localnet not set");
        return Ok(());
    };
    let Some(link) = nl.link_by_index(oif).map_err(CniError::from)? else { return Ok(()) };
    sysctl::set(&sysctl::iface_key("ipv4", &link.name, "route_localnet"), "1")?;
    Ok(())
}

/// Forget UDP flows to the host ports: they would keep their old NAT binding (plugins#123).
fn flush_udp(ports: impl IntoIterator<Item = (Fam, u16)>) {
    for (fam, port) in ports {
        let f = if fam == Fam::V4 { CtFamily::V4 } else { CtFamily::V6 };
        if let Err(e) = conntrack::delete_by_dst_port(f, conntrack::IPPROTO_UDP, port) {
            eprintln!("portmap: failed to delete stale UDP conntrack entries for port {port}: {}", e.msg);
        }
    }
}

fn udp_ports(entries: &[Entry]) -> HashSet<(Fam, u16)> {
    entries.iter().filter(|e| e.proto == Proto::Udp).map(|e| (e.fam, e.host_port)).collect()
}

impl Plugin for Portmap {
    fn name(&self) -> &'static str {
        "portmap"
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = load(req)?;
        let prev = req
            .prev_result()?
            .ok_or_else(|| CniError::config("must be called as chained plugin: prevResult is missing"))?;
        if conf.mappings.is_empty() {
            return Ok(prev);
        }
        let owner = owner(req);
        let (entries, elems) = plan(&conf, &prev, &req.env.ifname, &owner)?;
        if entries.is_empty() {
            eprintln!(
                "portmap: note: prevResult has no address on interface {:?} of a family the mappings use; nothing to forward",
                req.env.ifname
            );
            return Ok(prev);
        }
        let nft = Nft::find()?;
        if let Err(e) = nft.apply(&ruleset::fast_add_script(&conf, &elems, &owner)) {
            slow_add(&nft, &conf, &elems, &owner, e)?;
        }
        if conf.snat && !conf.masq_all {
            if let Some(e) = entries.iter().find(|e| e.fam == Fam::V4) {
                enable_route_localnet(e.ctr.addr())?;
            }
        }
        flush_udp(udp_ports(&entries));
        Ok(prev)
    }

    fn del(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        if conf.mappings.is_empty() {
            return Ok(()); // nothing was mapped (upstream's early exit; GC is the safety net)
        }
        let owner = owner(req);
        let nft = match Nft::find() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("portmap: {}; nothing to delete", e.msg);
                return Ok(());
            }
        };
        // Fast path: with prevResult we know every element; delete them guarded by our claims.
        if let Some(prev) = req.prev_result().ok().flatten() {
            if let Ok((entries, elems)) = plan(&conf, &prev, &req.env.ifname, &owner) {
                if !elems.is_empty() && nft.apply(&ruleset::guarded_delete_script(&elems, &owner)).is_ok() {
                    flush_udp(udp_ports(&entries));
                    return Ok(());
                }
            }
        }
        // Slow path: whatever carries our owner tag.
        let _lock = lock()?;
        let mut last = None;
        for _ in 0..SLOW_ATTEMPTS {
            let Some(l) = listing(&nft)? else { return Ok(()) };
            let mine: Vec<&Listed> = l.owned_by(&owner).collect();
            if mine.is_empty() {
                return Ok(());
            }
            match nft.apply(&ruleset::change_script(&[], &mine, &owner.tag)) {
                Ok(()) => {
                    flush_udp(ruleset::udp_ports_of(&mine));
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("an attempt failed").context("portmap: could not delete the port mappings"))
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        let prev = req.prev_result()?.ok_or_else(|| CniError::config("Required prevResult missing"))?;
        if conf.mappings.is_empty() {
            return Ok(());
        }
        let owner = owner(req);
        let (_, elems) = plan(&conf, &prev, &req.env.ifname, &owner)?;
        if elems.is_empty() {
            return Ok(());
        }
        let nft = Nft::find()?;
        let l = listing(&nft)?
            .ok_or_else(|| CniError::internal(format!("portmap: table {FAMILY} {TABLE} does not exist")))?;
        if let Some(p) = l.static_problem(&conf) {
            return Err(CniError::internal(format!("portmap: table {FAMILY} {TABLE}: {p}")));
        }
        for e in &elems {
            let Some(x) = l.find(&e.set, &e.key) else {
                return Err(CniError::internal(format!(
                    "portmap: element {} {{ {} }} is missing",
                    e.set, e.key
                )));
            };
            if x.data != e.data {
                return Err(CniError::internal(format!(
                    "portmap: element {} {{ {} }} maps to {} instead of {}",
                    e.set,
                    e.key,
                    x.data.as_deref().unwrap_or("-"),
                    e.data.as_deref().unwrap_or("-")
                )));
            }
            let shared_masq = e.set.starts_with("masq");
            if !shared_masq && x.comment.as_deref() != Some(owner.tag.as_str()) {
                return Err(CniError::internal(format!(
                    "portmap: element {} {{ {} }} belongs to {}",
                    e.set,
                    e.key,
                    ruleset::describe_holder(x.comment.as_deref())
                )));
            }
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<()> {
        load(req)?; // validates; GC itself needs only the network name
        let valid: HashSet<String> = req
            .valid_attachments()?
            .iter()
            .map(|a| Owner::new(req.network(), &a.container_id, &a.ifname).tag)
            .collect();
        let prefix = ruleset::net_prefix(req.network());
        let nft = match Nft::find() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("portmap: {}; nothing to collect", e.msg);
                return Ok(());
            }
        };
        let _lock = lock()?;
        let mut last = None;
        for _ in 0..SLOW_ATTEMPTS {
            let Some(l) = listing(&nft)? else { return Ok(()) };
            let victims: Vec<&Listed> = l
                .all_elements()
                .filter(|x| {
                    x.comment.as_deref().is_some_and(|c| c.starts_with(&prefix) && !valid.contains(c))
                })
                .collect();
            let remaining = l.all_elements().count() - victims.len();
            let script = if remaining == 0 {
                // Nothing of any network is mapped any more: leave no table behind.
                format!("delete table {FAMILY} {TABLE}\n")
            } else if victims.is_empty() {
                return Ok(());
            } else {
                ruleset::change_script(&[], &victims, "")
            };
            match nft.apply(&script) {
                Ok(()) => {
                    flush_udp(ruleset::udp_ports_of(&victims));
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("an attempt failed").context("portmap: GC could not delete stale port mappings"))
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        let nft = Nft::find()?;
        nft.probe()?;
        // Dry-run the whole static layout: proves nat, fib, vmap and concatenated interval
        // sets are usable in this kernel, without committing anything.
        nft.check(&ruleset::setup_script(&conf, &[])).map_err(|e| {
            CniError::new(code::NOT_AVAILABLE, format!("nf_tables cannot hold the portmap rules: {}", e.msg))
        })
    }
}

fn main() {
    cni_common::skel::run(&Portmap)
}
