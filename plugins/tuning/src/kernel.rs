//! The seam of the container's link and sysctls ([`Kernel`]; the saved-settings directory's is
//! [`crate::store::Store`]). [`Real`] acts on the system; the fake (tests) keeps everything in
//! memory with the kernel's answers (a link gone is `ENODEV`, a sysctl that does not exist in
//! the namespace is an error) and inject failures, so every failure point of ADD is unit-tested
//! without root.

use cni_common::error::{CniError, Result};
use cni_common::netlink::{Link, Netlink, NlError};
use cni_common::netns::NetNs;
use cni_common::sysctl;

use crate::saved::Restore;

pub trait Kernel {
    /// The container's link called `name`.
    fn link(&mut self, name: &str) -> std::result::Result<Option<Link>, NlError>;
    fn set(&mut self, index: u32, change: Restore) -> std::result::Result<(), NlError>;
    /// A sysctl of the container's namespace (slash form below /proc/sys).
    fn sysctl_get(&mut self, path: &str) -> Result<String>;
    fn sysctl_set(&mut self, path: &str, value: &str) -> Result<()>;
}

/// The container's namespace, through netlink and /proc/sys.
pub struct Real {
    ns: NetNs,
    nl: Netlink,
}

impl Real {
    pub fn new(ns: &NetNs) -> Result<Real> {
        Ok(Real { ns: ns.try_clone()?, nl: Netlink::new_in(ns)? })
    }
}

impl Kernel for Real {
    fn link(&mut self, name: &str) -> std::result::Result<Option<Link>, NlError> {
        self.nl.link_by_name(name)
    }

    fn set(&mut self, index: u32, change: Restore) -> std::result::Result<(), NlError> {
        match change {
            Restore::Mtu(m) => self.nl.link_set_mtu(index, m),
            Restore::Mac(m) => self.nl.link_set_mac(index, m.0),
            Restore::Promisc(p) => self.nl.link_set_promisc(index, p),
            Restore::Allmulti(a) => self.nl.link_set_allmulti(index, a),
            Restore::TxQLen(q) => self.nl.link_set_txqlen(index, q),
        }
    }

    fn sysctl_get(&mut self, path: &str) -> Result<String> {
        self.ns.run(|| sysctl::get(path).map_err(|e| CniError::io(format!("read sysctl {path}: {e}"))))
    }

    fn sysctl_set(&mut self, path: &str, value: &str) -> Result<()> {
        self.ns.run(|| sysctl::set(path, value).map(drop))
    }
}

#[cfg(test)]
pub mod fake {
    use super::*;
    use std::collections::BTreeMap;

    /// The container's namespace in memory.
    #[derive(Debug, Clone, Default)]
    pub struct Fake {
        pub links: Vec<Link>,
        pub sysctls: BTreeMap<String, String>,
        /// Changing calls so far; the n-th (from 1) fails with `fail_at`, never returns with
        /// `crash_at` (a panic the test catches: the process was killed there).
        pub changes: usize,
        pub fail_at: Option<usize>,
        pub crash_at: Option<usize>,
    }

    impl Fake {
        fn change(&mut self) -> std::result::Result<(), NlError> {
            self.changes += 1;
            if self.crash_at == Some(self.changes) {
                panic!("killed at change {}", self.changes);
            }
            if self.fail_at == Some(self.changes) {
                return Err(NlError::new("injected", libc::EIO));
            }
            Ok(())
        }
    }

    impl Kernel for Fake {
        fn link(&mut self, name: &str) -> std::result::Result<Option<Link>, NlError> {
            Ok(self.links.iter().find(|l| l.name == name).cloned())
        }

        fn set(&mut self, index: u32, change: Restore) -> std::result::Result<(), NlError> {
            self.change()?;
            let l = self
                .links
                .iter_mut()
                .find(|l| l.index == index)
                .ok_or_else(|| NlError::new("set", libc::ENODEV))?;
            match change {
                Restore::Mtu(m) => l.mtu = m,
                Restore::Mac(m) => l.mac = Some(m.0),
                Restore::Promisc(p) => l.flags = if p { l.flags | 0x100 } else { l.flags & !0x100 },
                Restore::Allmulti(a) => l.flags = if a { l.flags | 0x200 } else { l.flags & !0x200 },
                Restore::TxQLen(q) => l.txqlen = q,
            }
            Ok(())
        }

        fn sysctl_get(&mut self, path: &str) -> Result<String> {
            self.sysctls
                .get(path)
                .cloned()
                .ok_or_else(|| CniError::io(format!("read sysctl {path}: No such file")))
        }

        fn sysctl_set(&mut self, path: &str, value: &str) -> Result<()> {
            self.change()?;
            let v = self
                .sysctls
                .get_mut(path)
                .ok_or_else(|| CniError::io(format!("set sysctl {path}: No such file")))?;
            *v = value.to_string();
            Ok(())
        }
    }
}
