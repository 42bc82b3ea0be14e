//! A 48-bit Ethernet address: parsed from configuration text, printed the way results and
//! messages show it (`0a:58:0a:f4:00:05`).

use std::fmt;

use crate::error::{CniError, Result};

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// Six hex byte pairs separated by `:` or `-` (both spellings upstream accepts). Returns
    /// why not otherwise.
    pub fn parse(s: &str) -> std::result::Result<Mac, &'static str> {
        let parts: Vec<&str> = s.split([':', '-']).collect();
        if parts.len() != 6 || parts.iter().any(|p| p.len() != 2) {
            return Err("expected six hex byte pairs like 0a:58:0a:f4:00:05");
        }
        let mut mac = [0u8; 6];
        for (i, p) in parts.iter().enumerate() {
            mac[i] = u8::from_str_radix(p, 16).map_err(|_| "not hexadecimal")?;
        }
        Ok(Mac(mac))
    }

    /// A MAC for an interface, from the configuration key `field`: refuses what the kernel
    /// would refuse for a veth (multicast, all zero). Code 7 naming the field and the value.
    pub fn parse_interface(field: &str, s: &str) -> Result<Mac> {
        let bad = |why: &str| CniError::config(format!("{field}: invalid MAC address {s:?}: {why}"));
        let mac = Mac::parse(s).map_err(bad)?;
        if mac.is_multicast() {
            return Err(bad("a multicast address cannot be an interface address"));
        }
        if mac.0 == [0; 6] {
            return Err(bad("the all-zero address cannot be an interface address"));
        }
        Ok(mac)
    }

    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// The text of an optional address, empty when there is none (result `mac` fields).
    pub fn text(mac: Option<[u8; 6]>) -> String {
        mac.map(|m| Mac(m).to_string()).unwrap_or_default()
    }
}

impl From<[u8; 6]> for Mac {
    fn from(b: [u8; 6]) -> Mac {
        Mac(b)
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code;

    #[test]
    fn parse_and_format_round_trip() {
        let m = Mac::parse("0A-58-0a:f4:00:05").unwrap();
        assert_eq!(m.octets(), [0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x05]);
        assert_eq!(m.to_string(), "0a:58:0a:f4:00:05");
        assert_eq!(Mac::parse(&m.to_string()), Ok(m));
        assert_eq!(Mac::text(None), "");
        assert_eq!(Mac::text(Some([0; 6])), "00:00:00:00:00:00");
        for bad in ["0a:00:00:00:00", "zz:00:00:00:00:01", "0a:0:00:00:00:01", "0a:00:00:00:00:01:02", ""] {
            assert!(Mac::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn interface_addresses_refuse_multicast_and_zero() {
        assert!(Mac::parse_interface("mac", "0a:00:00:00:00:01").is_ok());
        for bad in ["01:00:5e:00:00:01", "00:00:00:00:00:00", "nope"] {
            let e = Mac::parse_interface("runtimeConfig.mac", bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
            assert!(e.msg.starts_with("runtimeConfig.mac: invalid MAC address"), "{}", e.msg);
        }
    }
}
