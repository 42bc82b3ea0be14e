//! The `CNI_*` environment: which variables each verb needs, identifier validation and
//! `CNI_ARGS` parsing, with the error codes the Go skeleton uses.

use crate::error::{code, CniError, Result};

/// The verbs of spec 1.1.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }

    /// Verbs that act on one attachment and so carry container id and ifname.
    pub fn has_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

/// The environment of one invocation, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Env {
    pub command: Option<Command>,
    pub container_id: String,
    /// Empty when not given (allowed for DEL).
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: String,
    /// `CNI_NETNS_OVERRIDE=1|true`: skip the "CNI_NETNS is our own netns" safety check
    /// (a Go-library extension used by test suites).
    pub netns_override: bool,
}

/// Variables in the order the Go skeleton lists them, with the verbs that require each.
const VARS: [(&str, &[Command]); 6] = {
    use Command::*;
    [
        ("CNI_COMMAND", &[Add, Del, Check, Gc, Status, Version]),
        ("CNI_CONTAINERID", &[Add, Del, Check]),
        ("CNI_NETNS", &[Add, Check]),
        ("CNI_IFNAME", &[Add, Del, Check]),
        ("CNI_ARGS", &[]),
        ("CNI_PATH", &[Add, Del, Check, Gc, Status]),
    ]
};

/// Outcome of reading the environment.
#[derive(Debug, PartialEq, Eq)]
pub enum EnvOutcome {
    /// `CNI_COMMAND` is unset or empty: print the about banner.
    NoCommand,
    Ready(Env),
}

impl Env {
    /// Read and validate the environment through `get` (so tests need not touch the process
    /// environment). All missing variables are reported in one code-4 error.
    pub fn load(get: impl Fn(&str) -> Option<String>) -> Result<EnvOutcome> {
        let val = |k: &str| get(k).unwrap_or_default();
        let cmd_text = val("CNI_COMMAND");
        if cmd_text.is_empty() {
            return Ok(EnvOutcome::NoCommand);
        }
        let command = Command::parse(&cmd_text);
        let mut missing = Vec::new();
        for (name, required_for) in VARS {
            let needed = match command {
                Some(c) => required_for.contains(&c),
                None => false,
            };
            if needed && val(name).is_empty() {
                missing.push(name);
            }
        }
        if !missing.is_empty() {
            return Err(CniError::env(format!("required env variables [{}] missing", missing.join(","))));
        }
        let Some(command) = command else {
            return Err(CniError::env(format!("unknown CNI_COMMAND: {cmd_text}")));
        };
        if command != Command::Version {
            // Ours: the deadline of the programs this plugin may run (crate::child).
            crate::child::parse_timeout(&val(crate::child::TIMEOUT_ENV))?;
        }
        let override_text = val("CNI_NETNS_OVERRIDE");
        Ok(EnvOutcome::Ready(Env {
            command: Some(command),
            container_id: val("CNI_CONTAINERID"),
            netns: val("CNI_NETNS"),
            ifname: val("CNI_IFNAME"),
            args: val("CNI_ARGS"),
            path: val("CNI_PATH"),
            netns_override: override_text == "1" || override_text.eq_ignore_ascii_case("true"),
        }))
    }
}

/// The rule container ids and network names share, `[A-Za-z0-9][A-Za-z0-9_.-]*`, with the error
/// each kind of name gets when it is empty (`missing`) or has other characters (`invalid`, with
/// the name as details).
fn validate_id_chars(s: &str, missing: fn() -> CniError, invalid: fn() -> CniError) -> Result<()> {
    let id_char = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
    match s.as_bytes() {
        [] => Err(missing()),
        [first, rest @ ..] if first.is_ascii_alphanumeric() && rest.iter().all(id_char) => Ok(()),
        _ => Err(invalid().with_details(s)),
    }
}

/// The longest container id accepted, in bytes. Runtimes use 64 hex digits (containerd, CRI-O,
/// Podman) or a few more; the bound keeps what is derived from an id (aliases, comments, names)
/// finite, whatever a caller sends.
pub const CONTAINER_ID_MAX: usize = 1024;

