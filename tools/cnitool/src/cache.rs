//! libcni's attachment cache: one JSON file per attachment at
//! `<cacheDir>/results/<net>-<containerid>-<ifname>`, so that upstream tools and ours can
//! CHECK, DEL and GC each other's attachments.
//!
//! The object (Go's `cachedInfo`, keys in its field order, compact JSON, file mode 0600 in a
//! 0700 directory):
//! `kind` ("cniCacheV1"), `containerId`, `config` (base64 of the network config list bytes),
//! `ifName`, `networkName`, `netns` (omitted when empty), `cniArgs` (array of `[key, value]`,
//! omitted when empty), `capabilityArgs` (object, omitted when empty), `result` (the final
//! ADD result, omitted when empty).

use cni_common::fsread;
use cni_common::spec::json;
use cni_common::spec::result::CniResult;
use cni_common::spec::version::Version;
use cni_common::statedir::StateDir;
use cni_common::{CniError, Result};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

pub const KIND_V1: &str = "cniCacheV1";

/// One cached attachment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheEntry {
    pub container_id: String,
    /// The network configuration list bytes the attachment was made with.
    pub config: Vec<u8>,
    pub if_name: String,
    pub network_name: String,
    pub netns: String,
    pub cni_args: Vec<(String, String)>,
    pub capability_args: Option<Map<String, Value>>,
    pub result: Option<Map<String, Value>>,
}

/// The wire form, decoded with Go's key matching (Go's decoder is case-insensitive too).
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    kind: String,
    #[serde(rename = "containerId", default)]
    container_id: String,
    #[serde(default)]
    config: Option<String>,
    #[serde(rename = "ifName", default)]
    if_name: String,
    #[serde(rename = "networkName", default)]
    network_name: String,
    #[serde(default)]
    netns: String,
    #[serde(rename = "cniArgs", default)]
    cni_args: Option<Vec<Vec<String>>>,
    #[serde(rename = "capabilityArgs", default)]
    capability_args: Option<Map<String, Value>>,
    #[serde(default)]
    result: Option<Map<String, Value>>,
}

impl CacheEntry {
    /// The JSON object libcni writes.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), KIND_V1.into());
        m.insert("containerId".into(), self.container_id.clone().into());
        m.insert("config".into(), base64_encode(&self.config).into());
        m.insert("ifName".into(), self.if_name.clone().into());
        m.insert("networkName".into(), self.network_name.clone().into());
        if !self.netns.is_empty() {
            m.insert("netns".into(), self.netns.clone().into());
        }
        if !self.cni_args.is_empty() {
            let pairs = self.cni_args.iter().map(|(k, v)| Value::from(vec![k.clone(), v.clone()])).collect();
            m.insert("cniArgs".into(), Value::Array(pairs));
        }
        if let Some(c) = self.capability_args.as_ref().filter(|c| !c.is_empty()) {
            m.insert("capabilityArgs".into(), Value::Object(c.clone()));
        }
        if let Some(r) = self.result.as_ref().filter(|r| !r.is_empty()) {
            m.insert("result".into(), Value::Object(r.clone()));
        }
        Value::Object(m)
    }

    /// Decode a cache object; `Err` when it is not JSON, not an object of the right types, or
    /// not of kind `cniCacheV1`.
    pub fn from_json(bytes: &[u8]) -> std::result::Result<CacheEntry, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if !v.is_object() {
            return Err("the cache file is not a JSON object".into());
        }
        let w: Wire = json::from_ref(&v)?;
        if w.kind != KIND_V1 {
            return Err(format!("wrong kind {:?}", w.kind));
        }
        let config = match w.config {
            None => Vec::new(),
            Some(text) => base64_decode(&text).ok_or("config is not valid base64")?,
        };
        let cni_args = w
            .cni_args
            .unwrap_or_default()
            .into_iter()
            .map(|mut p| {
                p.resize(2, String::new());
                (p[0].clone(), p[1].clone())
            })
            .collect();
        Ok(CacheEntry {
            container_id: w.container_id,
            config,
            if_name: w.if_name,
            network_name: w.network_name,
            netns: w.netns,
            cni_args,
            capability_args: w.capability_args,
            result: w.result,
        })
    }
}

