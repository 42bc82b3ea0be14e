//! Which backend a verb uses, and each verb's calls into it per family.
//!
//! The default rule (no `backend` key, or ""): where the legacy x_tables `filter` table is
//! loaded in this network namespace (`/proc/net/ip{,6}_tables_names`: Docker or a firewall on
//! iptables-legacy), the drop lives there, out of nf_tables' reach: the iptables backend through
//! `iptables-legacy`. Otherwise nftables over netlink. Before both, as upstream: firewalld when
//! it owns its name on the system bus. Upstream's rule is "firewalld if it runs, else
//! iptables": on an iptables-nft host its iptables and our nftables write the same rules.
//! "Not running" is only what the bus says (its `NameHasNoOwner`) or a host without a system
//! bus socket; a bus that cannot be asked fails the verb with code 11 instead of choosing
//! another backend ([`firewalld::running`]).

use crate::config::{Backend, Conf};
use crate::model::Rule;
use crate::{firewalld, iptables, kernel, nft};
use cni_common::net::Family;
use cni_common::upstream::iptables::{default_backend, Backend as Xt};
use cni_common::{code, CniError, Result};
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chosen {
    Nftables,
    Iptables(Xt),
    Firewalld,
}

impl Chosen {
    pub fn name(self) -> &'static str {
        match self {
            Chosen::Nftables => "nftables",
            Chosen::Iptables(Xt::Nft) => "iptables-nft",
            Chosen::Iptables(Xt::Legacy) => "iptables-legacy",
            Chosen::Firewalld => "firewalld",
        }
    }

    pub fn from_name(n: &str) -> Option<Chosen> {
        match n {
            "nftables" => Some(Chosen::Nftables),
            "iptables-nft" => Some(Chosen::Iptables(Xt::Nft)),
            "iptables-legacy" => Some(Chosen::Iptables(Xt::Legacy)),
            "firewalld" => Some(Chosen::Firewalld),
            _ => None,
        }
    }
}

/// Whether iptables-legacy's `filter` table is loaded in the calling thread's network namespace
/// (`/proc/thread-self`: `/proc/net` is the main thread's).
pub fn legacy_filter_loaded() -> bool {
    ["/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"]
        .iter()
        .any(|p| std::fs::read_to_string(p).is_ok_and(|t| t.lines().any(|l| l.trim() == "filter")))
}

/// The default rule, given what the host shows (pure).
pub fn default_rule(firewalld: bool, legacy_filter: bool) -> Chosen {
    if firewalld {
        Chosen::Firewalld
    } else if legacy_filter {
        Chosen::Iptables(Xt::Legacy)
    } else {
        Chosen::Nftables
    }
}

/// Where the firewalld backend puts `ingressPolicy`'s chains: where upstream's `iptables`
/// would (iptables-legacy when its filter table is loaded, else iptables-nft's tables, which our
/// nftables backend writes).
pub fn isolation_backend() -> Chosen {
    default_rule(false, legacy_filter_loaded())
}

pub fn choose(conf: &Conf) -> Result<Chosen> {
    match conf.backend {
        Some(Backend::Nftables) => Ok(Chosen::Nftables),
        Some(Backend::Iptables) => match default_backend()? {
            Some(b) => Ok(Chosen::Iptables(b)),
            None => Err(CniError::new(
                code::NOT_AVAILABLE,
                "backend \"iptables\": no iptables command on this host (install iptables, or use backend \"nftables\")",
            )),
        },
        Some(Backend::Firewalld) => Ok(Chosen::Firewalld),
        None => Ok(default_rule(firewalld::running()?, legacy_filter_loaded())),
    }
}

fn nf() -> Result<kernel::Netlink> {
    kernel::Netlink::new()
        .map_err(|e| CniError::new(code::NOT_AVAILABLE, format!("nf_tables is not usable (netlink): {e}")))
}

/// The names a verb needs besides the rules: the admin chain and the firewalld zone.
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    pub admin: &'a str,
    pub zone: &'a str,
}

fn of_family(addrs: &[IpAddr], fam: Family) -> Vec<IpAddr> {
    addrs.iter().copied().filter(|a| Family::of(a) == fam).collect()
}

pub fn add(
    b: Chosen,
    fam: Family,
    n: Names,
    addrs: &[IpAddr],
    chains: &[String],
    rules: &[Rule],
) -> Result<()> {
    if rules.is_empty() {
        return Ok(());
    }
    let admin = n.admin;
    match b {
        Chosen::Firewalld => firewalld::add(n.zone, &of_family(addrs, fam)),
        Chosen::Nftables => nft::add(&mut nf()?, fam, admin, chains, rules),
        Chosen::Iptables(x) => iptables::add(x, fam, chains, rules),
    }
}

pub fn del(b: Chosen, fam: Family, n: Names, addrs: &[IpAddr]) -> Result<()> {
    let admin = n.admin;
    match b {
        Chosen::Firewalld => firewalld::del(n.zone, &of_family(addrs, fam)),
        Chosen::Nftables => nft::del(&mut nf()?, fam, admin, addrs),
        Chosen::Iptables(x) => iptables::del(x, fam, addrs),
    }
}

pub fn missing(
    b: Chosen,
    fam: Family,
    n: Names,
    addrs: &[IpAddr],
    chains: &[String],
    rules: &[Rule],
) -> Result<Vec<String>> {
    let admin = n.admin;
    match b {
        Chosen::Firewalld => firewalld::missing(n.zone, &of_family(addrs, fam)),
        Chosen::Nftables => nft::missing(&mut nf()?, fam, admin, chains, rules),
        Chosen::Iptables(x) => iptables::missing(x, fam, chains, rules),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_follows_where_the_drop_can_be() {
        assert_eq!(default_rule(false, true), Chosen::Iptables(Xt::Legacy));
        assert_eq!(default_rule(false, false), Chosen::Nftables);
        assert_eq!(default_rule(true, true), Chosen::Firewalld, "firewalld first, as upstream");
        for c in
            [Chosen::Nftables, Chosen::Iptables(Xt::Nft), Chosen::Iptables(Xt::Legacy), Chosen::Firewalld]
        {
            assert_eq!(Chosen::from_name(c.name()), Some(c));
        }
        let fw = Conf::from_raw(&serde_json::json!({"backend": "firewalld"})).unwrap();
        assert_eq!(choose(&fw).unwrap(), Chosen::Firewalld);
    }
}