/// Container id: `[A-Za-z0-9][A-Za-z0-9_.-]*`, at most [`CONTAINER_ID_MAX`] bytes. Empty is code
/// 3, bad characters or too long code 4.
pub fn validate_container_id(id: &str) -> Result<()> {
    if id.len() > CONTAINER_ID_MAX {
        return Err(CniError::env(format!(
            "containerID is {} bytes long; at most {CONTAINER_ID_MAX} are accepted",
            id.len()
        )));
    }
    validate_id_chars(
        id,
        || CniError::new(code::UNKNOWN_CONTAINER, "missing containerID"),
        || CniError::env("invalid characters in containerID"),
    )
}

/// Network name: same character set as container ids; problems are code 7.
pub fn validate_network_name(name: &str) -> Result<()> {
    validate_id_chars(
        name,
        || CniError::config("missing network name"),
        || CniError::config("invalid characters found in network name"),
    )
}

/// Interface name rules of the kernel and the spec: non-empty, at most 15 bytes, not `.` or
/// `..`, no `/`, `:` or whitespace. Problems are code 4.
pub fn validate_ifname(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(CniError::env("interface name is empty"));
    }
    if name.len() > 15 {
        return Err(CniError::env("interface name is too long")
            .with_details(format!("interface name should be less than 16 characters, got {name:?}")));
    }
    if name == "." || name == ".." {
        return Err(CniError::env("interface name is . or ..").with_details(name));
    }
    if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) || name.contains('\0') {
        return Err(
            CniError::env("interface name contains / or : or whitespace characters").with_details(name)
        );
    }
    Ok(())
}

/// `CNI_ARGS` (`K1=V1;K2=V2`), parsed like Go's `types.LoadArgs`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
}

/// Go's `UnmarshallableBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "true" | "True" => Some(true),
        "0" | "false" | "False" => Some(false),
        _ => None,
    }
}

impl CniArgs {
    /// Split into pairs; every item must be exactly `K=V` (code 4 otherwise).
    pub fn parse(s: &str) -> Result<CniArgs> {
        let mut pairs = Vec::new();
        if s.is_empty() {
            return Ok(CniArgs { pairs });
        }
        for item in s.split(';') {
            let mut kv = item.split('=');
            match (kv.next(), kv.next(), kv.next()) {
                (Some(k), Some(v), None) => pairs.push((k.to_string(), v.to_string())),
                _ => return Err(CniError::env(format!("ARGS: invalid pair {item:?}"))),
            }
        }
        Ok(CniArgs { pairs })
    }

    /// Check the pairs against the keys a plugin understands (`IgnoreUnknown` is always
    /// understood). Unknown keys are an error unless `IgnoreUnknown` is true.
    pub fn validate(&self, known: &[&str]) -> Result<()> {
        let mut ignore_unknown = false;
        let mut unknown = Vec::new();
        for (k, v) in &self.pairs {
            if k == "IgnoreUnknown" {
                ignore_unknown = parse_go_bool(v).ok_or_else(|| {
                    CniError::env(format!("ARGS: IgnoreUnknown: boolean unmarshal error: invalid input {v}"))
                })?;
            } else if !known.contains(&k.as_str()) {
                unknown.push(format!("{k}={v}"));
            }
        }
        if !unknown.is_empty() && !ignore_unknown {
            return Err(CniError::env(format!("ARGS: unknown args {unknown:?}")));
        }
        Ok(())
    }

