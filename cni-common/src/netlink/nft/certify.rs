//! STATUS without a transaction: a dry run's success, certified once per boot and namespace.
//!
//! A plugin's STATUS proves that nf_tables can hold what its ADD would write by sending that
//! transaction without its end marker ([`NfTables::validate`]): the kernel processes every
//! message, then aborts. The abort is what makes it expensive. `__nf_tables_abort` waits for
//! an RCU grace period (`synchronize_rcu`) before it frees what the batch built, and it waits
//! holding the namespace's nf_tables commit mutex: for those milliseconds (10–12 ms measured on
//! the project's 2-core machines, more when they are busy) no other transaction of the
//! namespace can start, neither kube-proxy's nor an ADD's. containerd ≥ 2.0.1 runs STATUS of
//! every plugin of a 1.1.0 list on every CRI `Status` call (the kubelet's, every 5 s).
//!
//! What a dry run proves does not change with the ruleset: that this kernel has nf_tables in
//! this namespace, the chain types, expressions and set types the batch uses (built in, or a
//! module it loaded on demand), and room for objects of our own names. So a success is written
//! down as a **certificate**, one small file under [`DIR`] (a tmpfs: gone at reboot) naming the
//! plugin, the boot id, the namespace (nsfs inode and netns cookie) and a SHA-256 of the exact
//! batch (and of the `nft` script a plugin checks beside it). A later STATUS with the same
//! batch in the same namespace of the same boot finds its certificate and only asks nf_tables
//! for the ruleset generation (`NFT_MSG_GETGEN`, a read: no mutex, no grace period) to prove
//! that nf_tables still answers here. Nothing else is taken from the file: it is compared byte
//! for byte with what this call would write, so a stale, foreign or damaged file only means a
//! new dry run. Failures are never written down: a STATUS that failed runs the dry run again
//! next time, so it turns ready as soon as the cause is gone. Without netns cookies (Linux
//! < 5.14) a namespace is not unambiguous over time and nothing is certified.
//!
//! The directory is a [`StateDir`]: opened once along its path and trusted only when it and
//! every directory above it is ours and writable by no one else; otherwise every STATUS
//! dry-runs, as before. A certificate is read only when it is a regular file, without waiting
//! and at most [`MAX`] bytes: a FIFO, link or device in its place is no certificate (issue 37,
//! finding 5: a FIFO there once blocked STATUS for ever). Writing a certificate is best effort:
//! a failure to write costs the next STATUS a dry run, never a wrong answer.

use super::encode::op_messages;
use super::ops::NftOp;
use super::NfTables;
use crate::netlink::NlError;
use crate::nsident;
use crate::statedir::StateDir;
use sha2::{Digest, Sha256};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where certificates live (a tmpfs: nothing survives a reboot).
pub const DIR: &str = "/run/cni-rs/status";

/// The largest certificate read back (they are ~200 bytes).
const MAX: u64 = 4096;

/// The most certificates one plugin keeps: a node has one per network configuration (a
/// plugin's batch changes only with its configuration), so more means configurations that came
/// and went (or a test varying them); past this, recording one removes the plugin's others.
const PER_PLUGIN: usize = 32;

