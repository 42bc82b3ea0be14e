//! A synchronous rtnetlink client: links, addresses, routes and traffic control ([`tc`]).
//!
//! One [`Netlink`] owns one blocking `NETLINK_ROUTE` socket. A socket talks to the network
//! namespace it was created in for its whole life, whatever the thread does afterwards, so a
//! plugin opens one for the host ([`Netlink::new`]) and one for the container
//! ([`Netlink::new_in`]) and then never has to think about which namespace a call lands in.
//!
//! Every operation returns [`NlError`], which keeps the kernel's errno so callers can tell
//! "already gone" ([`NlError::is_not_found`]) or "already there" ([`NlError::is_exists`]) from
//! real failures; it converts into a [`CniError`] (code 999) with `?`.
//!
//! The netlink-packet-* message types stay inside this module; the API uses std types, `ipnet`
//! and the small structs defined here.

mod addr;
mod bridge;
mod devconf;
mod events;
mod link;
pub mod nftables;
#[doc(hidden)]
pub mod nftgolden;
pub mod nftwrite;
mod route;
mod socket;
pub mod tc;
#[cfg(test)]
mod tests;

use std::fmt;
use std::net::IpAddr;

use netlink_packet_route::AddressFamily;

use crate::netns::NetNs;
use crate::{CniError, Result};

pub use addr::Address;
pub use bridge::{vlan_request_bytes, PortFlags, PortVlan};
pub use devconf::IPV4_DEVCONF_ARP_NOTIFY;
pub use link::{Link, LinkKind, LinkSpec, VethPeer};
pub use route::{NextHop, Route, RouteKind, RouteSpec, SCOPE_LINK, SCOPE_UNIVERSE, TABLE_MAIN};

use socket::NlSocket;

/// A failed netlink operation: what we tried (`op`), the kernel's errno (positive), and the
/// kernel's extended-ack message when it sent one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlError {
    pub op: String,
    pub errno: i32,
    pub detail: Option<String>,
}

impl NlError {
    pub fn new(op: impl Into<String>, errno: i32) -> Self {
        NlError { op: op.into(), errno, detail: None }
    }

    pub(crate) fn from_io(op: impl Into<String>, e: &std::io::Error) -> Self {
        Self::new(op, e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// Replace the description of what was being done.
    pub(crate) fn during(mut self, op: impl Into<String>) -> Self {
        self.op = op.into();
        self
    }

    /// The positive errno value.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The object does not exist (any more): ENODEV, ENOENT, ESRCH, ENXIO, and EADDRNOTAVAIL
    /// (what deleting an address that is not there returns). DEL treats these as success.
    pub fn is_not_found(&self) -> bool {
        matches!(self.errno, libc::ENODEV | libc::ENOENT | libc::ESRCH | libc::ENXIO | libc::EADDRNOTAVAIL)
    }

    /// The object already exists (EEXIST).
    pub fn is_exists(&self) -> bool {
        self.errno == libc::EEXIST
    }
}

impl fmt::Display for NlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // strerror(3) text, without std's " (os error N)" suffix.
        let text = std::io::Error::from_raw_os_error(self.errno).to_string();
        let desc = text.strip_suffix(&format!(" (os error {})", self.errno)).unwrap_or(&text);
        write!(f, "{}: {desc}", self.op)?;
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl std::error::Error for NlError {}

impl From<NlError> for CniError {
    fn from(e: NlError) -> Self {
        CniError::internal(e.to_string())
    }
}

/// An IP address family, for filtering dumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    fn to_af(self) -> AddressFamily {
        match self {
            Family::V4 => AddressFamily::Inet,
            Family::V6 => AddressFamily::Inet6,
        }
    }

    fn from_af(af: AddressFamily) -> Option<Family> {
        match af {
            AddressFamily::Inet => Some(Family::V4),
            AddressFamily::Inet6 => Some(Family::V6),
            _ => None,
        }
    }
}

fn af_of(family: Option<Family>) -> AddressFamily {
    family.map_or(AddressFamily::Unspec, Family::to_af)
}

/// An rtnetlink connection bound to one network namespace. Methods live in the `link`, `addr`
/// and `route` submodules.
pub struct Netlink {
    sock: NlSocket,
}

impl Netlink {
    /// A connection to the calling thread's current network namespace.
    pub fn new() -> std::result::Result<Netlink, NlError> {
        Ok(Netlink { sock: NlSocket::open()? })
    }

    /// A connection to `ns`: enters it on this thread, creates the socket and comes back. The
    /// socket keeps talking to `ns`.
    pub fn new_in(ns: &NetNs) -> Result<Netlink> {
        ns.run(|| Netlink::new().map_err(CniError::from))
            .map_err(|e| e.context(format_args!("netlink socket in {}", ns.path().display())))
    }
}
