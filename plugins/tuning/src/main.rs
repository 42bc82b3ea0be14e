cni_common::global_allocator!();

fn main() {
    cni_common::skel::run(&tuning::Tuning)
}
