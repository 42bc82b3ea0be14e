//! The saved-settings directory: the names of an attachment's file and the only code that
//! touches the files ([`Files`]; [`fake::MemStore`] in tests).
//!
//! **Names.** Upstream names the file `<containerID>_<ifname>.json`, which is ambiguous as soon
//! as an id or an ifname holds `_` (id `a_b` with ifname `c` and id `a` with ifname `b_c` are
//! both `a_b_c.json`: the second ADD takes the first one's values as its own, and one DEL
//! restores nothing). Ours ([`Names::new`]) is upstream's name when that has exactly one `_`
//! (the usual case: hex ids, `eth0`), so that upstream's DEL still finds it after a switch back,
//! and `+<containerID>+<ifname>.json` otherwise: a container id has no `+` (its characters are
//! `[A-Za-z0-9_.-]`), so the second `+` ends it, and no upstream name starts with `+` (an id
//! starts with a letter or digit). Either form reads back to one attachment only, and none is
//! another attachment's upstream name. DEL also looks for upstream's exact name, which a
//! file upstream (or an earlier build of ours) wrote has.
//!
//! **What is at a name.** Only a regular file is read, and it is looked at (`fstatat`, no
//! link followed) before it is opened: a FIFO, socket, device, directory or symbolic link at
//! the name is not a file this plugin or upstream wrote, and is reported as [`Entry::NotOurs`]
//! without being opened; so is a file too large or that does not decode. Files are created
//! `O_EXCL | O_NOFOLLOW` under a temporary name and renamed into place at the directory's
//! descriptor, so a crash never leaves half of one and nothing planted is written through.

use std::path::{Path, PathBuf};

use cni_common::error::{CniError, Result};
use cni_common::fsread;
use cni_common::statedir::{self, StateDir};
use nix::errno::Errno;
use nix::fcntl::AtFlags;

use crate::saved::Saved;

/// The file names of one attachment's saved settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The name ADD writes.
    pub ours: String,
    /// Upstream's name, `<containerID>_<ifname>.json` (the same as `ours` in the usual case).
    pub upstream: String,
}

/// The first character of an escaped name, and the separator after the container id: neither
/// occurs in a container id.
const MARK: char = '+';

impl Names {
    /// The names for a validated container id and ifname (no `/` in either).
    pub fn new(container_id: &str, ifname: &str) -> Names {
        let upstream = format!("{container_id}_{ifname}.json");
        let ours = if container_id.contains('_') || ifname.contains('_') {
            format!("{MARK}{container_id}{MARK}{ifname}.json")
        } else {
            upstream.clone()
        };
        Names { ours, upstream }
    }

    /// Where DEL looks, in order: ours, then upstream's name when it is another.
    pub fn lookup(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.ours.as_str())
            .chain((self.upstream != self.ours).then_some(self.upstream.as_str()))
    }
}

/// What is at a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Missing,
    /// Something no tuning wrote (what it is, for the message): a FIFO, a link, a file that
    /// does not decode… Never to be restored from.
    NotOurs(String),
    Saved(Saved),
}

pub trait Store {
    fn load(&mut self, name: &str) -> Result<Entry>;
    fn save(&mut self, name: &str, s: &Saved) -> Result<()>;
    /// Remove the entry at `name`, whatever it is, without following it (and a temporary file
    /// of that name a killed ADD left). Whether there was one.
    fn remove(&mut self, name: &str) -> Result<bool>;
    /// Every saved file: (name, content; None when it is not saved settings).
    fn list(&mut self) -> Result<Vec<(String, Option<Saved>)>>;
}

/// The most a saved-settings file may hold (they are a few dozen bytes).
const FILE_MAX: u64 = 64 << 10;

/// The saved-settings directory on disk.
pub struct Files {
    dir: PathBuf,
}

impl Files {
    pub fn new(dir: &Path) -> Files {
        Files { dir: dir.to_path_buf() }
    }

