//! `bandwidth`: the CNI plugin binary around the [`bandwidth`] library.

cni_common::global_allocator!();

fn main() {
    cni_common::skel::run(&bandwidth::Bandwidth)
}