/// Write `entry` to `path` (creating the directory 0700), replacing the file atomically with
/// mode 0600, through cni-common's [`StateDir`]: the directory opened once along its path and
/// refused when it or one above it is another user's or writable by others; the file written
/// under an unpredictable temporary name created exclusively (`O_EXCL | O_NOFOLLOW`: whatever
/// is at a temporary name already, a planted link or another writer's file, is never written
/// through or truncated), flushed, and renamed at the directory's descriptor.
pub fn write(path: &Path, entry: &CacheEntry) -> Result<()> {
    let fail = |e: std::io::Error| CniError::io(format!("write {}: {e}", path.display()));
    let dir = path.parent().ok_or_else(|| CniError::internal("cache path has no directory"))?;
    let name =
        path.file_name().and_then(|n| n.to_str()).ok_or_else(|| CniError::internal("cache file name"))?;
    let bytes = serde_json::to_vec(&entry.to_json()).expect("a Value always serializes");
    let dir = StateDir::open(&std::path::absolute(dir).map_err(fail)?, Some(0o700)).map_err(fail)?;
    dir.write_atomic(name, &bytes, 0o600, true).map_err(fail)
}

/// Remove a cache file; a missing one is fine.
pub fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CniError::io(format!("remove {}: {e}", path.display()))),
    }
}

/// The cached result of an attachment, converted to `version` and encoded in it, as libcni's
/// `getCachedResult` does. `Ok(None)` when there is no readable file. A file that is not a
/// `cniCacheV1` object is read as a bare result (the pre-cache format).
pub fn read_result(path: &Path, version: Version) -> Result<Option<Value>> {
    // libcni ignores a cache file it cannot read; so do we, saying why when it exists.
    let bytes = match read_file(path) {
        Ok(b) => b,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("cnitool: ignoring cached result {}: {e}", path.display());
            }
            return Ok(None);
        }
    };
    let raw: Value = match CacheEntry::from_json(&bytes) {
        Ok(entry) => match entry.result {
            Some(r) if !r.is_empty() => Value::Object(r),
            _ => {
                return Err(CniError::decode(format!("{}: the cache entry holds no result", path.display())))
            }
        },
        Err(_) => serde_json::from_slice(&bytes).map_err(|e| {
            CniError::decode(format!("{}: not a cache entry nor a result: {e}", path.display()))
        })?,
    };
    // A result without cniVersion is 0.1.0 here (libcni's create.CreateFromBytes).
    let result = CniResult::decode(&raw, Version::V0_1_0).map_err(|e| e.context(path.display()))?;
    encode_result(&result, version).map(Some).map_err(|e| {
        e.context(format!("failed to convert cached result to config version {:?}", version.as_str()))
    })
}

/// Encode a result for `version`. A 0.1.0/0.2.0 result without any IP (loopback) cannot be
/// converted by the rules; it is then the empty document Go's 0.2.0 type prints.
pub fn encode_result(result: &CniResult, version: Version) -> Result<Value> {
    match result.encode(version) {
        Ok(v) => Ok(v),
        Err(_) if !version.has_rich_result() && result.ips.is_empty() => {
            let mut m = Map::new();
            m.insert("cniVersion".into(), version.as_str().into());
            m.insert("dns".into(), serde_json::to_value(&result.dns).expect("dns serializes"));
            Ok(Value::Object(m))
        }
        Err(e) => Err(e),
    }
}

/// A file of the cache directory `results`, read as what it is: a directory anyone who can
/// write there may have planted things in. Neither `results` nor the file is followed when it
/// is a symbolic link (a link could hand us another attachment's or any file's content), only
/// a regular file is read (a FIFO is never waited on) and at most [`crate::conf::FILE_MAX`]
/// bytes of it.
fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a cache file path");
    let dir = path.parent().ok_or_else(bad)?;
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(bad)?;
    let dir = fsread::open_dir(dir)?;
    fsread::read_regular_at(dir.as_fd(), name, crate::conf::FILE_MAX as u64)
}

