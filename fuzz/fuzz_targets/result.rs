//! Result decoding of any version, then encoding for every version. Invariants: no panic;
//! a decoded result re-encoded as 1.1.0 decodes to the same canonical value (1.1.0 is
//! lossless); rich encodings never fail.
#![no_main]

use cni_common::spec::result::CniResult;
use cni_common::Version;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(rest) else { return };
    let default = Version::ALL[(sel as usize) % Version::ALL.len()];
    let Ok(r) = CniResult::decode(&v, default) else { return };
    for ver in Version::ALL {
        match r.encode(ver) {
            Ok(doc) => {
                let back = CniResult::decode(&doc, ver).expect("our own encoding decodes");
                if ver == Version::V1_1_0 {
                    assert_eq!(back, r, "1.1.0 round trip is lossless");
                }
            }
            Err(e) => {
                assert!(!ver.has_rich_result(), "rich encoding failed: {e}");
                assert!(r.ips.is_empty());
            }
        }
    }
});