    /// The directory, checked as every plugin's state directory is ([`StateDir`]: each
    /// component root's and writable by no one else, the last never a link); made (0700) when
    /// `create`. `None`: it is not there.
    fn open(&self, create: bool) -> Result<Option<StateDir>> {
        match StateDir::open(&self.dir, create.then_some(0o700)) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CniError::io(format!("tuning's dataDir {}: {e}", self.dir.display()))),
        }
    }

    fn unlink(&self, dir: &StateDir, name: &str) -> Result<bool> {
        let gone = match dir.remove(name) {
            // a directory at the name: removed when empty (a full one is reported)
            Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => match dir.remove_dir(name) {
                Ok(false) => Err(std::io::Error::other(format!("{name} is a directory that is not empty"))),
                r => r,
            },
            r => r,
        };
        match gone {
            Ok(g) => Ok(g),
            // an id too long for a file name, which no ADD could have saved
            Err(e) if e.kind() == std::io::ErrorKind::InvalidFilename => Ok(false),
            Err(e) => Err(CniError::io(format!("failed to remove {}/{name}: {e}", self.dir.display()))),
        }
    }
}

impl Store for Files {
    fn load(&mut self, name: &str) -> Result<Entry> {
        let Some(dir) = self.open(false)? else { return Ok(Entry::Missing) };
        let here = || format!("{}/{name}", self.dir.display());
        // Looked at before it is opened: a FIFO is never opened, a link never followed.
        match nix::sys::stat::fstatat(dir.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFREG => {
                return Ok(Entry::NotOurs(fsread::kind(st.st_mode).to_string()))
            }
            Ok(_) => {}
            Err(Errno::ENOENT | Errno::ENAMETOOLONG) => return Ok(Entry::Missing),
            Err(e) => return Err(CniError::io(format!("{}: {e}", here()))),
        }
        // Still O_NOFOLLOW | O_NONBLOCK, and refused unless regular: something put in its place
        // meanwhile is not waited on either.
        match dir.read(name, FILE_MAX) {
            Ok(bytes) => Ok(match serde_json::from_slice(&bytes) {
                Ok(s) => Entry::Saved(s),
                Err(e) => Entry::NotOurs(format!("a file that is no saved settings ({e})")),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Entry::Missing),
            Err(e) if statedir::not_ours(&e) => Ok(Entry::NotOurs(e.to_string())),
            Err(e) => Err(CniError::io(format!("{}: {e}", here()))),
        }
    }

    fn save(&mut self, name: &str, s: &Saved) -> Result<()> {
        let dir = self
            .open(true)?
            .ok_or_else(|| CniError::io(format!("dataDir {} vanished", self.dir.display())))?;
        let data = serde_json::to_vec_pretty(s).map_err(|e| CniError::internal(format!("encode: {e}")))?;
        dir.write_atomic(name, &data, 0o600, true)
            .map_err(|e| CniError::io(format!("failed to save {}/{name}: {e}", self.dir.display())))
    }

    fn remove(&mut self, name: &str) -> Result<bool> {
        let Some(dir) = self.open(false)? else { return Ok(false) };
        // a temporary file of this attachment's that a killed ADD left before its rename (the
        // shared writer's names, and `.<name>.<pid>` of the build before it)
        let old_temp = format!(".{name}.");
        let names = dir.names().map_err(|e| CniError::io(format!("list {}: {e}", self.dir.display())))?;
        for n in names.iter().filter_map(|n| n.to_str()) {
            if n.starts_with(&old_temp) || statedir::is_tmp_of(n) == Some(name) {
                let _ = dir.remove(n);
            }
        }
        self.unlink(&dir, name)
    }

    fn list(&mut self) -> Result<Vec<(String, Option<Saved>)>> {
        let Some(dir) = self.open(false)? else { return Ok(Vec::new()) };
        let names = dir.names().map_err(|e| CniError::io(format!("list {}: {e}", self.dir.display())))?;
        let mut out = Vec::new();
        for n in names {
            let Some(n) = n.to_str().filter(|n| n.ends_with(".json") && !n.starts_with('.')) else {
                continue;
            };
            let content = match self.load(n) {
                Ok(Entry::Saved(s)) => Some(s),
                _ => None,
            };
            out.push((n.to_string(), content));
        }
        Ok(out)
    }
}

#[cfg(test)]
pub mod fake {
    use super::*;
    use std::collections::BTreeMap;

    /// The saved-settings directory in memory.
    #[derive(Debug, Clone, Default)]
    pub struct MemStore {
        pub files: BTreeMap<String, Saved>,
        /// Entries no tuning wrote (a FIFO, a link…): name and what they are.
        pub foreign: BTreeMap<String, String>,
        pub fail_save: bool,
        /// Names loaded so far, in order.
        pub loads: Vec<String>,
    }

