//! The `host-local` binary: the CNI skeleton around [`host_local::HostLocal`].

#![warn(clippy::too_many_lines)]

cni_common::global_allocator!();

/// This build's identity, where `cni_common::ident::file_carries` looks for it.
#[used]
#[link_section = ".cni_rs_ident"]
static IDENTITY: [u8; host_local::BUILD_IDENTITY.len()] =
    cni_common::ident::to_array(host_local::BUILD_IDENTITY);

fn main() {
    // Referenced, so no linker can drop the section as unused.
    std::hint::black_box(&IDENTITY);
    cni_common::skel::run(&host_local::HostLocal)
}
