//! host-local IPAM: hands out addresses from per-node pools and records them in a store that
//! stays byte-compatible with upstream containernetworking/plugins host-local.
//! See README.md for the store, the index and the error codes.

#![warn(clippy::too_many_lines)]

pub mod config;
pub mod index;
pub mod range;
pub mod store;

use cni_common::attachment::AttachmentId;
use cni_common::error::{code, CniError, Result};
use cni_common::error_list::ErrorList;
use cni_common::spec::result::{CniResult, Dns, IpConfig};
use cni_common::{Plugin, Request};
use config::{read_resolv_conf, Config};
use ipnet::IpNet;
use range::{Range, RangeSet};
use std::net::IpAddr;
use store::{Owner, Pending, Store};

pub struct HostLocal;

/// The identity this build's host-local binary carries in its `.cni_rs_ident` section
/// (`cni_common::ident`): magic, name, version, commit and random per-build id (build.rs).
/// A bridge of the same build runs host-local in-process only when the file on CNI_PATH
/// carries exactly these bytes.
pub const BUILD_IDENTITY: &[u8] = concat!(
    "cni-rs build identity v1\0",
    "host-local\0",
    env!("CARGO_PKG_VERSION"),
    "\0",
    env!("HOST_LOCAL_BUILD_ID"),
    "\0"
)
.as_bytes();

impl Plugin for HostLocal {
    fn name(&self) -> &'static str {
        "host-local"
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        add(req)
    }

    fn del(&self, req: &Request) -> Result<()> {
        del(req)
    }

    fn check(&self, req: &Request) -> Result<()> {
        check(req)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        gc(req)
    }

    fn status(&self, req: &Request) -> Result<()> {
        status(req)
    }
}

/// Bind each requested address to the first range set containing it (one per set), and reject
/// requests that can never be satisfied before anything is created.
pub fn plan_requests(conf: &Config) -> Result<Vec<Option<IpAddr>>> {
    let mut left: Vec<IpAddr> = conf.requested.clone();
    let mut plan = vec![None; conf.sets.len()];
    for (i, set) in conf.sets.iter().enumerate() {
        if let Some(pos) = left.iter().position(|ip| set.contains(*ip)) {
            let ip = left.remove(pos);
            let r = set.range_for(ip).expect("contains");
            if ip == r.gateway {
                return Err(CniError::config(format!("requested ip {ip} is subnet's gateway"))
                    .with_details(format!("range set {i} ({set}) uses {ip} as gateway of {}", r.subnet)));
            }
            plan[i] = Some(ip);
        }
    }
    if !left.is_empty() {
        let list: Vec<String> = left.iter().map(|ip| ip.to_string()).collect();
        let sets: Vec<String> = conf.sets.iter().enumerate().map(|(i, s)| format!("{i}: {s}")).collect();
        return Err(CniError::config(format!("failed to allocate all requested IPs: {}", list.join(" ")))
            .with_details(format!(
                "each requested IP must lie inside a range of a different range set; range sets are [{}]",
                sets.join("; ")
            )));
    }
    Ok(plan)
}

fn ip_config(ip: IpAddr, r: &Range) -> IpConfig {
    IpConfig {
        interface: None,
        address: IpNet::new(ip, r.subnet.prefix_len()).expect("prefix of a valid subnet"),
        gateway: Some(r.gateway),
    }
}

/// Allocate one address in range set `idx` for `a` (the caller holds the store lock).
pub fn allocate_in_set(
    store: &mut Store,
    set: &RangeSet,
    idx: usize,
    a: &AttachmentId,
    requested: Option<IpAddr>,
) -> Result<IpConfig> {
    let mut pending: Option<Pending> = None;
    if let Some(ip) = requested {
        let r = set.range_for(ip).expect("planned into this set");
        if !store.reserve(&mut pending, ip, a)? {
            let holder = store.owner_of(ip)?.map(|o| o.to_string()).unwrap_or_else(|| "nobody".into());
            return Err(CniError::internal(format!(
                "requested IP address {ip} is not available in range set {set}"
            ))
            .with_details(format!("{ip} is reserved by {holder}")));
        }
        store.set_last_reserved(idx, ip)?;
        return Ok(ip_config(ip, r));
    }
    let mut held = store.held_exact(a)?;
    held.extend(store.held_legacy(&a.container_id)?);
    if let Some((_, ip)) = held.iter().find(|(_, ip)| set.contains(*ip)) {
        return Err(CniError::internal(format!(
            "{ip} has been allocated to {}, duplicate allocation is not allowed",
            a.container_id
        )));
    }
    let last = store.last_reserved(idx);
    for (cand, r) in set.candidates(last) {
        if store.reserve(&mut pending, cand, a)? {
            store.set_last_reserved(idx, cand)?;
            return Ok(ip_config(cand, r));
        }
    }
    Err(CniError::internal(format!("no IP addresses available in range set: {set}")))
}

