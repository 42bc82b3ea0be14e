//! firewall: lets a chained attachment's traffic through the host's forward filters, with
//! upstream's keys and rules (v1.10's `firewall` plugin).
//!
//! ```text
//!  request ──► config ──► Conf, Intent ──► model::desired (pure: chains and rules per family)
//!                                              │
//!  kernel ──► Kernel::read (one generation) ──►plan (pure) ──► Kernel::apply(ops, generation)
//!                  ▲                                                  │
//!                  └────────── refused: the table changed since ◄─────┘
//! ```
//!
//! - [`config`]: the keys, validated; [`config::Intent`] from the prevResult.
//! - [`model`]: upstream's chains and rules declared once, as iptables words and as the
//!   nf_tables expressions iptables-nft writes for them.
//! - [`kernel`]: the nftables seam (netlink, and a fake for tests); [`plan`]: the planner;
//!   [`nft`]: the nftables flows; [`iptables`]: the iptables backend; [`backend`]: the choice.
//! - [`record`]: which addresses each attachment holds (DEL without prevResult, GC).
//! - [`add`], [`del`], [`check`], [`gc`], [`status`]: the verbs.
//! - [`resync`]: judge and rebuild an attachment's rules after a firewall reload (`cni-migrate
//!   resync`'s surface of this plugin).

pub mod add;
pub mod backend;
pub mod check;
pub mod config;
pub mod dbus;
pub mod del;
pub mod firewalld;
pub mod gc;
pub mod iptables;
pub mod kernel;
pub mod model;
pub mod nft;
pub mod plan;
pub mod record;
pub mod resync;
pub mod status;
