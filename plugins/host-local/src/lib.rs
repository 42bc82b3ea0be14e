//! host-local IPAM: hands out addresses from per-node pools and records them in a store that
//! stays byte-compatible with upstream containernetworking/plugins host-local.
//! See README.md for the store, the index and the error codes.

#![warn(clippy::too_many_lines)]

pub mod config;
pub mod index;
pub mod liveness;
pub mod range;
pub mod record;
pub mod store;

use cni_common::attachment::AttachmentId;
use cni_common::error::{code, CniError, Result};
use cni_common::error_list::ErrorList;
use cni_common::spec::result::{CniResult, Dns, IpConfig};
use cni_common::{Plugin, Request};
use config::{read_resolv_conf, Config};
use ipnet::IpNet;
use liveness::Judge;
use range::{Range, RangeSet};
use record::Record;
use std::net::IpAddr;
use store::{Access, NsNote, Owner, Pending, Store};

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

/// The exhaustion reclaim of one ADD: it runs at most once per call.
#[derive(Default)]
pub struct Reclaim {
    done: bool,
}

impl Reclaim {
    /// Release every reservation whose attachment is provably gone, once per call. Returns
    /// whether anything was released.
    fn run(&mut self, store: &mut Store, network: &str) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        self.done = true;
        let mut judge = Judge::new(store.boot());
        let released = store.reclaim(|rec| judge.gone(rec))?;
        report(network, "the pool is exhausted", &released);
        Ok(!released.is_empty())
    }
}

/// One line on stderr per released reservation.
fn report(network: &str, when: &str, released: &[(IpAddr, Owner, String)]) {
    for (ip, owner, why) in released {
        cni_common::log!("host-local", "network {network}: {when}: released {ip} of {owner}: {why}");
    }
}

/// Once per boot (the first ADD after a boot id change): release the reservations recorded
/// in an earlier boot. Failures are reported and do not stop the ADD.
fn reclaim_after_reboot(store: &mut Store, network: &str) {
    // Unknown is alive: with this boot's id unreadable nothing is of "an earlier boot".
    let Some(boot) = store.boot() else { return };
    if store.records_boot().is_none_or(|b| b == boot) {
        return;
    }
    // a record that names no boot (all zero) proves nothing
    let earlier = |rec: &Record| rec.boot != boot && rec.boot != [0; 16];
    match store.reclaim(|rec| earlier(rec).then(|| "it was made before the last reboot".to_string())) {
        Ok(released) => {
            report(network, "first ADD since a reboot", &released);
            store.set_records_boot();
        }
        Err(e) => {
            cni_common::log!(
                "host-local",
                "network {network}: releasing reservations of an earlier boot: {}",
                e.msg
            )
        }
    }
}

/// `Some(why)` when the reservation of `ip` is recorded for a namespace that is provably gone.
fn dead_earlier_incarnation(store: &Store, ip: IpAddr) -> Option<String> {
    let rec = store.record(ip)?;
    if store.file_id(ip) != Some(rec.file) {
        return None;
    }
    Judge::new(store.boot()).gone(&rec)
}

/// Allocate one address in range set `idx` for `a` (the caller holds the store lock). When the
/// set is exhausted, reservations of provably dead attachments are released (once per call)
/// and the set is tried again.
pub fn allocate_in_set(
    store: &mut Store,
    set: &RangeSet,
    idx: usize,
    a: &AttachmentId,
    requested: Option<IpAddr>,
    reclaim: &mut Reclaim,
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
    for (slot, ip) in held.into_iter().filter(|(_, ip)| set.contains(*ip)) {
        // The same container and interface again (a runtime restarting a container under its
        // id): a reservation of its earlier, provably gone namespace is released.
        if let Some(why) = dead_earlier_incarnation(store, ip) {
            store.release(slot, ip)?;
            cni_common::log!(
                "host-local",
                "network {}: released {ip} of an earlier incarnation of container {} interface {}: {why}",
                a.network,
                a.container_id,
                a.ifname
            );
            continue;
        }
        return Err(CniError::internal(format!(
            "{ip} has been allocated to {}, duplicate allocation is not allowed",
            a.container_id
        )));
    }
    loop {
        let last = store.last_reserved(idx)?;
        for (cand, r) in set.candidates(last) {
            if store.reserve(&mut pending, cand, a)? {
                store.set_last_reserved(idx, cand)?;
                return Ok(ip_config(cand, r));
            }
        }
        if !reclaim.run(store, &a.network)? {
            return Err(CniError::internal(format!("no IP addresses available in range set: {set}")));
        }
    }
}

