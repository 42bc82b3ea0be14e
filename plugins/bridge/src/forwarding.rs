//! Forwarding on the host, turned on by `isGateway` for each family that has a gateway.
//!
//! IPv6 has a trap: with `net.ipv6.conf.all.forwarding=1` the kernel applies forwarding to every
//! interface, and an interface whose `accept_ra` is 1 then ignores router advertisements; worse,
//! the moment forwarding is switched on the kernel purges every default route learnt from them
//! (unless that interface's `accept_ra` is 2). A host whose uplink takes its IPv6 default route
//! from router advertisements would lose it at the first dual-stack pod. So before turning IPv6
//! forwarding on, every interface with `accept_ra=1` is raised to 2 ("accept even when
//! forwarding"), as LXD/Incus do, and a line on stderr says which. When forwarding is on already
//! nothing is read beyond the one sysctl ADD always read.

use cni_common::error::{Context, Result};
use cni_common::sysctl;

use crate::kernel::Kernel;

const ALL_FORWARDING_V6: &str = "net/ipv6/conf/all/forwarding";

/// `net.ipv4.ip_forward=1`.
pub(crate) fn enable_v4(k: &mut dyn Kernel) -> Result<()> {
    k.sysctl_set("net/ipv4/ip_forward", "1").context("failed to enable forwarding")?;
    Ok(())
}

/// `net.ipv6.conf.all.forwarding=1`, interfaces with `accept_ra=1` raised to 2 first.
pub(crate) fn enable_v6(k: &mut dyn Kernel) -> Result<()> {
    if k.sysctl_get(ALL_FORWARDING_V6).is_ok_and(|v| v == "1") {
        return Ok(());
    }
    let have = host_accept_ra(k);
    let raised = raise_accept_ra(k, &have);
    if !raised.is_empty() {
        cni_common::log!(
            "bridge", "accept_ra raised from 1 to 2 on {} before turning on IPv6 forwarding, so that {} keep{} accepting router advertisements and {} default route{} (see bridge's README, \"IPv6 forwarding and uplinks\")",
            raised.join(", "),
            if raised.len() == 1 { "it" } else { "they" },
            if raised.len() == 1 { "s" } else { "" },
            if raised.len() == 1 { "its" } else { "their" },
            if raised.len() == 1 { "" } else { "s" },
        );
    }
    k.sysctl_set(ALL_FORWARDING_V6, "1").context("failed to enable forwarding")?;
    Ok(())
}

/// Every interface of `/proc/sys/net/ipv6/conf` with its `accept_ra` (unreadable ones left out:
/// an interface that vanished meanwhile has nothing to keep).
fn host_accept_ra(k: &mut dyn Kernel) -> Vec<(String, String)> {
    k.ipv6_conf_names()
        .into_iter()
        .filter(|name| valid_ifname(name))
        .filter_map(|name| {
            let v = k.sysctl_get(&sysctl::iface_key("ipv6", &name, "accept_ra")).ok()?;
            Some((name, v))
        })
        .collect()
}

/// A name read from `/proc` is used only when it is one an interface can have.
fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name.contains(['/', ':'])
        && !name.chars().any(char::is_whitespace)
}

/// Which interfaces of `have` (name, accept_ra) to raise: those at exactly 1. `all` and
/// `default` are templates, not interfaces (raising `default` would make every later veth,
/// ours and other runtimes', accept router advertisements from its container); `lo` never
/// receives one.
fn to_raise(have: &[(String, String)]) -> Vec<&str> {
    have.iter()
        .filter(|(name, v)| v == "1" && !matches!(name.as_str(), "all" | "default" | "lo"))
        .map(|(name, _)| name.as_str())
        .collect()
}

/// Raise what [`to_raise`] picks; returns the names raised. A failure is reported on stderr and
/// does not stop the ADD (forwarding is what the configuration asked for).
fn raise_accept_ra(k: &mut dyn Kernel, have: &[(String, String)]) -> Vec<String> {
    let mut raised = Vec::new();
    for name in to_raise(have) {
        match k.sysctl_set(&sysctl::iface_key("ipv6", name, "accept_ra"), "2") {
            Ok(_) => raised.push(name.to_string()),
            Err(e) => cni_common::log!("bridge", "could not raise accept_ra of {name} to 2: {e}"),
        }
    }
    raised
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    #[test]
    fn only_interfaces_at_one_are_raised() {
        let h = have(&[
            ("all", "1"),
            ("default", "1"),
            ("lo", "1"),
            ("eth0", "1"),
            ("eth1", "0"),
            ("wlan0", "2"),
            ("eth0.100", "1"),
        ]);
        assert_eq!(to_raise(&h), vec!["eth0", "eth0.100"]);
        assert!(to_raise(&have(&[("eth0", "0"), ("eth1", "2")])).is_empty());
    }

    #[test]
    fn names_from_proc_are_checked() {
        for ok in ["eth0", "eth0.100", "veth1234abcd", "a-b_c", "x23456789012345"] {
            assert!(valid_ifname(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a:b", "a b", "x234567890123456"] {
            assert!(!valid_ifname(bad), "{bad:?}");
        }
    }
}
