//! `portmap`: host port forwarding for a chained attachment, with nftables sets and maps.
//!
//! The rules never grow with the number of mappings (see [`layout`]); every verb changes the
//! kernel in one atomic nf_tables transaction. Element changes and all reads go over netlink
//! ([`wire`]), and so does (re)building the static part on the first ADD on a host or after
//! tampering; only a DNAT part with `conditionsV4/V6`, which are nft syntax, is built with
//! `nft -f`.
//!
//! ADD first tries a netlink transaction that only adds elements (well under a millisecond
//! whatever the number of attached containers); when that fails — table missing or in the
//! previous layout, other conditions installed, a host port claimed by another attachment, or
//! this attachment's old elements differing — the slow path ([`slow`]) reads the table,
//! replaces holders whose pods are gone ([`netns`]), explains conflicts with live containers
//! by naming the holder, shares host ports between attachments of one container
//! ([`claims`]), and applies what is needed in one transaction.
#![warn(clippy::too_many_lines)]

mod claims;
mod config;
mod layout;
mod legacy;
mod model;
mod netns;
mod owner;
mod slow;
mod table;
mod wire;

use cni_common::attachment::{portmap_net_prefix, AttachmentId};
use cni_common::netlink::conntrack::{self, IPPROTO_UDP};
use cni_common::netlink::nft::NfTables;
use cni_common::netlink::{Family, Netlink, RouteKind, TABLE_MAIN};
use cni_common::nft_cli::Nft;
use cni_common::spec::config::PortMapConf;
use cni_common::spec::result::CniResult;
use cni_common::{code, sysctl, CniError, Plugin, Request, Result};
use config::{container_addrs, Conf, Fam, Teardown};
use model::{Elem, Hash, Key};
use owner::Owner;
use std::collections::HashSet;
use std::net::IpAddr;
use table::{Entry, Want};

struct Portmap;

fn load(req: &Request) -> Result<Conf> {
    let conf = Conf::from_raw(&req.plugin_config()?)?;
    for n in &conf.notes {
        eprintln!("{n}");
    }
    Ok(conf)
}

/// The configuration as DEL and GC read it (see [`Teardown`]).
fn load_teardown(req: &Request, verb: &str) -> Result<Teardown> {
    let raw: PortMapConf = req.plugin_config()?;
    let t = Teardown::from_raw(&raw, verb)?;
    for n in &t.notes {
        eprintln!("{n}");
    }
    Ok(t)
}

fn owner(req: &Request) -> Owner {
    Owner::of(&AttachmentId::of(req))
}

fn nftables() -> Result<NfTables> {
    NfTables::new()
        .map_err(|e| CniError::new(code::NOT_AVAILABLE, format!("nf_tables is not usable (netlink): {e}")))
}

