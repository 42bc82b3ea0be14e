//! Traffic control: the `ingress` and `tbf` qdiscs and a u32 match-all filter with one mirred
//! egress redirect — what traffic shaping with an ifb builds — plus dumps that read them back.
//!
//! netlink-packet-route has no TBF type, so its options are encoded here by hand, the way the
//! kernel's `net/sched/sch_tbf.c` reads them:
//! - `TCA_TBF_PARMS`: `struct tc_tbf_qopt` (rate ratespec, peak ratespec, limit, buffer, mtu;
//!   36 bytes, native endian). The rate ratespec carries the rate in bytes/s (saturated at
//!   `u32::MAX`) and link layer "ethernet".
//! - `TCA_TBF_RATE64` with the full rate when it does not fit in 32 bits.
//!
//! Not sent: `TCA_TBF_RTAB`, the 256-entry rate table. The kernel only reads it for a ratespec
//! whose link layer is "unaware" (0), and even then drops it right away; with link layer
//! "ethernet" it computes transmission times itself (since Linux 3.11). `TCA_TBF_BURST` is not
//! sent either, as by the Go plugin: the bucket travels as `buffer`, its time at the rate in
//! scheduler ticks (see [`Psched`]), which the kernel keeps as sent and reports back unchanged,
//! so CHECK can compare exactly. (With `TCA_TBF_BURST` the kernel would derive the bucket time
//! in 64 bits and report it truncated to 32-bit ticks.) A 32-bit tick count limits the bucket
//! to about 274.9 s of traffic at the rate; [`Tbf::with_latency`] saturates there.

use std::time::Duration;

use netlink_packet_core::{parse_string, DefaultNla, NlasIterator, NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute,
    TcFilterU32Option, TcHeader, TcMessage, TcMirror, TcMirrorActionType, TcOption, TcU32Key, TcU32Selector,
    TcU32SelectorFlags,
};
use netlink_packet_route::RouteNetlinkMessage;

use super::{Netlink, NlError};

/// `TC_H_ROOT`: the parent of a device's root (egress) qdisc.
pub const TC_H_ROOT: u32 = 0xFFFF_FFFF;
/// `TC_H_INGRESS`: the parent of a device's ingress qdisc.
pub const TC_H_INGRESS: u32 = 0xFFFF_FFF1;
/// `ffff:` — the handle of the ingress qdisc, and the parent of filters attached to it.
pub const INGRESS_HANDLE: u32 = 0xFFFF_0000;
/// `ETH_P_ALL`: a filter protocol that matches every packet.
pub const ETH_P_ALL: u16 = 0x0003;

/// `TC_H_MAKE(major << 16, minor)`.
pub const fn handle(major: u16, minor: u16) -> u32 {
    ((major as u32) << 16) | minor as u32
}

/// `maj:min` as tc prints handles (hex, minor omitted when 0).
pub fn handle_str(h: u32) -> String {
    match h {
        TC_H_ROOT => "root".into(),
        h if h & 0xFFFF == 0 => format!("{:x}:", h >> 16),
        h => format!("{:x}:{:x}", h >> 16, h & 0xFFFF),
    }
}

const RTM_NEWQDISC: u16 = 36;
const RTM_NEWTFILTER: u16 = 44;
const TC_HEADER_LEN: usize = 20;

const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;

const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TBF_QOPT_LEN: usize = 36;
const RATESPEC_LEN: usize = 12;
/// `TC_LINKLAYER_ETHERNET`.
const LINKLAYER_ETHERNET: u8 = 1;

const TCA_U32_SEL: u16 = 5;
const TCA_U32_ACT: u16 = 7;
const TCA_ACT_KIND: u16 = 1;
const TCA_ACT_OPTIONS: u16 = 2;
const TCA_MIRRED_PARMS: u16 = 2;
/// Size of `struct tc_u32_sel` without keys, and of one `struct tc_u32_key`.
const U32_SEL_LEN: usize = 16;
const U32_KEY_LEN: usize = 16;

/// `TC_ACT_STOLEN`: the packet was consumed (by a redirect).
pub const TC_ACT_STOLEN: i32 = 4;
/// `TCA_EGRESS_REDIR`.
pub const TCA_EGRESS_REDIR: i32 = 1;

/// The packet scheduler clock as `/proc/net/psched` describes it, with iproute2's reading of
/// that file: ticks per microsecond (`tick_in_usec`). On every kernel since 2.6.31 a tick is
/// 64 ns, i.e. 15.625 ticks per µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Psched {
    pub ticks_per_usec: f64,
}

