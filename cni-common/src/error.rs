//! The CNI error object (`{"cniVersion", "code", "msg", "details"}`) and the spec's codes.
//!
//! Every fallible function in the suite returns [`Result`]; the skeleton prints the error
//! as the one JSON document on stdout and exits non-zero.

use std::fmt;

/// Error codes defined by the CNI specification (plus the Go library's code 8).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in the network configuration; the message names key and value.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid or missing environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure, e.g. reading stdin.
    pub const IO: u32 = 5;
    /// Failure to decode content (bad JSON, wrong types, bad version string).
    pub const DECODE: u32 = 6;
    /// Invalid network configuration.
    pub const INVALID_CONFIG: u32 = 7;
    /// CNI_NETNS is the plugin's own network namespace (Go library extension).
    pub const INVALID_NETNS: u32 = 8;
    /// Transient failure: try again later.
    pub const TRY_AGAIN: u32 = 11;
    /// STATUS: the plugin cannot serve ADD requests.
    pub const NOT_AVAILABLE: u32 = 50;
    /// STATUS: not available and existing containers may have limited connectivity.
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// Internal or otherwise unclassified error.
    pub const INTERNAL: u32 = 999;
}

/// A CNI error: what the plugin prints on stdout when a verb fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

pub type Result<T, E = CniError> = std::result::Result<T, E>;

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError { code, msg: msg.into(), details: String::new() }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Code 999: something failed that has no better code.
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(code::INTERNAL, msg)
    }

    /// Code 7: the network configuration is semantically invalid.
    pub fn config(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_CONFIG, msg)
    }

    /// Code 6: the configuration could not be decoded (syntax or types).
    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(code::DECODE, msg)
    }

    /// Code 2: a field holds a value this implementation does not support.
    pub fn unsupported_field(field: &str, value: impl fmt::Display, why: &str) -> Self {
        Self::new(code::UNSUPPORTED_FIELD, format!("unsupported value {value} for field \"{field}\": {why}"))
    }

    /// Code 4: an environment variable is missing or malformed.
    pub fn env(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_ENV, msg)
    }

    /// Code 5: an I/O operation failed.
    pub fn io(msg: impl Into<String>) -> Self {
        Self::new(code::IO, msg)
    }

    /// Prefix the message with what we were doing: "create veth: File exists".
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }

    /// The error as printed under `trace` (see [`crate::trace`]): `details` name its trace id,
    /// the rest unchanged; without a trace, the error itself.
    pub fn traced(mut self, trace: Option<&crate::trace::TraceParent>) -> Self {
        if let Some(t) = trace {
            self.details = t.decorate_details(&self.details);
        }
        self
    }

    /// The JSON document printed on stdout. `cniVersion` is included as the spec lists it
    /// (the Go library omits it).
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("cniVersion".into(), cni_version.into());
        m.insert("code".into(), self.code.into());
        m.insert("msg".into(), self.msg.clone().into());
        if !self.details.is_empty() {
            m.insert("details".into(), self.details.clone().into());
        }
        serde_json::Value::Object(m)
    }

    /// Parse an error object printed by another plugin (delegated IPAM, chained plugins).
    /// Returns `None` when the document is not an error object with a non-zero code.
    pub fn from_json(bytes: &[u8]) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let code = v.get("code")?.as_u64()?;
        if code == 0 {
            return None;
        }
        Some(CniError {
            code: u32::try_from(code).unwrap_or(code::INTERNAL),
            msg: v.get("msg").and_then(|m| m.as_str()).unwrap_or("").to_string(),
            details: v.get("details").and_then(|m| m.as_str()).unwrap_or("").to_string(),
        })
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

impl From<std::io::Error> for CniError {
    fn from(e: std::io::Error) -> Self {
        CniError::new(code::IO, e.to_string())
    }
}

/// Attach context to any error convertible into a [`CniError`].
pub trait Context<T> {
    fn context(self, what: impl fmt::Display) -> Result<T>;
    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: Into<CniError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().context(what))
    }
    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| e.into().context(what()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_has_version_and_omits_empty_details() {
        let e = CniError::new(code::INVALID_ENV, "required env variables [CNI_PATH] missing");
        assert_eq!(
            e.to_json("1.1.0").to_string(),
            r#"{"cniVersion":"1.1.0","code":4,"msg":"required env variables [CNI_PATH] missing"}"#
        );
        let e = e.with_details("x");
        assert_eq!(e.to_json("0.4.0")["details"], "x");
    }

    #[test]
    fn parses_foreign_error_objects() {
        let e = CniError::from_json(br#"{"code":11,"msg":"busy","details":"d"}"#).unwrap();
        assert_eq!((e.code, e.msg.as_str(), e.details.as_str()), (11, "busy", "d"));
        assert!(CniError::from_json(br#"{"code":0,"msg":"x"}"#).is_none());
        assert!(CniError::from_json(b"not json").is_none());
        assert!(CniError::from_json(br#"{"cniVersion":"1.0.0","ips":[]}"#).is_none());
    }

    #[test]
    fn context_prefixes_message_and_keeps_code() {
        let r: Result<()> = Err(CniError::new(code::TRY_AGAIN, "locked"));
        let e = r.context("reserve 10.0.0.2").unwrap_err();
        assert_eq!(e.code, 11);
        assert_eq!(e.msg, "reserve 10.0.0.2: locked");
    }
}
