//! Shared library of the CNI plugin suite.
//!
//! Two layers:
//! - the **spec layer** ([`spec`], [`skel`], [`ipam`]): CNI 0.1.0 … 1.1.0 configuration and
//!   result types, errors, environment validation, verb dispatch and IPAM delegation (exec'd,
//!   or in-process for a binary proven by [`ident`] to be the same build). No root needed, no
//!   kernel access.
//! - the **kernel layer** ([`netns`], [`netlink`], [`sysctl`]): entering network namespaces,
//!   a synchronous rtnetlink socket and `/proc/sys` access. Netlink message types never leave
//!   the [`netlink`] module.

pub mod attachment;
pub mod conntrack;
pub mod error;
pub mod error_list;
pub mod ident;
pub mod ipam;
pub mod mac;
pub mod netlink;
pub mod netns;
pub mod nft;
pub mod skel;
pub mod spec;
pub mod sysctl;

pub use attachment::AttachmentId;
pub use error::{code, CniError, Context, Result};
pub use error_list::ErrorList;
pub use mac::Mac;
pub use skel::{Plugin, Request};
pub use spec::{CniResult, Version};