/// The cached attachments of a cache directory, and the files that could not be read.
#[derive(Debug, Default)]
pub struct Listing {
    /// Valid entries, in file-name order.
    pub entries: Vec<(PathBuf, CacheEntry)>,
    /// Files skipped because they are no regular files or cannot be read: each path, and why.
    pub unreadable: Vec<(PathBuf, std::io::Error)>,
}

/// Every valid cached attachment under `<cacheDir>/results`, in file-name order (libcni's
/// `GetCachedAttachments("")`): unreadable files, other kinds and entries without an
/// interface or network name are skipped.
pub fn attachments(cache_dir: &Path) -> Result<Vec<(PathBuf, CacheEntry)>> {
    Ok(list(cache_dir)?.entries)
}

/// [`attachments`], also naming the files that could not be read. `results` and its files
/// are read as [`read_file`] says (no link followed, no FIFO waited on, a cap); a `results`
/// that is a symbolic link is an error.
pub fn list(cache_dir: &Path) -> Result<Listing> {
    let path = cache_dir.join("results");
    let dir = match fsread::open_dir(&path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Listing::default()),
        Err(e) => return Err(CniError::io(format!("cannot read {}: {e}", path.display()))),
    };
    let mut names =
        fsread::names(&dir).map_err(|e| CniError::io(format!("cannot read {}: {e}", path.display())))?;
    names.sort();
    let mut out = Listing::default();
    for name in names {
        let p = path.join(&name);
        let read = match name.to_str() {
            Some(n) => fsread::read_regular_at(dir.as_fd(), n, crate::conf::FILE_MAX as u64),
            // libcni's names are made of validated identifiers
            None => continue,
        };
        let bytes = match read {
            Ok(b) => b,
            // removed meanwhile
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                out.unreadable.push((p, e));
                continue;
            }
        };
        let Ok(entry) = CacheEntry::from_json(&bytes) else { continue };
        if entry.if_name.is_empty() || entry.network_name.is_empty() {
            continue;
        }
        out.entries.push((p, entry));
    }
    Ok(out)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (Go's encoding of `[]byte` in JSON).
pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64; padding optional, CR and LF ignored (as Go's decoder does).
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut vals = Vec::with_capacity(text.len());
    let mut padding = 0;
    for c in text.bytes() {
        match c {
            b'\r' | b'\n' => continue,
            b'=' => {
                padding += 1;
                continue;
            }
            _ if padding > 0 => return None,
            _ => {}
        }
        let v = B64.iter().position(|&x| x == c)? as u32;
        vals.push(v);
    }
    if padding > 2 || vals.len() % 4 == 1 || (padding > 0 && (vals.len() + padding) % 4 != 0) {
        return None;
    }
    let mut out = Vec::with_capacity(vals.len() * 3 / 4);
    for chunk in vals.chunks(4) {
        let mut n = 0u32;
        for (i, v) in chunk.iter().enumerate() {
            n |= v << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn base64_vectors() {
        // RFC 4648 section 10.
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), enc);
            assert_eq!(base64_decode(enc).unwrap(), plain.as_bytes(), "{enc}");
        }
        assert_eq!(base64_decode("Zm9vYg").unwrap(), b"foob");
        assert_eq!(base64_decode("Zm9v\r\nYmFy").unwrap(), b"foobar");
        for bad in ["Zm9vY", "Zm=9v", "Zm9v!", "Z==="] {
            assert!(base64_decode(bad).is_none(), "{bad}");
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(base64_decode(&base64_encode(&all)).unwrap(), all);
    }

    fn sample() -> CacheEntry {
        CacheEntry {
            container_id: "cnitool-77383ca0a0715733ca6f".into(),
            config: br#"{"cniVersion":"1.0.0","name":"lo","plugins":[{"type":"loopback"}]}"#.to_vec(),
            if_name: "eth0".into(),
            network_name: "lo".into(),
            netns: "/var/run/netns/t".into(),
            cni_args: vec![("IgnoreUnknown".into(), "1".into())],
            capability_args: Some(json!({"mac": "c2:11:22:33:44:55"}).as_object().unwrap().clone()),
            result: Some(
                json!({"cniVersion": "1.0.0", "interfaces": [{"name": "lo", "sandbox": "/var/run/netns/t"}]})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        }
    }

    const GOLDEN: &str = concat!(
        r#"{"kind":"cniCacheV1","containerId":"cnitool-77383ca0a0715733ca6f","#,
        r#""config":"eyJjbmlWZXJzaW9uIjoiMS4wLjAiLCJuYW1lIjoibG8iLCJwbHVnaW5zIjpbeyJ0eXBlIjoibG9vcGJhY2sifV19","#,
        r#""ifName":"eth0","networkName":"lo","netns":"/var/run/netns/t","cniArgs":[["IgnoreUnknown","1"]],"#,
        r#""capabilityArgs":{"mac":"c2:11:22:33:44:55"},"#,
        r#""result":{"cniVersion":"1.0.0","interfaces":[{"name":"lo","sandbox":"/var/run/netns/t"}]}}"#
    );

    #[test]
    fn golden_encoding() {
        assert_eq!(serde_json::to_string(&sample().to_json()).unwrap(), GOLDEN);
        assert_eq!(CacheEntry::from_json(GOLDEN.as_bytes()).unwrap(), sample());
    }

    #[test]
    fn empty_fields_are_omitted() {
        let e = CacheEntry {
            container_id: "c".into(),
            if_name: "eth0".into(),
            network_name: "n".into(),
            capability_args: Some(Map::new()),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&e.to_json()).unwrap(),
            r#"{"kind":"cniCacheV1","containerId":"c","config":"","ifName":"eth0","networkName":"n"}"#
        );
    }

    #[test]
    fn decodes_what_go_writes() {
        // Go's libcni 1.1 output: no netns, config as base64, `null` for an absent []byte,
        // keys of maps sorted.
        let go = r#"{"kind":"cniCacheV1","containerId":"abc","config":null,"ifName":"eth0","networkName":"n","cniArgs":[["A","1"],["B","2"]],"result":{"cniVersion":"0.4.0","dns":{},"interfaces":[{"name":"lo","sandbox":"/x"}],"ips":[{"address":"127.0.0.1/8","interface":0,"version":"4"}]}}"#;
        let e = CacheEntry::from_json(go.as_bytes()).unwrap();
        assert_eq!(e.config, Vec::<u8>::new());
        assert_eq!(e.cni_args, vec![("A".into(), "1".into()), ("B".into(), "2".into())]);
        assert_eq!(e.netns, "");
        assert!(CacheEntry::from_json(br#"{"kind":"other"}"#).is_err());
        assert!(CacheEntry::from_json(b"[]").is_err());
        assert!(CacheEntry::from_json(br#"{"kind":"cniCacheV1","config":"%%"}"#).is_err());
    }

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("cnitool-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn write_read_and_list() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp("rw");
        let path = dir.join("results").join("lo-cnitool-77383ca0a0715733ca6f-eth0");
        write(&path, &sample()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777;
        assert_eq!(dmode, 0o700);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), GOLDEN);

        // Converted to the config version for prevResult.
        let r = read_result(&path, Version::V0_4_0).unwrap().unwrap();
        assert_eq!(r["cniVersion"], "0.4.0");
        assert_eq!(r["interfaces"][0]["name"], "lo");
        assert_eq!(read_result(&dir.join("results/none"), Version::V1_0_0).unwrap(), None);

        // Legacy: a bare result file.
        let legacy = dir.join("results").join("legacy");
        std::fs::write(&legacy, r#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.0.0.2/24"}]}"#)
            .unwrap();
        let r = read_result(&legacy, Version::V1_0_0).unwrap().unwrap();
        assert_eq!(r, json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}], "dns": {}}));
        std::fs::write(&legacy, "garbage").unwrap();
        assert!(read_result(&legacy, Version::V1_0_0).is_err());

        let list = attachments(&dir).unwrap();
        assert_eq!(list.len(), 1, "legacy and garbage files are skipped");
        assert_eq!(list[0].1, sample());
        assert!(attachments(&dir.join("nope")).unwrap().is_empty());

        remove(&path).unwrap();
        remove(&path).unwrap();
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_temporary_file_is_created_exclusively_and_nothing_planted_is_written_through() {
        let dir = tmp("excl");
        let results = dir.join("results");
        std::fs::create_dir_all(&results).unwrap();
        let path = results.join("lo-c-eth0");
        // the predictable name of the previous build, linked to a file outside the cache
        let victim = dir.join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let old_tmp = results.join(format!(".lo-c-eth0.tmp{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &old_tmp).unwrap();
        write(&path, &sample()).unwrap();
        write(&path, &sample()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert!(std::fs::symlink_metadata(&old_tmp).unwrap().file_type().is_symlink());
        let names: Vec<String> = std::fs::read_dir(&results)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "the entry and the planted link, no temporary left: {names:?}");
        assert_eq!(attachments(&dir).unwrap(), vec![(path.clone(), sample())]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn planted_cache_files_are_never_followed_or_waited_on() {
        use std::os::unix::fs::symlink;
        let dir = tmp("planted");
        let results = dir.join("results");
        let real = results.join("lo-real-eth0");
        write(&real, &sample()).unwrap();
        // a forged attachment outside the cache, linked in: reading it would make GC or
        // resync act on an attachment nobody made
        let elsewhere = dir.join("elsewhere");
        let forged = CacheEntry { container_id: "forged".into(), ..sample() };
        write(&elsewhere.join("forged"), &forged).unwrap();
        symlink(elsewhere.join("forged"), results.join("lo-forged-eth0")).unwrap();
        // a FIFO: a plain read waits for a writer forever
        let fifo = std::ffi::CString::new(results.join("lo-fifo-eth0").to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        // an oversized (sparse) file: never read whole
        std::fs::File::create(results.join("lo-huge-eth0")).unwrap().set_len(1 << 31).unwrap();

        let l = list(&dir).unwrap();
        assert_eq!(l.entries, vec![(real.clone(), sample())]);
        let why: Vec<(String, String)> = l
            .unreadable
            .iter()
            .map(|(p, e)| (p.file_name().unwrap().to_string_lossy().into_owned(), e.to_string()))
            .collect();
        let max = crate::conf::FILE_MAX;
        assert_eq!(
            why,
            vec![
                ("lo-fifo-eth0".into(), "not a regular file but a FIFO".into()),
                ("lo-forged-eth0".into(), "a symbolic link, which is not followed".into()),
                ("lo-huge-eth0".into(), format!("larger than {max} bytes, the most that is read")),
            ]
        );
        assert_eq!(attachments(&dir).unwrap().len(), 1);
        // a cached result behind a planted file is none (libcni ignores what it cannot read)
        for name in ["lo-forged-eth0", "lo-fifo-eth0", "lo-huge-eth0"] {
            assert_eq!(read_result(&results.join(name), Version::V1_0_0).unwrap(), None, "{name}");
        }
        assert!(read_result(&real, Version::V1_0_0).unwrap().is_some());

        // `results` itself a link: refused, not followed
        let moved = dir.join("moved");
        std::fs::rename(&results, &moved).unwrap();
        symlink(&moved, &results).unwrap();
        let e = list(&dir).unwrap_err();
        assert!(e.msg.contains("a symbolic link, which is not followed"), "{}", e.msg);
        assert_eq!(read_result(&real, Version::V1_0_0).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn legacy_versions_without_ips_encode_as_empty() {
        let r = CniResult::default();
        assert_eq!(encode_result(&r, Version::V0_2_0).unwrap(), json!({"cniVersion": "0.2.0", "dns": {}}));
        assert_eq!(encode_result(&r, Version::V1_0_0).unwrap(), json!({"cniVersion": "1.0.0", "dns": {}}));
        assert_eq!(encode_result(&r, Version::V1_1_0).unwrap(), json!({"cniVersion": "1.1.0"}));
    }
}
