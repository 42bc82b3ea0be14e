//! `portmap`: host port forwarding for a chained attachment, with nftables sets and maps.
//!
//! The rules never grow with the number of mappings (see [`ruleset`] for the layout); every
//! verb changes the kernel in one atomic nf_tables transaction. Element changes and all reads
//! go over netlink ([`wire`]), and so does (re)building the static part (table, sets, chains,
//! rules) on the first ADD on a host or after tampering; only a static part with
//! `conditionsV4/V6`, which are nft syntax, is built with `nft -f`.
//!
//! ADD first tries a netlink transaction that only adds elements (well under a millisecond
//! whatever the number of attached containers); when that fails — table missing, other
//! conditions installed, a host port claimed by another attachment, or this attachment's old
//! elements differing — the slow path reads the table, explains conflicts with other
//! containers by naming the holder, shares host ports between attachments of one container,
//! and applies what is needed in one transaction (netlink, rebuilding the static part when
//! needed; one `nft -f` instead when that part has conditions).

mod config;
mod ruleset;
mod wire;

use cni_common::netlink::conntrack::{self, IPPROTO_UDP};
use cni_common::netlink::nft::NfTables;
use cni_common::netlink::{Family, Netlink, RouteKind, TABLE_MAIN};
use cni_common::nft_cli::Nft;
use cni_common::spec::result::CniResult;
use cni_common::{code, sysctl, CniError, Plugin, Request, Result};
use config::{container_addrs, Conf, Fam, Proto, RawConf};
use ruleset::{Elem, Entry, Listed, Owner, FAMILY, TABLE};
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

fn nftables() -> Result<NfTables> {
    NfTables::new()
        .map_err(|e| CniError::new(code::NOT_AVAILABLE, format!("nf_tables is not usable (netlink): {e}")))
}

/// The elements this attachment needs, from the config and prevResult.
fn plan(conf: &Conf, prev: &CniResult, ifname: &str, owner: &Owner) -> Result<(Vec<Entry>, Vec<Elem>)> {
    let (v4, v6) = container_addrs(prev, ifname);
    let entries = ruleset::entries(conf, v4, v6)?;
    let elems = ruleset::elements(conf, &entries, owner);
    Ok((entries, elems))
}

/// The slow ADD path: read the table, refuse claims of other containers, and apply this
/// attachment's changes (sharing host ports with other attachments of the same container) in
/// one transaction: over netlink when the static part is as `conf` needs it, else with one
/// `nft -f` that also (re)builds the static part. Returns the UDP ports whose target changed.
fn slow_add(
    nf: &mut NfTables,
    conf: &Conf,
    elems: &[Elem],
    owner: &Owner,
    fast_err: CniError,
) -> Result<HashSet<(Fam, u16)>> {
    let _lock = lock()?;
    let mut last = fast_err;
    let mut rebuild = false;
    let mut nft = None;
    for _ in 0..SLOW_ATTEMPTS {
        let l = wire::read(nf)?;
        rebuild |= l.as_ref().is_none_or(|l| l.static_problem(conf).is_some());
        let l = l.unwrap_or_default();
        // Claims held by another container: refuse, naming the holder.
        if let Some((e, holder, x)) = ruleset::foreign_claim(&l, elems, owner) {
            let what = describe_key(e);
            return Err(CniError::config(format!(
                "host port {what} is already mapped by {}: refusing to shadow it",
                ruleset::describe_holder(holder.as_deref())
            ))
            .with_details(format!("conflicting element: {} {{ {} }}", x.set, x.key)));
        }
        let hash = owner.hash.to_string();
        let gone = |tag: &str, h: &str| tag == owner.tag || h == hash;
        let plan = ruleset::plan(&l, &gone, elems, &owner.tag);
        let applied = if rebuild {
            match wire::setup_ops(conf, &l.gate_chains()) {
                // No conditions: the static part goes over netlink too, in the same transaction.
                Some(mut ops) => {
                    ops.extend(wire::plan_ops(&plan)?);
                    nf.apply(&ops).map_err(CniError::from)
                }
                None => {
                    let nft = match &nft {
                        Some(n) => n,
                        None => nft.insert(Nft::find()?),
                    };
                    let mut script = ruleset::setup_script(conf, &l.gate_chains());
                    script.push_str(&plan.script());
                    nft.apply(&script)
                }
            }
        } else {
            // A failure here (a concurrent change, or a set that went missing) is retried from
            // a new read with the static part rebuilt.
            rebuild = true;
            nf.apply(&wire::plan_ops(&plan)?).map_err(CniError::from)
        };
        match applied {
            Ok(()) => return Ok(plan.udp_ports()),
            Err(e) => last = e,
        }
    }
    if !conf.conditions_v4.is_empty() || !conf.conditions_v6.is_empty() {
        if let Some(nft) = &nft {
            if let Err(e) = nft.check(&ruleset::conditions_probe_script(conf)) {
                return Err(CniError::config(format!(
                    "conditionsV4/conditionsV6 are not valid nft syntax: {}",
                    e.msg.trim_start_matches("nft check failed: ")
                )));
            }
        }
    }
    Err(last.context("portmap: could not install the port mappings"))
}