pub fn add(req: &Request) -> Result<CniResult> {
    let conf = Config::load(req)?;
    let dns = match &conf.resolv_conf {
        Some(p) => read_resolv_conf(p)?,
        None => Dns::default(),
    };
    let plan = plan_requests(&conf)?;
    let a = AttachmentId::of(req);
    let mut store = Store::open(&conf.network_dir(), true)?.expect("created on demand");
    let mut ips: Vec<IpConfig> = Vec::with_capacity(conf.sets.len());
    let mut cursors = Vec::with_capacity(conf.sets.len());
    for (idx, set) in conf.sets.iter().enumerate() {
        cursors.push(store.cursor_snapshot(idx));
        match allocate_in_set(&mut store, set, idx, &a, plan[idx]) {
            Ok(ipc) => ips.push(ipc),
            Err(e) => {
                rollback(store, &a, &ips, cursors);
                return Err(e.context(format!("failed to allocate for range {idx}")));
            }
        }
    }
    store.finish()?;
    Ok(CniResult { interfaces: Vec::new(), ips, routes: conf.routes.clone(), dns })
}

/// A failed ADD holds one lock for all its work: take back what this call reserved (and the
/// round-robin cursors it moved), nothing else. When all of it could be taken back the store
/// is left exactly as it was ([`Store::abort`]); otherwise what remains is recorded.
fn rollback(mut store: Store, a: &AttachmentId, ips: &[IpConfig], cursors: Vec<Option<Vec<u8>>>) {
    let mut clean = true;
    for done in ips {
        if let Err(re) = store.release_ip(a, done.address.addr()) {
            eprintln!("host-local: rollback of {}: {re}", done.address.addr());
            clean = false;
        }
    }
    for (i, saved) in cursors.into_iter().enumerate() {
        if let Err(re) = store.restore_cursor(i, saved) {
            eprintln!("host-local: rollback of last_reserved_ip.{i}: {re}");
            clean = false;
        }
    }
    if clean {
        store.abort();
    } else if let Err(e) = store.finish() {
        eprintln!("host-local: record the store after a failed rollback: {e}");
    }
}

/// DEL: every reservation of the attachment is released (legacy id-only files when there is
/// no exact one); errors are collected with their codes.
pub fn del(req: &Request) -> Result<()> {
    let conf = Config::load(req)?;
    let a = AttachmentId::of(req);
    let Some(mut store) = Store::open(&conf.network_dir(), false)? else {
        return Ok(());
    };
    let mut held = store.held_exact(&a)?;
    if held.is_empty() {
        // Files written by old upstream versions hold only the id.
        held = store.held_legacy(&a.container_id)?;
    }
    let mut errors = ErrorList::new();
    for (slot, ip) in held {
        errors.take(store.release(slot, ip));
    }
    errors.take(store.finish());
    errors.finish()
}

pub fn check(req: &Request) -> Result<()> {
    let conf = Config::load(req)?;
    let prev = req.prev_result()?;
    let (id, ifname) = (req.env.container_id.as_str(), req.env.ifname.as_str());
    let not_found = || {
        CniError::internal(format!("host-local: Failed to find address added by container {id}"))
            .with_details(format!(
                "no reservation for container {id} interface {ifname} in {}",
                conf.network_dir().display()
            ))
    };
    let Some(mut store) = Store::open(&conf.network_dir(), false)? else {
        return Err(not_found());
    };
    let mut held: Vec<IpAddr> = store.held_exact(&AttachmentId::of(req))?.into_iter().map(|h| h.1).collect();
    if held.is_empty() {
        held = store.held_legacy(id)?.into_iter().map(|h| h.1).collect();
    }
    store.finish()?;
    drop(store);
    if held.is_empty() {
        return Err(not_found());
    }
    let Some(prev) = prev else { return Ok(()) };
    let ours: Vec<IpAddr> = prev
        .ips
        .iter()
        .map(|i| i.address.addr())
        .filter(|ip| conf.sets.iter().any(|s| s.contains(*ip)))
        .collect();
    if let Some(ip) = ours.iter().find(|ip| !held.contains(ip)) {
        return Err(CniError::internal(format!(
            "host-local: address {ip} from prevResult is not reserved for container {id} interface {ifname}"
        )));
    }
    if let Some(ip) = held.iter().find(|ip| !ours.contains(ip)) {
        return Err(CniError::internal(format!(
            "host-local: address {ip} reserved for container {id} interface {ifname} is missing from prevResult"
        )));
    }
    Ok(())
}

