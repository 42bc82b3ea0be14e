fn main() {
    cni_common::skel::run(&bridge::Bridge)
}