pub fn add(req: &Request) -> Result<CniResult> {
    let conf = Config::load(req)?;
    let dns = match &conf.resolv_conf {
        Some(p) => read_resolv_conf(p)?,
        None => Dns::default(),
    };
    let plan = plan_requests(&conf)?;
    let a = AttachmentId::of(req);
    // Looked at before the lock is taken: it is this call's own namespace.
    let note = liveness::capture(&req.env.netns).map(|(id, path)| NsNote { id, path });
    let mut store =
        Store::open(&conf.network_dir(), Access::Add, conf.lock_timeout)?.expect("created on demand");
    store.note = note;
    reclaim_after_reboot(&mut store, &conf.name);
    let mut reclaim = Reclaim::default();
    let mut ips: Vec<IpConfig> = Vec::with_capacity(conf.sets.len());
    let mut cursors = Vec::with_capacity(conf.sets.len());
    for (idx, set) in conf.sets.iter().enumerate() {
        cursors.push(store.cursor_snapshot(idx));
        match allocate_in_set(&mut store, set, idx, &a, plan[idx], &mut reclaim) {
            Ok(ipc) => ips.push(ipc),
            Err(e) => {
                rollback(store, &a, &ips, cursors);
                return Err(e.context(format!("failed to allocate for range {idx}")));
            }
        }
    }
    store.finish();
    Ok(CniResult { interfaces: Vec::new(), ips, routes: conf.routes.clone(), dns })
}

/// A failed ADD holds one lock for all its work: take back what this call reserved (and the
/// round-robin cursors it moved), nothing else. When all of it could be taken back the store
/// is left exactly as it was ([`Store::abort`]); otherwise what remains is recorded.
fn rollback(mut store: Store, a: &AttachmentId, ips: &[IpConfig], cursors: Vec<Option<Vec<u8>>>) {
    let mut clean = true;
    for done in ips {
        if let Err(re) = store.release_ip(a, done.address.addr()) {
            cni_common::log!("host-local", "rollback of {}: {re}", done.address.addr());
            clean = false;
        }
    }
    for (i, saved) in cursors.into_iter().enumerate() {
        if let Err(re) = store.restore_cursor(i, saved) {
            cni_common::log!("host-local", "rollback of last_reserved_ip.{i}: {re}");
            clean = false;
        }
    }
    if clean {
        store.abort();
    } else {
        store.finish();
    }
}

/// DEL: every reservation of the attachment is released (legacy id-only files when there is
/// no exact one); errors are collected with their codes. A reservation whose record shows it
/// is held for the same container and interface by another, live network namespace than the
/// one this DEL names is left alone (a late DEL of an earlier incarnation).
pub fn del(req: &Request) -> Result<()> {
    let conf = Config::load(req)?;
    let a = AttachmentId::of(req);
    let Some(mut store) = Store::open(&conf.network_dir(), Access::Change, conf.lock_timeout)? else {
        return Ok(());
    };
    let mut held = store.held_exact(&a)?;
    if held.is_empty() {
        // Files written by old upstream versions hold only the id.
        held = store.held_legacy(&a.container_id)?;
    }
    let mut errors = ErrorList::new();
    for (slot, ip) in held {
        if let Some(why) = late_del(&store, ip, &req.env.netns) {
            cni_common::log!(
                "host-local",
                "DEL of container {} interface {}: {ip} left alone: {why}",
                a.container_id,
                a.ifname
            );
            continue;
        }
        errors.take(store.release(slot, ip));
    }
    store.finish();
    errors.finish()
}

/// `Some(why)` when the reservation of `ip` is recorded for a live namespace other than the one
/// DEL names (`liveness::not_for_holder`). Only looked at when DEL names a namespace other
/// than the recorded path.
fn late_del(store: &Store, ip: IpAddr, netns: &str) -> Option<String> {
    if netns.is_empty() {
        return None;
    }
    let rec = store.record(ip)?;
    if rec.path == netns || store.file_id(ip) != Some(rec.file) {
        return None;
    }
    liveness::not_for_holder(&rec, store.boot(), netns)
}

