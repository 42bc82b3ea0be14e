//! The firewalld backend (upstream's): each address, as `<ip>/32` or `<ip>/128`, a source of
//! the zone (`firewalldZone`, default `trusted`) through firewalld's D-Bus interface; removed
//! on DEL. The same calls upstream makes, so the sources either plugin added are the other's.

use crate::dbus::{system_bus_path, Bus, Failure, Reply};
use cni_common::{code, CniError, Result};
use ipnet::IpNet;
use std::net::IpAddr;
use std::time::Duration;

const NAME: &str = "org.fedoraproject.FirewallD1";
const PATH: &str = "/org/fedoraproject/FirewallD1";
const ZONE: &str = "org.fedoraproject.FirewallD1.zone";

/// The error the bus driver answers `GetNameOwner` with when nobody owns the name.
pub const NO_OWNER: &str = "org.freedesktop.DBus.Error.NameHasNoOwner";

/// Connecting (authentication and Hello), and then each call, all its reads and writes.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A failure of the bus: code 11 (try again), but for a host with no bus socket at all, where
/// the firewalld backend is not available (50).
fn failed(what: &str, e: Failure) -> CniError {
    let c = match e {
        Failure::NoBus(_) => code::NOT_AVAILABLE,
        Failure::TimedOut(_) | Failure::Broken(_) => code::TRY_AGAIN,
    };
    CniError::new(c, format!("firewalld backend: {what}: {e}"))
}

fn connect() -> Result<Bus> {
    Bus::connect(&system_bus_path(), DEADLINE).map_err(|e| failed("connecting to the system bus", e))
}

/// The source text upstream passes (`ipString`).
pub fn source(a: IpAddr) -> String {
    IpNet::from(a).to_string()
}

/// Whether firewalld owns its name on the system bus (upstream's `isFirewalldRunning`), as the
/// bus says. No: the bus driver answered [`NO_OWNER`], or this host has no system bus socket.
/// Anything else that keeps the bus from answering (refused, timed out, a stream that is not
/// D-Bus, another error name) is code 11, never a no: a no makes the default backend write
/// the attachment's rules into nf_tables instead of firewalld's zone (issue 37, finding 1).
pub fn running() -> Result<bool> {
    let asked = Bus::connect(&system_bus_path(), DEADLINE).and_then(|mut bus| {
        bus.call(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "GetNameOwner",
            &[NAME],
        )
    });
    owned(asked)
}

/// [`running`]'s judgment of what the bus answered (pure).
pub fn owned(asked: std::result::Result<Reply, Failure>) -> Result<bool> {
    match asked {
        Ok(Reply::Return(_)) => Ok(true),
        Ok(Reply::Error(n, _)) if n == NO_OWNER => Ok(false),
        Err(Failure::NoBus(_)) => Ok(false),
        Ok(Reply::Error(n, m)) => Err(CniError::new(
            code::TRY_AGAIN,
            format!("firewalld backend: asking the system bus who owns {NAME}: {n}: {m}"),
        )),
        Err(e) => Err(CniError::new(
            code::TRY_AGAIN,
            format!("firewalld backend: asking the system bus who owns {NAME}: {e}"),
        )),
    }
}

pub fn add(zone: &str, addrs: &[IpAddr]) -> Result<()> {
    let mut bus = connect()?;
    for a in addrs {
        let src = source(*a);
        match bus.call(NAME, PATH, ZONE, "addSource", &[zone, &src]).map_err(|e| failed("addSource", e))? {
            Reply::Return(_) => {}
            Reply::Error(_, m) if m.contains("ZONE_ALREADY_SET") => {}
            Reply::Error(n, m) => {
                return Err(CniError::internal(format!(
                    "failed to add the address {src} to {zone} zone: {n}: {m}"
                )))
            }
        }
    }
    Ok(())
}

/// DEL: every address's source, errors ignored as upstream does (a source already gone).
pub fn del(zone: &str, addrs: &[IpAddr]) -> Result<()> {
    if addrs.is_empty() {
        return Ok(());
    }
    let mut bus = connect()?;
    for a in addrs {
        let src = source(*a);
        if let Ok(Reply::Error(n, m)) = bus.call(NAME, PATH, ZONE, "removeSource", &[zone, &src]) {
            if !m.contains("UNKNOWN_SOURCE") {
                cni_common::log!("firewall", "firewalld removeSource {src} from {zone}: {n}: {m}");
            }
        }
    }
    Ok(())
}

/// CHECK: the sources not in the zone.
pub fn missing(zone: &str, addrs: &[IpAddr]) -> Result<Vec<String>> {
    let mut bus = connect()?;
    let mut out = Vec::new();
    for a in addrs {
        let src = source(*a);
        match bus
            .call(NAME, PATH, ZONE, "querySource", &[zone, &src])
            .map_err(|e| failed("querySource", e))?
        {
            Reply::Return(Some(t)) if t == "true" => {}
            _ => out.push(format!("source {src} in firewalld zone {zone}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the bus's own "no owner" (or no bus at all) is a no; a failure of the transport or
    /// the protocol, or another error name, is code 11 and never a no.
    #[test]
    fn only_the_bus_saying_no_owner_is_a_no() {
        assert!(owned(Ok(Reply::Return(Some(":1.7".into())))).unwrap());
        assert!(!owned(Ok(Reply::Error(NO_OWNER.into(), "no".into()))).unwrap());
        assert!(!owned(Err(Failure::NoBus("D-Bus connect: not found".into()))).unwrap());
        for e in [
            Err(Failure::Broken("D-Bus: a message whose byte-order flag is 0x58".into())),
            Err(Failure::Broken("D-Bus connect: Connection refused".into())),
            Err(Failure::TimedOut("D-Bus read: no answer within the deadline".into())),
            Ok(Reply::Error("org.freedesktop.DBus.Error.AccessDenied".into(), "no".into())),
            Ok(Reply::Error("org.freedesktop.DBus.Error.LimitsExceeded".into(), "no".into())),
        ] {
            let err = owned(e.clone()).expect_err(&format!("{e:?}"));
            assert_eq!(err.code, code::TRY_AGAIN, "{e:?}: {}", err.msg);
            assert!(err.msg.contains("who owns org.fedoraproject.FirewallD1"), "{}", err.msg);
        }
        assert_eq!(failed("x", Failure::NoBus("gone".into())).code, code::NOT_AVAILABLE);
        assert_eq!(failed("x", Failure::Broken("reset".into())).code, code::TRY_AGAIN);
    }
}
