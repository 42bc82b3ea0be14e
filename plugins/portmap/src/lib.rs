//! portmap: host ports forwarded to a chained attachment's container, with nf_tables sets and
//! maps whose rules never grow with the number of mappings.
//!
//! One flow for every verb:
//!
//! ```text
//!  request ──► config ──► Intent                    what the attachment wants (pure)
//!                           │
//!  kernel ──► Kernel::read ─┼─► State ──► plan ──► Plan ──► Kernel::apply(ops, generation)
//!               (snapshot)  │   (decode)  (pure)            one nf_tables transaction
//!                  ▲        │                                        │
//!                  └────────┴──── refused: the table changed since ◄─┘
//!                                 it was read, or a point read was not enough
//! ```
//!
//! - [`config`]: the keys, validated ([`config::Conf`], [`config::Teardown`] for DEL and GC),
//!   and [`config::Intent`], the attachment's desired elements.
//! - [`model`]: the elements, typed, and their bytes; who owns them ([`model::Owner`]).
//! - [`layout`]: the table declared once (sets, chains, rules) and everything derived from it.
//! - [`state`]: what a verb reads ([`state::Scope`]) and the [`state::State`] decoded from it.
//! - [`plan`]: the planner (pure): ADD, DEL, GC, CHECK.
//! - [`kernel`]: the seam ([`kernel::Kernel`]): netlink, and a fake for tests.
//! - [`flow`]: each verb's loop of read, plan, apply.
//! - [`netns`]: telling a stale holder of a host port from a live one.
//! - [`marks`]: DEL's marks, which keep `cni-migrate resync` from rebuilding what a DEL removes.
//! - [`upstream`]: upstream portmap's host ports (iptables, its nftables backend), found,
//!   checked and removed so that binaries can be swapped under running containers.
#![warn(clippy::too_many_lines)]

pub mod config;
pub mod flow;
pub mod identity;
pub mod kernel;
pub mod layout;
pub mod localnet;
pub mod marks;
pub mod model;
pub mod netns;
pub mod plan;
pub mod plugin;
pub mod state;
pub mod upstream;
