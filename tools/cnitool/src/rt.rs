//! What one cnitool invocation is about: the verb, the attachment (container id, netns,
//! ifname), CNI_ARGS and capability args, read from the command line and the environment the
//! way upstream cnitool does, plus our documented extensions.

use cni_common::spec::config::Attachment;
use cni_common::spec::env::{validate_container_id, validate_ifname};
use cni_common::{CniError, Result};
use serde_json::{Map, Value};
use sha2::{Digest, Sha512};
use std::path::{Path, PathBuf};

/// Default directory of network configurations (upstream's).
pub const DEFAULT_NET_DIR: &str = "/etc/cni/net.d";
/// Default cache directory (libcni's `CacheDir`).
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";
/// Default interface name when CNI_IFNAME is not set at all.
pub const DEFAULT_IFNAME: &str = "eth0";

/// The verbs of the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Add,
    Check,
    Del,
    Gc,
    Status,
}

impl Verb {
    pub fn parse(s: &str) -> Option<Verb> {
        Some(match s {
            "add" => Verb::Add,
            "check" => Verb::Check,
            "del" => Verb::Del,
            "gc" => Verb::Gc,
            "status" => Verb::Status,
            _ => return None,
        })
    }
}

/// libcni's `RuntimeConf`: the arguments of one attachment, apart from the network config.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeConf {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    /// CNI_ARGS as ordered pairs.
    pub args: Vec<(String, String)>,
    /// CAP_ARGS: capability name -> value; `None` when not given (or JSON `null`).
    pub capability_args: Option<Map<String, Value>>,
}

impl RuntimeConf {
    /// CNI_ARGS as the plugins see it: `K=V;K=V`.
    pub fn args_string(&self) -> String {
        self.args.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";")
    }
}

/// Everything one run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Invocation {
    pub verb: Verb,
    pub network: String,
    pub rt: RuntimeConf,
    pub cni_path: String,
    pub net_dir: PathBuf,
    pub cache_dir: PathBuf,
    /// `CNI_GC_KEEP`: attachments that stay valid during `gc`. `None` = none (upstream).
    pub gc_keep: Option<Vec<Attachment>>,
}

/// A command-line problem: the caller prints the usage text.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

/// Parse `<verb> <net> <netns>` (arguments after the program name). Extra arguments are
/// ignored, as upstream does.
pub fn parse_command_line(args: &[String]) -> std::result::Result<(Verb, String, String), UsageError> {
    if args.len() < 3 {
        return Err(UsageError(format!("expected 3 arguments, got {}", args.len())));
    }
    let verb = Verb::parse(&args[0]).ok_or_else(|| {
        UsageError(format!("unknown command {:?}: use add, check, del, gc or status", args[0]))
    })?;
    Ok((verb, args[1].clone(), args[2].clone()))
}

