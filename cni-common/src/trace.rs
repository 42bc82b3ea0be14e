//! W3C Trace Context from the plugin environment, and the one function every stderr line of
//! the plugins goes through ([`log!`](crate::log!)).
//!
//! libcni 1.3.1 (`pkg/invoke/raw_exec.go`, `injectTraceContext`) sets `TRACEPARENT` and
//! `TRACESTATE` in a plugin's environment when the runtime's `context.Context` carries a valid
//! OpenTelemetry span context (the OTEP 0258 environment carrier); a runtime may also have them
//! in its own environment, which libcni passes on (`Args.AsEnv` starts from `os.Environ()`).
//! When a well-formed `TRACEPARENT` is given, every stderr line of our plugins and the
//! `details` of every error object they print name its trace id, so a runtime's span and a
//! plugin's words can be joined. No peer does this; without a trace (or with one that does not
//! parse) output is byte-for-byte what it was.
//!
//! The value is untrusted input from the environment. Only a `traceparent` that parses exactly
//! ([`TraceParent::parse`]) is used, and only its trace id — 32 lowercase hex digits, checked —
//! is ever printed: nothing of an invalid value, and nothing of `TRACESTATE` (vendor data), is
//! echoed, so no control character or escape sequence can reach a log through it.
//!
//! Delegation keeps the trace without any code here: an exec'd IPAM plugin inherits our whole
//! environment ([`crate::delegate::spawn_plugin`] adds to it, never clears it), and an
//! in-process one reads the same process environment.

use std::fmt;
use std::sync::OnceLock;

/// The environment variable libcni 1.3.1 sets from the span context (W3C `traceparent`).
pub const TRACEPARENT_ENV: &str = "TRACEPARENT";
/// Its companion (W3C `tracestate`); passed on to delegates with the environment, never printed.
pub const TRACESTATE_ENV: &str = "TRACESTATE";

/// A parsed W3C `traceparent`: `<version>-<trace-id>-<parent-id>-<flags>`, e.g.
/// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    trace_id: [u8; 32],
    parent_id: [u8; 16],
    flags: u8,
}

/// `n` lowercase hex digits (the spec's HEXDIGLC; upper case is invalid).
fn lower_hex(s: &[u8]) -> bool {
    s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

fn all_zero(s: &[u8]) -> bool {
    s.iter().all(|&c| c == b'0')
}

impl TraceParent {
    /// Parse a `traceparent` value as W3C Trace Context (level 1) says a receiver must:
    /// two lowercase hex digits of version, not `ff`; a 32-digit trace id and a 16-digit parent
    /// id, lowercase hex, neither all zeros; two hex digits of flags; fields joined by `-`.
    /// Version `00` is exactly 55 characters. A later version may append fields: its first 55
    /// characters are parsed as version 00's and anything after them must start with `-`.
    /// Anything else is `None`: the value is ignored, not repaired.
    pub fn parse(s: &str) -> Option<TraceParent> {
        let b = s.as_bytes();
        if b.len() < 55 {
            return None;
        }
        let (version, rest) = (&b[..2], &b[55..]);
        if !lower_hex(version) || version == b"ff" {
            return None;
        }
        if version == b"00" && !rest.is_empty() {
            return None;
        }
        if !rest.is_empty() && rest[0] != b'-' {
            return None;
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let (trace, parent, flags) = (&b[3..35], &b[36..52], &b[53..55]);
        if !lower_hex(trace) || !lower_hex(parent) || !lower_hex(flags) {
            return None;
        }
        if all_zero(trace) || all_zero(parent) {
            return None;
        }
        let flags = u8::from_str_radix(std::str::from_utf8(flags).ok()?, 16).ok()?;
        Some(TraceParent { trace_id: trace.try_into().ok()?, parent_id: parent.try_into().ok()?, flags })
    }

    /// The trace id: 32 lowercase hex digits (checked by [`TraceParent::parse`]).
    pub fn trace_id(&self) -> &str {
        // Only ASCII hex digits are ever stored.
        std::str::from_utf8(&self.trace_id).unwrap_or("")
    }

    /// The parent (span) id: 16 lowercase hex digits.
    pub fn parent_id(&self) -> &str {
        std::str::from_utf8(&self.parent_id).unwrap_or("")
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// The `TRACEPARENT` of an environment read through `get`, if it parses.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Option<TraceParent> {
        get(TRACEPARENT_ENV).as_deref().and_then(TraceParent::parse)
    }

    /// The `details` of an error object naming this trace: `trace <id>` alone, or appended to
    /// existing details as ` (trace <id>)`, so the text before it stays what it was. Details
    /// that already name this trace (an IPAM delegate's error, surfaced unchanged by its
    /// caller) are returned as they are.
    pub fn decorate_details(&self, details: &str) -> String {
        let tag = format!("trace {}", self.trace_id());
        if details.contains(&tag) {
            details.to_string()
        } else if details.is_empty() {
            tag
        } else {
            format!("{details} ({tag})")
        }
    }
}

impl fmt::Display for TraceParent {
    /// The canonical version-00 form (what the runtime sent, for version 00).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-{}-{:02x}", self.trace_id(), self.parent_id(), self.flags)
    }
}

/// The trace of this process: `TRACEPARENT` of the process environment, parsed once.
pub fn current() -> Option<&'static TraceParent> {
    static CURRENT: OnceLock<Option<TraceParent>> = OnceLock::new();
    CURRENT.get_or_init(|| TraceParent::from_env(|k| std::env::var(k).ok())).as_ref()
}