/// The entries and elements of an attachment, and notes on mappings that do not apply to the
/// container's address family. Fails (code 7) when prevResult gives the container no address
/// the mappings can use: the host ports would silently not work.
fn attachment(
    conf: &Conf,
    prev: &CniResult,
    ifname: &str,
    owner: &Owner,
) -> Result<(Vec<Entry>, Vec<Elem>, Vec<String>)> {
    let (v4, v6) = container_addrs(prev, ifname)?;
    if v4.is_none() && v6.is_none() {
        return Err(CniError::config(format!(
            "prevResult has no address for interface {ifname:?} (an IP whose \"interface\" is that \
             container interface, or has none): the host ports cannot be forwarded"
        )));
    }
    let entries = table::entries(conf, v4, v6)?;
    let mut notes = Vec::new();
    for (i, m) in conf.mappings.iter().enumerate() {
        if !entries.iter().any(|e| table::covers(e, m)) {
            let fam = if v4.is_some() { "IPv4" } else { "IPv6" };
            let msg = format!(
                "runtimeConfig.portMappings[{i}] (host port {}/{}) names a hostIP of another family \
                 than the container's {fam} address",
                m.proto.as_str(),
                m.host_port
            );
            if entries.is_empty() {
                return Err(CniError::config(format!("{msg}: nothing would be forwarded")));
            }
            notes.push(format!("portmap: note: {msg}; it is not forwarded"));
        }
    }
    let elems = table::elements(conf, &entries, owner);
    Ok((entries, elems, notes))
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

/// DEL of our own elements: with prevResult and valid mappings, one transaction that names
/// every element (guarded by our claims); otherwise (no prevResult, mappings ADD would refuse,
/// partial state, a port shared with another attachment of the container) the slow path
/// withdraws whatever carries the attachment's tag. Needs neither the netns nor prevResult.
fn del_ours(req: &Request, t: &Teardown) -> Result<()> {
    let owner = owner(req);
    let mut nf = match nftables() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("portmap: {}; nothing to delete", e.msg);
            return Ok(());
        }
    };
    let named = t.conf().zip(req.prev.as_ref()).and_then(|(conf, prev)| {
        let (_, elems, _) = attachment(&conf, prev, &req.env.ifname, &owner).ok()?;
        Some(elems)
    });
    if let Some(elems) = named {
        if nf.apply(&wire::guarded_delete_ops(&elems, &owner)).is_ok() {
            flush_udp(table::udp_ports(elems.iter().map(|e| &e.key)));
            return Ok(());
        }
    }
    let gone = |tag: &str, h: Option<Hash>| tag == owner.tag || h == Some(owner.hash);
    let ports = slow::withdraw(&mut nf, &gone, false, "portmap: could not delete the port mappings")?;
    flush_udp(ports);
    Ok(())
}