impl Psched {
    /// Read `/proc/net/psched`.
    pub fn read() -> std::io::Result<Psched> {
        let text = std::fs::read_to_string("/proc/net/psched")?;
        Psched::parse(&text).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("cannot parse /proc/net/psched: {text:?}"),
            )
        })
    }

    /// Parse the file's text: `t2us us2t clock_res [hrtimer res]` in hex.
    pub fn parse(text: &str) -> Option<Psched> {
        let mut it = text.split_whitespace().map(|w| u32::from_str_radix(w, 16).ok());
        let (mut t2us, us2t, clock_res) = (it.next()??, it.next()??, it.next()??);
        if us2t == 0 || t2us == 0 || clock_res == 0 {
            return None;
        }
        // iproute2's compatibility rule: a clock resolution of 1 GHz means the tick
        // multiplier advertised for old binaries is really 1.
        if clock_res == 1_000_000_000 {
            t2us = us2t;
        }
        let clock_factor = f64::from(clock_res) / 1e6;
        Some(Psched { ticks_per_usec: f64::from(t2us) / f64::from(us2t) * clock_factor })
    }

    /// Microseconds to ticks (truncated, saturating at `u32::MAX`).
    pub fn usec_to_ticks(&self, usec: u64) -> u32 {
        let t = (usec as f64 * self.ticks_per_usec).floor();
        if t >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            t as u32
        }
    }

    /// Ticks to whole microseconds (truncated, as iproute2's `tc_core_tick2time`).
    pub fn ticks_to_usec(&self, ticks: u32) -> u64 {
        (f64::from(ticks) / self.ticks_per_usec) as u64
    }
}

/// A token bucket filter's parameters, in the units the kernel uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// Rate in bytes per second.
    pub rate: u64,
    /// Bucket size as the time to send it at `rate`, in scheduler ticks.
    pub buffer: u32,
    /// Bytes that may wait in the queue.
    pub limit: u32,
}

impl Tbf {
    /// A TBF as upstream's plugins compute it: `rate` bytes/s, a bucket of `burst`
    /// bytes, and a queue that holds `latency` worth of traffic on top of the burst
    /// (`limit = rate × latency + burst`, saturating). The bucket is converted to time at the
    /// rate (whole µs) and then to ticks, saturating at `u32::MAX` ticks (≈ 274.9 s at the
    /// rate; upstream's 32-bit arithmetic wraps instead). `rate` must not be 0.
    pub fn with_latency(rate: u64, burst: u64, latency: Duration, psched: &Psched) -> Tbf {
        assert!(rate > 0, "tbf rate must be positive");
        let usec = u128::from(burst) * 1_000_000 / u128::from(rate);
        let usec = u64::try_from(usec).unwrap_or(u64::MAX);
        let buffer = psched.usec_to_ticks(usec);
        let queued = u128::from(rate) * latency.as_micros() / 1_000_000 + u128::from(burst);
        let limit = u32::try_from(queued).unwrap_or(u32::MAX);
        Tbf { rate, buffer, limit }
    }

    /// The bucket size in bytes as `tc` prints it (`burst`): rate × buffer time in whole µs.
    pub fn burst_bytes(&self, psched: &Psched) -> u64 {
        let usec = psched.ticks_to_usec(self.buffer);
        (u128::from(self.rate) * u128::from(usec) / 1_000_000) as u64
    }

    /// `TCA_OPTIONS` content.
    fn options(&self) -> Vec<TcOption> {
        let mut parms = Vec::with_capacity(TBF_QOPT_LEN);
        // rate: cell_log, linklayer, overhead, cell_align, mpu, rate
        parms.extend_from_slice(&[0, LINKLAYER_ETHERNET]);
        parms.extend_from_slice(&0u16.to_ne_bytes());
        parms.extend_from_slice(&0i16.to_ne_bytes());
        parms.extend_from_slice(&0u16.to_ne_bytes());
        parms.extend_from_slice(&u32::try_from(self.rate).unwrap_or(u32::MAX).to_ne_bytes());
        // peakrate: none
        parms.extend_from_slice(&[0; RATESPEC_LEN]);
        parms.extend_from_slice(&self.limit.to_ne_bytes());
        parms.extend_from_slice(&self.buffer.to_ne_bytes());
        parms.extend_from_slice(&0u32.to_ne_bytes()); // mtu: only with a peak rate
        debug_assert_eq!(parms.len(), TBF_QOPT_LEN);
        let mut opts = vec![TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, parms))];
        if self.rate > u64::from(u32::MAX) {
            opts.push(TcOption::Other(DefaultNla::new(TCA_TBF_RATE64, self.rate.to_ne_bytes().to_vec())));
        }
        opts
    }

    /// Decode the raw `TCA_OPTIONS` value of a tbf qdisc.
    fn parse(options: &[u8]) -> Option<Tbf> {
        let mut parms = None;
        let mut rate64 = None;
        for nla in NlasIterator::new(options) {
            let nla = nla.ok()?;
            match nla.kind() {
                TCA_TBF_PARMS => parms = Some(nla.value().get(..TBF_QOPT_LEN)?.to_vec()),
                TCA_TBF_RATE64 => rate64 = Some(u64::from_ne_bytes(nla.value().get(..8)?.try_into().ok()?)),
                _ => {}
            }
        }
        let p = parms?;
        let u32_at = |off: usize| u32::from_ne_bytes(p[off..off + 4].try_into().expect("4 bytes"));
        let rate32 = u64::from(u32_at(8));
        Some(Tbf {
            rate: rate64.map_or(rate32, |r| r.max(rate32)),
            limit: u32_at(2 * RATESPEC_LEN),
            buffer: u32_at(2 * RATESPEC_LEN + 4),
        })
    }
}

