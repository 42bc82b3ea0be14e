//! `from-upstream`: every attachment upstream's plugins left in iptables (bridge `ipMasq`,
//! portmap host ports; either backend of the `iptables` tool) gets our nftables form, written
//! by our own code (the bridge plugin's firewall module; our portmap binary's ADD), and then
//! loses upstream's form, one attachment at a time, so its traffic is always handled.
//!
//! Upstream's nftables backend (v1.6+): its masquerade rules are our own form already (table
//! `inet cni_plugins_masquerade`); its host ports (`ip`/`ip6 cni_hostport`, rules commented
//! with the bare container id) are converted when libcni's cache names the container's
//! attachment, from the cached configuration and result (the runtime's truth); without a cache
//! entry they stay in upstream's form, which our CHECK and DEL handle.

use crate::inventory::{Cached, Inventory};
use crate::opts::{Opts, Report};
use bridge::firewall;
use cni_common::attachment::AttachmentId;
use cni_common::child;
use cni_common::netlink::nft::{NfTables, NftFamily};
use cni_common::netlink::Netlink;
use cni_common::netns::NetNs;
use cni_common::spec::config::PortMapping;
use cni_common::upstream::iptables::{self, Backend, Fam, Table};
use cni_common::upstream::{masq, names};
use cni_common::{CniError, Result};
use ipnet::IpNet;
use portmap::upstream::{self as hostport, names as hostport_names};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What upstream made for one (network, container id).
#[derive(Debug, Default)]
struct Found {
    /// Masquerade: the container addresses (prefix from the chain's ACCEPT rule).
    masq: Vec<IpNet>,
    /// Host ports: mappings in chain order, container addresses, snat/masqAll.
    mappings: Vec<PortMapping>,
    ctr: Vec<IpNet>,
    snat: bool,
    masq_all: bool,
}

fn push_unique<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

/// Read upstream's attachments out of one saved nat table.
fn collect(t: &Table, out: &mut BTreeMap<(String, String), Found>) {
    for r in t.rules_in("POSTROUTING") {
        let Some((net, id)) = r.rule.comment.as_deref().and_then(|c| names::parse_comment("", c)) else {
            continue;
        };
        let chain = names::masq_chain(net, id);
        if r.rule.target.as_deref() != Some(chain.as_str()) {
            continue;
        }
        let Some(src) = r.rule.src.filter(|s| !s.negated) else { continue };
        let ip = src.net.addr();
        // The subnet: the chain's non-negated ACCEPT destination that holds the address.
        let prefix = t
            .rules_in(&chain)
            .filter(|x| x.rule.target.as_deref() == Some("ACCEPT"))
            .filter_map(|x| x.rule.dst.filter(|d| !d.negated && d.net.contains(&ip)))
            .map(|d| d.net.prefix_len())
            .max()
            .unwrap_or(src.net.max_prefix_len());
        let f = out.entry((net.to_string(), id.to_string())).or_default();
        push_unique(&mut f.masq, IpNet::new(ip, prefix).unwrap_or(src.net));
    }
    for r in t.rules_in(hostport_names::HOSTPORT_DNAT) {
        let Some((net, id)) = r.rule.comment.as_deref().and_then(|c| names::parse_comment("dnat ", c)) else {
            continue;
        };
        let chain = hostport_names::dnat_chain(net, id);
        if r.rule.target.as_deref() != Some(chain.as_str()) {
            continue;
        }
        let f = out.entry((net.to_string(), id.to_string())).or_default();
        for x in t.rules_in(&chain) {
            let (Some(proto), Some(port)) = (x.rule.proto.clone(), x.rule.dport_num()) else { continue };
            match x.rule.target.as_deref() {
                Some("DNAT") => {
                    let Some(to) = x.rule.to_destination.as_deref() else { continue };
                    let Some((host, cport)) = to.rsplit_once(':') else { continue };
                    let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() else { continue };
                    let Ok(cport) = cport.parse::<u32>() else { continue };
                    // the hairpin mark rule of the same port carries the container subnet
                    let prefix = t
                        .rules_in(&chain)
                        .filter_map(|m| m.rule.src.filter(|s| !s.negated && s.net.contains(&ip)))
                        .map(|s| s.net.prefix_len())
                        .max()
                        .unwrap_or(if ip.is_ipv4() { 32 } else { 128 });
                    if let Ok(n) = IpNet::new(ip, prefix) {
                        if !f.ctr.iter().any(|c| c.addr() == ip) {
                            f.ctr.push(n);
                        }
                    }
                    push_unique(
                        &mut f.mappings,
                        PortMapping {
                            host_port: i64::from(port),
                            container_port: i64::from(cport),
                            protocol: proto,
                            host_ip: x.rule.dst.map(|d| d.net.addr().to_string()).unwrap_or_default(),
                        },
                    );
                }
                Some(_) => {
                    // a mark rule: snat; no source at all: masqAll
                    f.snat = true;
                    if x.rule.src.is_none() {
                        f.masq_all = true;
                    }
                }
                None => {}
            }
        }
    }
}

