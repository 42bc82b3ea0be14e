//! `CNI_COMMAND=VERSION` on every binary, and the about banner with CNI_COMMAND unset.

use cni_tests::Exec;
use serde_json::json;

const ALL: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

#[test]
fn every_plugin_answers_version_with_its_spec_versions() {
    for p in ["loopback", "bridge", "host-local", "portmap", "bandwidth", "firewall", "ptp", "tuning"] {
        // stdin is ignored for VERSION, even when it is not JSON
        let v = Exec::new(p).env("CNI_COMMAND", "VERSION").run("not json").ok();
        // bandwidth, like upstream's, needs results that can list its ifb, and firewall a
        // prevResult: 0.3.0 and later
        let want: &[&str] = if p == "bandwidth" || p == "firewall" { &ALL[2..] } else { &ALL };
        assert_eq!(v["supportedVersions"], json!(want), "{p}");
        assert_eq!(v["cniVersion"], "1.1.0", "{p}");
    }
}

#[test]
fn about_banner_names_plugin_version_and_spec_versions() {
    for p in ["loopback", "bridge", "host-local", "portmap", "bandwidth", "firewall", "ptp", "tuning"] {
        let out = Exec::new(p).run("");
        assert_eq!(out.code, 0, "{p}");
        assert!(out.stdout.is_empty(), "{p}: the banner goes to stderr");
        assert!(
            out.stderr.starts_with(&format!("CNI {p} plugin {} (", cni_common::skel::BANNER_VERSION)),
            "{p}: {}",
            out.stderr
        );
        assert!(out.stderr.contains("CNI protocol versions supported: "), "{p}");
    }
}