/// A qdisc as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    pub ifindex: u32,
    pub handle: u32,
    pub parent: u32,
    /// "tbf", "ingress", "noqueue", "pfifo_fast", …
    pub kind: String,
    /// The parameters of a tbf qdisc.
    pub tbf: Option<Tbf>,
}

impl Qdisc {
    /// The device's root qdisc (including the kernel's default one, handle 0).
    pub fn is_root(&self) -> bool {
        self.parent == TC_H_ROOT
    }

    /// The ingress qdisc (`ffff:`).
    pub fn is_ingress(&self) -> bool {
        self.parent == TC_H_INGRESS
    }
}

/// One action of a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterAction {
    /// `mirred`: `eaction` is `TCA_EGRESS_REDIR` (1), `TCA_EGRESS_MIRROR` (2), …; `verdict` the
    /// generic `TC_ACT_*` result (`TC_ACT_STOLEN` for a redirect).
    Mirred { eaction: i32, ifindex: u32, verdict: i32 },
    /// Any other action, by kind.
    Other(String),
}

impl FilterAction {
    /// An egress redirect to `ifindex` that consumes the packet.
    pub fn is_egress_redirect_to(&self, ifindex: u32) -> bool {
        matches!(self, FilterAction::Mirred { eaction: TCA_EGRESS_REDIR, ifindex: i, verdict: TC_ACT_STOLEN }
            if *i == ifindex)
    }
}

/// A classifier rule as the kernel reports it. For u32 only the rules (knodes) are listed,
/// not the hash tables the kernel reports alongside them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub ifindex: u32,
    pub parent: u32,
    pub handle: u32,
    pub prio: u16,
    /// Host byte order (`ETH_P_ALL` = 3).
    pub protocol: u16,
    pub kind: String,
    /// For u32: the selector matches every packet (all key masks 0).
    pub match_all: bool,
    pub actions: Vec<FilterAction>,
}

fn tc_header(ifindex: u32, handle: u32, parent: u32) -> TcHeader {
    TcHeader {
        index: i32::try_from(ifindex).unwrap_or(i32::MAX),
        handle: handle.into(),
        parent: parent.into(),
        ..TcHeader::default()
    }
}

/// `RTM_NEWQDISC` for a tbf qdisc.
pub(crate) fn tbf_message(ifindex: u32, handle: u32, parent: u32, tbf: &Tbf) -> TcMessage {
    TcMessage::from_parts(
        tc_header(ifindex, handle, parent),
        vec![TcAttribute::Kind("tbf".into()), TcAttribute::Options(tbf.options())],
    )
}

/// `RTM_NEWQDISC` for the ingress qdisc.
pub(crate) fn ingress_message(ifindex: u32) -> TcMessage {
    TcMessage::from_parts(
        tc_header(ifindex, INGRESS_HANDLE, TC_H_INGRESS),
        vec![TcAttribute::Kind("ingress".into()), TcAttribute::Options(vec![])],
    )
}

/// `RTM_NEWTFILTER` for `tc filter add dev <ifindex> parent <parent> protocol all prio <prio>
/// u32 match u32 0 0 action mirred egress redirect dev <target>`.
pub(crate) fn redirect_filter_message(ifindex: u32, parent: u32, prio: u16, target: u32) -> TcMessage {
    let mut header = tc_header(ifindex, 0, parent);
    // tcm_info = TC_H_MAKE(prio << 16, htons(protocol))
    header.info = (u32::from(prio) << 16) | u32::from(ETH_P_ALL.to_be());

    let mut sel = TcU32Selector::default();
    sel.flags = TcU32SelectorFlags::Terminal;
    sel.nkeys = 1;
    sel.keys = vec![TcU32Key::default()]; // mask 0, value 0 at offset 0: matches everything

    let mut mirror = TcMirror::default();
    mirror.generic.action = TcActionType::Stolen;
    mirror.eaction = TcMirrorActionType::EgressRedir;
    mirror.ifindex = target;
    let mut action = TcAction::default(); // tab (order) 1
    action.attributes = vec![
        TcActionAttribute::Kind("mirred".into()),
        TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(mirror))]),
    ];

    TcMessage::from_parts(
        header,
        vec![
            TcAttribute::Kind("u32".into()),
            TcAttribute::Options(vec![
                TcOption::U32(TcFilterU32Option::Selector(sel)),
                TcOption::U32(TcFilterU32Option::Action(vec![action])),
            ]),
        ],
    )
}

/// The raw header fields and the `TCA_KIND` / `TCA_OPTIONS` values of a tc message. Parsed
/// by hand so that attributes this crate version cannot decode never hide a qdisc or filter.
struct RawTc<'a> {
    ifindex: u32,
    handle: u32,
    parent: u32,
    info: u32,
    kind: String,
    options: Option<&'a [u8]>,
}