impl Invocation {
    /// Build the invocation from the parsed command line and the environment (read through
    /// `get`, which returns `None` for an unset variable).
    pub fn new(
        verb: Verb,
        network: String,
        netns_arg: &str,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Invocation> {
        let nonempty = |k: &str| get(k).filter(|v| !v.is_empty());
        let capability_args = match nonempty("CAP_ARGS") {
            Some(text) => parse_cap_args(&text)?,
            None => None,
        };
        let args = match nonempty("CNI_ARGS") {
            Some(text) => parse_cni_args(&text)?,
            None => Vec::new(),
        };
        // Upstream distinguishes "unset" (eth0) from "set but empty" (an invalid name).
        let ifname = get("CNI_IFNAME").unwrap_or_else(|| DEFAULT_IFNAME.to_string());
        let netns = absolute(netns_arg, |k| get(k))?;
        let container_id = match nonempty("CNI_CONTAINERID") {
            Some(id) => {
                validate_container_id(&id).map_err(|e| e.context("CNI_CONTAINERID"))?;
                id
            }
            None => container_id_for(&netns),
        };
        if matches!(verb, Verb::Add | Verb::Check | Verb::Del) {
            validate_ifname(&ifname).map_err(|e| e.context(format!("CNI_IFNAME {ifname:?}")))?;
        }
        // The plugins' deadline (cni_common::child), checked before anything runs.
        cni_common::child::parse_timeout(&get(cni_common::child::TIMEOUT_ENV).unwrap_or_default())?;
        let gc_keep = match get("CNI_GC_KEEP") {
            Some(text) => Some(parse_gc_keep(&text)?),
            None => None,
        };
        Ok(Invocation {
            verb,
            network,
            rt: RuntimeConf { container_id, netns, ifname, args, capability_args },
            cni_path: get("CNI_PATH").unwrap_or_default(),
            net_dir: PathBuf::from(nonempty("NETCONFPATH").unwrap_or_else(|| DEFAULT_NET_DIR.to_string())),
            cache_dir: PathBuf::from(
                nonempty("CNI_CACHE_DIR").unwrap_or_else(|| DEFAULT_CACHE_DIR.to_string()),
            ),
            gc_keep,
        })
    }
}

/// Upstream cnitool's container id: `cnitool-` and the lowercase hex of the first 10 bytes of
/// sha512 of the absolute netns path.
pub fn container_id_for(abs_netns: &str) -> String {
    let digest = Sha512::digest(abs_netns.as_bytes());
    let mut id = String::from("cnitool-");
    for b in &digest[..10] {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// CNI_ARGS as upstream cnitool parses it: `;`-separated `K=V` pairs, each with exactly one
/// `=` and a non-empty key and value.
pub fn parse_cni_args(text: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for pair in text.split(';') {
        let kv: Vec<&str> = pair.split('=').collect();
        if kv.len() != 2 || kv[0].is_empty() || kv[1].is_empty() {
            return Err(CniError::env(format!("invalid CNI_ARGS pair {pair:?}"))
                .with_details("CNI_ARGS must be K=V pairs separated by ';', each key and value non-empty"));
        }
        out.push((kv[0].to_string(), kv[1].to_string()));
    }
    Ok(out)
}

/// CAP_ARGS: a JSON object (or `null`, meaning none).
pub fn parse_cap_args(text: &str) -> Result<Option<Map<String, Value>>> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(Some(m)),
        Ok(Value::Null) => Ok(None),
        Ok(other) => Err(CniError::decode(format!(
            "invalid CAP_ARGS: expected a JSON object of capability arguments, got {}",
            json_kind(&other)
        ))),
        Err(e) => Err(CniError::decode(format!("invalid CAP_ARGS: {e}"))),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// CNI_GC_KEEP (our extension): `id:ifname,id:ifname`. Empty means an empty list.
pub fn parse_gc_keep(text: &str) -> Result<Vec<Attachment>> {
    let mut out: Vec<Attachment> = Vec::new();
    if text.trim().is_empty() {
        return Ok(out);
    }
    for item in text.split(',') {
        let item = item.trim();
        let Some((id, ifname)) = item.split_once(':').filter(|(id, _)| !id.is_empty()) else {
            return Err(CniError::env(format!("invalid CNI_GC_KEEP entry {item:?}"))
                .with_details("expected containerID:ifname, e.g. cnitool-0123456789abcdef0123:eth0"));
        };
        validate_container_id(id).map_err(|e| e.context(format!("CNI_GC_KEEP entry {item:?}")))?;
        validate_ifname(ifname).map_err(|e| e.context(format!("CNI_GC_KEEP entry {item:?}")))?;
        let a = Attachment { container_id: id.to_string(), ifname: ifname.to_string() };
        if !out.contains(&a) {
            out.push(a);
        }
    }
    Ok(out)
}

/// Go's `filepath.Abs`: join with the working directory (Go's `os.Getwd`, which prefers
/// `$PWD` when it names the same directory) and clean lexically. Symlinks are not resolved.
pub fn absolute(path: &str, get: impl Fn(&str) -> Option<String>) -> Result<String> {
    if path.starts_with('/') {
        return Ok(clean(path));
    }
    let cwd = working_dir(get)?;
    Ok(clean(&format!("{cwd}/{path}")))
}

fn working_dir(get: impl Fn(&str) -> Option<String>) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    if let Some(pwd) = get("PWD").filter(|p| p.starts_with('/')) {
        if let (Ok(a), Ok(b)) = (std::fs::metadata(&pwd), std::fs::metadata(".")) {
            if a.dev() == b.dev() && a.ino() == b.ino() {
                return Ok(pwd);
            }
        }
    }
    let cwd =
        std::env::current_dir().map_err(|e| CniError::io(format!("cannot get working directory: {e}")))?;
    cwd.to_str()
        .map(str::to_string)
        .ok_or_else(|| CniError::io(format!("working directory {} is not UTF-8", cwd.display())))
}

/// Go's `filepath.Clean` for Unix paths.
pub fn clean(path: &str) -> String {
    if path.is_empty() {
        return ".".to_string();
    }
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// `<cacheDir>/results/<net>-<containerid>-<ifname>`: libcni's cache file of one attachment.
pub fn cache_file(cache_dir: &Path, network: &str, rt: &RuntimeConf) -> Result<PathBuf> {
    if network.is_empty() || rt.container_id.is_empty() || rt.ifname.is_empty() {
        return Err(CniError::internal(format!(
            "cache file path requires network name ({network:?}), container ID ({:?}), and interface name ({:?})",
            rt.container_id, rt.ifname
        )));
    }
    Ok(cache_dir.join("results").join(format!("{network}-{}-{}", rt.container_id, rt.ifname)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    /// sha512 computed independently of the `sha2` crate: a minimal FIPS 180-4 implementation.
    fn reference_sha512(msg: &[u8]) -> [u8; 64] {
        const K: [u64; 80] = [
            0x428a2f98d728ae22,
            0x7137449123ef65cd,
            0xb5c0fbcfec4d3b2f,
            0xe9b5dba58189dbbc,
            0x3956c25bf348b538,
            0x59f111f1b605d019,
            0x923f82a4af194f9b,
            0xab1c5ed5da6d8118,
            0xd807aa98a3030242,
            0x12835b0145706fbe,
            0x243185be4ee4b28c,
            0x550c7dc3d5ffb4e2,
            0x72be5d74f27b896f,
            0x80deb1fe3b1696b1,
            0x9bdc06a725c71235,
            0xc19bf174cf692694,
            0xe49b69c19ef14ad2,
            0xefbe4786384f25e3,
            0x0fc19dc68b8cd5b5,
            0x240ca1cc77ac9c65,
            0x2de92c6f592b0275,
            0x4a7484aa6ea6e483,
            0x5cb0a9dcbd41fbd4,
            0x76f988da831153b5,
            0x983e5152ee66dfab,
            0xa831c66d2db43210,
            0xb00327c898fb213f,
            0xbf597fc7beef0ee4,
            0xc6e00bf33da88fc2,
            0xd5a79147930aa725,
            0x06ca6351e003826f,
            0x142929670a0e6e70,
            0x27b70a8546d22ffc,
            0x2e1b21385c26c926,
            0x4d2c6dfc5ac42aed,
            0x53380d139d95b3df,
            0x650a73548baf63de,
            0x766a0abb3c77b2a8,
            0x81c2c92e47edaee6,
            0x92722c851482353b,
            0xa2bfe8a14cf10364,
            0xa81a664bbc423001,
            0xc24b8b70d0f89791,
            0xc76c51a30654be30,
            0xd192e819d6ef5218,
            0xd69906245565a910,
            0xf40e35855771202a,
            0x106aa07032bbd1b8,
            0x19a4c116b8d2d0c8,
            0x1e376c085141ab53,
            0x2748774cdf8eeb99,
            0x34b0bcb5e19b48a8,
            0x391c0cb3c5c95a63,
            0x4ed8aa4ae3418acb,
            0x5b9cca4f7763e373,
            0x682e6ff3d6b2b8a3,
            0x748f82ee5defb2fc,
            0x78a5636f43172f60,
            0x84c87814a1f0ab72,
            0x8cc702081a6439ec,
            0x90befffa23631e28,
            0xa4506cebde82bde9,
            0xbef9a3f7b2c67915,
            0xc67178f2e372532b,
            0xca273eceea26619c,
            0xd186b8c721c0c207,
            0xeada7dd6cde0eb1e,
            0xf57d4f7fee6ed178,
            0x06f067aa72176fba,
            0x0a637dc5a2c898a6,
            0x113f9804bef90dae,
            0x1b710b35131c471b,
            0x28db77f523047d84,
            0x32caab7b40c72493,
            0x3c9ebe0a15c9bebc,
            0x431d67c49c100d4c,
            0x4cc5d4becb3e42b6,
            0x597f299cfc657e2a,
            0x5fcb6fab3ad6faec,
            0x6c44198c4a475817,
        ];
        let mut h: [u64; 8] = [
            0x6a09e667f3bcc908,
            0xbb67ae8584caa73b,
            0x3c6ef372fe94f82b,
            0xa54ff53a5f1d36f1,
            0x510e527fade682d1,
            0x9b05688c2b3e6c1f,
            0x1f83d9abfb41bd6b,
            0x5be0cd19137e2179,
        ];
        let mut data = msg.to_vec();
        data.push(0x80);
        while data.len() % 128 != 112 {
            data.push(0);
        }
        data.extend_from_slice(&((msg.len() as u128) * 8).to_be_bytes());
        for block in data.chunks(128) {
            let mut w = [0u64; 80];
            for i in 0..16 {
                w[i] = u64::from_be_bytes(block[i * 8..i * 8 + 8].try_into().unwrap());
            }
            for i in 16..80 {
                let s0 = w[i - 15].rotate_right(1) ^ w[i - 15].rotate_right(8) ^ (w[i - 15] >> 7);
                let s1 = w[i - 2].rotate_right(19) ^ w[i - 2].rotate_right(61) ^ (w[i - 2] >> 6);
                w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
            }
            let mut v = h;
            for i in 0..80 {
                let s1 = v[4].rotate_right(14) ^ v[4].rotate_right(18) ^ v[4].rotate_right(41);
                let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
                let t1 = v[7].wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
                let s0 = v[0].rotate_right(28) ^ v[0].rotate_right(34) ^ v[0].rotate_right(39);
                let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
                let t2 = s0.wrapping_add(maj);
                v = [t1.wrapping_add(t2), v[0], v[1], v[2], v[3].wrapping_add(t1), v[4], v[5], v[6]];
            }
            for i in 0..8 {
                h[i] = h[i].wrapping_add(v[i]);
            }
        }
        let mut out = [0u8; 64];
        for i in 0..8 {
            out[i * 8..i * 8 + 8].copy_from_slice(&h[i].to_be_bytes());
        }
        out
    }

    #[test]
    fn reference_sha512_is_right() {
        // FIPS 180-2 example "abc".
        let d = reference_sha512(b"abc");
        assert_eq!(&d[..8], &[0xdd, 0xaf, 0x35, 0xa1, 0x93, 0x61, 0x7a, 0xba]);
        assert_eq!(&d[56..], &[0x2a, 0x9a, 0xc9, 0x4f, 0xa5, 0x4c, 0xa4, 0x9f]);
    }

    #[test]
    fn container_id_matches_independent_hash() {
        let path = "/var/run/netns/testing";
        let d = reference_sha512(path.as_bytes());
        let want: String = d[..10].iter().map(|b| format!("{b:02x}")).collect();
        let id = container_id_for(path);
        assert_eq!(id, format!("cnitool-{want}"));
        let hex = id.strip_prefix("cnitool-").unwrap();
        assert_eq!(hex.len(), 20);
        assert!(hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{hex}");
        assert!(validate_container_id(&id).is_ok());
        assert_ne!(container_id_for("/var/run/netns/other"), id);
    }

    #[test]
    fn cni_args_parsing_follows_upstream_cnitool() {
        assert_eq!(
            parse_cni_args("IgnoreUnknown=1;K8S_POD_NAME=p").unwrap(),
            vec![("IgnoreUnknown".into(), "1".into()), ("K8S_POD_NAME".into(), "p".into())]
        );
        for bad in ["A", "A=", "=1", "A=1=2", "A=1;", ";A=1", "A=1;;B=2", "A=1;B"] {
            let e = parse_cni_args(bad).unwrap_err();
            assert_eq!(e.code, 4, "{bad}");
            assert!(e.msg.starts_with("invalid CNI_ARGS pair"), "{bad}: {}", e.msg);
        }
        let e = parse_cni_args("A=1;B").unwrap_err();
        assert_eq!(e.msg, "invalid CNI_ARGS pair \"B\"");
    }

    #[test]
    fn cap_args_must_be_an_object() {
        let m = parse_cap_args(r#"{"portMappings":[{"hostPort":80}],"b":1}"#).unwrap().unwrap();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["portMappings", "b"]);
        assert_eq!(parse_cap_args("null").unwrap(), None);
        assert!(parse_cap_args("[1]").unwrap_err().msg.contains("an array"));
        assert!(parse_cap_args("{").unwrap_err().msg.starts_with("invalid CAP_ARGS"));
    }

    #[test]
    fn gc_keep_parsing() {
        assert!(parse_gc_keep("").unwrap().is_empty());
        let l = parse_gc_keep("cnitool-aa:eth0, b1:net1,b1:net1").unwrap();
        assert_eq!(
            l,
            vec![
                Attachment { container_id: "cnitool-aa".into(), ifname: "eth0".into() },
                Attachment { container_id: "b1".into(), ifname: "net1".into() },
            ]
        );
        for bad in ["x", "x:", ":eth0", "a:eth0,", "-a:eth0", "a:b:c", "a:this-name-is-too-long"] {
            assert_eq!(parse_gc_keep(bad).unwrap_err().code, 4, "{bad}");
        }
    }

    #[test]
    fn clean_like_go() {
        for (i, o) in [
            ("/a/b/../c", "/a/c"),
            ("/../a", "/a"),
            ("/a//b/./", "/a/b"),
            ("/", "/"),
            ("a/../..", ".."),
            ("", "."),
            ("./x", "x"),
        ] {
            assert_eq!(clean(i), o, "{i}");
        }
        assert_eq!(absolute("/var/run/netns/../netns/x", |_| None).unwrap(), "/var/run/netns/x");
        let rel = absolute("x/y", |_| None).unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(rel, format!("{}/x/y", cwd.display()));
    }

    #[test]
    fn invocation_defaults_and_extensions() {
        let inv = Invocation::new(Verb::Add, "net".into(), "/run/netns/a", env(&[])).unwrap();
        assert_eq!(inv.rt.ifname, "eth0");
        assert_eq!(inv.rt.container_id, container_id_for("/run/netns/a"));
        assert_eq!(inv.net_dir, PathBuf::from("/etc/cni/net.d"));
        assert_eq!(inv.cache_dir, PathBuf::from("/var/lib/cni"));
        assert_eq!(inv.gc_keep, None);
        assert_eq!(inv.rt.capability_args, None);

        let inv = Invocation::new(
            Verb::Gc,
            "net".into(),
            "/run/netns/a",
            env(&[
                ("CNI_IFNAME", "net1"),
                ("NETCONFPATH", "/tmp/conf"),
                ("CNI_CACHE_DIR", "/tmp/cache"),
                ("CNI_CONTAINERID", "my-id"),
                ("CNI_ARGS", "A=1"),
                ("CAP_ARGS", "{\"mac\":\"x\"}"),
                ("CNI_GC_KEEP", "my-id:net1"),
                ("CNI_PATH", "/opt/cni/bin"),
            ]),
        )
        .unwrap();
        assert_eq!(inv.rt.ifname, "net1");
        assert_eq!(inv.rt.container_id, "my-id");
        assert_eq!(inv.rt.args_string(), "A=1");
        assert_eq!(inv.cni_path, "/opt/cni/bin");
        assert_eq!(inv.gc_keep.as_ref().unwrap().len(), 1);
        assert_eq!(inv.cache_dir, PathBuf::from("/tmp/cache"));

        // Set but empty CNI_IFNAME is an invalid name, as with upstream.
        let e = Invocation::new(Verb::Add, "n".into(), "/x", env(&[("CNI_IFNAME", "")])).unwrap_err();
        assert_eq!(e.code, 4);
        let e =
            Invocation::new(Verb::Del, "n".into(), "/x", env(&[("CNI_CONTAINERID", "../x")])).unwrap_err();
        assert_eq!(e.code, 4);
    }

    #[test]
    fn command_line() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_command_line(&a(&["add", "n", "/x"])).unwrap(),
            (Verb::Add, "n".to_string(), "/x".to_string())
        );
        assert!(parse_command_line(&a(&["add", "n"])).is_err());
        assert!(parse_command_line(&a(&["ADD", "n", "/x"])).is_err());
        assert!(parse_command_line(&a(&["status", "n", "/x", "extra"])).is_ok());
    }

    #[test]
    fn cache_file_path() {
        let rt = RuntimeConf { container_id: "c1".into(), ifname: "eth0".into(), ..Default::default() };
        assert_eq!(
            cache_file(Path::new("/var/lib/cni"), "net", &rt).unwrap(),
            PathBuf::from("/var/lib/cni/results/net-c1-eth0")
        );
        assert!(cache_file(Path::new("/x"), "", &rt).is_err());
    }
}