/// Whether interface `ifname` of the namespace at `path` holds `ip` and is the peer of a veth
/// of this (the host's) namespace: the pod's end of the bridge plugin's veth pair, not another
/// namespace's interface that happens to have the same address.
fn holds(host: &mut Netlink, path: &Path, ifname: &str, ip: IpAddr) -> bool {
    let Ok(ns) = NetNs::open(path) else { return false };
    let Ok(mut nl) = Netlink::new_in(&ns) else { return false };
    let Ok(Some(link)) = nl.link_by_name(ifname) else { return false };
    if !nl.addrs(Some(link.index), None).is_ok_and(|a| a.iter().any(|x| x.addr.addr() == ip)) {
        return false;
    }
    let Some(peer) = link.link else { return false };
    // ifindexes repeat from namespace to namespace: the host's end must also name `ns` as
    // the namespace of its peer
    let Ok(Some(h)) = host.link_by_index(peer) else { return false };
    h.kind.as_deref() == Some("veth")
        && h.link == Some(link.index)
        && h.link_netnsid.is_some()
        && host.nsid_of(&ns).is_ok_and(|id| id == h.link_netnsid)
}

/// The pod's network namespace, as a path our portmap can record (it tells a live holder of a
/// host port from a stale one by it): the sandbox libcni cached, else a bind mount under
/// `/var/run/netns` or `/run/netns`, else a process's `/proc/<pid>/ns/net` — whichever has
/// interface `ifname` with the container's address. None when the pod is gone.
fn find_netns(cached: Option<String>, ifname: &str, ip: IpAddr) -> Option<String> {
    let mut host = Netlink::new().ok()?;
    let mut candidates: Vec<PathBuf> = cached.into_iter().map(PathBuf::from).collect();
    for dir in ["/var/run/netns", "/run/netns"] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            let mut names: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            names.sort();
            candidates.extend(names);
        }
    }
    if let Some(p) = candidates.iter().find(|p| holds(&mut host, p, ifname, ip)) {
        return Some(p.to_string_lossy().into_owned());
    }
    // a process in the pod (its pause process), one per namespace
    let mut seen = std::collections::HashSet::new();
    let own = std::fs::metadata("/proc/self/ns/net").ok().map(|m| (m.dev(), m.ino()));
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        if !e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let p = e.path().join("ns/net");
        let Ok(m) = std::fs::metadata(&p) else { continue };
        let key = (m.dev(), m.ino());
        if Some(key) == own || !seen.insert(key) {
            continue;
        }
        if holds(&mut host, &p, ifname, ip) {
            return Some(p.to_string_lossy().into_owned());
        }
    }
    None
}

