//! The firewall plugin's resync surface: what `cni-migrate resync` asks of it after the
//! firewall was reloaded (`nft flush ruleset`, `systemctl reload nftables`, iptables-restore
//! of a saved ruleset), for one attachment the runtime still has. The request is the one
//! libcni's cache gives: the plugin's cached configuration, CNI_NETNS and ifname, and the
//! cached result as prevResult.
//!
//! - [`judge`]: what of the attachment's chains and rules is missing, judged as CHECK judges
//!   it ([`check::missing`]) in the backend its record names (the backend its ADD chose: the
//!   default rule follows what the host showed then, see [`crate::backend`]), with the record's
//!   firewalld zone. An attachment without its record, with a record of other addresses than
//!   the cached result's, or whose backend cannot be read now, cannot be judged: an error,
//!   which resync reports as such (never as intact).
//! - [`rebuild`]: ADD's rules for that backend ([`add::apply`]; the record is left as it is),
//!   judged again afterwards.
//! - [`Rebuilt::undo`]: what was rebuilt taken back (the runtime's DEL began meanwhile), for
//!   the addresses no other recorded attachment holds.

use crate::backend::{self, Chosen};
use crate::config::{Conf, Intent};
use crate::record::{self, Record};
use crate::{add, check};
use cni_common::net::Family;
use cni_common::{code, AttachmentId, CniError, ErrorList, Request, Result};
use serde_json::Value;
use std::net::IpAddr;
use std::path::Path;

/// One attachment as resync sees it: its configuration, the intent of its cached result, the
/// backend and zone of its record.
struct Seen {
    conf: Conf,
    intent: Intent,
    backend: Chosen,
    me: AttachmentId,
}

/// Why an attachment cannot be judged: code 50 (resync names it, never counts it intact).
fn unjudged(msg: String) -> CniError {
    CniError::new(code::NOT_AVAILABLE, msg)
}

fn seen(root: &Path, req: &Request) -> Result<Seen> {
    let conf = Conf::from_raw(&req.plugin_config::<Value>()?)?;
    let prev =
        req.prev_result()?.ok_or_else(|| CniError::config("no result to judge against (prevResult)"))?;
    let intent = Intent::new(&conf, &prev)?;
    let me = AttachmentId::of(req);
    let rec: Record = record::read(root, &me).ok_or_else(|| {
        unjudged(format!(
            "no firewall record of this attachment in {}: which backend its ADD used is not known",
            root.display()
        ))
    })?;
    let mut recorded = rec.addrs.clone();
    let mut cached = intent.addrs.clone();
    recorded.sort();
    cached.sort();
    if recorded != cached {
        return Err(unjudged(format!(
            "its firewall record names the addresses {recorded:?}, the cached result {cached:?}: \
             the record is not of the ADD that was cached"
        )));
    }
    // Record::parse reads back only the backends `from_name` knows
    let backend = Chosen::from_name(&rec.backend)
        .ok_or_else(|| unjudged(format!("its firewall record names no backend ({:?})", rec.backend)))?;
    Ok(Seen { conf: Conf { zone: rec.zone, ..conf }, intent, backend, me })
}

/// [`check::missing`] in the recorded backend; a backend that cannot be read is code 50.
fn missing(s: &Seen) -> Result<Vec<String>> {
    check::missing(&s.conf, &s.intent, s.backend).map_err(|e| {
        unjudged(format!("the {} backend its record names cannot be read: {}", s.backend.name(), e.msg))
    })
}

/// What is missing of the attachment's rules (`Ok(None)`: intact); Err: it cannot be judged
/// (code 50: no record, a record of other addresses, a backend that cannot be read), or its
/// configuration or cached result is not valid.
pub fn judge(req: &Request) -> Result<Option<String>> {
    judge_in(Path::new(record::DIR), req)
}

pub fn judge_in(root: &Path, req: &Request) -> Result<Option<String>> {
    let s = seen(root, req)?;
    let m = missing(&s)?;
    Ok((!m.is_empty()).then(|| format!("{} backend: {}", s.backend.name(), m.join("; "))))
}

/// What [`rebuild`] made, to take back when the attachment's DEL began meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    root: std::path::PathBuf,
    me: AttachmentId,
    backend: Chosen,
    admin: String,
    zone: String,
    addrs: Vec<IpAddr>,
}

/// Rebuild the attachment's rules in the backend its record names (ADD's code), and judge
/// again: Err when something is still missing afterwards.
pub fn rebuild(req: &Request) -> Result<Rebuilt> {
    rebuild_in(Path::new(record::DIR), req)
}