/// CHECK: never writes (no lock file, no index, nothing).
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
    let Some(mut store) = Store::open(&conf.network_dir(), Access::Read, conf.lock_timeout)? else {
        return Err(not_found());
    };
    let mut held: Vec<IpAddr> = store.held_exact(&AttachmentId::of(req))?.into_iter().map(|h| h.1).collect();
    if held.is_empty() {
        held = store.held_legacy(id)?.into_iter().map(|h| h.1).collect();
    }
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
    let Some(mut store) = Store::open(&conf.network_dir(), Access::Change, conf.lock_timeout)? else {
        return Ok(());
    };
    let keep = |o: &Owner| match o {
        Owner::Attachment { id, ifname } => {
            valid.iter().any(|a| a.container_id == *id && a.ifname == *ifname)
        }
        // A legacy file names no interface: it stays while any attachment of its id is alive.
        Owner::Legacy { id } => valid.iter().any(|a| a.container_id == *id),
        Owner::Unknown => false,
        Owner::Foreign(_) => true,
    };
    let (removed, failed) = store.retain(keep)?;
    let mut errors = ErrorList::new();
    for e in failed {
        errors.push(e.context(format_args!("GC of network {}", conf.name)));
    }
    store.finish();
    if !removed.is_empty() {
        let list: Vec<String> = removed.iter().map(|ip| ip.to_string()).collect();
        cni_common::log!("host-local", "GC of network {} released {}", conf.name, list.join(" "));
    }
    errors.finish()
}

/// STATUS (README.md, "STATUS"): code 50 only when no ADD could work: the store is unusable.
/// An exhausted pool is reported by ADD, not here, unless `ipam.reportExhaustionInStatus`
/// asks for it; then a set counts as exhausted only when no address is free and no
/// reservation is provably dead (what ADD's reclaim would release). Writes nothing.
pub fn status(req: &Request) -> Result<()> {
    let conf = Config::load(req)?;
    let dir = conf.network_dir();
    Store::usable(&dir, conf.sets.len()).map_err(|why| {
        CniError::new(
            code::NOT_AVAILABLE,
            format!("host-local store of network {} is not usable: {why}", conf.name),
        )
        .with_details("no ADD can succeed until it is repaired")
    })?;
    if !conf.report_exhaustion_in_status {
        return Ok(());
    }
    let Some(store) = Store::open(&dir, Access::Read, conf.lock_timeout)? else {
        // Nothing reserved yet; only an empty range set could be exhausted.
        if let Some((i, s)) = conf.sets.iter().enumerate().find(|(_, s)| s.capacity() == 0) {
            return Err(exhausted(i, s));
        }
        return Ok(());
    };
    let mut judge: Option<(Judge, Vec<(IpAddr, Record)>)> = None;
    for (i, set) in conf.sets.iter().enumerate() {
        let last = store.last_reserved(i).map_err(|e| CniError::new(code::NOT_AVAILABLE, e.msg))?;
        if set.candidates(last).any(|(ip, _)| store.is_free(ip)) {
            continue;
        }
        let (j, records) = judge.get_or_insert_with(|| (Judge::new(store.boot()), store.records()));
        let reclaimable = records.iter().any(|(ip, rec)| {
            set.contains(*ip) && store.file_id(*ip) == Some(rec.file) && j.gone(rec).is_some()
        });
        if !reclaimable {
            return Err(exhausted(i, set));
        }
    }
    Ok(())
}

fn exhausted(i: usize, set: &RangeSet) -> CniError {
    CniError::new(code::NOT_AVAILABLE, format!("no IP addresses available in range set {i}: {set}"))
        .with_details(
            "ADD would fail until addresses are released (DEL or GC); no reservation is provably dead",
        )
}

