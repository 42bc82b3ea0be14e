//! The `host-local` binary: the CNI skeleton around [`host_local::HostLocal`].

fn main() {
    cni_common::skel::run(&host_local::HostLocal)
}
