//! The settings ADD replaced, as upstream keeps them: one JSON file per attachment,
//! `<dataDir>/<containerID>_<ifname>.json`, with the keys of upstream's `configToRestore`
//! (`mac`, `promisc`, `mtu`, `allmulti`, `txQLen`; only those ADD changed). Either build's DEL
//! restores from the other's file. Ours also records the network (`network`, a key upstream's
//! decoder ignores), so GC of one network never removes another's files.

use cni_common::error::{CniError, Result};
use cni_common::mac::Mac;
use cni_common::netlink::Link;
use serde::{Deserialize, Serialize};

use crate::config::LinkSettings;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promisc: Option<bool>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtu: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allmulti: Option<bool>,
    #[serde(rename = "txQLen", default, skip_serializing_if = "Option::is_none")]
    pub txqlen: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// The file name of an attachment's saved settings (container id and ifname are validated
/// identifiers: no `/`).
pub fn file_name(container_id: &str, ifname: &str) -> String {
    format!("{container_id}_{ifname}.json")
}

/// What to save before `want` is applied to `link`: its current value of every setting `want`
/// changes. With `earlier` (a file an earlier ADD of the same attachment left), its values win:
/// they are the link's state before any tuning.
pub fn backup(link: &Link, want: &LinkSettings, network: &str, earlier: Option<Saved>) -> Saved {
    let mut s = Saved { network: network.to_string(), ..Saved::default() };
    if want.mac.is_some() {
        s.mac = Mac::text(link.mac);
    }
    if want.promisc {
        s.promisc = Some(link.promisc());
    }
    if want.mtu.is_some() {
        s.mtu = i64::from(link.mtu);
    }
    if want.allmulti.is_some() {
        s.allmulti = Some(link.allmulti());
    }
    if want.txqlen.is_some() {
        s.txqlen = Some(i64::from(link.txqlen));
    }
    if let Some(e) = earlier {
        if !e.mac.is_empty() {
            s.mac = e.mac;
        }
        s.promisc = e.promisc.or(s.promisc);
        if e.mtu != 0 {
            s.mtu = e.mtu;
        }
        s.allmulti = e.allmulti.or(s.allmulti);
        s.txqlen = e.txqlen.or(s.txqlen);
    }
    s
}

/// What DEL restores, in upstream's order (MTU, MAC, promiscuity, all-multicast, queue length),
/// as link settings; a value that cannot be used (a file another program wrote) is an error
/// naming it, and nothing of the file is applied.
pub fn restore_plan(s: &Saved) -> Result<Vec<Restore>> {
    let mut plan = Vec::new();
    if s.mtu != 0 {
        let m = u32::try_from(s.mtu)
            .map_err(|_| CniError::internal(format!("saved mtu {} is not valid", s.mtu)))?;
        plan.push(Restore::Mtu(m));
    }
    if !s.mac.is_empty() {
        let m = Mac::parse(&s.mac).map_err(|e| CniError::internal(format!("saved mac {:?}: {e}", s.mac)))?;
        plan.push(Restore::Mac(m));
    }
    if let Some(p) = s.promisc {
        plan.push(Restore::Promisc(p));
    }
    if let Some(a) = s.allmulti {
        plan.push(Restore::Allmulti(a));
    }
    if let Some(q) = s.txqlen {
        let q = u32::try_from(q).map_err(|_| CniError::internal(format!("saved txQLen {q} is not valid")))?;
        plan.push(Restore::TxQLen(q));
    }
    Ok(plan)
}

/// One link setting to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    Mtu(u32),
    Mac(Mac),
    Promisc(bool),
    Allmulti(bool),
    TxQLen(u32),
}

/// ADD's link changes, in upstream's order (MAC, promiscuity, MTU, all-multicast, queue length).
pub fn apply_plan(want: &LinkSettings) -> Vec<Restore> {
    let mut plan = Vec::new();
    if let Some(m) = want.mac {
        plan.push(Restore::Mac(m));
    }
    if want.promisc {
        plan.push(Restore::Promisc(true));
    }
    if let Some(m) = want.mtu {
        plan.push(Restore::Mtu(m));
    }
    if let Some(a) = want.allmulti {
        plan.push(Restore::Allmulti(a));
    }
    if let Some(q) = want.txqlen {
        plan.push(Restore::TxQLen(q));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link() -> Link {
        Link {
            index: 3,
            name: "eth0".into(),
            mtu: 1500,
            mac: Some([2, 0, 0, 0, 0, 9]),
            txqlen: 1000,
            ..Link::default()
        }
    }

    #[test]
    fn saves_only_what_changes_in_upstreams_format() {
        let want = LinkSettings { mtu: Some(1400), txqlen: Some(5), ..Default::default() };
        let s = backup(&link(), &want, "net1", None);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"mtu": 1500, "txQLen": 1000, "network": "net1"})
        );
        // upstream's file (no network) reads back
        let up: Saved =
            serde_json::from_str(r#"{"mac": "02:00:00:00:00:09", "promisc": false, "allmulti": true}"#)
                .unwrap();
        let plan = restore_plan(&up).unwrap();
        assert_eq!(
            plan,
            vec![Restore::Mac(Mac([2, 0, 0, 0, 0, 9])), Restore::Promisc(false), Restore::Allmulti(true)]
        );
        // an earlier ADD's file keeps the original values
        let again = backup(&Link { mtu: 1400, ..link() }, &want, "net1", Some(s.clone()));
        assert_eq!(again.mtu, 1500);
        assert!(restore_plan(&Saved { mtu: -5, ..Default::default() }).is_err());
        assert!(restore_plan(&Saved { mac: "zz".into(), ..Default::default() }).is_err());
    }

    /// The twin of the MTU-and-txQLen file: settings other than the MTU save no `mtu` key
    /// (upstream's omitempty), so a later restore does not set an MTU of 0.
    #[test]
    fn a_file_without_an_mtu_change_has_no_mtu_key() {
        let want = LinkSettings { mac: Some(Mac([2, 0, 0, 0, 0, 1])), promisc: true, ..Default::default() };
        let s = backup(&link(), &want, "net1", None);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"mac": "02:00:00:00:00:09", "promisc": false, "network": "net1"})
        );
        assert_eq!(
            restore_plan(&s).unwrap(),
            vec![Restore::Mac(Mac([2, 0, 0, 0, 0, 9])), Restore::Promisc(false)]
        );
    }

    #[test]
    fn apply_order_is_upstreams() {
        let want = LinkSettings {
            mac: Some(Mac([2, 0, 0, 0, 0, 1])),
            promisc: true,
            mtu: Some(1400),
            allmulti: Some(false),
            txqlen: Some(0),
        };
        let kinds: Vec<&str> = apply_plan(&want)
            .iter()
            .map(|r| match r {
                Restore::Mac(_) => "mac",
                Restore::Promisc(_) => "promisc",
                Restore::Mtu(_) => "mtu",
                Restore::Allmulti(_) => "allmulti",
                Restore::TxQLen(_) => "txqlen",
            })
            .collect();
        assert_eq!(kinds, vec!["mac", "promisc", "mtu", "allmulti", "txqlen"]);
        assert!(apply_plan(&LinkSettings::default()).is_empty());
    }
}