pub fn gc(req: &Request) -> Result<()> {
    let conf = Config::load(req)?;
    let valid = req.valid_attachments()?;
    let Some(mut store) = Store::open(&conf.network_dir(), false)? else {
        return Ok(());
    };
    let keep = |o: &Owner| match o {
        Owner::Attachment { id, ifname } => {
            valid.iter().any(|a| a.container_id == *id && a.ifname == *ifname)
        }
        // A legacy file names no interface: it stays while any attachment of its id is alive.
        Owner::Legacy { id } => valid.iter().any(|a| a.container_id == *id),
        Owner::Unknown => false,
    };
    let (removed, failed) = store.retain(keep)?;
    let mut errors = ErrorList::new();
    for e in failed {
        errors.push(e.context(format_args!("GC of network {}", conf.name)));
    }
    errors.take(store.finish());
    if !removed.is_empty() {
        let list: Vec<String> = removed.iter().map(|ip| ip.to_string()).collect();
        eprintln!("host-local: GC of network {} released {}", conf.name, list.join(" "));
    }
    errors.finish()
}

pub fn status(req: &Request) -> Result<()> {
    let conf = Config::load(req)?;
    let Some(store) = Store::open(&conf.network_dir(), false)? else {
        // Nothing reserved yet; only an empty range set could be exhausted.
        if let Some((i, s)) = conf.sets.iter().enumerate().find(|(_, s)| s.capacity() == 0) {
            return Err(exhausted(i, s));
        }
        return Ok(());
    };
    for (i, set) in conf.sets.iter().enumerate() {
        let last = store.last_reserved(i);
        if !set.candidates(last).any(|(ip, _)| store.is_free(ip)) {
            return Err(exhausted(i, set));
        }
    }
    Ok(())
}

