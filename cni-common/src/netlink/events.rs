//! Waiting for kernel state changes without sleeping: a netlink socket subscribed to rtnetlink
//! multicast groups, read with a deadline. The usual pattern is subscribe, then query the current
//! state, then wait for notifications until the condition holds — so a change that happens
//! between the query and the wait is never missed.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use netlink_packet_core::{NetlinkBuffer, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use super::addr::{parse_address, Address};
use super::link::parse_link;
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

struct Subscription {
    sock: Socket,
    buf: Vec<u8>,
}

impl Subscription {
    /// A socket in the calling thread's network namespace, joined to `groups`.
    fn open(groups: &[u32]) -> Result<Subscription, NlError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| NlError::from_io("open netlink socket", &e))?;
        sock.bind(&SocketAddr::new(0, 0)).map_err(|e| NlError::from_io("bind netlink socket", &e))?;
        for g in groups {
            sock.add_membership(*g).map_err(|e| NlError::from_io("join rtnetlink group", &e))?;
        }
        Ok(Subscription { sock, buf: vec![0; 64 * 1024] })
    }

    /// The next batch of notifications, or an empty batch when `deadline` has passed.
    fn next(&mut self, deadline: Instant) -> Result<Vec<Event>, NlError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            let mut pfd = libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(NlError::from_io("poll netlink socket", &e));
            }
            if n == 0 {
                continue; // re-check the deadline
            }
            let mut window: &mut [u8] = &mut self.buf[..];
            let len = match self.sock.recv(&mut window, libc::MSG_DONTWAIT) {
                Ok(len) => len,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // ENOBUFS: notifications were dropped; the caller re-queries the state.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(Vec::new()),
                Err(e) => return Err(NlError::from_io("receive netlink notification", &e)),
            };
            return Ok(decode_events(&self.buf[..len]));
        }
    }
}

fn decode_events(mut data: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    while let Ok(msg) = NetlinkBuffer::new_checked(data) {
        let len = msg.length() as usize;
        match msg.message_type() {
            RTM_NEWLINK => out.extend(parse_link(msg.payload()).map(Event::Link)),
            RTM_NEWADDR => out.extend(parse_address(msg.payload()).map(|_| Event::Addr)),
            NLMSG_NOOP | NLMSG_DONE | NLMSG_ERROR | NLMSG_OVERRUN => {}
            _ => {}
        }
        let step = (len + 3) & !3;
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
    ///
    /// The subscription socket is created in the calling thread's namespace, which must be the
    /// one this connection talks to.
    pub fn wait_link_oper_up(&mut self, index: u32, timeout: Duration) -> Result<Option<Link>, NlError> {
        let deadline = Instant::now() + timeout;
        // Fast path: already up (the usual case when the peer came up a moment ago).
        let Some(link) = self.link_by_index(index)? else { return Ok(None) };
        if link.oper_state_up() {
            return Ok(Some(link));
        }
        let mut sub = Subscription::open(&[RTNLGRP_LINK])?;
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
        let mut sub = Subscription::open(&[RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR])?;
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
