//! What an attachment's shaping should be (pure): the token bucket into the container at the
//! root of the host veth, and for traffic out of it the ifb (name, owner record, group), its
//! token bucket, and the u32 filter on the host veth's ingress redirecting into it.
//!
//! ```text
//!  container ──eth0══veth══▶ host veth ── root tbf 1: ──▶ (into the container: "ingress")
//!                              │
//!                              └ ingress qdisc ffff: ─ u32 match-all ─ mirred egress redirect
//!                                                                       │
//!                                             ifb bwp<hash> ── root tbf 1: ──▶ (out of the container: "egress")
//! ```

use std::time::Duration;

use cni_common::attachment::AttachmentId;
use cni_common::netlink::tc::{self, Psched, Tbf};
use cni_common::netlink::Link;

use crate::config::{Limits, Shape};
use crate::identity::IfbIdentity;
use crate::kernel::IfbSpec;

/// Upstream's queueing latency: `limit = rate × 25 ms + burst`.
pub const LATENCY: Duration = Duration::from_millis(25);
/// Handle of both token bucket qdiscs.
pub const TBF_HANDLE: u32 = tc::handle(1, 0);
/// Priority of the redirect filter.
pub const FILTER_PRIO: u16 = 1;

/// Traffic out of the container: the ifb and its bucket (the redirect into it is implied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    pub ifb: IfbSpec,
    pub tbf: Tbf,
}

/// The attachment's shaping as it should be.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Desired {
    /// The root tbf `1:` of the host veth.
    pub ingress: Option<Tbf>,
    pub egress: Option<Egress>,
}

/// The shaping of `att` for `limits` on the host veth `veth` (whose MTU sizes a default burst
/// and is the ifb's too), with buckets in the clock units of `psched`.
pub fn desired(limits: &Limits, veth: &Link, att: &AttachmentId, psched: &Psched) -> Desired {
    let tbf = |s: &Shape| Tbf::with_latency(s.rate_bytes(), s.burst_bytes(veth.mtu), LATENCY, psched);
    Desired {
        ingress: limits.ingress.as_ref().map(tbf),
        egress: limits.egress.as_ref().map(|s| Egress {
            ifb: IfbSpec {
                name: att.ifb_name(),
                mtu: veth.mtu,
                // upstream: the veth's queue length, at least 1000
                txqlen: veth.txqlen.max(1000),
                alias: att.ifb_alias(),
                group: att.ifb_group(),
            },
            tbf: tbf(s),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psched() -> Psched {
        Psched::parse("000003e8 00000040 000f4240 3b9aca00\n").unwrap()
    }

    #[test]
    fn both_buckets_and_the_ifb_from_the_veth() {
        let limits = Limits {
            ingress: Some(Shape { rate: 8000, burst: Some(800) }),
            egress: Some(Shape { rate: 1_000_000, burst: None }),
        };
        let veth = Link { index: 7, name: "veth1".into(), mtu: 9000, txqlen: 500, ..Link::default() };
        let att = AttachmentId::new("net", "ctr", "eth0");
        let d = desired(&limits, &veth, &att, &psched());
        let t = d.ingress.unwrap();
        assert_eq!((t.rate, t.burst_bytes(&psched())), (1000, 100));
        let e = d.egress.unwrap();
        assert_eq!((e.tbf.rate, e.tbf.burst_bytes(&psched())), (125_000, 12_500));
        assert_eq!(e.tbf.limit, 125_000 / 40 + 12_500, "25 ms of traffic on top of the burst");
        assert_eq!(e.ifb.name, att.ifb_name());
        assert_eq!((e.ifb.mtu, e.ifb.txqlen), (9000, 1000));
        assert_eq!(e.ifb.alias, "cni-bandwidth net=net ctr=ctr if=eth0");
        assert_eq!(e.ifb.group, att.ifb_group());
        let long = Link { txqlen: 5000, ..veth };
        assert_eq!(desired(&limits, &long, &att, &psched()).egress.unwrap().ifb.txqlen, 5000);
        let none = desired(&Limits::default(), &long, &att, &psched());
        assert_eq!(none, Desired::default());
    }
}
