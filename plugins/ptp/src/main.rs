cni_common::global_allocator!();

use cni_common::delegate::{allow_in_process, InProcess};

/// host-local runs inside this process when the `host-local` found on CNI_PATH is this very
/// build of it (cni_common::delegate explains the check; CNI_IPAM_EXEC=1 turns it off).
static IN_PROCESS: [InProcess; 1] =
    [InProcess { identity: host_local::BUILD_IDENTITY, plugin: &host_local::HostLocal }];

fn main() {
    allow_in_process(&IN_PROCESS);
    cni_common::skel::run(&ptp::Ptp)
}