fn parse_raw(buf: &[u8]) -> Option<RawTc<'_>> {
    let header = TcHeader::parse(buf).ok()?;
    let mut raw = RawTc {
        ifindex: u32::try_from(header.index).ok()?,
        handle: header.handle.into(),
        parent: header.parent.into(),
        info: header.info,
        kind: String::new(),
        options: None,
    };
    for nla in NlasIterator::new(buf.get(TC_HEADER_LEN..)?) {
        let Ok(nla) = nla else { break };
        match nla.kind() {
            TCA_KIND => raw.kind = parse_string(nla.value()).ok()?,
            TCA_OPTIONS => {
                let len = nla.length() as usize;
                raw.options = nla.into_inner().get(4..len);
            }
            _ => {}
        }
    }
    Some(raw)
}

pub(crate) fn parse_qdisc(buf: &[u8]) -> Option<Qdisc> {
    let raw = parse_raw(buf)?;
    let tbf = match (raw.kind.as_str(), raw.options) {
        ("tbf", Some(o)) => Tbf::parse(o),
        _ => None,
    };
    Some(Qdisc { ifindex: raw.ifindex, handle: raw.handle, parent: raw.parent, kind: raw.kind, tbf })
}

/// A filter dump entry; `None` for entries that are not rules (u32 hash tables) or cannot be
/// read.
pub(crate) fn parse_filter(buf: &[u8]) -> Option<Filter> {
    let raw = parse_raw(buf)?;
    let mut filter = Filter {
        ifindex: raw.ifindex,
        parent: raw.parent,
        handle: raw.handle,
        prio: (raw.info >> 16) as u16,
        protocol: u16::from_be(raw.info as u16),
        kind: raw.kind,
        match_all: false,
        actions: Vec::new(),
    };
    if filter.kind != "u32" {
        return Some(filter);
    }
    let mut is_rule = false;
    for nla in NlasIterator::new(raw.options?) {
        let Ok(nla) = nla else { break };
        match nla.kind() {
            TCA_U32_SEL => {
                is_rule = true;
                filter.match_all = u32_selector_matches_all(nla.value());
            }
            TCA_U32_ACT => filter.actions = parse_actions(nla.value()),
            _ => {}
        }
    }
    is_rule.then_some(filter)
}

/// `struct tc_u32_sel` followed by `nkeys` keys: true when every key's mask is 0.
fn u32_selector_matches_all(sel: &[u8]) -> bool {
    let Some(&nkeys) = sel.get(2) else { return false };
    (0..usize::from(nkeys)).all(|i| {
        let off = U32_SEL_LEN + i * U32_KEY_LEN;
        sel.get(off..off + 4).is_some_and(|mask| mask == [0; 4])
    })
}

fn parse_actions(list: &[u8]) -> Vec<FilterAction> {
    let mut out: Vec<(u16, FilterAction)> = Vec::new();
    for nla in NlasIterator::new(list) {
        let Ok(nla) = nla else { break };
        let order = nla.kind();
        let mut kind = String::new();
        let mut mirred = None;
        for attr in NlasIterator::new(nla.value()) {
            let Ok(attr) = attr else { break };
            match attr.kind() & !netlink_packet_core::NLA_F_NESTED {
                TCA_ACT_KIND => kind = parse_string(attr.value()).unwrap_or_default(),
                TCA_ACT_OPTIONS => {
                    for opt in NlasIterator::new(attr.value()) {
                        let Ok(opt) = opt else { break };
                        if opt.kind() == TCA_MIRRED_PARMS {
                            mirred = TcMirror::parse(opt.value()).ok();
                        }
                    }
                }
                _ => {}
            }
        }
        let action = match (kind.as_str(), mirred) {
            ("mirred", Some(m)) => FilterAction::Mirred {
                eaction: m.eaction.into(),
                ifindex: m.ifindex,
                verdict: m.generic.action.into(),
            },
            _ => FilterAction::Other(kind),
        };
        out.push((order, action));
    }
    out.sort_by_key(|(order, _)| *order);
    out.into_iter().map(|(_, a)| a).collect()
}

