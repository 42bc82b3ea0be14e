//! Shared library of the CNI plugin suite.
//!
//! Two layers:
//! - the **spec layer** ([`spec`], [`skel`], [`delegate`]): CNI 0.1.0 … 1.1.0 configuration and
//!   result types, errors, environment validation, verb dispatch, and running other plugins
//!   (IPAM delegation; cnitool) — exec'd, or in-process for a binary proven by [`ident`] to be
//!   the same build. No root needed, no kernel access.
//! - the **kernel layer** ([`netns`], [`netlink`], [`sysctl`], [`nft_cli`]): entering network
//!   namespaces, synchronous netlink (rtnetlink, nf_tables, conntrack), `/proc/sys` access, and
//!   the `nft` command-line tool for the one input that is nft syntax. Netlink message types
//!   never leave the [`netlink`] module.
//! - files: [`fsread`] (bounded, non-blocking reads of regular files only) and [`filelock`]
//!   (`flock` with a deadline); [`statedir`] (a directory of the plugins' own state, checked once
//!   and used through its descriptor: the one way their files are read and written);
//!   [`nsident`] tells one network namespace from a later one.
//! - [`trace`]: W3C trace context (`TRACEPARENT`) named in every stderr line ([`log!`]) and
//!   error object.
//! - [`upstream`]: state made by upstream's Go plugins (iptables chains, nftables rules, ifbs),
//!   found, checked and removed so that binaries can be swapped on a node with containers.

pub mod alloc;
pub mod attachment;
pub mod child;
pub mod delegate;
pub mod error;
pub mod error_list;
pub mod filelock;
pub mod forward_drop;
pub mod fsread;
pub mod ident;
pub mod ipmasq;
pub mod mac;
pub mod net;
pub mod netlink;
pub mod netns;
pub mod nft_cli;
pub mod nsident;
pub mod skel;
pub mod spec;
pub mod statedir;
pub mod sysctl;
pub mod trace;
pub mod upstream;

pub use attachment::AttachmentId;
pub use error::{code, CniError, Context, Result};
pub use error_list::ErrorList;
pub use mac::Mac;
pub use skel::{Plugin, Request};
pub use spec::{CniResult, Version};
