//! The build identity of host-local (see `cni_common::ident`): bridge runs host-local in-process
//! only when the host-local binary on CNI_PATH carries exactly the identity bridge was built
//! with. The id is random per build: it changes whenever anything host-local's code is built
//! from changes (its sources, cni-common's, the lock file, the workspace manifest with its
//! profiles), so two binaries carry the same id only if they come out of the same build of the
//! same code. `CNI_BUILD_ID` replaces the random part (reproducible builds: set it to something
//! unique to the source and build configuration); `CNI_BUILD_COMMIT` (scripts/build-release.sh)
//! is recorded too.

use std::io::Read;

fn main() {
    for p in [
        "build.rs",
        "Cargo.toml",
        "src",
        "../../cni-common/src",
        "../../cni-common/Cargo.toml",
        "../../Cargo.toml",
        "../../Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rerun-if-env-changed=CNI_BUILD_ID");
    println!("cargo:rerun-if-env-changed=CNI_BUILD_COMMIT");
    let commit = std::env::var("CNI_BUILD_COMMIT").ok().filter(|c| !c.is_empty());
    let id = match std::env::var("CNI_BUILD_ID") {
        Ok(id) if !id.is_empty() => id,
        _ => random_id(),
    };
    let text = format!("commit={} id={id}", commit.as_deref().unwrap_or("unknown"));
    assert!(
        text.bytes().all(|b| b.is_ascii_graphic() || b == b' '),
        "CNI_BUILD_ID and CNI_BUILD_COMMIT must be printable ASCII"
    );
    println!("cargo:rustc-env=HOST_LOCAL_BUILD_ID={text}");
}

/// 128 random bits from the kernel, as hex.
fn random_id() -> String {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("read /dev/urandom for the build id");
    b.iter().map(|x| format!("{x:02x}")).collect()
}