impl Netlink {
    fn new_qdisc(&mut self, msg: TcMessage, what: impl FnOnce() -> String) -> Result<(), NlError> {
        self.sock
            .request(RouteNetlinkMessage::NewQueueDiscipline(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map(drop)
            .map_err(|e| e.during(what()))
    }

    /// `tc qdisc add dev <ifindex> parent <parent> handle <handle> tbf …`. EEXIST when the
    /// parent already has a (non-default) qdisc.
    pub fn qdisc_add_tbf(
        &mut self,
        ifindex: u32,
        handle: u32,
        parent: u32,
        tbf: &Tbf,
    ) -> Result<(), NlError> {
        self.new_qdisc(tbf_message(ifindex, handle, parent, tbf), || {
            format!(
                "add tbf qdisc {} (rate {} B/s, limit {} B) on link {ifindex}",
                handle_str(handle),
                tbf.rate,
                tbf.limit
            )
        })
    }

    /// `tc qdisc add dev <ifindex> ingress` (handle `ffff:`). EEXIST when there is one.
    pub fn qdisc_add_ingress(&mut self, ifindex: u32) -> Result<(), NlError> {
        self.new_qdisc(ingress_message(ifindex), || format!("add ingress qdisc on link {ifindex}"))
    }

    /// Delete the qdisc `handle` under `parent` ([`TC_H_ROOT`] or [`TC_H_INGRESS`] for the
    /// device's own ones). `Ok(false)` when the device or the qdisc is gone.
    pub fn qdisc_del(&mut self, ifindex: u32, parent: u32, handle: u32) -> Result<bool, NlError> {
        let msg = TcMessage::from_parts(tc_header(ifindex, handle, parent), vec![]);
        let what = || format!("delete qdisc {} of link {ifindex}", handle_str(handle));
        match self.sock.request(RouteNetlinkMessage::DelQueueDiscipline(msg), 0) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            // The kernel says "Invalid handle" when the qdisc at `parent` has another handle,
            // which includes the built-in default (handle 0) left after a delete.
            Err(e) if e.errno == libc::EINVAL => {
                let there = self.qdiscs(Some(ifindex)).map_err(|d| d.during(what()))?;
                if there.iter().any(|q| q.parent == parent && q.handle == handle) {
                    Err(e.during(what()))
                } else {
                    Ok(false)
                }
            }
            Err(e) => Err(e.during(what())),
        }
    }

    /// The qdiscs of link `ifindex` (all links when `None`).
    pub fn qdiscs(&mut self, ifindex: Option<u32>) -> Result<Vec<Qdisc>, NlError> {
        let msg = TcMessage::with_index(0);
        let all = self
            .dump(RouteNetlinkMessage::GetQueueDiscipline(msg), RTM_NEWQDISC, parse_qdisc)
            .map_err(|e| e.during("list qdiscs"))?;
        Ok(all.into_iter().filter(|q| ifindex.is_none_or(|i| q.ifindex == i)).collect())
    }

    /// Attach a u32 filter matching every packet (protocol all) to `parent` of link `ifindex`,
    /// with one action: mirred egress redirect to `target` (verdict stolen).
    pub fn filter_add_redirect(
        &mut self,
        ifindex: u32,
        parent: u32,
        prio: u16,
        target: u32,
    ) -> Result<(), NlError> {
        self.sock
            .request(
                RouteNetlinkMessage::NewTrafficFilter(redirect_filter_message(ifindex, parent, prio, target)),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .map(drop)
            .map_err(|e| {
                e.during(format!(
                    "add u32 redirect filter from link {ifindex} ({}) to link {target}",
                    handle_str(parent)
                ))
            })
    }

    /// The filters attached to `parent` of link `ifindex`. An empty list when the link or the
    /// parent qdisc does not exist.
    pub fn filters(&mut self, ifindex: u32, parent: u32) -> Result<Vec<Filter>, NlError> {
        let msg = TcMessage::from_parts(tc_header(ifindex, 0, parent), vec![]);
        match self.dump(RouteNetlinkMessage::GetTrafficFilter(msg), RTM_NEWTFILTER, parse_filter) {
            Ok(all) => Ok(all.into_iter().filter(|f| f.ifindex == ifindex).collect()),
            Err(e) if e.is_not_found() || e.errno == libc::EINVAL => Ok(Vec::new()),
            Err(e) => Err(e.during(format!("list filters of link {ifindex}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::emit;
    use netlink_packet_core::{Nla, Parseable};

    const PSCHED: &str = "000003e8 00000040 000f4240 3b9aca00\n";

    fn psched() -> Psched {
        Psched::parse(PSCHED).unwrap()
    }

    #[test]
    fn psched_of_modern_kernels() {
        let p = psched();
        assert_eq!(p.ticks_per_usec, 15.625);
        assert_eq!(p.usec_to_ticks(81_920), 1_280_000);
        assert_eq!(p.ticks_to_usec(1_280_000), 81_920);
        assert_eq!(p.usec_to_ticks(u64::MAX), u32::MAX);
        // Old kernels with a nanosecond clock advertised 1000 ticks per µs this way.
        let old = Psched::parse("000003e8 00000400 3b9aca00 3b9aca00").unwrap();
        assert_eq!(old.ticks_per_usec, 1000.0);
        assert!(Psched::parse("").is_none());
        assert!(Psched::parse("0 0 0").is_none());
        // any one of the three values zero: unusable
        for text in ["0 40 f4240", "3e8 0 f4240", "3e8 40 0"] {
            assert!(Psched::parse(text).is_none(), "{text}");
        }
        assert!(Psched::parse("zz 40 f4240").is_none());
    }

    #[test]
    fn the_live_psched_file_parses() {
        let p = Psched::read().unwrap();
        assert!(p.ticks_per_usec > 0.0);
    }

    #[test]
    fn tbf_arithmetic_matches_tc() {
        // tc qdisc add … tbf rate 1mbit burst 10kb latency 25ms prints
        // rate 125000 burst 10240 burst_raw 0x138800 limit 13365.
        let t = Tbf::with_latency(125_000, 10_240, Duration::from_millis(25), &psched());
        assert_eq!(t, Tbf { rate: 125_000, buffer: 0x13_8800, limit: 13_365 });
        assert_eq!(t.burst_bytes(&psched()), 10_240);
    }

    #[test]
    fn tbf_rates_above_32_bits_get_the_64_bit_attribute() {
        let t = |rate| Tbf { rate, buffer: 1, limit: 1 }.options().len();
        assert_eq!(t(u64::from(u32::MAX)), 1, "fits TCA_TBF_PARMS");
        assert_eq!(t(u64::from(u32::MAX) + 1), 2, "plus TCA_TBF_RATE64");
    }

    #[test]
    fn tbf_bucket_saturates_at_32_bit_ticks() {
        // containerd sends a burst of 2^32-1 bits for Kubernetes' annotations: 512 MiB at
        // 1 Mbit/s is over an hour of traffic; 2^32-1 ticks of 64 ns are 274.877906 s.
        let p = psched();
        let t = Tbf::with_latency(125_000, (u64::from(u32::MAX)) / 8, Duration::from_millis(25), &p);
        assert_eq!(t.buffer, u32::MAX);
        assert_eq!(t.burst_bytes(&p), 125_000 * 274_877_906 / 1_000_000);
        assert_eq!(t.limit, 3_125 + 536_870_911);
        // limit saturates instead of wrapping
        let t =
            Tbf::with_latency(u64::from(u32::MAX), u64::from(u32::MAX) - 1, Duration::from_millis(25), &p);
        assert_eq!(t.limit, u32::MAX);
    }

    #[test]
    fn tbf_options_encode_and_parse_back() {
        let t = Tbf { rate: 1_250_000, buffer: 1234, limit: 99_999 };
        let opts = t.options();
        assert_eq!(opts.len(), 1, "no RATE64 for a 32-bit rate");
        let TcOption::Other(parms) = &opts[0] else { panic!("{opts:?}") };
        assert_eq!(parms.kind(), TCA_TBF_PARMS);
        let mut v = vec![0; parms.value_len()];
        parms.emit_value(&mut v);
        assert_eq!(v.len(), TBF_QOPT_LEN);
        assert_eq!(v[1], LINKLAYER_ETHERNET);
        assert_eq!(&v[8..12], &1_250_000u32.to_ne_bytes());
        assert!(v[12..24].iter().all(|b| *b == 0), "no peak rate");
        assert_eq!(&v[24..28], &99_999u32.to_ne_bytes());
        assert_eq!(&v[28..32], &1234u32.to_ne_bytes());
        assert_eq!(&v[32..36], &[0; 4], "mtu");

        let msg = tbf_message(7, handle(1, 0), TC_H_ROOT, &t);
        let bytes = emit(&msg);
        let q = parse_qdisc(&bytes).unwrap();
        assert_eq!(
            q,
            Qdisc { ifindex: 7, handle: 0x0001_0000, parent: TC_H_ROOT, kind: "tbf".into(), tbf: Some(t) }
        );
        assert!(q.is_root() && !q.is_ingress());
    }

    #[test]
    fn rates_above_32_bits_use_rate64() {
        let t = Tbf { rate: 5_000_000_000, buffer: 10, limit: 10 };
        let opts = t.options();
        assert_eq!(opts.len(), 2);
        let TcOption::Other(r64) = &opts[1] else { panic!() };
        assert_eq!(r64.kind(), TCA_TBF_RATE64);
        let q = parse_qdisc(&emit(&tbf_message(3, handle(1, 0), TC_H_ROOT, &t))).unwrap();
        assert_eq!(q.tbf, Some(t));
    }

    #[test]
    fn ingress_qdisc_message() {
        let msg = ingress_message(9);
        let parsed = TcMessage::parse(&emit(&msg)[..]).unwrap();
        assert_eq!(parsed.header.index, 9);
        assert_eq!(u32::from(parsed.header.parent), 0xFFFF_FFF1);
        assert_eq!(u32::from(parsed.header.handle), 0xFFFF_0000);
        assert_eq!(parsed.attributes[0], TcAttribute::Kind("ingress".into()));
        let q = parse_qdisc(&emit(&msg)).unwrap();
        assert!(q.is_ingress());
        assert_eq!(q.tbf, None);
    }

    #[test]
    fn redirect_filter_has_one_stolen_egress_redirect() {
        let msg = redirect_filter_message(4, INGRESS_HANDLE, 1, 12);
        let bytes = emit(&msg);
        // The crate's own parser reads it back as we meant it.
        let parsed = TcMessage::parse(&bytes[..]).unwrap();
        assert_eq!(parsed.header.info, 0x0001_0300, "prio 1, protocol htons(ETH_P_ALL)");
        let f = parse_filter(&bytes).unwrap();
        assert_eq!(
            f,
            Filter {
                ifindex: 4,
                parent: INGRESS_HANDLE,
                handle: 0,
                prio: 1,
                protocol: ETH_P_ALL,
                kind: "u32".into(),
                match_all: true,
                actions: vec![FilterAction::Mirred {
                    eaction: TCA_EGRESS_REDIR,
                    ifindex: 12,
                    verdict: TC_ACT_STOLEN
                }],
            }
        );
        assert!(f.actions[0].is_egress_redirect_to(12));
        assert!(!f.actions[0].is_egress_redirect_to(13));
    }

    #[test]
    fn handles_print_like_tc() {
        assert_eq!(handle_str(handle(1, 0)), "1:");
        assert_eq!(handle_str(INGRESS_HANDLE), "ffff:");
        assert_eq!(handle_str(TC_H_INGRESS), "ffff:fff1");
        assert_eq!(handle_str(TC_H_ROOT), "root");
    }

    #[test]
    fn garbage_does_not_parse() {
        assert!(parse_qdisc(&[0; 4]).is_none());
        assert_eq!(Tbf::parse(&[4, 0, 1, 0]), None);
        assert!(!u32_selector_matches_all(&[]));
    }
}

/// Kernel tests (root): each test thread moves into a fresh network namespace first, and every
/// object is read back both through our dump and through iproute2's `tc -j`.
#[cfg(test)]
mod kernel_tests {
    use super::*;
    use crate::netlink::{Link, LinkKind, LinkSpec, VethPeer};
    use crate::netns::test_support::private_netns;
    use serde_json::Value;

    fn fresh() -> Netlink {
        private_netns();
        Netlink::new().expect("open netlink socket")
    }

    fn ifb(nl: &mut Netlink, name: &str) -> Link {
        nl.link_add(&LinkSpec { up: true, ..LinkSpec::new(name, LinkKind::Ifb) }).expect("create ifb")
    }

    /// `tc -j <args>` in this thread's namespace, parsed.
    fn tc_json(args: &[&str]) -> Value {
        let out = std::process::Command::new("tc").args(args).output().expect("run tc (iproute2)");
        assert!(out.status.success(), "tc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("tc {args:?} printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout))
        })
    }

    fn tc_qdisc(dev: &str, kind: &str) -> Value {
        let all = tc_json(&["-s", "-d", "-j", "-raw", "qdisc", "show", "dev", dev]);
        all.as_array().unwrap().iter().find(|q| q["kind"] == kind).cloned().unwrap_or_else(|| {
            panic!("no {kind} qdisc on {dev}: {all}");
        })
    }

    fn add_and_compare(nl: &mut Netlink, dev: &Link, tbf: Tbf) {
        let p = Psched::read().unwrap();
        nl.qdisc_add_tbf(dev.index, handle(1, 0), TC_H_ROOT, &tbf).unwrap();
        let ours: Vec<Qdisc> =
            nl.qdiscs(Some(dev.index)).unwrap().into_iter().filter(|q| q.is_root()).collect();
        assert_eq!(ours.len(), 1, "{ours:?}");
        assert_eq!(ours[0].kind, "tbf");
        assert_eq!(ours[0].handle, handle(1, 0));
        assert_eq!(ours[0].tbf, Some(tbf), "the kernel reports back exactly what was sent");

        let q = tc_qdisc(&dev.name, "tbf");
        assert_eq!(q["handle"], "1:");
        assert_eq!(q["root"], true);
        let o = &q["options"];
        assert_eq!(o["rate"].as_u64(), Some(tbf.rate), "{q}");
        assert_eq!(o["limit"].as_u64(), Some(u64::from(tbf.limit)), "{q}");
        assert_eq!(o["linklayer"], "ethernet", "{q}");
        // -d prints burst as "<size>/<cell>"; burst_raw is the buffer in ticks (hex).
        assert_eq!(o["burst_raw"].as_str(), Some(format!("{:x}", tbf.buffer).as_str()), "{q}");
        let burst_tc = tc_json(&["-j", "qdisc", "show", "dev", &dev.name]);
        let burst_tc = burst_tc.as_array().unwrap().iter().find(|q| q["kind"] == "tbf").unwrap();
        assert_eq!(burst_tc["options"]["burst"].as_u64(), Some(tbf.burst_bytes(&p)), "{burst_tc}");
    }

    #[test]
    fn tbf_reads_back_as_sent_and_as_tc_prints_it() {
        let mut nl = fresh();
        let p = Psched::read().unwrap();
        let dev = ifb(&mut nl, "shape0");
        // 1 Mbit/s, 10 KiB burst, 25 ms: what `tc … tbf rate 1mbit burst 10kb latency 25ms` makes
        let t = Tbf::with_latency(125_000, 10_240, Duration::from_millis(25), &p);
        add_and_compare(&mut nl, &dev, t);
        let o = &tc_qdisc("shape0", "tbf")["options"];
        assert_eq!(o["lat"].as_u64(), Some(25_000), "{o}");

        // A second root qdisc is refused.
        let e = nl.qdisc_add_tbf(dev.index, handle(1, 0), TC_H_ROOT, &t).unwrap_err();
        assert!(e.is_exists(), "{e}");
        assert!(e.to_string().starts_with("add tbf qdisc 1: (rate 125000 B/s"), "{e}");

        assert!(nl.qdisc_del(dev.index, TC_H_ROOT, handle(1, 0)).unwrap());
        assert!(nl.qdiscs(Some(dev.index)).unwrap().iter().all(|q| q.kind != "tbf"));
        assert!(!nl.qdisc_del(dev.index, TC_H_ROOT, handle(1, 0)).unwrap(), "already gone");
    }

    #[test]
    fn tbf_above_4_gbyte_per_second_and_with_a_huge_burst() {
        let mut nl = fresh();
        let p = Psched::read().unwrap();
        let fast = ifb(&mut nl, "fast0");
        // 40 Gbit/s needs TCA_TBF_RATE64.
        add_and_compare(
            &mut nl,
            &fast,
            Tbf::with_latency(5_000_000_000, 1_000_000, Duration::from_millis(25), &p),
        );
        // containerd's "unlimited" burst of 2^32-1 bits at 1 Mbit/s: the largest bucket.
        let slow = ifb(&mut nl, "slow0");
        let t = Tbf::with_latency(125_000, u64::from(u32::MAX) / 8, Duration::from_millis(25), &p);
        assert_eq!(t.buffer, u32::MAX);
        add_and_compare(&mut nl, &slow, t);
    }

    #[test]
    fn ingress_qdisc_and_redirect_filter() {
        let mut nl = fresh();
        let veth = nl
            .link_add(&LinkSpec {
                up: true,
                ..LinkSpec::new(
                    "host0",
                    LinkKind::Veth { peer: VethPeer { up: true, ..VethPeer::new("ctr0", None) } },
                )
            })
            .unwrap();
        let target = ifb(&mut nl, "bwp0");
        assert!(nl.filters(veth.index, INGRESS_HANDLE).unwrap().is_empty(), "no ingress qdisc yet");

        nl.qdisc_add_ingress(veth.index).unwrap();
        assert!(nl.qdisc_add_ingress(veth.index).unwrap_err().is_exists());
        let q = nl.qdiscs(Some(veth.index)).unwrap();
        let ing: Vec<&Qdisc> = q.iter().filter(|q| q.is_ingress()).collect();
        assert_eq!(ing.len(), 1, "{q:?}");
        assert_eq!((ing[0].kind.as_str(), ing[0].handle), ("ingress", INGRESS_HANDLE));
        assert_eq!(tc_qdisc("host0", "ingress")["handle"], "ffff:");

        nl.filter_add_redirect(veth.index, INGRESS_HANDLE, 1, target.index).unwrap();
        let filters = nl.filters(veth.index, INGRESS_HANDLE).unwrap();
        assert_eq!(filters.len(), 1, "{filters:?}");
        let f = &filters[0];
        assert_eq!((f.kind.as_str(), f.prio, f.protocol, f.match_all), ("u32", 1, ETH_P_ALL, true));
        assert_eq!(
            f.actions,
            vec![FilterAction::Mirred {
                eaction: TCA_EGRESS_REDIR,
                ifindex: target.index,
                verdict: TC_ACT_STOLEN
            }]
        );

        // What tc sees: one rule, match-all, a single mirred egress redirect, stolen.
        let shown = tc_json(&["-j", "filter", "show", "dev", "host0", "parent", "ffff:"]);
        let rules: Vec<&Value> =
            shown.as_array().unwrap().iter().filter(|f| f["options"]["match"].is_object()).collect();
        assert_eq!(rules.len(), 1, "{shown}");
        let r = rules[0];
        assert_eq!(
            (r["protocol"].as_str(), r["pref"].as_u64(), r["kind"].as_str()),
            (Some("all"), Some(1), Some("u32"))
        );
        assert_eq!(r["options"]["match"]["mask"], "0");
        assert_eq!(r["options"]["match"]["value"], "0");
        let acts = r["options"]["actions"].as_array().unwrap();
        assert_eq!(acts.len(), 1, "one action, not upstream's two: {r}");
        assert_eq!(acts[0]["kind"], "mirred");
        assert_eq!(acts[0]["mirred_action"], "redirect");
        assert_eq!(acts[0]["direction"], "egress");
        assert_eq!(acts[0]["to_dev"], "bwp0");
        assert_eq!(acts[0]["control_action"]["type"], "stolen");

        // Deleting the ingress qdisc takes its filters along; a second delete finds nothing.
        assert!(nl.qdisc_del(veth.index, TC_H_INGRESS, INGRESS_HANDLE).unwrap());
        assert!(nl.qdiscs(Some(veth.index)).unwrap().iter().all(|q| !q.is_ingress()));
        assert!(nl.filters(veth.index, INGRESS_HANDLE).unwrap().is_empty());
        assert!(!nl.qdisc_del(veth.index, TC_H_INGRESS, INGRESS_HANDLE).unwrap());
    }

    #[test]
    fn missing_devices() {
        let mut nl = fresh();
        assert!(nl.filters(4242, INGRESS_HANDLE).unwrap().is_empty());
        assert!(nl.qdiscs(Some(4242)).unwrap().is_empty());
        assert!(!nl.qdisc_del(4242, TC_H_ROOT, handle(1, 0)).unwrap());
        let e = nl.qdisc_add_ingress(4242).unwrap_err();
        assert!(e.is_not_found(), "{e}");
    }
}