    /// The last value given for `key` (Go assigns each pair in order, so the last one wins).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(vars: &[(&str, &str)]) -> Result<EnvOutcome> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Env::load(|k| m.get(k).cloned())
    }

    const FULL: [(&str, &str); 5] = [
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_ARGS", ""),
    ];

    fn with_cmd(cmd: &str, drop: &[&str]) -> Result<EnvOutcome> {
        let mut v: Vec<(&str, &str)> = FULL.iter().copied().filter(|(k, _)| !drop.contains(k)).collect();
        v.push(("CNI_COMMAND", cmd));
        load(&v)
    }

    #[test]
    fn no_command_prints_about() {
        assert_eq!(load(&[]).unwrap(), EnvOutcome::NoCommand);
        assert_eq!(load(&[("CNI_COMMAND", "")]).unwrap(), EnvOutcome::NoCommand);
    }

    #[test]
    fn required_table_per_verb() {
        // (verb, variable, required?)
        let table = [
            ("ADD", "CNI_CONTAINERID", true),
            ("ADD", "CNI_NETNS", true),
            ("ADD", "CNI_IFNAME", true),
            ("ADD", "CNI_PATH", true),
            ("ADD", "CNI_ARGS", false),
            ("CHECK", "CNI_CONTAINERID", true),
            ("CHECK", "CNI_NETNS", true),
            ("CHECK", "CNI_IFNAME", true),
            ("CHECK", "CNI_PATH", true),
            ("DEL", "CNI_CONTAINERID", true),
            ("DEL", "CNI_NETNS", false),
            ("DEL", "CNI_IFNAME", true),
            ("DEL", "CNI_PATH", true),
            ("GC", "CNI_CONTAINERID", false),
            ("GC", "CNI_NETNS", false),
            ("GC", "CNI_IFNAME", false),
            ("GC", "CNI_PATH", true),
            ("STATUS", "CNI_CONTAINERID", false),
            ("STATUS", "CNI_IFNAME", false),
            ("STATUS", "CNI_PATH", true),
            ("VERSION", "CNI_CONTAINERID", false),
            ("VERSION", "CNI_NETNS", false),
            ("VERSION", "CNI_IFNAME", false),
            ("VERSION", "CNI_PATH", false),
        ];
        for (verb, var, required) in table {
            let r = with_cmd(verb, &[var]);
            if required {
                let e = r.unwrap_err();
                assert_eq!(e.code, code::INVALID_ENV, "{verb} without {var}");
                assert_eq!(e.msg, format!("required env variables [{var}] missing"));
            } else {
                assert!(r.is_ok(), "{verb} without {var} must be accepted: {r:?}");
            }
        }
    }

    #[test]
    fn all_missing_variables_in_one_error() {
        let e = load(&[("CNI_COMMAND", "ADD")]).unwrap_err();
        assert_eq!(e.code, 4);
        assert_eq!(e.msg, "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing");
        let e = load(&[("CNI_COMMAND", "DEL")]).unwrap_err();
        assert_eq!(e.msg, "required env variables [CNI_CONTAINERID,CNI_IFNAME,CNI_PATH] missing");
        let e = load(&[("CNI_COMMAND", "GC")]).unwrap_err();
        assert_eq!(e.msg, "required env variables [CNI_PATH] missing");
    }

    #[test]
    fn unknown_command_is_code_4() {
        let e = with_cmd("ATTACH", &[]).unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (4, "unknown CNI_COMMAND: ATTACH"));
        let e = with_cmd("add", &[]).unwrap_err();
        assert_eq!(e.code, 4, "verbs are case-sensitive");
    }

    #[test]
    fn netns_override_values() {
        for (v, want) in
            [("1", true), ("true", true), ("TRUE", true), ("0", false), ("yes", false), ("", false)]
        {
            let mut vars: Vec<(&str, &str)> = FULL.to_vec();
            vars.push(("CNI_COMMAND", "ADD"));
            vars.push(("CNI_NETNS_OVERRIDE", v));
            let EnvOutcome::Ready(env) = load(&vars).unwrap() else { panic!() };
            assert_eq!(env.netns_override, want, "{v}");
        }
    }

    #[test]
    fn container_id_rules() {
        for ok in ["a", "A1", "0abc", "a_b.c-d", "cnitool-77383ca0a0715733ca6f"] {
            assert!(validate_container_id(ok).is_ok(), "{ok}");
        }
        assert_eq!(validate_container_id("").unwrap_err().code, code::UNKNOWN_CONTAINER);
        for bad in ["_a", "-a", ".a", "a b", "a/b", "a;b", "ä", "a\n"] {
            let e = validate_container_id(bad).unwrap_err();
            assert_eq!((e.code, e.msg.as_str()), (4, "invalid characters in containerID"), "{bad}");
            assert_eq!(e.details, bad);
        }
        assert!(validate_container_id(&"a".repeat(CONTAINER_ID_MAX)).is_ok());
        let e = validate_container_id(&"a".repeat(CONTAINER_ID_MAX + 1)).unwrap_err();
        assert_eq!(e.code, 4, "{e:?}");
        assert!(e.msg.contains("1025 bytes"), "{e:?}");
    }

    #[test]
    fn network_name_rules() {
        assert!(validate_network_name("kubenet").is_ok());
        assert!(validate_network_name("my.net_1-x").is_ok());
        assert_eq!(validate_network_name("").unwrap_err().code, code::INVALID_CONFIG);
        for bad in ["../etc", "a/b", "-x", "net work", ".hidden"] {
            let e = validate_network_name(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
        }
    }

    #[test]
    fn ifname_rules() {
        for ok in ["eth0", "a", "123456789012345", "net1.100", "veth-x_y"] {
            assert!(validate_ifname(ok).is_ok(), "{ok}");
        }
        let cases = [
            ("", "interface name is empty"),
            ("1234567890123456", "interface name is too long"),
            (".", "interface name is . or .."),
            ("..", "interface name is . or .."),
            ("eth/0", "interface name contains / or : or whitespace characters"),
            ("eth:0", "interface name contains / or : or whitespace characters"),
            ("eth 0", "interface name contains / or : or whitespace characters"),
            ("eth\t0", "interface name contains / or : or whitespace characters"),
            ("eth\u{a0}0", "interface name contains / or : or whitespace characters"),
        ];
        for (bad, msg) in cases {
            let e = validate_ifname(bad).unwrap_err();
            assert_eq!((e.code, e.msg.as_str()), (4, msg), "{bad:?}");
        }
        // 15 bytes, counted in bytes not characters
        assert!(validate_ifname("ééééééé").is_ok());
        assert!(validate_ifname("éééééééé").is_err());
    }

    #[test]
    fn cni_args_parsing() {
        let a = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.0.0.5").unwrap();
        assert_eq!(a.get("IP"), Some("10.0.0.5"));
        assert!(a.validate(&["IP"]).is_ok());
        assert_eq!(CniArgs::parse("").unwrap().pairs().len(), 0);
        let e = CniArgs::parse("A=1;B").unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (4, "ARGS: invalid pair \"B\""));
        assert_eq!(CniArgs::parse("A=1=2").unwrap_err().code, 4);
        assert_eq!(CniArgs::parse("A=1;").unwrap_err().code, 4, "trailing separator makes an empty pair");
        assert_eq!(CniArgs::parse("K=").unwrap().get("K"), Some(""), "empty values are allowed, as in Go");
    }

    #[test]
    fn cni_args_unknown_keys_need_ignore_unknown() {
        let a = CniArgs::parse("K8S_POD_NAME=p;MAC=aa:bb:cc:dd:ee:ff").unwrap();
        let e = a.validate(&["MAC"]).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("K8S_POD_NAME=p"), "{}", e.msg);
        for t in ["1", "true", "True"] {
            let a = CniArgs::parse(&format!("IgnoreUnknown={t};X=1")).unwrap();
            assert!(a.validate(&[]).is_ok(), "{t}");
        }
        for f in ["0", "false", "False"] {
            let a = CniArgs::parse(&format!("IgnoreUnknown={f};X=1")).unwrap();
            assert!(a.validate(&[]).is_err(), "{f}");
        }
        let a = CniArgs::parse("IgnoreUnknown=yes").unwrap();
        assert_eq!(a.validate(&[]).unwrap_err().code, 4);
        // order does not matter: IgnoreUnknown may come last
        assert!(CniArgs::parse("X=1;IgnoreUnknown=1").unwrap().validate(&[]).is_ok());
    }

    #[test]
    fn command_names_round_trip() {
        for name in ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"] {
            assert_eq!(Command::parse(name).map(Command::as_str), Some(name));
        }
    }

    #[test]
    fn go_bools_and_cni_args_pairs() {
        for (text, want) in [
            ("1", Some(true)),
            ("True", Some(true)),
            ("0", Some(false)),
            ("false", Some(false)),
            ("False", Some(false)),
            ("yes", None),
        ] {
            assert_eq!(parse_go_bool(text), want, "{text}");
        }
        let a = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=web").unwrap();
        assert_eq!(
            a.pairs(),
            [("IgnoreUnknown".to_string(), "1".to_string()), ("K8S_POD_NAME".to_string(), "web".to_string())]
        );
    }
}
