//! `portmap`: the CNI plugin around the [`portmap`] library ([`portmap::plugin::Portmap`]).

cni_common::global_allocator!();

fn main() {
    cni_common::skel::run(&portmap::plugin::Portmap)
}
