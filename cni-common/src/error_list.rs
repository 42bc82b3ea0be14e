//! The errors of a best-effort verb — DEL, GC, the undo of a failed ADD — collected while every
//! step is still tried, and reported as one CNI error at the end (netavark's error list,
//! youki's `MultiError`).

use crate::error::{code, CniError, Result};

/// Errors collected while a teardown goes on.
///
/// [`ErrorList::finish`] reports them as one error: with the **most meaningful code** among
/// them (a specific code such as 3, 7 or a delegate's own beats 11 "try again", which beats the
/// generic 5 "I/O", which beats 999 "internal"; the first wins a tie), and a message naming
/// **every** error, the chosen one first.
#[derive(Debug, Default)]
pub struct ErrorList(Vec<CniError>);

/// How much a code tells the runtime (higher: more).
fn weight(c: u32) -> u8 {
    match c {
        code::INTERNAL => 0,
        code::IO => 1,
        code::TRY_AGAIN => 2,
        _ => 3,
    }
}

impl ErrorList {
    pub fn new() -> ErrorList {
        ErrorList(Vec::new())
    }

    pub fn push(&mut self, e: CniError) {
        self.0.push(e);
    }

    /// Keep the error of `r`, if any, and hand back its value: `if let Some(x) =
    /// errors.take(step()) { … }` goes on either way.
    pub fn take<T>(&mut self, r: Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.push(e);
                None
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The collected errors as one (see the type's documentation); `Ok` when there were none.
    pub fn finish(mut self) -> Result<()> {
        let Some(best) = (0..self.0.len()).rev().max_by_key(|&i| weight(self.0[i].code)) else {
            return Ok(());
        };
        let mut chosen = self.0.remove(best);
        if !self.0.is_empty() {
            let rest: Vec<String> = self.0.iter().map(ToString::to_string).collect();
            chosen.msg = format!("{}; also: {}", chosen.msg, rest.join("; "));
        }
        Err(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_collected_is_success() {
        assert_eq!(ErrorList::new().finish(), Ok(()));
        let mut l = ErrorList::new();
        assert_eq!(l.take(Ok::<u8, CniError>(7)), Some(7));
        assert!(l.is_empty());
        assert_eq!(l.finish(), Ok(()));
    }

    #[test]
    fn one_error_is_returned_unchanged() {
        let mut l = ErrorList::new();
        let e = CniError::new(code::TRY_AGAIN, "busy").with_details("d");
        assert_eq!(l.take::<()>(Err(e.clone())), None);
        assert_eq!(l.len(), 1);
        assert_eq!(l.finish(), Err(e));
    }

    #[test]
    fn the_most_meaningful_code_wins_and_every_message_is_kept() {
        let mut l = ErrorList::new();
        l.push(CniError::internal("netlink said no"));
        l.push(CniError::io("remove /x: Permission denied"));
        l.push(CniError::new(code::TRY_AGAIN, "store locked").with_details("by pid 7"));
        l.push(CniError::io("remove /y: Read-only file system"));
        let e = l.finish().unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN);
        assert_eq!(
            e.msg,
            "store locked; also: netlink said no; remove /x: Permission denied; remove /y: Read-only file system"
        );
        assert_eq!(e.details, "by pid 7");

        // A specific code beats "try again"; among equals the first is chosen.
        let mut l = ErrorList::new();
        l.push(CniError::new(code::TRY_AGAIN, "a"));
        l.push(CniError::new(code::UNKNOWN_CONTAINER, "b"));
        l.push(CniError::config("c"));
        let e = l.finish().unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (code::UNKNOWN_CONTAINER, "b; also: a; c"));

        // I/O beats internal.
        let mut l = ErrorList::new();
        l.push(CniError::internal("x").with_details("why"));
        l.push(CniError::io("y"));
        let e = l.finish().unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (code::IO, "y; also: x (why)"));
    }
}
