//! `cnitool`: run a CNI network configuration against a network namespace, with the command
//! line of upstream cnitool and libcni's behaviour (configuration loading, version choice,
//! per-plugin configuration, chaining, the attachment cache, GC and STATUS).
//!
//! - [`rt`]: command line and environment -> one [`rt::Invocation`];
//! - [`conf`]: finding and parsing the network configuration list;
//! - [`runner`]: the verbs and the configuration each plugin gets;
//! - [`cache`]: libcni's cache files, interoperable with upstream tools.

pub mod cache;
pub mod conf;
pub mod rt;
pub mod runner;

use cni_common::Result;
use rt::{Invocation, Verb};
use runner::{Exec, Runner};

/// Run one invocation. Returns the text to print on stdout (the ADD result), if any.
pub fn run<E: Exec>(inv: &Invocation, exec: E) -> Result<Option<String>> {
    let list = conf::load(&inv.net_dir, &inv.network)?;
    let mut runner = Runner { exec, cni_path: inv.cni_path.clone(), cache_dir: inv.cache_dir.clone() };
    match inv.verb {
        Verb::Add => {
            let result = runner.add(&list, &inv.rt)?;
            Ok(Some(cni_common::spec::result::pretty(&result)))
        }
        Verb::Check => runner.check(&list, &inv.rt).map(|_| None),
        Verb::Del => runner.del(&list, &inv.rt).map(|_| None),
        Verb::Gc => runner.gc(&list, inv.gc_keep.as_deref().unwrap_or(&[])).map(|_| None),
        Verb::Status => runner.status(&list).map(|_| None),
    }
}
