//! The settings ADD replaced, as upstream keeps them: one JSON file per attachment (its name:
//! [`crate::store::Names`]) with the keys of upstream's `configToRestore` (`mac`, `promisc`,
//! `mtu`, `allmulti`, `txQLen`; only those ADD changed). Either build's DEL restores from the
//! other's file. Ours adds keys upstream's decoder ignores: the network (`network`), so GC of
//! one network never removes another's files, and the tuned link's identity (`ifindex`,
//! `kind`), so DEL restores the link ADD tuned and no other link that took its name
//! ([`decide`]).

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
    /// The tuned link's ifindex (None in upstream's files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifindex: Option<u32>,
    /// Its `IFLA_INFO_KIND` ("veth", …; None for a link without one, and in upstream's files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl Saved {
    /// Why `link` is not the link these settings were saved from; None when it is, or when the
    /// file does not say (upstream's, an earlier build's): then it is taken to be, as upstream.
    /// A pod with CAP_NET_ADMIN in its namespace can replace its interface by another under the
    /// same name (a macvlan): the new link gets another ifindex, and a pod that chooses the old
    /// ifindex (`ip link add … index N`) still cannot choose a veth.
    pub fn other_link(&self, link: &Link) -> Option<String> {
        let index = self.ifindex?;
        let kind = self.kind.as_deref().unwrap_or("");
        let now = link.kind.as_deref().unwrap_or("");
        (index != link.index || kind != now).then(|| {
            format!(
                "the link now called {} (ifindex {}, kind {now:?}) is not the one tuned (ifindex {index}, kind {kind:?})",
                link.name, link.index
            )
        })
    }
}

/// What DEL does with a saved file, given the link now under the attachment's ifname.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Put these settings back, in this order.
    Restore(Vec<Restore>),
    /// Leave the link alone, for this reason: it is another link, or the file holds a value
    /// no link takes.
    Leave(String),
}

/// DEL's choice: restore only the link ADD tuned, and only from values that are settings.
pub fn decide(s: &Saved, link: &Link) -> Decision {
    if let Some(why) = s.other_link(link) {
        return Decision::Leave(why);
    }
    match restore_plan(s) {
        Ok(plan) => Decision::Restore(plan),
        Err(e) => Decision::Leave(e.msg),
    }
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// What to save before `want` is applied to `link`: its identity and its current value of
/// every setting `want` changes. With `earlier` (a file an earlier ADD of the same attachment
/// left), its values win: they are the link's state before any tuning. An earlier file of
/// another link ([`Saved::other_link`]: the name was taken over since) says nothing of this
/// one and is not used.
pub fn backup(link: &Link, want: &LinkSettings, network: &str, earlier: Option<Saved>) -> Saved {
    let mut s = Saved {
        network: network.to_string(),
        ifindex: Some(link.index),
        kind: link.kind.clone(),
        ..Saved::default()
    };
    let earlier = earlier.filter(|e| e.other_link(link).is_none());
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
            serde_json::json!({"mtu": 1500, "txQLen": 1000, "network": "net1", "ifindex": 3})
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
            serde_json::json!({"mac": "02:00:00:00:00:09", "promisc": false, "network": "net1", "ifindex": 3})
        );
        assert_eq!(
            restore_plan(&s).unwrap(),
            vec![Restore::Mac(Mac([2, 0, 0, 0, 0, 9])), Restore::Promisc(false)]
        );
    }

    /// Issue 37.4: DEL restores the link ADD tuned (same ifindex and kind) and no other; a file
    /// without an identity (upstream's) is taken to be the link's, as upstream does; a value no
    /// link takes is left, with the reason.
    #[test]
    fn del_restores_only_the_tuned_link_from_usable_values() {
        let veth = Link { kind: Some("veth".into()), ..link() };
        let want = LinkSettings { mtu: Some(1400), ..Default::default() };
        let s = backup(&veth, &want, "net1", None);
        assert_eq!((s.ifindex, s.kind.as_deref()), (Some(3), Some("veth")));
        assert_eq!(decide(&s, &veth), Decision::Restore(vec![Restore::Mtu(1500)]));
        // the pod replaced its interface: another ifindex, or the same one with another kind
        let macvlan = Link { index: 7, kind: Some("macvlan".into()), ..link() };
        let same_index = Link { kind: Some("dummy".into()), ..link() };
        let kindless = Link { kind: None, ..link() };
        for other in [&macvlan, &same_index, &kindless, &Link { index: 4, ..veth.clone() }] {
            match decide(&s, other) {
                Decision::Leave(why) => assert!(why.contains("not the one tuned"), "{why}"),
                d => panic!("{other:?}: {d:?}"),
            }
        }
        // a link without a kind (a physical one) is recognised as itself
        let phys = backup(&kindless, &want, "net1", None);
        assert_eq!(serde_json::to_value(&phys).unwrap()["kind"], serde_json::Value::Null);
        assert_eq!(decide(&phys, &kindless), Decision::Restore(vec![Restore::Mtu(1500)]));
        assert!(matches!(decide(&phys, &veth), Decision::Leave(_)));
        // upstream's file: no identity, restored on whatever link has the name
        let up: Saved = serde_json::from_str(r#"{"mtu": 1500}"#).unwrap();
        assert_eq!(decide(&up, &macvlan), Decision::Restore(vec![Restore::Mtu(1500)]));
        // a value that is no setting: left, naming it
        let bad = Saved { mtu: -5, ..s.clone() };
        assert_eq!(decide(&bad, &veth), Decision::Leave("saved mtu -5 is not valid".into()));
        // our keys are extra keys to upstream's decoder: the settings read the same without them
        let mut v = serde_json::to_value(&s).unwrap();
        for k in ["network", "ifindex", "kind"] {
            v.as_object_mut().unwrap().remove(k);
        }
        assert_eq!(restore_plan(&serde_json::from_value(v).unwrap()).unwrap(), vec![Restore::Mtu(1500)]);
    }

    /// A second ADD keeps an earlier file's values only when it is this link's.
    #[test]
    fn an_earlier_file_of_another_link_is_not_kept() {
        let want = LinkSettings { mtu: Some(1400), ..Default::default() };
        let stale = Saved { mtu: 9000, ifindex: Some(99), kind: Some("veth".into()), ..Default::default() };
        assert_eq!(backup(&link(), &want, "net1", Some(stale.clone())).mtu, 1500);
        let mine = Saved { ifindex: Some(3), kind: None, ..stale };
        assert_eq!(backup(&link(), &want, "net1", Some(mine)).mtu, 9000);
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
