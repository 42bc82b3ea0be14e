//! The CNI plugin around this library (request in, side effects of the kernel's answers out:
//! `route_localnet` and its guard, UDP conntrack flushes, upstream's leftovers).
//!
//! DEL, CHECK and GC reach what lies beyond the library's pure parts through one seam,
//! [`Host`]: our table's kernel, upstream's state of the attachment (its iptables chains and
//! nftables `cni_hostport` rules, `crate::upstream`), the deletion marks, the namespace's
//! identity, `route_localnet`. [`System`] is the node; the unit tests (`plugin/tests.rs`) give a
//! fake node whose upstream part is `crate::upstream::fake::Fake` (upstream's iptables tables
//! and nftables backend) beside the fake table, so the order of the steps (CHECK judges
//! upstream's form first) and how DEL's and GC's errors combine are tested without root.

use crate::config::PortMapConf;
use crate::config::{Conf, Intent, Teardown};
use crate::flow;
use crate::kernel;
use crate::localnet;
use crate::marks::Marks;
use crate::model::Owner;
use crate::netns;
use crate::upstream::{self, seam::Upstream};
use cni_common::attachment::AttachmentId;

use crate::identity::{portmap_net_prefix, PortmapIdentity};
use cni_common::net::Family;
use cni_common::netlink::conntrack;
use cni_common::netlink::{Netlink, Route};
use cni_common::spec::result::CniResult;
use cni_common::{code, CniError, ErrorList, Plugin, Request, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The plugin: what `portmap`'s binary runs (and the fuzz target `entry`).
pub struct Portmap;

fn load(req: &Request) -> Result<Conf> {
    let conf = Conf::from_raw(&req.plugin_config()?)?;
    for n in &conf.notes {
        cni_common::log!("", "{n}");
    }
    Ok(conf)
}

/// The configuration as DEL and GC read it (see [`Teardown`]).
fn load_teardown(req: &Request, verb: &str) -> Result<Teardown> {
    let raw: PortMapConf = req.plugin_config()?;
    let t = Teardown::from_raw(&raw, verb)?;
    for n in &t.notes {
        cni_common::log!("", "{n}");
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

fn netlink() -> Result<Netlink> {
    Netlink::new().map_err(CniError::from)
}

/// Refuse container addresses the host holds itself (code 7): a DNAT there would lead
/// `<any address>:<hostPort>` into the host's own services (issue 27 finding 4). The pure
/// refusals (loopback, unspecified, multicast, link-local) are [`Intent::new`]'s. Returns the
/// kernel's route to each address, which `route_localnet` follows after the transaction.
fn refuse_local_targets(nl: &mut Netlink, intent: &Intent) -> Result<BTreeMap<IpAddr, Option<Route>>> {
    let mut routes = BTreeMap::new();
    for ip in intent.entries.iter().map(|e| e.ctr.addr()) {
        if routes.contains_key(&ip) {
            continue;
        }
        let best = localnet::best_route(nl, ip)?;
        if localnet::local_to_host(best.as_ref()) {
            return Err(CniError::config(format!(
                "prevResult gives the container the address {ip}, which is local to this host: host ports \
                 are never forwarded to the host's own addresses"
            )));
        }
        routes.insert(ip, best);
    }
    Ok(routes)
}

/// The localhost guard for an attachment without host ports whose host-side interfaces have
/// `route_localnet` on (set for another pod on the same bridge): after a ruleset flush the
/// sysctl stays and the guard must come back ([`localnet`]).
fn restore_guard(conf: &Conf, prev: &CniResult) -> Result<()> {
    if localnet::enabled_on(prev).is_empty() {
        return Ok(());
    }
    flow::guard(&mut nf_tables()?, &conf.conditions).map(|o| notes(&o))
}

fn flush_udp(ports: &BTreeSet<(Family, u16)>) {
    conntrack::flush_udp_ports("portmap", &ports.iter().copied().collect::<Vec<_>>());
}

fn notes(o: &flow::Outcome) {
    for n in &o.notes {
        cni_common::log!("", "{n}");
    }
}

/// What DEL, CHECK and GC reach beyond the library's pure parts (see the module's comment).
pub(crate) trait Host {
    /// Our table's kernel (nf_tables over netlink), or why it is not usable (code 4).
    fn tables(&mut self) -> Result<&mut dyn kernel::Kernel>;
    /// Upstream's host-port state: its iptables `nat` tables and nftables backend
    /// (`crate::upstream::seam`), which `crate::upstream` reads and changes.
    fn upstream(&mut self) -> &mut dyn Upstream;
    /// Mark `me` deleted before anything is deleted ([`Marks`]).
    fn mark_deleted(&mut self, me: &Owner) -> Result<()>;
    /// The identity of the request's network namespace now, when it can be recorded.
    fn netns_now(&mut self, req: &Request) -> Result<Option<crate::model::NsId>>;
    /// prevResult's host-side interfaces whose `route_localnet` is on.
    fn localnet_on(&mut self, prev: &CniResult) -> Vec<String>;
    /// Forget conntrack's UDP flows to these host ports.
    fn flush_udp(&mut self, ports: &BTreeSet<(Family, u16)>);
}

/// The node.
#[derive(Default)]
pub(crate) struct System {
    nf: Option<kernel::Netlink>,
    upstream: crate::upstream::seam::System,
}

impl Host for System {
    fn tables(&mut self) -> Result<&mut dyn kernel::Kernel> {
        if self.nf.is_none() {
            self.nf = Some(nf_tables()?);
        }
        Ok(self.nf.as_mut().expect("opened above"))
    }
    fn upstream(&mut self) -> &mut dyn Upstream {
        &mut self.upstream
    }
    fn mark_deleted(&mut self, me: &Owner) -> Result<()> {
        Marks::system().mark_deleted(me)
    }
    fn netns_now(&mut self, req: &Request) -> Result<Option<crate::model::NsId>> {
        Ok(netns::record(req)?.map(|(id, _)| id))
    }
    fn localnet_on(&mut self, prev: &CniResult) -> Vec<String> {
        localnet::enabled_on(prev)
    }
    fn flush_udp(&mut self, ports: &BTreeSet<(Family, u16)>) {
        flush_udp(ports)
    }
}

/// DEL removes everything the attachment has, whatever the configuration says (its mappings,
/// when valid and with prevResult, only let it go straight to the elements). Every step is
/// tried; the errors are reported together.
pub(crate) fn del_with(h: &mut dyn Host, req: &Request) -> Result<()> {
    let t = load_teardown(req, "DEL")?;
    let me = owner(req);
    // marked before anything is deleted, under the lock resync's rebuild holds: a rebuild
    // either sees the mark or comes before it, and then this deletion removes what it made
    // ([`crate::marks`]). Deleting goes on when the mark cannot be made; the error is then
    // reported (the runtime tries DEL again).
    let marked = h.mark_deleted(&me);
    let ours = match h.tables() {
        Ok(k) => {
            let intent = t
                .conf()
                .zip(req.prev.as_ref())
                .and_then(|(c, prev)| Intent::new(&c, prev, &req.env.ifname, me.clone(), None).ok())
                .map(|(i, _)| i);
            flow::del(k, &me, intent.as_ref()).map(|done| h.flush_udp(&done.udp))
        }
        Err(e) => {
            cni_common::log!("portmap", "{}; nothing to delete", e.msg);
            Ok(())
        }
    };
    // Upstream-made state of this attachment (iptables CNI-DN-… chains and their jumps,
    // nftables `cni_hostport` rules): crate::upstream, docs/switching.md.
    let mut errors = ErrorList::new();
    errors.take(ours);
    errors.take(upstream::del(h.upstream(), req));
    errors.take(marked);
    errors.finish()
}

/// CHECK: an attachment made by upstream (iptables or its nftables backend) is checked in its
/// own form instead of ours (before our validation: its configuration is upstream's).
pub(crate) fn check_with(h: &mut dyn Host, req: &Request) -> Result<()> {
    let prev = req.prev_result()?.ok_or_else(|| CniError::config("Required prevResult missing"))?;
    if upstream::check(h.upstream(), req)?.is_intact() {
        return Ok(());
    }
    let conf = load(req)?;
    if conf.mappings.is_empty() {
        let on = h.localnet_on(&prev);
        if on.is_empty() {
            return Ok(());
        }
        let missing = flow::guard_missing(h.tables()?, &conf.conditions)?;
        if missing.is_empty() {
            return Ok(());
        }
        return Err(CniError::internal(format!(
            "portmap: route_localnet is on for {on:?}, but the localhost guard is not intact: {}",
            missing.join("; ")
        )));
    }
    let now = h.netns_now(req)?;
    let (intent, _) = Intent::new(&conf, &prev, &req.env.ifname, owner(req), None)?;
    let mut notes = Vec::new();
    let checked = flow::check(h.tables()?, &conf, &intent, now, &mut notes);
    for n in notes {
        cni_common::log!("", "{n}");
    }
    checked
}

/// GC: upstream's leftovers and ours of the network's attachments not in the valid list.
pub(crate) fn gc_with(h: &mut dyn Host, req: &Request) -> Result<()> {
    load_teardown(req, "GC")?; // refuses hostile values; GC itself needs only the network name
    let valid: BTreeSet<String> =
        AttachmentId::valid_list(req)?.iter().map(AttachmentId::portmap_tag).collect();
    let mut errors = ErrorList::new();
    errors.take(upstream::gc(h.upstream(), req));
    let ours = match h.tables() {
        Ok(k) => flow::gc(k, &portmap_net_prefix(req.network()), &valid).map(|done| h.flush_udp(&done.udp)),
        Err(e) => {
            cni_common::log!("portmap", "{}; nothing to collect", e.msg);
            Ok(())
        }
    };
    errors.take(ours);
    errors.finish()
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
        // a DEL of this attachment (same container id and interface) may have marked it: it
        // lives again, and resync may rebuild it from the cache entry this ADD leads to
        Marks::system().unmark(&owner(req))?;
        if conf.mappings.is_empty() {
            restore_guard(&conf, &prev)?;
            return Ok(prev);
        }
        let record = netns::record(req)?;
        let (intent, intent_notes) = Intent::new(&conf, &prev, &req.env.ifname, owner(req), record)?;
        for n in intent_notes {
            cni_common::log!("", "{n}");
        }
        // one rtnetlink socket and one route lookup per container address serve both the
        // refusal and route_localnet
        let mut nl = netlink()?;
        let routes = refuse_local_targets(&mut nl, &intent)?;
        let done = flow::add(&mut nf_tables()?, &conf, &intent, &netns::gone)?;
        notes(&done);
        if conf.snat {
            if let Some(e) = intent.entries.iter().find(|e| e.host.fam == Family::V4) {
                let ip = e.ctr.addr();
                localnet::enable(&mut nl, &prev, ip, routes.get(&ip).and_then(Option::as_ref))?;
            }
        }
        flush_udp(&done.udp);
        Ok(prev)
    }

    fn del(&self, req: &Request) -> Result<()> {
        del_with(&mut System::default(), req)
    }

    fn check(&self, req: &Request) -> Result<()> {
        check_with(&mut System::default(), req)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        gc_with(&mut System::default(), req)
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

#[cfg(test)]
mod tests;
