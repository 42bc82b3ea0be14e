//! Whole-request fuzzing of the skeleton: arbitrary stdin (and a verb picked from the first
//! byte) through env validation, config decoding, version negotiation, prevResult and the
//! well-known runtimeConfig/args types. Invariants: no panic, exit code 0 or 1, exactly one
//! JSON document on stdout for ADD and for every failure, and a failure carries a spec code.
#![no_main]

use cni_common::skel::{run_with, Plugin, Request};
use cni_common::spec::config::{Args, PortMapping, RangeConf};
use cni_common::spec::json;
use cni_common::{CniResult, Result};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct Runtime {
    #[serde(default)]
    port_mappings: Vec<PortMapping>,
    #[serde(default)]
    ip_ranges: Vec<Vec<RangeConf>>,
    #[serde(default)]
    ips: Vec<String>,
    #[serde(default)]
    mac: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct Conf {
    #[serde(default)]
    runtime_config: Option<Runtime>,
    #[serde(default)]
    args: Option<Args>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    is_gateway: bool,
}

struct Fuzz;

impl Fuzz {
    fn touch(&self, req: &Request) -> Result<()> {
        let _: Conf = req.plugin_config()?;
        let _ = req.prev_result()?;
        let _ = req.cni_args(&["IP", "MAC"])?;
        let _ = req.valid_attachments()?;
        Ok(())
    }
}

impl Plugin for Fuzz {
    fn name(&self) -> &'static str {
        "fuzz"
    }
    fn add(&self, req: &Request) -> Result<CniResult> {
        self.touch(req)?;
        Ok(req.prev_result()?.unwrap_or_default())
    }
    fn del(&self, req: &Request) -> Result<()> {
        self.touch(req)
    }
    fn check(&self, req: &Request) -> Result<()> {
        self.touch(req)
    }
    fn gc(&self, req: &Request) -> Result<()> {
        self.touch(req)
    }
    fn status(&self, req: &Request) -> Result<()> {
        self.touch(req)
    }
}

const CODES: [u64; 13] = [1, 2, 3, 4, 5, 6, 7, 8, 11, 50, 51, 999, 0];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, stdin)) = data.split_first() else { return };
    let verb = ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"][(sel % 6) as usize];
    let args = if sel & 0x80 != 0 { "IgnoreUnknown=1;IP=10.0.0.2" } else { "" };
    let get = |k: &str| -> Option<String> {
        Some(match k {
            "CNI_COMMAND" => verb.into(),
            "CNI_CONTAINERID" => "fuzz1".into(),
            // DEL tolerates a missing netns, so the netns checks are exercised without root
            "CNI_NETNS" => "/nonexistent/fuzz".into(),
            "CNI_IFNAME" => "eth0".into(),
            "CNI_PATH" => "/nonexistent".into(),
            "CNI_ARGS" => args.into(),
            _ => return None,
        })
    };
    let mut out = Vec::new();
    let code = run_with(&Fuzz, get, &mut &stdin[..], &mut out, &mut Vec::new());
    assert!(code == 0 || code == 1, "exit code {code}");
    if code == 1 || (verb == "ADD" && code == 0) || verb == "VERSION" {
        let text = std::str::from_utf8(&out).expect("stdout is UTF-8");
        let mut docs = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        let doc = docs.next().expect("one document").expect("valid JSON");
        assert!(docs.next().is_none(), "exactly one document");
        if code == 1 {
            let c = doc["code"].as_u64().expect("error has a code");
            assert!(CODES.contains(&c), "code {c} not in the spec");
        }
    } else {
        assert!(out.is_empty(), "silent success");
    }
    let _ = json::from_value::<Conf>(serde_json::Value::Null);
});
