//! What "nothing left behind" means for a network on a fake host, checked after churn,
//! crash and client tests: no veth or ifb in the host, no portmap element, no masquerade rule
//! and no host-local reservation of the network.

use crate::Netns;
use serde_json::Value;
use std::path::Path;

/// Sets of portmap's table that are not state of an attachment.
pub const PORTMAP_TABLE_LEVEL: [&str; 3] = ["layout", "gates", "conditions"];

/// Problems found; empty means clean. `keep_links` are host links that legitimately stay
/// (the bridge itself, lo).
pub fn leaks(host: &Netns, network: &str, data_dir: &Path, keep_links: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for l in host.link_names() {
        if !keep_links.contains(&l.as_str()) {
            found.push(format!("link {l} left in the host"));
        }
    }
    let nft = host.try_run("nft", &["-j", "list", "ruleset"]);
    if nft.status.success() {
        let v: Value = serde_json::from_slice(&nft.stdout).unwrap_or(Value::Null);
        for o in v["nftables"].as_array().into_iter().flatten() {
            // set/map elements, and rules whose comment names the network
            if let Some(set) = o.get("set").or_else(|| o.get("map")) {
                // portmap's `layout` holds the table's layout version (the table is never
                // dropped), and the released layout's `gates` and `conditions` record which
                // conditions its rules carry: table-level bookkeeping, not state of an attachment
                if set["table"] == "cni_portmap"
                    && PORTMAP_TABLE_LEVEL.contains(&set["name"].as_str().unwrap_or(""))
                {
                    continue;
                }
                let n = set.get("elem").and_then(Value::as_array).map(|a| a.len()).unwrap_or(0);
                if n > 0 {
                    found.push(format!(
                        "{n} elements left in {} {}",
                        set["table"].as_str().unwrap_or("?"),
                        set["name"].as_str().unwrap_or("?")
                    ));
                }
            }
            if let Some(rule) = o.get("rule") {
                if rule.get("comment").and_then(Value::as_str).is_some_and(|c| c.contains(network)) {
                    found.push(format!("rule left: {rule}"));
                }
            }
        }
    }
    let dir = data_dir.join(network);
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.parse::<std::net::IpAddr>().is_ok() {
                let content = std::fs::read_to_string(e.path()).unwrap_or_default();
                found.push(format!("reservation {name} left ({content:?})"));
            }
        }
    }
    found
}