/// CHECK of our elements for this attachment: its claims and masquerade elements are there,
/// and the owner and DNAT elements of each of its ports are what its claimants need.
fn check_ours(req: &Request, conf: &Conf, elems: &[Elem], owner: &Owner) -> Result<()> {
    let l = wire::read(&mut nftables()?)?.ok_or_else(|| {
        CniError::internal(format!("portmap: table {} {} does not exist", layout::FAMILY, layout::TABLE))
    })?;
    let masq = if l.legacy_sets.is_empty() {
        layout::masq_problem(&l, &table::net_lens(elems))
    } else {
        legacy::problem(&l)
    };
    if let Some(p) = layout::dnat_problem(&l, conf).or(masq) {
        return Err(CniError::internal(format!("portmap: table {} {}: {p}", layout::FAMILY, layout::TABLE)));
    }
    let missing = |e: &Elem| CniError::internal(format!("portmap: element {e} is missing"));
    let differs = |e: &Elem, x: &Elem| {
        CniError::internal(format!(
            "portmap: element {e} maps to {} instead of {}",
            x.data_text(),
            e.data_text()
        ))
    };
    // our own claims and masquerade elements (the latter may be shared: any owner will do)
    for e in elems.iter().filter(|e| matches!(e.key, Key::Claim(..) | Key::Masq(_))) {
        let x = l.find(&e.key).ok_or_else(|| missing(e))?;
        if x.elem != *e {
            return Err(differs(e, &x.elem));
        }
    }
    // the owner and DNAT elements of each host port: what its claimants need
    let claims = l.claims();
    for e in elems {
        let Key::Owner(port) = e.key else { continue };
        let claimants: Vec<&table::Claim> = claims.iter().filter(|c| c.port == port).collect();
        let dnat = l.find(&Key::Dnat(port));
        let Some(desired) = claims::desired_slots(port, &claimants, dnat) else { continue };
        for (want, tag) in &desired {
            let x = l.find(&want.key).ok_or_else(|| missing(want))?;
            if x.comment.as_deref() != Some(tag.as_str()) {
                return Err(CniError::internal(format!(
                    "portmap: element {want} belongs to {}",
                    owner::describe_holder(x.comment.as_deref())
                )));
            }
            if x.elem != *want {
                return Err(differs(want, &x.elem));
            }
        }
    }
    // the recorded namespace, when there is a record (attachments made before records existed
    // have none), is CNI_NETNS
    if let (Some((id, path)), Some((now, _))) = (l.netns_record(owner.hash), netns::record(req.netns())?) {
        if id.differs(&now) {
            return Err(CniError::internal(format!(
                "portmap: the attachment was made for network namespace {path:?}, not for CNI_NETNS"
            )));
        }
    }
    Ok(())
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
        let (entries, elems, notes) = attachment(&conf, &prev, &req.env.ifname, &owner)?;
        for n in notes {
            eprintln!("{n}");
        }
        let want =
            Want { tag: owner.tag.clone(), hash: owner.hash, elems, netns: netns::record(req.netns())? };
        let mut nf = nftables()?;
        let changed_udp = match nf.apply(&wire::fast_add_ops(&conf, &want)) {
            Ok(()) => table::udp_ports(want.elems.iter().map(|e| &e.key)),
            Err(e) => slow::add(&mut nf, &conf, &want, &owner, e.into())?,
        };
        if conf.snat && !conf.masq_all {
            if let Some(e) = entries.iter().find(|e| e.host.fam == Fam::V4) {
                enable_route_localnet(e.ctr.addr())?;
            }
        }
        flush_udp(changed_udp);
        Ok(prev)
    }

    fn del(&self, req: &Request) -> Result<()> {
        let t = load_teardown(req, "DEL")?;
        if !t.listed {
            return Ok(()); // nothing was mapped (upstream's early exit; GC is the safety net)
        }
        let ours = del_ours(req, &t);
        // Upstream-made state of this attachment (iptables CNI-DN-… chains and their jumps,
        // nftables `cni_hostport` rules): cni_common::upstream, docs/switching.md.
        ours.and(cni_common::upstream::hostport::del(req))
    }

    fn check(&self, req: &Request) -> Result<()> {
        let prev = req.prev_result()?.ok_or_else(|| CniError::config("Required prevResult missing"))?;
        // An attachment made by upstream (iptables or its nftables backend) is checked in its
        // own form instead of ours (before our validation: its configuration is upstream's).
        if cni_common::upstream::hostport::check(req)?.is_intact() {
            return Ok(());
        }
        let conf = load(req)?;
        if conf.mappings.is_empty() {
            return Ok(());
        }
        let owner = owner(req);
        let (_, elems, _) = attachment(&conf, &prev, &req.env.ifname, &owner)?;
        check_ours(req, &conf, &elems, &owner)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        load_teardown(req, "GC")?; // refuses hostile values; GC itself needs only the network name
                                   // Upstream-made leftovers of this network's attachments not in the valid list.
        let upstream = cni_common::upstream::hostport::gc(req);
        let valid: HashSet<String> =
            AttachmentId::valid_list(req)?.iter().map(AttachmentId::portmap_tag).collect();
        let prefix = portmap_net_prefix(req.network());
        let mut nf = match nftables() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("portmap: {}; nothing to collect", e.msg);
                return upstream;
            }
        };
        let gone = |tag: &str, _: Option<Hash>| tag.starts_with(&prefix) && !valid.contains(tag);
        let ports = slow::withdraw(&mut nf, &gone, true, "portmap: GC could not delete stale port mappings")?;
        flush_udp(ports);
        upstream
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        // Every change and read goes over netlink...
        let mut nf = nftables()?;
        nf.generation().map_err(|e| {
            CniError::new(code::NOT_AVAILABLE, format!("nf_tables is not usable (netlink): {e}"))
        })?;
        // Dry-run the whole static layout (with a masquerade set of each family): proves nat,
        // fib, vmap, masquerade and concatenated hash sets are usable in this kernel, without
        // committing anything. Over netlink too, unless conditions need nft (and then a
        // missing nft is reported).
        let cannot = |msg: String| {
            CniError::new(code::NOT_AVAILABLE, format!("nf_tables cannot hold the portmap rules: {msg}"))
        };
        let lens: layout::Lens = [(Fam::V4, 24), (Fam::V6, 64)].into();
        match wire::dnat_ops(&conf, &[], &lens) {
            Some(mut ops) => {
                ops.extend(wire::masq_ops(&lens, &[]));
                nf.validate(&ops).map_err(|e| cannot(e.to_string()))
            }
            None => {
                Nft::find()?.check(&layout::setup_script(&conf, &[], &lens, &[])).map_err(|e| cannot(e.msg))
            }
        }
    }
}

fn main() {
    cni_common::skel::run(&Portmap)
}