/// SHA-256 of the batch `ops` encodes (message by message, as sent) and of `script`, an `nft`
/// script checked beside it.
pub fn fingerprint(ops: &[NftOp], script: Option<&str>) -> [u8; 32] {
    let mut h = Sha256::new();
    for m in ops.iter().flat_map(op_messages) {
        h.update((m.len() as u64).to_le_bytes());
        h.update(&m);
    }
    if let Some(s) = script {
        h.update(b"nft script\0");
        h.update(s.as_bytes());
    }
    h.finalize().into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The certificate plugin `plugin` would hold for dry run `fingerprint` in the calling thread's
/// network namespace, this boot.
pub struct Certificate {
    dir: PathBuf,
    name: String,
    text: String,
}

impl Certificate {
    /// In `dir` ([`DIR`] for the plugins; tests give their own). None when this namespace cannot
    /// be named unambiguously (no netns cookie), the boot id is unreadable, or `plugin` is not
    /// a plain name.
    pub fn here(dir: &Path, plugin: &str, fingerprint: &[u8; 32]) -> Option<Certificate> {
        if plugin.is_empty() || !plugin.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return None;
        }
        let boot = nsident::boot_id()?;
        let cookie = nsident::cookie_here();
        if cookie == 0 || boot == [0; 16] {
            return None;
        }
        let ino = std::fs::metadata("/proc/thread-self/ns/net").ok()?.ino();
        let text = format!(
            "STATUS certificate: nf_tables accepted this dry run here\nplugin {plugin}\nboot {}\nnetns {ino} {cookie}\ndry-run {}\n",
            hex(&boot),
            hex(fingerprint)
        );
        let name = format!("{plugin}-{}", hex(&fingerprint[..16]));
        Some(Certificate { dir: dir.to_path_buf(), name, text })
    }

    /// Whether the certificate is on file, exactly as this call would write it, in a
    /// directory we can trust. Anything but a regular file at its name is no certificate.
    pub fn holds(&self) -> bool {
        let Ok(dir) = StateDir::open(&self.dir, None) else { return false };
        dir.read(&self.name, MAX).is_ok_and(|got| got == self.text.as_bytes())
    }

    /// Write it down (best effort: a failure only costs the next STATUS a dry run).
    pub fn record(&self) {
        let Ok(dir) = StateDir::open(&self.dir, Some(0o700)) else { return };
        // a tmpfs: nothing to flush
        let _ = dir.write_atomic(&self.name, self.text.as_bytes(), 0o600, false);
        self.prune(&dir);
    }

    /// Keep the directory bounded: past [`PER_PLUGIN`] certificates of this plugin, remove all
    /// but this one (the removed ones cost their next STATUS a dry run, nothing else).
    fn prune(&self, dir: &StateDir) {
        let Some((prefix, _)) = self.name.rsplit_once('-') else { return };
        let prefix = format!("{prefix}-");
        let Ok(names) = dir.names() else { return };
        let others: Vec<String> = names
            .into_iter()
            .filter_map(|n| n.into_string().ok())
            .filter(|n| *n != self.name && n.starts_with(&prefix))
            .collect();
        if others.len() >= PER_PLUGIN {
            for n in others {
                let _ = dir.remove(&n);
            }
        }
    }

    /// Remove it (a dry run failed: it no longer holds).
    pub fn revoke(&self) {
        if let Ok(dir) = StateDir::open(&self.dir, None) {
            let _ = dir.remove(&self.name);
        }
    }
}

/// STATUS's proof for `plugin`: `live` (a read that shows nf_tables answers here) always; then,
/// unless a certificate for `fingerprint` holds, `dry_run`, whose success is certified and
/// whose failure revokes. `dir` None: no certificates (every call dry-runs).
pub fn certified<E>(
    dir: Option<&Path>,
    plugin: &str,
    fingerprint: &[u8; 32],
    live: impl FnOnce() -> Result<(), E>,
    dry_run: impl FnOnce() -> Result<(), E>,
) -> Result<(), E> {
    live()?;
    let cert = dir.and_then(|d| Certificate::here(d, plugin, fingerprint));
    if cert.as_ref().is_some_and(Certificate::holds) {
        return Ok(());
    }
    match dry_run() {
        Ok(()) => {
            if let Some(c) = &cert {
                c.record();
            }
            Ok(())
        }
        Err(e) => {
            if let Some(c) = &cert {
                c.revoke();
            }
            Err(e)
        }
    }
}

