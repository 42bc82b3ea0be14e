//! The error of every netlink layer ([`NlError`]) and its CNI error code.

use std::fmt;

use crate::CniError;

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

impl NlError {
    /// Whether the failure is transient: the kernel's answer did not come in time or was
    /// lost (`ETIMEDOUT`, `ENOBUFS`), a dump kept being interrupted (`EINTR`), or an
    /// nf_tables transaction was refused because the ruleset changed since it was read
    /// (`ERESTART`). Reported as code 11, "try again later".
    pub fn is_transient(&self) -> bool {
        matches!(self.errno, libc::ETIMEDOUT | libc::ENOBUFS | libc::EINTR | libc::ERESTART)
    }
}

impl From<NlError> for CniError {
    fn from(e: NlError) -> Self {
        if e.is_transient() {
            CniError::new(crate::code::TRY_AGAIN, e.to_string())
        } else {
            CniError::internal(e.to_string())
        }
    }
}
