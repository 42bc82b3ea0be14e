//! Waiting for kernel state changes without sleeping: a netlink socket subscribed to rtnetlink
//! multicast groups, read with a deadline. The usual pattern is subscribe, then query the current
//! state, then wait for notifications until the condition holds — so a change that happens
//! between the query and the wait is never missed.

use std::time::{Duration, Instant};

use netlink_packet_core::NetlinkBuffer;

use super::addr::{parse_address, Address};
use super::link::parse_link;
use super::socket::NlSocket;
use super::{Family, Link, Netlink, NlError};

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV6_IFADDR: u32 = 9;

/// Notifications of one kind, as they arrive.
#[derive(Debug)]
enum Event {
    Link(Link),
    Addr,
}

/// A socket joined to rtnetlink multicast groups, in the namespace of the [`Netlink`] that
/// opened it.
pub(super) struct Subscription {
    pub(super) sock: NlSocket,
}

impl Subscription {
    /// The next batch of notifications, or an empty batch when `deadline` has passed (or
    /// notifications were dropped: the caller re-queries the state).
    fn next(&mut self, deadline: Instant) -> Result<Vec<Event>, NlError> {
        Ok(self.sock.recv_until(deadline)?.map(decode_events).unwrap_or_default())
    }
}

impl Netlink {
    /// A socket subscribed to `groups` in this connection's namespace (not necessarily the
    /// calling thread's).
    pub(super) fn subscribe(&self, groups: &[u32]) -> Result<Subscription, NlError> {
        self.open_beside(|| {
            let mut sock = NlSocket::open()?;
            for g in groups {
                sock.join(*g)?;
            }
            Ok(Subscription { sock })
        })
    }
}

fn decode_events(mut data: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    while let Ok(msg) = NetlinkBuffer::new_checked(data) {
        let len = msg.length() as usize;
        match msg.message_type() {
            RTM_NEWLINK => out.extend(parse_link(msg.payload()).map(Event::Link)),
            RTM_NEWADDR => out.extend(parse_address(msg.payload()).map(|_| Event::Addr)),
            _ => {}
        }
        let step = len.next_multiple_of(4);
        if step == 0 || step >= data.len() {
            break;
        }
        data = &data[step..];
    }
    out
}

impl Netlink {
    /// Wait until link `index` is operationally up (`IF_OPER_UP`), for at most `timeout`.
    /// Event-driven: subscribes to link notifications, then checks the current state, then
    /// waits for notifications. Returns the link as last seen; `Ok(None)` when it vanished.
    /// On timeout the error is ETIMEDOUT with the last seen state in its text.
    pub fn wait_link_oper_up(&mut self, index: u32, timeout: Duration) -> Result<Option<Link>, NlError> {
        let deadline = Instant::now() + timeout;
        // Fast path: already up (the usual case when the peer came up a moment ago).
        let Some(link) = self.link_by_index(index)? else { return Ok(None) };
        if link.oper_state_up() {
            return Ok(Some(link));
        }
        let mut sub = self.subscribe(&[RTNLGRP_LINK])?;
        let mut last = self.link_by_index(index)?;
        loop {
            match &last {
                None => return Ok(None),
                Some(l) if l.oper_state_up() => return Ok(last),
                _ => {}
            }
            if Instant::now() >= deadline {
                let state = last.as_ref().map(|l| oper_state_name(l.oper_state)).unwrap_or("gone");
                let mut e = NlError::new(format!("wait for link {index} to be up"), libc::ETIMEDOUT);
                e.detail = Some(format!("operational state is still {state} after {timeout:?}"));
                return Err(e);
            }
            let events = sub.next(deadline)?;
            if events.is_empty() {
                // Timeout or dropped notifications: look again.
                last = self.link_by_index(index)?;
                continue;
            }
            for ev in events {
                if let Event::Link(l) = ev {
                    if l.index == index {
                        last = Some(l);
                    }
                }
            }
        }
    }

    /// Wait until no address of link `index` (of `family`, or any) is tentative (IPv6 duplicate
    /// address detection still running), for at most `timeout`. Fails with EADDRNOTAVAIL naming
    /// the address when DAD found a duplicate, ETIMEDOUT when it did not finish in time.
    pub fn wait_addrs_settled(
        &mut self,
        index: u32,
        family: Option<Family>,
        timeout: Duration,
    ) -> Result<Vec<Address>, NlError> {
        let deadline = Instant::now() + timeout;
        let check = |addrs: &[Address]| -> Result<bool, NlError> {
            if let Some(a) = addrs.iter().find(|a| a.dadfailed()) {
                return Err(NlError::new(
                    format!("address {} failed duplicate address detection", a.addr),
                    libc::EADDRNOTAVAIL,
                ));
            }
            Ok(!addrs.iter().any(|a| a.tentative()))
        };
        let addrs = self.addrs(Some(index), family)?;
        if check(&addrs)? {
            return Ok(addrs);
        }
        let mut sub = self.subscribe(&[RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR])?;
        loop {
            let addrs = self.addrs(Some(index), family)?;
            if check(&addrs)? {
                return Ok(addrs);
            }
            if Instant::now() >= deadline {
                let list: Vec<String> =
                    addrs.iter().filter(|a| a.tentative()).map(|a| a.addr.to_string()).collect();
                let mut e =
                    NlError::new(format!("wait for addresses of link {index} to settle"), libc::ETIMEDOUT);
                e.detail = Some(format!("still tentative after {timeout:?}: {}", list.join(", ")));
                return Err(e);
            }
            // Any address notification for the link means: look again.
            let _ = sub.next(deadline)?;
        }
    }
}

fn oper_state_name(s: u8) -> &'static str {
    match s {
        0 => "unknown",
        1 => "notpresent",
        2 => "down",
        3 => "lowerlayerdown",
        4 => "testing",
        5 => "dormant",
        6 => "up",
        _ => "other",
    }
}