#[cfg(test)]
mod twins;

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::spec::config::RangeConf;
    use std::path::PathBuf;

    pub(super) fn ip(s: &str) -> IpAddr {
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

    pub(super) fn set(specs: &[(&str, Option<&str>, Option<&str>)]) -> RangeSet {
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

    pub(super) fn config(sets: Vec<RangeSet>, requested: &[&str]) -> Config {
        Config {
            name: "net".into(),
            data_dir: PathBuf::from("/unused"),
            sets,
            routes: Vec::new(),
            resolv_conf: None,
            requested: requested.iter().map(|s| ip(s)).collect(),
            lock_timeout: store::DEFAULT_LOCK_TIMEOUT,
            report_exhaustion_in_status: false,
        }
    }

    pub(super) fn store(d: &tempfile::TempDir) -> Store {
        Store::open(&d.path().join("net"), Access::Add, store::DEFAULT_LOCK_TIMEOUT).unwrap().unwrap()
    }

    pub(super) fn alloc(s: &mut Store, set: &RangeSet, id: &str, req: Option<&str>) -> Result<String> {
        let a = AttachmentId::new("net", id, "eth0");
        allocate_in_set(s, set, 0, &a, req.map(ip), &mut Reclaim::default()).map(|c| c.address.to_string())
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
        assert_eq!(s.last_reserved(0).unwrap(), Some(ip("10.0.0.15")));
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

    /// A namespace that is gone: its path leads nowhere and nothing holds its identity.
    fn gone_note() -> Option<NsNote> {
        let path = format!("/run/netns/cni-rs-unit-gone-{}", std::process::id());
        Some(NsNote { id: cni_common::nsident::NsIdent { ino: 1, cookie: 1 }, path })
    }

    /// This test's own namespace, alive at its recorded path.
    fn live_note() -> Option<NsNote> {
        let (id, path) = liveness::capture(&format!("/proc/{}/ns/net", std::process::id())).unwrap();
        assert!(!path.is_empty());
        Some(NsNote { id, path })
    }

    /// One ADD call: allocate for each of `ids` with namespace `note` recorded.
    fn add_call(d: &tempfile::TempDir, set: &RangeSet, note: Option<NsNote>, ids: &[&str]) -> Vec<String> {
        let mut s = store(d);
        s.note = note;
        let got = ids.iter().map(|id| alloc(&mut s, set, id, None).unwrap()).collect();
        s.finish();
        got
    }

    fn exists(d: &tempfile::TempDir, ip: &str) -> bool {
        d.path().join("net").join(ip).exists()
    }

    #[test]
    fn an_exhausted_pool_takes_back_the_addresses_of_dead_pods_once_per_call() {
        let d = tempfile::tempdir().unwrap();
        let set = set(&[("192.168.1.0/29", None, None)]); // .2 … .6
        assert_eq!(add_call(&d, &set, gone_note(), &["a", "b"]), ["192.168.1.2/29", "192.168.1.3/29"]);
        assert_eq!(add_call(&d, &set, live_note(), &["c", "d"]), ["192.168.1.4/29", "192.168.1.5/29"]);
        assert_eq!(add_call(&d, &set, None, &["e"]), ["192.168.1.6/29"]);
        let mut s = store(&d);
        let mut reclaim = Reclaim::default();
        let mut next = |s: &mut Store, id: &str| {
            let a = AttachmentId::new("net", id, "eth0");
            allocate_in_set(s, &set, 0, &a, None, &mut reclaim).map(|c| c.address.to_string())
        };
        assert_eq!(next(&mut s, "f").unwrap(), "192.168.1.2/29", "a's and b's released");
        assert!(!exists(&d, "192.168.1.3"));
        assert_eq!(next(&mut s, "g").unwrap(), "192.168.1.3/29");
        // f's and g's records say gone too: only the once-per-call rule keeps them
        s.note = gone_note();
        s.finish();
        let e = next(&mut s, "h").unwrap_err();
        assert_eq!(
            e.msg, "no IP addresses available in range set: 192.168.1.1-192.168.1.6",
            "reclaimed once"
        );
        for live in ["192.168.1.4", "192.168.1.5", "192.168.1.6"] {
            assert!(exists(&d, live), "{live}: a live namespace or no record");
        }
    }

    #[test]
    fn the_first_add_after_a_reboot_releases_the_reservations_of_earlier_boots() {
        let d = tempfile::tempdir().unwrap();
        let set = set(&[("192.168.1.0/29", None, None)]);
        add_call(&d, &set, live_note(), &["a", "b"]);
        let records = d.path().join("net").join(record::RECORDS_DIR);
        let earlier_boot = |ip: &str| {
            let path = records.join(ip);
            let mut rec = Record::parse(&std::fs::read(&path).unwrap()).unwrap();
            rec.boot = [9; 16];
            std::fs::write(&path, rec.encode()).unwrap();
        };
        earlier_boot("192.168.1.2");
        std::fs::write(records.join(record::BOOT_MARKER), record::boot_marker(&[9; 16])).unwrap();
        let mut s = store(&d);
        reclaim_after_reboot(&mut s, "net");
        assert!(!exists(&d, "192.168.1.2"), "made before the reboot");
        assert!(exists(&d, "192.168.1.3"), "made in this boot, for a live namespace");
        let marker = std::fs::read(records.join(record::BOOT_MARKER)).unwrap();
        assert_eq!(record::parse_boot_marker(&marker), cni_common::nsident::boot_id());
        // once per boot: the next ADD does not look again
        earlier_boot("192.168.1.3");
        reclaim_after_reboot(&mut s, "net");
        assert!(exists(&d, "192.168.1.3"));
    }

    #[test]
    fn an_unknown_boot_releases_nothing_and_records_nothing() {
        // issue 27 finding 5: an unreadable boot id made every record "of an earlier boot"
        let d = tempfile::tempdir().unwrap();
        let set = set(&[("192.168.1.0/29", None, None)]); // .2 … .6
        add_call(&d, &set, gone_note(), &["a", "b", "c", "d", "e"]);
        let records = d.path().join("net").join(record::RECORDS_DIR);
        let marker = records.join(record::BOOT_MARKER);
        let mut s = store(&d);
        s.forget_boot();
        reclaim_after_reboot(&mut s, "net");
        assert!(exists(&d, "192.168.1.2"), "nothing is of an earlier boot when the boot is unknown");
        // an exhausted pool: the gone namespaces' reservations stay (no judgment is proof)
        let mut reclaim = Reclaim::default();
        let a = AttachmentId::new("net", "f", "eth0");
        let e = allocate_in_set(&mut s, &set, 0, &a, None, &mut reclaim).unwrap_err();
        assert!(e.msg.starts_with("no IP addresses available"), "{e:?}");
        for ip in ["192.168.1.2", "192.168.1.3", "192.168.1.4", "192.168.1.5", "192.168.1.6"] {
            assert!(exists(&d, ip), "{ip}");
        }
        drop(s);
        // no record written while blind: a later ADD that knows the boot misjudges nothing
        std::fs::remove_file(d.path().join("net/192.168.1.6")).unwrap();
        std::fs::remove_file(records.join("192.168.1.6")).unwrap();
        let mut s = store(&d);
        s.forget_boot();
        s.note = gone_note();
        let g = AttachmentId::new("net", "g", "eth0");
        allocate_in_set(&mut s, &set, 0, &g, None, &mut reclaim).unwrap();
        s.finish();
        assert!(exists(&d, "192.168.1.6"));
        assert!(!records.join("192.168.1.6").exists(), "no record without a boot id");
        // a record naming no boot (written blind by an earlier build) proves nothing either
        let path = records.join("192.168.1.2");
        let mut rec = Record::parse(&std::fs::read(&path).unwrap()).unwrap();
        rec.boot = [0; 16];
        std::fs::write(&path, rec.encode()).unwrap();
        std::fs::write(&marker, record::boot_marker(&[9; 16])).unwrap();
        drop(s);
        let mut s = store(&d);
        reclaim_after_reboot(&mut s, "net");
        assert!(exists(&d, "192.168.1.2"), "a zero boot is not an earlier boot");
        assert_eq!(Judge::new(s.boot()).gone(&rec), None);
    }

    #[test]
    fn a_container_restarted_under_its_id_gets_an_address_only_when_its_namespace_is_gone() {
        let d = tempfile::tempdir().unwrap();
        let set = set(&[("192.168.1.0/29", None, None)]);
        assert_eq!(add_call(&d, &set, gone_note(), &["a"]), ["192.168.1.2/29"]);
        assert_eq!(add_call(&d, &set, None, &["a"]), ["192.168.1.3/29"], "the gone one's address released");
        assert!(!exists(&d, "192.168.1.2"));
        add_call(&d, &set, live_note(), &["b"]);
        let e = alloc(&mut store(&d), &set, "b", None).unwrap_err();
        assert_eq!(e.msg, "192.168.1.4 has been allocated to b, duplicate allocation is not allowed");
        // a record that is not for the file there now (another writer replaced it) decides nothing
        add_call(&d, &set, gone_note(), &["c"]);
        let file = d.path().join("net/192.168.1.5");
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, "c\r\neth0").unwrap();
        let e = alloc(&mut store(&d), &set, "c", None).unwrap_err();
        assert_eq!(e.msg, "192.168.1.5 has been allocated to c, duplicate allocation is not allowed");
    }

    #[test]
    fn a_late_del_is_told_from_the_del_of_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let set = set(&[("192.168.1.0/29", None, None)]);
        let live = live_note().unwrap().path;
        add_call(&d, &set, live_note(), &["a"]);
        let s = store(&d);
        let a = ip("192.168.1.2");
        assert_eq!(late_del(&s, a, ""), None, "no namespace named: the DEL goes ahead");
        assert_eq!(late_del(&s, a, &live), None, "the holder's own DEL");
        let other = format!("/run/netns/cni-rs-unit-other-{}", std::process::id());
        assert_eq!(
            late_del(&s, a, &other),
            Some(format!(
                "DEL names network namespace {other}, but the address is held for this container and \
                 interface by the live network namespace {live}"
            ))
        );
        let file = d.path().join("net/192.168.1.2");
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, "a\r\neth0").unwrap();
        assert_eq!(late_del(&s, a, &other), None, "the record is for another file");
    }
}