fn exhausted(i: usize, set: &RangeSet) -> CniError {
    CniError::new(code::NOT_AVAILABLE, format!("no IP addresses available in range set {i}: {set}"))
        .with_details("ADD would fail until addresses are released (DEL or GC)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::spec::config::RangeConf;
    use std::path::PathBuf;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn build_identity_shape() {
        let id = BUILD_IDENTITY;
        assert!(id.starts_with(cni_common::ident::MAGIC), "magic");
        let fields: Vec<&[u8]> = id[cni_common::ident::MAGIC.len()..].split(|&b| b == 0).collect();
        assert_eq!(fields.len(), 4, "name, version, build id, then the final NUL: {fields:?}");
        assert_eq!(fields[0], b"host-local");
        assert_eq!(fields[1], env!("CARGO_PKG_VERSION").as_bytes());
        let build = std::str::from_utf8(fields[2]).unwrap();
        assert!(build.starts_with("commit=") && build.contains(" id="), "{build}");
        assert!(fields[3].is_empty());
    }

    fn set(specs: &[(&str, Option<&str>, Option<&str>)]) -> RangeSet {
        let confs: Vec<RangeConf> = specs
            .iter()
            .map(|(s, a, b)| RangeConf {
                subnet: s.parse().unwrap(),
                range_start: a.map(ip),
                range_end: b.map(ip),
                gateway: None,
            })
            .collect();
        RangeSet::canonicalize(&confs).unwrap()
    }

    fn config(sets: Vec<RangeSet>, requested: &[&str]) -> Config {
        Config {
            name: "net".into(),
            data_dir: PathBuf::from("/unused"),
            sets,
            routes: Vec::new(),
            resolv_conf: None,
            requested: requested.iter().map(|s| ip(s)).collect(),
        }
    }

    fn store(d: &tempfile::TempDir) -> Store {
        Store::open(&d.path().join("net"), true).unwrap().unwrap()
    }

    fn alloc(s: &mut Store, set: &RangeSet, id: &str, req: Option<&str>) -> Result<String> {
        allocate_in_set(s, set, 0, &AttachmentId::new("net", id, "eth0"), req.map(ip))
            .map(|c| c.address.to_string())
    }

    #[test]
    fn round_robin_and_exhaustion() {
        let d = tempfile::tempdir().unwrap();
        let mut s = store(&d);
        let set = set(&[("192.168.1.0/29", None, None)]); // .2 … .6 allocatable
        let got: Vec<String> =
            ["a", "b", "c", "d", "e"].iter().map(|id| alloc(&mut s, &set, id, None).unwrap()).collect();
        assert_eq!(
            got,
            ["192.168.1.2/29", "192.168.1.3/29", "192.168.1.4/29", "192.168.1.5/29", "192.168.1.6/29"]
        );
        let e = alloc(&mut s, &set, "f", None).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (999, "no IP addresses available in range set: 192.168.1.1-192.168.1.6")
        );
        // free .3: the next ADD finds it although the cursor is at .6
        let (slot, _) = s.held_exact(&AttachmentId::new("net", "b", "eth0")).unwrap()[0];
        s.release(slot, ip("192.168.1.3")).unwrap();
        assert_eq!(alloc(&mut s, &set, "f", None).unwrap(), "192.168.1.3/29");
    }

    #[test]
    fn requested_ip_success_taken_and_duplicates() {
        let d = tempfile::tempdir().unwrap();
        let mut s = store(&d);
        let set = set(&[("10.0.0.0/24", Some("10.0.0.10"), Some("10.0.0.20"))]);
        assert_eq!(alloc(&mut s, &set, "a", Some("10.0.0.15")).unwrap(), "10.0.0.15/24");
        assert_eq!(s.last_reserved(0), Some(ip("10.0.0.15")));
        let e = alloc(&mut s, &set, "b", Some("10.0.0.15")).unwrap_err();
        assert_eq!(e.msg, "requested IP address 10.0.0.15 is not available in range set 10.0.0.10-10.0.0.20");
        assert_eq!(e.details, "10.0.0.15 is reserved by container a interface eth0");
        let e = alloc(&mut s, &set, "a", None).unwrap_err();
        assert_eq!(e.msg, "10.0.0.15 has been allocated to a, duplicate allocation is not allowed");
        // the next automatic allocation continues after the requested one
        assert_eq!(alloc(&mut s, &set, "c", None).unwrap(), "10.0.0.16/24");
    }

    #[test]
    fn requested_ip_outside_range_bounds_or_gateway_is_rejected_up_front() {
        let sets = vec![set(&[("10.0.0.0/24", Some("10.0.0.10"), Some("10.0.0.20"))])];
        for bad in ["10.0.0.21", "10.0.0.9", "10.0.1.15"] {
            let e = plan_requests(&config(sets.clone(), &[bad])).unwrap_err();
            assert_eq!((e.code, e.msg.clone()), (7, format!("failed to allocate all requested IPs: {bad}")));
        }
        let gw = vec![set(&[("10.0.0.0/24", None, None)])];
        let e = plan_requests(&config(gw, &["10.0.0.1"])).unwrap_err();
        assert_eq!(e.msg, "requested ip 10.0.0.1 is subnet's gateway");
    }

    #[test]
    fn requested_ips_are_bound_to_the_first_containing_set() {
        let sets = vec![
            set(&[("10.0.0.0/24", None, None)]),
            set(&[("2001:db8::/64", None, None)]),
            set(&[("10.0.1.0/24", None, None)]),
        ];
        let plan = plan_requests(&config(sets.clone(), &["10.0.1.5", "2001:db8::5"])).unwrap();
        assert_eq!(plan, vec![None, Some(ip("2001:db8::5")), Some(ip("10.0.1.5"))]);
        let e = plan_requests(&config(sets, &["10.0.0.5", "10.0.0.6"])).unwrap_err();
        assert_eq!(e.msg, "failed to allocate all requested IPs: 10.0.0.6");
    }

    #[test]
    fn multi_range_set_moves_to_the_next_range() {
        let d = tempfile::tempdir().unwrap();
        let mut s = store(&d);
        let set = set(&[
            ("10.0.0.0/24", Some("10.0.0.253"), None),
            ("10.0.5.0/24", Some("10.0.5.100"), Some("10.0.5.100")),
        ]);
        let got: Vec<String> =
            ["a", "b", "c"].iter().map(|id| alloc(&mut s, &set, id, None).unwrap()).collect();
        assert_eq!(got, ["10.0.0.253/24", "10.0.0.254/24", "10.0.5.100/24"]);
        assert!(alloc(&mut s, &set, "d", None).is_err());
    }
}
