//! The firewalld backend (upstream's): each address, as `<ip>/32` or `<ip>/128`, a source of
//! the zone (`firewalldZone`, default `trusted`) through firewalld's D-Bus interface; removed
//! on DEL. The same calls upstream makes, so the sources either plugin added are the other's.

use crate::dbus::{system_bus_path, Bus, Reply};
use cni_common::{code, CniError, Result};
use ipnet::IpNet;
use std::net::IpAddr;
use std::time::Duration;

const NAME: &str = "org.fedoraproject.FirewallD1";
const PATH: &str = "/org/fedoraproject/FirewallD1";
const ZONE: &str = "org.fedoraproject.FirewallD1.zone";

/// Each read and write on the bus.
pub const DEADLINE: Duration = Duration::from_secs(10);

fn connect() -> Result<Bus> {
    Bus::connect(&system_bus_path(), DEADLINE).map_err(|e| {
        let c = if e.contains("timed out") || e.contains("Resource temporarily unavailable") {
            code::TRY_AGAIN
        } else {
            code::NOT_AVAILABLE
        };
        CniError::new(c, format!("firewalld backend: {e}"))
    })
}

/// The source text upstream passes (`ipString`).
pub fn source(a: IpAddr) -> String {
    IpNet::from(a).to_string()
}

/// Whether firewalld owns its name on the system bus (upstream's `isFirewalldRunning`). A bus
/// that cannot be reached means no.
pub fn running() -> bool {
    let Ok(mut bus) = Bus::connect(&system_bus_path(), Duration::from_secs(2)) else { return false };
    matches!(
        bus.call(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "GetNameOwner",
            &[NAME]
        ),
        Ok(Reply::Return(_))
    )
}

fn failed(what: &str, e: String) -> CniError {
    CniError::new(code::TRY_AGAIN, format!("firewalld backend: {what}: {e}"))
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
