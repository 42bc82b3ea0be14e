//! STATUS: the backend can do what ADD will ask (nf_tables: the table, chain and the x_tables
//! matches iptables-nft's form needs, processed and never committed; iptables: the tools run).

use crate::backend::Chosen;
use crate::kernel::{nft_family, Kernel, TABLE};
use crate::model::{addr_rules, setup, PRIV_CHAIN};
use cni_common::net::Family;
use cni_common::netlink::nft::NftOp;
use cni_common::{code, CniError, Result};

/// The ops of a dry run: a scratch table with one chain and upstream's rules in it.
pub fn probe_ops() -> Vec<NftOp> {
    let family = nft_family(Family::V4);
    let table = "cni_firewall_status";
    let mut ops = vec![
        NftOp::AddTable { family, table: table.into(), comment: None },
        NftOp::AddChain { family, table: table.into(), chain: PRIV_CHAIN.into(), base: None, comment: None },
        NftOp::AddChain { family, table: table.into(), chain: "CNI-ADMIN".into(), base: None, comment: None },
    ];
    let mut rules = vec![setup("CNI-ADMIN").remove(1)];
    rules.extend(addr_rules("192.0.2.1".parse().expect("a documentation address")));
    ops.extend(rules.iter().map(|r| NftOp::rule(family, table, &r.chain, r.exprs(), None)));
    ops
}

pub fn status<K: Kernel>(b: Chosen, k: Option<&mut K>) -> Result<()> {
    match (b, k) {
        (Chosen::Nftables, Some(k)) => k.validate(&probe_ops()).map_err(|e| {
            CniError::new(
                code::NOT_AVAILABLE,
                format!("nf_tables refused iptables-nft's form of the firewall's rules (nft_compat, xt_conntrack, xt_comment?): {e}"),
            )
        }),
        (Chosen::Nftables, None) => Err(CniError::new(code::NOT_AVAILABLE, "nf_tables is not usable")),
        (Chosen::Firewalld, _) => {
            // a bus that cannot be asked is code 11 (`running`), not "firewalld is gone"
            if crate::firewalld::running()? {
                Ok(())
            } else {
                Err(CniError::new(code::NOT_AVAILABLE, "firewalld does not own its name on the system bus"))
            }
        }
        (Chosen::Iptables(x), _) => {
            for fam in [Family::V4, Family::V6] {
                cni_common::upstream::iptables::save_table(x, fam, TABLE)
                    .map_err(|e| CniError::new(code::NOT_AVAILABLE, e.msg))?;
            }
            Ok(())
        }
    }
}