    impl Store for MemStore {
        fn load(&mut self, name: &str) -> Result<Entry> {
            self.loads.push(name.to_string());
            Ok(match (self.foreign.get(name), self.files.get(name)) {
                (Some(what), _) => Entry::NotOurs(what.clone()),
                (None, Some(s)) => Entry::Saved(s.clone()),
                (None, None) => Entry::Missing,
            })
        }
        fn save(&mut self, name: &str, s: &Saved) -> Result<()> {
            if self.fail_save {
                return Err(CniError::io("disk full"));
            }
            self.foreign.remove(name);
            self.files.insert(name.to_string(), s.clone());
            Ok(())
        }
        fn remove(&mut self, name: &str) -> Result<bool> {
            let foreign = self.foreign.remove(name).is_some();
            Ok(self.files.remove(name).is_some() || foreign)
        }
        fn list(&mut self) -> Result<Vec<(String, Option<Saved>)>> {
            let files = self.files.iter().map(|(k, v)| (k.clone(), Some(v.clone())));
            Ok(files.chain(self.foreign.keys().map(|k| (k.clone(), None))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usual_name_is_upstreams_and_an_ambiguous_one_is_escaped() {
        let n = Names::new("0123abcd", "eth0");
        assert_eq!((n.ours.as_str(), n.upstream.as_str()), ("0123abcd_eth0.json", "0123abcd_eth0.json"));
        assert_eq!(n.lookup().collect::<Vec<_>>(), vec!["0123abcd_eth0.json"]);
        // the issue's pair: one upstream name, two of ours
        let (a, b) = (Names::new("a_b", "c"), Names::new("a", "b_c"));
        assert_eq!((a.upstream.as_str(), b.upstream.as_str()), ("a_b_c.json", "a_b_c.json"));
        assert_eq!((a.ours.as_str(), b.ours.as_str()), ("+a_b+c.json", "+a+b_c.json"));
        assert_eq!(a.lookup().collect::<Vec<_>>(), vec!["+a_b+c.json", "a_b_c.json"]);
    }

    /// Every (id, ifname) over a small alphabet holding the separators: ours are all different,
    /// and ours of one attachment is never the upstream name of another.
    #[test]
    fn names_are_unambiguous_and_never_another_attachments_upstream_name() {
        fn words(alphabet: &[char], max: usize) -> Vec<String> {
            let mut all = vec![String::new()];
            let mut last = vec![String::new()];
            for _ in 0..max {
                last = last.iter().flat_map(|w| alphabet.iter().map(move |c| format!("{w}{c}"))).collect();
                all.extend(last.iter().cloned());
            }
            all
        }
        let ids: Vec<String> = words(&['a', '1', '_', '.', '-'], 3)
            .into_iter()
            .filter(|w| cni_common::spec::env::validate_container_id(w).is_ok())
            .collect();
        let ifnames: Vec<String> = words(&['a', '_', '+', '.', '@'], 3)
            .into_iter()
            .filter(|w| cni_common::spec::env::validate_ifname(w).is_ok())
            .collect();
        let mut ours = std::collections::HashMap::new();
        let mut upstream = std::collections::HashMap::new();
        for id in &ids {
            for ifname in &ifnames {
                let n = Names::new(id, ifname);
                assert!(!n.ours.starts_with('.') && !n.ours.contains('/'), "{n:?}");
                if let Some(other) = ours.insert(n.ours.clone(), (id.clone(), ifname.clone())) {
                    panic!("{n:?} is also {other:?}'s");
                }
                upstream.entry(n.upstream).or_insert_with(Vec::new).push((id.clone(), ifname.clone()));
            }
        }
        for (name, owner) in &ours {
            if let Some(owners) = upstream.get(name) {
                assert_eq!(owners, &vec![owner.clone()], "{name}");
            }
        }
        assert!(upstream.values().any(|o| o.len() > 1), "the alphabet makes upstream's names collide");
    }
}

#[cfg(test)]
mod files {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Dir(PathBuf);
    impl Dir {
        fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!("tuning-store-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Issue 37.4: a FIFO, a symbolic link, a directory or a file that does not decode at the
    /// name is not ours: loading says what it is (the FIFO is not opened: a blocking open would
    /// hang this test), removing takes the name away and leaves a link's target as it was.
    #[test]
    fn what_no_tuning_wrote_is_not_ours_and_is_removed_without_being_followed() {
        let d = Dir::new("notours");
        let target = d.0.join("target");
        std::fs::write(&target, br#"{"mtu": 1500}"#).unwrap();
        symlink(&target, d.0.join("link.json")).unwrap();
        nix::unistd::mkfifo(&d.0.join("fifo.json"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::create_dir(d.0.join("dir.json")).unwrap();
        std::fs::write(d.0.join("junk.json"), b"not json").unwrap();
        let mut s = Files::new(&d.0);
        let what = |s: &mut Files, n: &str| match s.load(n).unwrap() {
            Entry::NotOurs(w) => w,
            e => panic!("{n}: {e:?}"),
        };
        assert_eq!(what(&mut s, "link.json"), "a symbolic link");
        assert_eq!(what(&mut s, "fifo.json"), "a FIFO");
        assert_eq!(what(&mut s, "dir.json"), "a directory");
        assert!(what(&mut s, "junk.json").contains("no saved settings"));
        assert_eq!(s.list().unwrap().iter().filter(|(_, c)| c.is_some()).count(), 0);
        for n in ["link.json", "fifo.json", "dir.json", "junk.json"] {
            assert!(s.remove(n).unwrap(), "{n}");
            assert_eq!(s.load(n).unwrap(), Entry::Missing, "{n}");
        }
        assert_eq!(std::fs::read(&target).unwrap(), br#"{"mtu": 1500}"#);
        // a name longer than a file name can be: nothing there, nothing to remove
        let long = format!("{}.json", "a".repeat(300));
        assert_eq!(s.load(&long).unwrap(), Entry::Missing);
        assert!(!s.remove(&long).unwrap());
    }

    /// A save never writes through what is at its temporary or final name.
    #[test]
    fn a_save_replaces_a_planted_link_and_a_stale_temporary_file() {
        let d = Dir::new("save");
        let target = d.0.join("target");
        std::fs::write(&target, b"keep").unwrap();
        symlink(&target, d.0.join("x_eth0.json")).unwrap();
        symlink(&target, d.0.join(format!(".x_eth0.json.{}", std::process::id()))).unwrap();
        let mut s = Files::new(&d.0);
        let saved = Saved { mtu: 1500, ifindex: Some(2), ..Default::default() };
        s.save("x_eth0.json", &saved).unwrap();
        assert_eq!(s.load("x_eth0.json").unwrap(), Entry::Saved(saved));
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let mut left: Vec<String> =
            std::fs::read_dir(&d.0).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        // the stale temporary file of the build before (a predictable name) is no longer in
        // the way of a save (whose names cannot be guessed): DEL's remove takes it away
        let stale = format!(".x_eth0.json.{}", std::process::id());
        assert_eq!(left, vec![stale.clone(), "target".into(), "x_eth0.json".into()]);
        assert!(s.remove("x_eth0.json").unwrap());
        assert!(std::fs::symlink_metadata(d.0.join(&stale)).is_err(), "removed, not followed");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }
}

/// DEL over the real directory: what is at the attachment's names and is not ours never fails
/// it, even what cannot be removed (a directory with something in it), and a link's target is
/// left as it was.
#[cfg(test)]
#[test]
fn del_on_disk_goes_past_what_is_not_ours() {
    let d = std::env::temp_dir().join(format!("tuning-store-del-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("+a_b+c.json/inside")).unwrap();
    let target = d.join("target");
    std::fs::write(&target, b"{\"mtu\": 1500}").unwrap();
    std::os::unix::fs::symlink(&target, d.join("a_b_c.json")).unwrap();
    let names = Names::new("a_b", "c");
    let notes = crate::del::run(None, &mut Files::new(&d), "c", &names).unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with("+a_b+c.json is a directory, not settings a tuning saved: failed"),
        "{notes:?}"
    );
    assert_eq!(notes[1], "a_b_c.json is a symbolic link, not settings a tuning saved: removed");
    assert!(d.join("+a_b+c.json/inside").is_dir(), "a full directory is left, with a note");
    assert!(std::fs::symlink_metadata(d.join("a_b_c.json")).is_err(), "the link is removed");
    assert_eq!(std::fs::read(&target).unwrap(), b"{\"mtu\": 1500}");
    std::fs::remove_dir_all(&d).unwrap();
}
