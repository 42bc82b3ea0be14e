//! `bandwidth`: the CNI plugin binary around the [`bandwidth`] library.

fn main() {
    cni_common::skel::run(&bandwidth::Bandwidth)
}
