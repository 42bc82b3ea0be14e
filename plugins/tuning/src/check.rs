//! CHECK: every configured sysctl has its value in the container's namespace, and the link has
//! the configured MAC, promiscuity (on when configured, off otherwise, as upstream), MTU,
//! all-multicast mode and queue length.

use cni_common::error::{CniError, Result};
use cni_common::mac::Mac;
use cni_common::Request;

use crate::config::Conf;
use crate::kernel::{Kernel, Real};

pub fn check(req: &Request) -> Result<()> {
    let conf = Conf::from_request(req)?;
    req.prev_result()?.ok_or_else(|| CniError::config("Required prevResult missing"))?;
    let ns = req.require_netns()?;
    run(&mut Real::new(&ns)?, &conf, &req.env.ifname)
}

pub fn run(k: &mut dyn Kernel, conf: &Conf, ifname: &str) -> Result<()> {
    let fail = |m: String| Err(CniError::internal(m));
    for s in &conf.sysctls {
        let cur = k.sysctl_get(&s.path)?;
        if !cur.split_whitespace().eq(s.value.split_whitespace()) {
            return fail(format!(
                "Error: Tuning configured value of /proc/sys/{} is {}, current value is {cur}",
                s.path, s.value
            ));
        }
    }
    let Some(l) = k.link(ifname)? else { return fail(format!("Cannot find container link {ifname}")) };
    let want = &conf.link;
    if let Some(m) = want.mac {
        if Some(m.0) != l.mac {
            return fail(format!(
                "Error: Tuning configured Ethernet of {ifname} is {m}, current value is {}",
                Mac::text(l.mac)
            ));
        }
    }
    if want.promisc != l.promisc() {
        return fail(format!(
            "Error: Tuning link {ifname} configured promisc is {}, current value is {}",
            want.promisc,
            l.promisc()
        ));
    }
    if let Some(m) = want.mtu.filter(|m| *m != l.mtu) {
        return fail(format!("Error: Tuning configured MTU of {ifname} is {m}, current value is {}", l.mtu));
    }
    if let Some(a) = want.allmulti.filter(|a| *a != l.allmulti()) {
        return fail(format!(
            "Error: Tuning configured all-multicast mode of {ifname} is {a}, current value is {}",
            l.allmulti()
        ));
    }
    if let Some(q) = want.txqlen.filter(|q| *q != l.txqlen) {
        return fail(format!(
            "Error: Tuning configured Transmit Queue Length of {ifname} is {q}, current value is {}",
            l.txqlen
        ));
    }
    Ok(())
}