/// Under the lock: withdraw the claims of the attachments `gone` selects (the remaining
/// claimants of a shared host port keep it), delete their other elements, and flush their UDP
/// flows, in one netlink transaction. With `drop_empty_table`, a table left without any
/// element is deleted.
fn withdraw(
    nf: &mut NfTables,
    gone: &dyn Fn(&str, &str) -> bool,
    drop_empty_table: bool,
    what: &str,
) -> Result<()> {
    let _lock = lock()?;
    let mut last = None;
    for _ in 0..SLOW_ATTEMPTS {
        let Some(l) = wire::read(nf)? else { return Ok(()) };
        let plan = ruleset::plan(&l, gone, &[], "");
        let remaining = l.all_elements().count() + plan.add.len() - plan.delete.len();
        let ops = if drop_empty_table && remaining == 0 {
            // Nothing of any network is mapped any more: leave no table behind.
            vec![wire::delete_table_op()]
        } else if plan.is_empty() {
            return Ok(());
        } else {
            wire::plan_ops(&plan)?
        };
        match nf.apply(&ops) {
            Ok(()) => {
                flush_udp(plan.udp_ports());
                return Ok(());
            }
            Err(e) => last = Some(CniError::from(e)),
        }
    }
    Err(last.expect("an attempt failed").context(what))
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
/// One conntrack dump for all of them.
fn flush_udp(ports: impl IntoIterator<Item = (Fam, u16)>) {
    let targets: Vec<(Family, u16)> = ports
        .into_iter()
        .map(|(fam, port)| (if fam == Fam::V4 { Family::V4 } else { Family::V6 }, port))
        .collect();
    if let Err(e) = conntrack::delete_by_dst_ports(IPPROTO_UDP, &targets) {
        let ports: Vec<String> = targets.iter().map(|(_, p)| p.to_string()).collect();
        eprintln!(
            "portmap: failed to delete stale UDP conntrack entries for ports {}: {e}",
            ports.join(", ")
        );
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
        let mut nf = nftables()?;
        let changed_udp = match nf.apply(&wire::fast_add_ops(&conf, &elems, &owner)?) {
            Ok(()) => udp_ports(&entries),
            Err(e) => slow_add(&mut nf, &conf, &elems, &owner, e.into())?,
        };
        if conf.snat && !conf.masq_all {
            if let Some(e) = entries.iter().find(|e| e.fam == Fam::V4) {
                enable_route_localnet(e.ctr.addr())?;
            }
        }
        flush_udp(changed_udp);
        Ok(prev)
    }

    fn del(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        if conf.mappings.is_empty() {
            return Ok(()); // nothing was mapped (upstream's early exit; GC is the safety net)
        }
        let owner = owner(req);
        let mut nf = match nftables() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("portmap: {}; nothing to delete", e.msg);
                return Ok(());
            }
        };
        // Fast path: with prevResult we know every element; delete them guarded by our claims.
        if let Some(prev) = req.prev_result().ok().flatten() {
            if let Ok((entries, elems)) = plan(&conf, &prev, &req.env.ifname, &owner) {
                if let Ok(ops) = wire::guarded_delete_ops(&elems, &owner) {
                    if !elems.is_empty() && nf.apply(&ops).is_ok() {
                        flush_udp(udp_ports(&entries));
                        return Ok(());
                    }
                }
            }
        }
        // Slow path (no prevResult, partial state, or a host port shared with other
        // attachments of this container): withdraw whatever carries our tag or hash.
        let hash = owner.hash.to_string();
        withdraw(
            &mut nf,
            &|tag: &str, h: &str| tag == owner.tag || h == hash,
            false,
            "portmap: could not delete the port mappings",
        )
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
        let l = wire::read(&mut nftables()?)?
            .ok_or_else(|| CniError::internal(format!("portmap: table {FAMILY} {TABLE} does not exist")))?;
        if let Some(p) = l.static_problem(&conf) {
            return Err(CniError::internal(format!("portmap: table {FAMILY} {TABLE}: {p}")));
        }
        let claims = l.claims();
        let missing =
            |e: &Elem| CniError::internal(format!("portmap: element {} {{ {} }} is missing", e.set, e.key));
        let differs = |e: &Elem, x: &Listed| {
            CniError::internal(format!(
                "portmap: element {} {{ {} }} maps to {} instead of {}",
                e.set,
                e.key,
                x.data.as_deref().unwrap_or("-"),
                e.data.as_deref().unwrap_or("-")
            ))
        };
        // our own claims and masquerade elements (the latter may be shared: any owner will do)
        for e in elems.iter().filter(|e| e.set == "claims" || e.set.starts_with("masq")) {
            let x = l.find(&e.set, &e.key).ok_or_else(|| missing(e))?;
            if x.data != e.data {
                return Err(differs(e, x));
            }
        }
        // the owner and DNAT elements of each host port: what its claimants need
        for e in elems.iter().filter(|e| e.set == "owner") {
            let claimants: Vec<&ruleset::Claim> = claims.iter().filter(|c| c.key == e.key).collect();
            let dnat = ruleset::dnat_slot(&e.key).and_then(|(set, k)| l.find(set, &k));
            let Some(desired) = ruleset::desired_slots(&e.key, &claimants, dnat) else { continue };
            for (want, tag) in &desired {
                let x = l.find(&want.set, &want.key).ok_or_else(|| missing(want))?;
                if x.comment.as_deref() != Some(tag.as_str()) {
                    return Err(CniError::internal(format!(
                        "portmap: element {} {{ {} }} belongs to {}",
                        want.set,
                        want.key,
                        ruleset::describe_holder(x.comment.as_deref())
                    )));
                }
                if x.data != want.data {
                    return Err(differs(want, x));
                }
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
        let mut nf = match nftables() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("portmap: {}; nothing to collect", e.msg);
                return Ok(());
            }
        };
        withdraw(
            &mut nf,
            &|tag: &str, _: &str| tag.starts_with(&prefix) && !valid.contains(tag),
            true,
            "portmap: GC could not delete stale port mappings",
        )
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        // Every change and read goes over netlink...
        let mut nf = nftables()?;
        nf.generation().map_err(|e| {
            CniError::new(code::NOT_AVAILABLE, format!("nf_tables is not usable (netlink): {e}"))
        })?;
        // Dry-run the whole static layout: proves nat, fib, vmap and concatenated interval
        // sets are usable in this kernel, without committing anything. Over netlink too,
        // unless conditions need nft (and then a missing nft is reported).
        let cannot = |msg: String| {
            CniError::new(code::NOT_AVAILABLE, format!("nf_tables cannot hold the portmap rules: {msg}"))
        };
        match wire::setup_ops(&conf, &[]) {
            Some(ops) => nf.validate(&ops).map_err(|e| cannot(e.to_string())),
            None => Nft::find()?.check(&ruleset::setup_script(&conf, &[])).map_err(|e| cannot(e.msg)),
        }
    }
}

fn main() {
    cni_common::skel::run(&Portmap)
}
