//! Synchronous netlink: an rtnetlink client (links, addresses, routes, bridge ports and VLANs,
//! traffic control ([`tc`]), link and address events), nf_tables ([`nft`]) and conntrack
//! ([`conntrack`]), all over one blocking transport (`socket`, nfnetlink framing in `nfnl`).
//!
//! One [`Netlink`] owns one blocking `NETLINK_ROUTE` socket. A socket talks to the network
//! namespace it was created in for its whole life, whatever the thread does afterwards, so a
//! plugin opens one for the host ([`Netlink::new`]) and one for the container
//! ([`Netlink::new_in`]) and then never has to think about which namespace a call lands in —
//! also for calls that open a second socket (the event waits): it lands beside the first.
//!
//! Every operation returns [`NlError`], which keeps the kernel's errno so callers can tell
//! "already gone" ([`NlError::is_not_found`]) or "already there" ([`NlError::is_exists`]) from
//! real failures; it converts into a [`CniError`] (code 999) with `?`.
//!
//! The netlink-packet-* message types stay inside this module; the API uses std types, `ipnet`
//! and the small structs defined here.

mod addr;
mod bridge;
pub mod conntrack;
mod devconf;
mod error;
mod events;
mod link;
mod nfnl;
pub mod nft;
mod route;
mod socket;
pub mod tc;
#[cfg(test)]
mod tests;

use netlink_packet_route::AddressFamily;

use crate::netns::NetNs;
use crate::{CniError, Result};

pub use addr::Address;
pub use bridge::{PortFlag, PortFlags, PortVlan};
pub use devconf::IPV4_DEVCONF_ARP_NOTIFY;
pub use error::NlError;
pub use link::{BridgeOpt, BridgeOpts, Link, LinkKind, LinkSpec, OptValue, VethPeer};
pub use route::{NextHop, Route, RouteKind, RouteSpec, SCOPE_LINK, SCOPE_UNIVERSE, TABLE_MAIN};

use socket::NlSocket;

/// The address family (shared by every layer: [`crate::net::Family`]).
pub use crate::net::Family;

fn to_af(f: Family) -> AddressFamily {
    match f {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    }
}

/// The family of an rtnetlink header (None for other families).
fn family_of_af(af: AddressFamily) -> Option<Family> {
    match af {
        AddressFamily::Inet => Some(Family::V4),
        AddressFamily::Inet6 => Some(Family::V6),
        _ => None,
    }
}

fn af_of(family: Option<Family>) -> AddressFamily {
    family.map_or(AddressFamily::Unspec, to_af)
}

/// An rtnetlink connection bound to one network namespace. Methods live in the `link`, `addr`,
/// `route`, `bridge`, `tc` and `events` submodules.
pub struct Netlink {
    sock: NlSocket,
    /// The namespace of `sock`, when it was opened with [`Netlink::new_in`]; otherwise asked
    /// of the kernel when needed (the calling thread may have moved since).
    ns: Option<NetNs>,
}

impl Netlink {
    /// A connection to the calling thread's current network namespace.
    pub fn new() -> std::result::Result<Netlink, NlError> {
        Ok(Netlink { sock: NlSocket::open()?, ns: None })
    }

    /// A connection to `ns`: enters it on this thread, creates the socket and comes back. The
    /// socket keeps talking to `ns`, and the connection remembers `ns` for the sockets it opens
    /// later (event subscriptions).
    pub fn new_in(ns: &NetNs) -> Result<Netlink> {
        let context = || format!("netlink socket in {}", ns.path().display());
        let sock = ns.run(|| NlSocket::open().map_err(CniError::from)).map_err(|e| e.context(context()))?;
        Ok(Netlink { sock, ns: Some(ns.try_clone().map_err(|e| e.context(context()))?) })
    }

    /// Dump with `msg` and decode the replies of type `reply_type` with `parse` (those it cannot
    /// decode are skipped). Errors are the kernel's, for the caller to describe.
    fn dump<T>(
        &mut self,
        msg: netlink_packet_route::RouteNetlinkMessage,
        reply_type: u16,
        parse: impl Fn(&[u8]) -> Option<T>,
    ) -> std::result::Result<Vec<T>, NlError> {
        let replies = self.sock.request(msg, netlink_packet_core::NLM_F_DUMP)?;
        Ok(replies.iter().filter(|r| r.msg_type == reply_type).filter_map(|r| parse(&r.payload)).collect())
    }

    /// Run `f` (which opens another socket) in the namespace of this connection's socket,
    /// whichever namespace the calling thread is in.
    fn open_beside<T>(
        &self,
        f: impl FnOnce() -> std::result::Result<T, NlError>,
    ) -> std::result::Result<T, NlError> {
        let asked;
        let ns = match &self.ns {
            Some(ns) => ns,
            None => {
                asked = NetNs::of_socket(std::os::fd::AsFd::as_fd(&self.sock))
                    .map_err(|e| NlError::new(e.msg, libc::EINVAL))?;
                &asked
            }
        };
        let mut out = None;
        ns.run(|| {
            out = Some(f());
            Ok(())
        })
        .map_err(|e| NlError::new(e.msg, libc::EINVAL))?;
        out.unwrap_or_else(|| Err(NlError::new("open a netlink socket beside another", libc::EINVAL)))
    }
}
