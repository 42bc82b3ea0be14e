//! CNI_ARGS parsing. Invariants: no panic; every parsed pair round-trips through `get`
//! (last value wins); validation against a fixed key set never panics.
#![no_main]

use cni_common::spec::env::CniArgs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let Ok(a) = CniArgs::parse(s) else { return };
    for (k, v) in a.pairs() {
        assert!(!k.contains(';') && !k.contains('=') && !v.contains(';') && !v.contains('='));
        assert!(a.get(k).is_some());
        let _ = v;
    }
    let _ = a.validate(&["IP", "MAC", "K8S_POD_NAME"]);
});