/// Run our portmap with `cmd` for an attachment.
fn portmap(bin: &Path, cmd: &str, net_ns: &str, id: &str, ifname: &str, conf: &Value) -> Result<()> {
    let dir = bin.parent().unwrap_or(Path::new("/"));
    let mut command = Command::new(bin);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", net_ns)
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", dir);
    let out = child::run(&mut command, Some(conf.to_string().as_bytes()), child::Use::Runner)?;
    if !out.status.success() {
        return Err(CniError::internal(format!(
            "our portmap {cmd} failed: {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The configuration our portmap gets: the cached one (keys only upstream's iptables backend
/// knows are dropped: ours refuses `backend: "iptables"` and iptables-syntax conditions),
/// else one rebuilt from upstream's rules; prevResult from the cache, else minimal.
fn portmap_conf(
    net: &str,
    ifname: &str,
    f: &Found,
    cached: Option<&Cached>,
    sandbox: &str,
    notes: &mut Vec<String>,
) -> Value {
    let prev =
        cached.and_then(|c| c.result.as_ref()).and_then(|r| r.encode(cni_common::Version::V1_0_0).ok());
    let mut conf = cached.and_then(|c| c.plugin_config("portmap")).unwrap_or_else(|| {
        let maps: Vec<Value> = f
            .mappings
            .iter()
            .map(|m| {
                let mut v = json!({"hostPort": m.host_port, "containerPort": m.container_port, "protocol": m.protocol});
                if !m.host_ip.is_empty() {
                    v["hostIP"] = json!(m.host_ip);
                }
                v
            })
            .collect();
        json!({"type": "portmap", "name": net, "snat": f.snat, "masqAll": f.masq_all,
               "runtimeConfig": {"portMappings": maps}})
    });
    conf["cniVersion"] = json!("1.0.0");
    if let Some(o) = conf.as_object_mut() {
        o.remove("backend");
        for k in ["conditionsV4", "conditionsV6"] {
            let iptables_syntax = o
                .get(k)
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(Value::as_str)
                .is_some_and(|s| s.starts_with('-') || s.starts_with('!'));
            if iptables_syntax {
                notes.push(format!(
                    "{net}: {k} is iptables syntax, which our portmap (nftables) cannot use: dropped"
                ));
                o.remove(k);
            }
        }
    }
    conf["prevResult"] = prev.unwrap_or_else(|| {
        let ips: Vec<Value> =
            f.ctr.iter().map(|a| json!({"address": a.to_string(), "interface": 0})).collect();
        json!({"cniVersion": "1.0.0", "interfaces": [{"name": ifname, "sandbox": sandbox}], "ips": ips})
    });
    conf
}

/// Upstream's nftables-backend host ports (`cni_hostport`) of attachments libcni's cache
/// names: their mappings, addresses and snat from the cached configuration and result.
fn collect_nft_backend(
    nf: &mut NfTables,
    inv: &Inventory,
    out: &mut BTreeMap<(String, String), Found>,
    notes: &mut Vec<String>,
) -> Result<()> {
    let mut ids: Vec<String> = Vec::new();
    for family in [NftFamily::Ip, NftFamily::Ip6] {
        if !nf.has_table(family, hostport_names::NFT_HOSTPORT_TABLE)? {
            continue;
        }
        for chain in ["hostports", "hostip_hostports"] {
            for r in nf.rules(family, hostport_names::NFT_HOSTPORT_TABLE, Some(chain))? {
                if let Some(c) = r.comment.filter(|c| !c.is_empty()) {
                    push_unique(&mut ids, c);
                }
            }
        }
    }
    for id in ids {
        let named: Vec<_> = inv.identities().into_iter().filter(|(_, i, _)| *i == id).collect();
        let cached = match named.as_slice() {
            [(net, _, ifname)] => inv.cached(net, &id, ifname),
            _ => None,
        };
        let spec = cached.and_then(|c| {
            let conf = c.plugin_config("portmap")?;
            hostport::Spec::from_json(&c.network, &id, &c.ifname, &conf, c.result.as_ref()).ok()
        });
        let (Some(c), Some(spec)) = (cached, spec) else {
            notes.push(format!(
                "container {id:?}: host ports in upstream's cni_hostport, but no (single) libcni cache entry with its \
                 portmap configuration names its attachment: left in upstream's form, which our CHECK and DEL handle"
            ));
            continue;
        };
        let f = out.entry((c.network.clone(), id.clone())).or_default();
        for m in spec.mappings() {
            push_unique(&mut f.mappings, m.clone());
        }
        for a in [spec.v4, spec.v6].into_iter().flatten() {
            push_unique(&mut f.ctr, a);
        }
        f.snat = spec.conf.snat.unwrap_or(true);
        f.masq_all = spec.conf.masq_all;
    }
    Ok(())
}

pub fn run(opts: &Opts, report: &mut Report) -> Result<()> {
    let inv = Inventory::load(&opts.cache_dirs, &opts.data_dirs);
    report.notes.extend(inv.notes.iter().cloned());
    // Upstream's attachments, from every backend and family that has a nat table.
    let mut nf =
        NfTables::new().map_err(|e| CniError::internal(format!("nf_tables is not usable (netlink): {e}")))?;
    let hostport_tables = nf.has_table(NftFamily::Ip, hostport_names::NFT_HOSTPORT_TABLE)?
        || nf.has_table(NftFamily::Ip6, hostport_names::NFT_HOSTPORT_TABLE)?;
    if iptables::default_backend()?.is_none() && !hostport_tables {
        return Err(crate::opts::refused(
            "iptables is not installed on this node and there is no cni_hostport table: upstream's plugins cannot \
             have left state to convert (iptables state cannot be read without it); nothing was changed",
        ));
    }
    let mut found: BTreeMap<(String, String), Found> = BTreeMap::new();
    let mut sources: Vec<(Backend, Fam)> = Vec::new();
    for fam in Fam::BOTH {
        let fam_nft = if fam == Fam::V4 { NftFamily::Ip } else { NftFamily::Ip6 };
        if nf.has_table(fam_nft, "nat")? {
            sources.push((Backend::Nft, fam));
        }
        let legacy_names =
            if fam == Fam::V4 { "/proc/net/ip_tables_names" } else { "/proc/net/ip6_tables_names" };
        if std::fs::read_to_string(legacy_names).is_ok_and(|s| s.lines().any(|l| l.trim() == "nat")) {
            sources.push((Backend::Legacy, fam));
        }
    }
    for (backend, fam) in &sources {
        let t = iptables::save(*backend, *fam)?;
        collect(&t, &mut found);
    }
    if hostport_tables {
        collect_nft_backend(&mut nf, &inv, &mut found, &mut report.notes)?;
    }
    if found.is_empty() {
        report.notes.push(
            "no attachment made by upstream's plugins was found in iptables or cni_hostport: nothing to convert"
                .into(),
        );
        return Ok(());
    }
    let portmap_bin = opts.bin_dir.join("portmap");
    let needs_portmap = found.values().any(|f| !f.mappings.is_empty());
    if needs_portmap && crate::installed::ours(&opts.bin_dir, "portmap").is_err() {
        return Err(crate::opts::refused(format!(
            "{} is not this suite's portmap (install ours first: scripts/install.sh --force, or give --cni-bin-dir); \
             nothing was changed",
            portmap_bin.display()
        )));
    }
    let mut failures = Vec::new();
    for ((net, id), f) in &found {
        let first_ip = f.masq.first().or(f.ctr.first()).map(|n| n.addr());
        let ifname = match inv.ifname_of(net, id, first_ip) {
            Some(i) => i,
            None => {
                report.notes.push(format!(
                    "{net}/{id}: no libcni cache entry or host-local reservation names its interface: assumed eth0"
                ));
                "eth0".to_string()
            }
        };
        let who = format!("{net}/{id}/{ifname}");
        if opts.dry_run {
            report.done.push(format!(
                "would convert {who}: masquerade {:?}, host ports {:?}",
                f.masq.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                f.mappings
                    .iter()
                    .map(|m| format!("{}/{}->{}", m.protocol, m.host_port, m.container_port))
                    .collect::<Vec<_>>()
            ));
            continue;
        }
        let cached = inv.cached(net, id, &ifname);
        let Some(sandbox) = first_ip.and_then(|ip| find_netns(cached.and_then(Cached::sandbox), &ifname, ip))
        else {
            report.notes.push(format!(
                "{who}: no network namespace has {ifname} with its address any more (the pod is gone): left in \
                 upstream's form, which our DEL and GC remove"
            ));
            continue;
        };
        let r = (|| -> Result<()> {
            let att = AttachmentId::new(net, id, &ifname);
            // ours first ...
            if !f.masq.is_empty() {
                firewall::apply_add(&mut nf, &att, Some((&f.masq, None)), None)?;
            }
            let conf = if f.mappings.is_empty() {
                None
            } else {
                let c = portmap_conf(net, &ifname, f, cached, &sandbox, &mut report.notes);
                portmap(&portmap_bin, "ADD", &sandbox, id, &ifname, &c)?;
                Some(c)
            };
            // ... then upstream's goes
            masq::remove(net, id)?;
            hostport::remove(&mut hostport::seam::System::new(), net, id)?;
            // ours is complete
            if !f.masq.is_empty() {
                let have = firewall::find(&mut nf, &att, true, false)?;
                if have.masq.len() < f.masq.len() || !have.masq_hooked {
                    return Err(CniError::internal("our masquerade rules are incomplete after writing them"));
                }
            }
            if let Some(c) = conf {
                portmap(&portmap_bin, "CHECK", &sandbox, id, &ifname, &c)?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => report.done.push(format!(
                "{who}: {} masquerade address(es), {} host port mapping(s) now in our tables",
                f.masq.len(),
                f.mappings.len()
            )),
            Err(e) => failures.push(format!("{who}: {}", e.msg)),
        }
    }
    if !failures.is_empty() {
        return Err(CniError::internal(format!(
            "{} attachment(s) could not be converted (their upstream form was kept): {}",
            failures.len(),
            failures.join("; ")
        )));
    }
    Ok(())
}
