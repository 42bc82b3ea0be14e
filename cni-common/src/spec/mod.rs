//! The CNI specification, versions 0.1.0 … 1.1.0: versions, configuration, results,
//! environment. Pure data and validation; nothing here touches the kernel.

pub mod config;
pub mod env;
pub mod json;
pub mod result;
pub mod version;

pub use config::{Attachment, NetConf};
pub use env::{CniArgs, Command, Env};
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use version::Version;