pub fn rebuild_in(root: &Path, req: &Request) -> Result<Rebuilt> {
    let s = seen(root, req)?;
    add::apply(&s.conf, &s.intent, s.backend)?;
    let still = missing(&s)?;
    if !still.is_empty() {
        return Err(CniError::internal(format!("still missing after rebuilding it: {}", still.join("; "))));
    }
    Ok(Rebuilt {
        root: root.to_path_buf(),
        me: s.me,
        backend: s.backend,
        admin: s.conf.admin_chain,
        zone: s.conf.zone,
        addrs: s.intent.addrs,
    })
}

impl Rebuilt {
    /// Remove the address rules that were rebuilt, as DEL does, except for addresses that
    /// another attachment's record holds now (an address handed out again after the DEL).
    /// The shared chains stay, as with DEL.
    pub fn undo(&self) -> Result<()> {
        let others = held_by_others(&self.root, &self.me);
        let addrs: Vec<IpAddr> = self.addrs.iter().copied().filter(|a| !others.contains(a)).collect();
        let names = backend::Names { admin: &self.admin, zone: &self.zone };
        let mut errors = ErrorList::new();
        for fam in [Family::V4, Family::V6] {
            errors.take(backend::del(self.backend, fam, names, &addrs));
        }
        errors.finish()
    }
}

/// The addresses of every record under `root` but `me`'s.
fn held_by_others(root: &Path, me: &AttachmentId) -> Vec<IpAddr> {
    let Ok(dir) = std::fs::read_dir(root) else { return Vec::new() };
    let mut out = Vec::new();
    for e in dir.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Some(network) = e.file_name().to_str().map(String::from) else { continue };
        for r in record::all(root, &network) {
            if network == me.network && r.container_id == me.container_id && r.ifname == me.ifname {
                continue;
            }
            out.extend(r.addrs);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::spec::env::Env;
    use cni_common::spec::Command;
    use cni_common::Version;
    use serde_json::json;

    /// The request the way a DEL builds it (no namespace needed: the skeleton's rules look at
    /// CNI_NETNS for ADD; what is judged here is the configuration, the result and the record).
    fn req(conf: Value) -> Request {
        let env = Env {
            command: Some(Command::Del),
            container_id: "c1".into(),
            netns: String::new(),
            ifname: "eth0".into(),
            args: String::new(),
            path: "/opt/cni/bin".into(),
            netns_override: false,
        };
        Request::new(env, serde_json::to_vec(&conf).unwrap(), &Version::ALL).unwrap()
    }

    fn conf() -> Value {
        json!({"cniVersion": "1.0.0", "name": "net1", "type": "firewall", "ingressPolicy": "isolated",
               "prevResult": {"cniVersion": "1.0.0",
                              "interfaces": [{"name": "br0"}, {"name": "veth1"},
                                             {"name": "eth0", "sandbox": "/run/netns/p"}],
                              "ips": [{"address": "10.0.0.2/24", "interface": 2},
                                      {"address": "2001:db8::2/64", "interface": 2}]}})
    }

    fn rec(backend: &str, addrs: &[&str]) -> Record {
        Record {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            backend: backend.into(),
            zone: "internal".into(),
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    /// What cannot be judged says so with code 50 (resync names it, never counts it intact):
    /// no record, a record of other addresses; the record's backend and zone are the ones used.
    #[test]
    fn an_attachment_without_its_record_or_with_another_adds_record_is_not_judged() {
        let root = std::env::temp_dir().join(format!("fw-resync-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let r = req(conf());
        let e = judge_in(&root, &r).unwrap_err();
        assert_eq!(e.code, code::NOT_AVAILABLE, "{e:?}");
        assert!(e.msg.contains("no firewall record"), "{e:?}");
        let e = rebuild_in(&root, &r).unwrap_err();
        assert_eq!(e.code, code::NOT_AVAILABLE, "nothing is rebuilt without a record: {e:?}");
        let me = AttachmentId::of(&r);
        record::write(&root, &me, &rec("nftables", &["10.0.0.2"])).unwrap();
        let e = judge_in(&root, &r).unwrap_err();
        assert_eq!(e.code, code::NOT_AVAILABLE, "{e:?}");
        assert!(e.msg.contains("not of the ADD that was cached"), "{e:?}");
        record::write(&root, &me, &rec("firewalld", &["2001:db8::2", "10.0.0.2"])).unwrap();
        let s = seen(&root, &r).unwrap();
        assert_eq!(s.backend, Chosen::Firewalld, "the record's backend, not the default rule's");
        assert_eq!(s.conf.zone, "internal", "the record's zone");
        assert_eq!(s.intent.bridge.as_deref(), Some("br0"));
        // another attachment's record holds 10.0.0.2 now: its rules are not taken back
        let other = AttachmentId::new("net2", "c9", "eth0");
        record::write(&root, &other, &Record { container_id: "c9".into(), ..rec("nftables", &["10.0.0.2"]) })
            .unwrap();
        assert_eq!(held_by_others(&root, &me), vec!["10.0.0.2".parse::<IpAddr>().unwrap()]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