/// One stderr line: `<who>: trace <id>: <msg>` with a trace, `<who>: <msg>` without; with an
/// empty `who` (library code that does not know which plugin it runs in) `trace <id>: <msg>`
/// and `<msg>`. No trailing newline.
pub fn format_line(who: &str, trace: Option<&TraceParent>, msg: fmt::Arguments<'_>) -> String {
    match (who, trace) {
        ("", None) => format!("{msg}"),
        ("", Some(t)) => format!("trace {}: {msg}", t.trace_id()),
        (w, None) => format!("{w}: {msg}"),
        (w, Some(t)) => format!("{w}: trace {}: {msg}", t.trace_id()),
    }
}

/// Write one line to stderr ([`format_line`] with this process's trace), in one write so lines
/// of concurrent threads (an in-process IPAM delegate) do not interleave. Errors writing stderr
/// are ignored: it is informational, and a closed stderr must not fail a verb.
pub fn line(who: &str, msg: fmt::Arguments<'_>) {
    use std::io::Write;
    let mut text = format_line(who, current(), msg);
    text.push('\n');
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// Print a line on stderr naming the trace when there is one: `log!("bridge", "undo {x}: {e}")`
/// prints `bridge: undo …` or `bridge: trace 4bf9…: undo …`. Every stderr line of the plugins
/// goes through it (an empty first argument for library code: see [`format_line`]).
#[macro_export]
macro_rules! log {
    ($who:expr, $($arg:tt)*) => {
        $crate::trace::line($who, format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    #[test]
    fn parses_the_w3c_example() {
        let t = TraceParent::parse(GOOD).unwrap();
        assert_eq!((t.trace_id(), t.parent_id(), t.flags()), (ID, "00f067aa0ba902b7", 1));
        assert_eq!(t.to_string(), GOOD);
        let t = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert_eq!(t.flags(), 0);
    }

    #[test]
    fn a_later_version_may_append_fields_after_a_dash() {
        let v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(TraceParent::parse(v1).unwrap().trace_id(), ID);
        let more = format!("{v1}-what-comes-next");
        assert_eq!(TraceParent::parse(&more).unwrap().trace_id(), ID);
        assert_eq!(TraceParent::parse(&format!("{v1}x")), None);
    }

    #[test]
    fn rejects_every_malformed_form() {
        let bad = [
            "",
            "00",
            // version 00 with anything after it
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
            // short and long fields
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47366-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            // version ff is forbidden; non-hex version
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // upper case, non-hex
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0G",
            "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01",
            // all-zero ids
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // wrong separators, leading space, control characters
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
            "00-4bf92f3577b34da6a3ce929d0e0\x1b[2J-00f067aa0ba902b7-01",
            // a multi-byte character where an ASCII one belongs (no slicing panic)
            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b7-01",
        ];
        for b in bad {
            assert_eq!(TraceParent::parse(b), None, "{b:?}");
        }
    }

    #[test]
    fn from_env_reads_traceparent_only() {
        let t = TraceParent::from_env(|k| (k == "TRACEPARENT").then(|| GOOD.to_string()));
        assert_eq!(t.unwrap().trace_id(), ID);
        assert_eq!(TraceParent::from_env(|k| (k == "TRACESTATE").then(|| GOOD.to_string())), None);
        assert_eq!(TraceParent::from_env(|_| Some("garbage\u{7}".into())), None);
    }

    #[test]
    fn details_gain_the_trace_once_and_keep_their_text() {
        let t = TraceParent::parse(GOOD).unwrap();
        assert_eq!(t.decorate_details(""), format!("trace {ID}"));
        assert_eq!(t.decorate_details("range is full"), format!("range is full (trace {ID})"));
        let once = t.decorate_details("x");
        assert_eq!(t.decorate_details(&once), once);
    }

    #[test]
    fn lines_name_the_trace_only_when_there_is_one() {
        let t = TraceParent::parse(GOOD).unwrap();
        let n = 3;
        assert_eq!(format_line("bridge", None, format_args!("undo veth {n}")), "bridge: undo veth 3");
        assert_eq!(
            format_line("bridge", Some(&t), format_args!("undo veth {n}")),
            format!("bridge: trace {ID}: undo veth 3")
        );
        assert_eq!(format_line("", None, format_args!("GC: removed")), "GC: removed");
        assert_eq!(
            format_line("", Some(&t), format_args!("GC: removed")),
            format!("trace {ID}: GC: removed")
        );
    }
}
