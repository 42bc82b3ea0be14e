//! `portmap`: the CNI plugin around the [`portmap`] library (request in, side effects of the
//! kernel's answers out: `route_localnet`, UDP conntrack flushes, upstream's leftovers).

#![warn(clippy::too_many_lines)]

cni_common::global_allocator!();

use cni_common::attachment::{portmap_net_prefix, AttachmentId};
use cni_common::net::Family;
use cni_common::netlink::conntrack;
use cni_common::netlink::{Netlink, RouteKind};
use cni_common::spec::config::PortMapConf;
use cni_common::spec::result::CniResult;
use cni_common::{code, sysctl, CniError, ErrorList, Plugin, Request, Result};
use portmap::config::{Conf, Intent, Teardown};
use portmap::flow;
use portmap::kernel;
use portmap::model::Owner;
use portmap::netns;
use std::collections::BTreeSet;
use std::net::IpAddr;

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

fn nf_tables() -> Result<kernel::Netlink> {
    kernel::Netlink::new()
        .map_err(|e| CniError::new(code::NOT_AVAILABLE, format!("nf_tables is not usable (netlink): {e}")))
}

/// `route_localnet=1` on the interface that routes to the container, so that connections to
/// 127.0.0.1:<hostPort> can be DNATed out of the host (as upstream does whenever `snat` is on).
/// The table's `localnet` guard keeps containers from using it to reach the host's loopback.
fn enable_route_localnet(ctr: IpAddr) -> Result<()> {
    let mut nl = Netlink::new().map_err(CniError::from)?;
    // the kernel's own choice for the container's address: one lookup, not a dump of every route
    let best = nl.route_get(ctr).map_err(CniError::from)?.filter(|r| r.kind == RouteKind::Unicast);
    let Some(oif) = best.and_then(|r| r.oif.or_else(|| r.nexthops.first().and_then(|h| h.oif))) else {
        eprintln!("portmap: note: no route to {ctr} in the host; route_localnet not set");
        return Ok(());
    };
    let Some(link) = nl.link_by_index(oif).map_err(CniError::from)? else { return Ok(()) };
    sysctl::set(&sysctl::iface_key("ipv4", &link.name, "route_localnet"), "1")?;
    Ok(())
}

fn flush_udp(ports: &BTreeSet<(Family, u16)>) {
    conntrack::flush_udp_ports("portmap", &ports.iter().copied().collect::<Vec<_>>());
}

fn notes(o: &flow::Outcome) {
    for n in &o.notes {
        eprintln!("{n}");
    }
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
        let record = netns::record(req)?;
        let (intent, intent_notes) = Intent::new(&conf, &prev, &req.env.ifname, owner(req), record)?;
        for n in intent_notes {
            eprintln!("{n}");
        }
        let done = flow::add(&mut nf_tables()?, &conf, &intent, &netns::gone)?;
        notes(&done);
        if conf.snat {
            if let Some(e) = intent.entries.iter().find(|e| e.host.fam == Family::V4) {
                enable_route_localnet(e.ctr.addr())?;
            }
        }
        flush_udp(&done.udp);
        Ok(prev)
    }

    /// DEL removes everything the attachment has, whatever the configuration says (its
    /// mappings, when valid and with prevResult, only let it go straight to the elements).
    fn del(&self, req: &Request) -> Result<()> {
        let t = load_teardown(req, "DEL")?;
        let me = owner(req);
        let ours = match nf_tables() {
            Ok(mut k) => {
                let intent = t
                    .conf()
                    .zip(req.prev.as_ref())
                    .and_then(|(c, prev)| Intent::new(&c, prev, &req.env.ifname, me.clone(), None).ok())
                    .map(|(i, _)| i);
                flow::del(&mut k, &me, intent.as_ref()).map(|done| flush_udp(&done.udp))
            }
            Err(e) => {
                eprintln!("portmap: {}; nothing to delete", e.msg);
                Ok(())
            }
        };
        // Upstream-made state of this attachment (iptables CNI-DN-… chains and their jumps,
        // nftables `cni_hostport` rules): cni_common::upstream, docs/switching.md.
        let mut errors = ErrorList::new();
        errors.take(ours);
        errors.take(cni_common::upstream::hostport::del(req));
        errors.finish()
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
        let now = netns::record(req)?;
        let (intent, _) = Intent::new(&conf, &prev, &req.env.ifname, owner(req), None)?;
        let mut notes = Vec::new();
        let checked = flow::check(&mut nf_tables()?, &conf, &intent, now.map(|(id, _)| id), &mut notes);
        for n in notes {
            eprintln!("{n}");
        }
        checked
    }

    fn gc(&self, req: &Request) -> Result<()> {
        load_teardown(req, "GC")?; // refuses hostile values; GC itself needs only the network name
        let valid: BTreeSet<String> =
            AttachmentId::valid_list(req)?.iter().map(AttachmentId::portmap_tag).collect();
        let mut errors = ErrorList::new();
        // Upstream-made leftovers of this network's attachments not in the valid list.
        errors.take(cni_common::upstream::hostport::gc(req));
        let ours = match nf_tables() {
            Ok(mut k) => {
                flow::gc(&mut k, &portmap_net_prefix(req.network()), &valid).map(|done| flush_udp(&done.udp))
            }
            Err(e) => {
                eprintln!("portmap: {}; nothing to collect", e.msg);
                Ok(())
            }
        };
        errors.take(ours);
        errors.finish()
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        flow::status(
            &mut nf_tables()?,
            &conf,
            Some(std::path::Path::new(cni_common::netlink::nft::certify::DIR)),
        )
    }
}

fn main() {
    cni_common::skel::run(&Portmap)
}