/// [`certified`] over one connection: the generation read, then `ops` validated unless
/// certified in [`DIR`].
pub fn validate_certified(nf: &mut NfTables, plugin: &str, ops: &[NftOp]) -> Result<(), NlError> {
    let fp = fingerprint(ops, None);
    let nf = std::cell::RefCell::new(nf);
    certified(
        Some(Path::new(DIR)),
        plugin,
        &fp,
        || nf.borrow_mut().generation().map(drop),
        || nf.borrow_mut().validate(ops),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::nft::NftFamily;
    use std::cell::Cell;

    fn table(name: &str) -> Vec<NftOp> {
        vec![NftOp::AddTable { family: NftFamily::Inet, table: name.into(), comment: None }]
    }

    /// A directory of the test's own (tests of one process run concurrently in one namespace).
    fn scratch(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("certify-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d.join("status")
    }

    #[test]
    fn fingerprint_names_the_exact_batch_and_script() {
        let a = fingerprint(&table("a"), None);
        assert_eq!(a, fingerprint(&table("a"), None));
        assert_ne!(a, fingerprint(&table("b"), None));
        assert_ne!(a, fingerprint(&table("a"), Some("")));
        assert_ne!(fingerprint(&table("a"), Some("x")), fingerprint(&table("a"), Some("y")));
    }

    /// The dry run runs until it succeeds once; after that only the live read runs; a failed
    /// live read fails STATUS whatever is certified; a failed dry run is never certified.
    #[test]
    fn a_success_is_certified_a_failure_never() {
        if nsident::cookie_here() == 0 {
            // without cookies nothing is certified: every call dry-runs
            let dir = scratch("nocookie");
            let runs = Cell::new(0);
            for _ in 0..2 {
                let dry_run = || {
                    runs.set(runs.get() + 1);
                    Ok::<(), ()>(())
                };
                certified(Some(&dir), "p", &[1; 32], || Ok(()), dry_run).unwrap();
            }
            assert_eq!(runs.get(), 2);
            return;
        }
        let dir = scratch("success");
        let runs = Cell::new(0);
        let ok = || -> Result<(), &str> {
            runs.set(runs.get() + 1);
            Ok(())
        };
        let fail = || -> Result<(), &str> {
            runs.set(runs.get() + 1);
            Err("no nat")
        };
        let live = || Ok(());
        // a failure: not certified, so the next call dry-runs again
        assert_eq!(certified(Some(&dir), "p", &[1; 32], live, fail), Err("no nat"));
        assert_eq!(certified(Some(&dir), "p", &[1; 32], live, fail), Err("no nat"));
        assert_eq!(runs.get(), 2);
        // the first success is certified; the next calls do not dry-run
        certified(Some(&dir), "p", &[1; 32], live, ok).unwrap();
        certified(Some(&dir), "p", &[1; 32], live, ok).unwrap();
        certified(Some(&dir), "p", &[1; 32], live, fail).unwrap();
        assert_eq!(runs.get(), 3);
        // another batch, another plugin: their own dry runs
        certified(Some(&dir), "p", &[2; 32], live, ok).unwrap();
        certified(Some(&dir), "q", &[1; 32], live, ok).unwrap();
        assert_eq!(runs.get(), 5);
        // nf_tables not answering: STATUS fails, certificate or not
        assert_eq!(
            certified(Some(&dir), "p", &[1; 32], || Err("EPROTONOSUPPORT"), ok),
            Err("EPROTONOSUPPORT")
        );
        assert_eq!(runs.get(), 5);
        // no directory: every call dry-runs
        certified(None, "p", &[1; 32], live, ok).unwrap();
        assert_eq!(runs.get(), 6);
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    /// What is on file is compared byte for byte: a damaged or foreign file, or a directory
    /// others can write, certifies nothing.
    #[test]
    fn only_an_exact_certificate_in_a_private_directory_holds() {
        let dir = scratch("exact");
        let Some(c) = Certificate::here(&dir, "p", &[7; 32]) else {
            assert_eq!(nsident::cookie_here(), 0, "a certificate is named whenever the namespace can be");
            return;
        };
        assert!(!c.holds(), "nothing on file yet");
        c.record();
        assert!(c.holds());
        let file = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("plugin p\n") && text.contains(&format!("dry-run {}\n", hex(&[7; 32]))),
            "{text}"
        );
        std::fs::write(&file, text.replace("plugin p", "plugin q")).unwrap();
        assert!(!c.holds(), "a damaged certificate");
        c.record();
        assert!(c.holds(), "rewritten");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!c.holds(), "a directory others can write");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(c.holds());
        c.revoke();
        assert!(!c.holds(), "revoked");
        assert!(Certificate::here(&dir, "../p", &[7; 32]).is_none(), "a plugin name is a plain name");
        // bounded: past PER_PLUGIN certificates of one plugin, recording one removes the others
        for i in 0..=PER_PLUGIN as u8 {
            Certificate::here(&dir, "p", &[i; 32]).unwrap().record();
        }
        Certificate::here(&dir, "q", &[0; 32]).unwrap().record();
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.iter().filter(|n| n.starts_with("p-")).count(), 1, "{names:?}");
        assert!(Certificate::here(&dir, "p", &[PER_PLUGIN as u8; 32]).unwrap().holds(), "the last one stays");
        assert!(Certificate::here(&dir, "q", &[0; 32]).unwrap().holds(), "another plugin's stay");
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    /// Issue 37, finding 5: a FIFO (or a link, or a device) at the certificate's name is no
    /// certificate and is never waited on; recording replaces it.
    #[test]
    fn a_fifo_at_the_certificate_is_none() {
        let dir = scratch("fifo");
        let Some(c) = Certificate::here(&dir, "p", &[9; 32]) else {
            assert_eq!(nsident::cookie_here(), 0);
            return;
        };
        c.record();
        let file = dir.join(&c.name);
        std::fs::remove_file(&file).unwrap();
        nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(!c.holds(), "a FIFO is no certificate (and holds() returned: it did not wait)");
        c.record();
        assert!(
            c.holds() && std::fs::symlink_metadata(&file).unwrap().is_file(),
            "replaced by a certificate"
        );
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
        assert!(!c.holds(), "a link is not followed");
        c.revoke();
        assert!(std::fs::symlink_metadata(&file).is_err(), "revoked: the link removed, not followed");
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }
}
