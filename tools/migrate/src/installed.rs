//! Which build of a plugin is installed: this suite's (its about banner, printed when
//! CNI_COMMAND is unset, names this very version as build metadata of upstream's release) or another (upstream's says "version
//! unknown" or "v1.x"). The binary runs under [`cni_common::child`]'s deadline.

use cni_common::child;
use std::path::Path;
use std::process::Command;

/// Ok when `dir/<plugin>` is this suite's `plugin`; else why not.
pub fn ours(dir: &Path, plugin: &str) -> Result<(), String> {
    let bin = dir.join(plugin);
    if !bin.is_file() {
        return Err(format!("{} is not installed (another directory: --cni-bin-dir)", bin.display()));
    }
    let mut cmd = Command::new(&bin);
    cmd.env_clear();
    let out = child::run(&mut cmd, None, child::Use::Runner)
        .map_err(|e| format!("cannot tell which {plugin} {} is: {}", bin.display(), e.msg))?;
    let banner = String::from_utf8_lossy(&out.stderr);
    if banner.starts_with(&format!("CNI {plugin} plugin {} (", cni_common::skel::BANNER_VERSION)) {
        return Ok(());
    }
    let first = banner.lines().next().unwrap_or_default();
    Err(format!(
        "{} is not this suite's {plugin} (it says {first:?}): what it made is not ours to rebuild",
        bin.display()
    ))
}
