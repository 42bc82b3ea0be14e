//! The IPAM delegate as a seam: the real one runs `ipam.type` from CNI_PATH (in-process when it
//! is this build's host-local), the fake hands out a fixed result and counts releases.

use cni_common::delegate::ipam;
use cni_common::error::Result;
use cni_common::spec::result::CniResult;
use cni_common::spec::Command;
use cni_common::Request;

pub trait Ipam {
    /// Reserve: the delegate's result.
    fn add(&mut self) -> Result<CniResult>;
    /// Release what the attachment holds.
    fn del(&mut self) -> Result<()>;
}

/// The configured delegate of a request.
pub struct Delegated<'r>(pub &'r Request);

impl Ipam for Delegated<'_> {
    fn add(&mut self) -> Result<CniResult> {
        let out = ipam::start(self.0, Command::Add)?.wait()?;
        ipam::decode_result(self.0, &out)
    }

    fn del(&mut self) -> Result<()> {
        ipam::del(self.0)
    }
}

#[cfg(test)]
pub mod fake {
    use super::*;

    #[derive(Debug, Default)]
    pub struct FakeIpam {
        pub result: CniResult,
        pub reserved: bool,
        pub adds: usize,
        pub dels: usize,
        pub fail_add: bool,
    }

    impl Ipam for FakeIpam {
        fn add(&mut self) -> Result<CniResult> {
            self.adds += 1;
            if self.fail_add {
                return Err(cni_common::CniError::internal("no addresses left"));
            }
            self.reserved = true;
            Ok(self.result.clone())
        }

        fn del(&mut self) -> Result<()> {
            self.dels += 1;
            self.reserved = false;
            Ok(())
        }
    }
}
