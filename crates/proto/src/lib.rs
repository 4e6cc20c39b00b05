//! gRPC services and messages shared by every elastrec process.
//!
//! Each `.proto` file under `proto/` is compiled at build time (no `protoc` needed) and
//! exposed as a module named after its package. Add a service by dropping a file into
//! `proto/` and a `pub mod` line here.

/// Major version of the wire protocol. Bumped on incompatible message changes.
pub const PROTOCOL_MAJOR: u32 = 2;

pub mod packed;

/// Messages shared by all services.
pub mod common {
    tonic::include_proto!("elastrec.common.v1");
}

/// Generated code of the versioned packages, nested as their package names expect
/// (`elastrec.master.v1` refers to `elastrec.common.v1` as `super::super::common::v1`).
mod wire {
    pub mod common {
        pub mod v1 {
            pub use crate::common::*;
        }
    }
    pub mod master {
        pub mod v1 {
            tonic::include_proto!("elastrec.master.v1");
        }
    }
    pub mod ps {
        pub mod v1 {
            tonic::include_proto!("elastrec.ps.v1");
        }
    }
    pub mod executor {
        pub mod v1 {
            tonic::include_proto!("elastrec.executor.v1");
        }
    }
}

/// A data executor's service (`elastrec.executor.v1`): parsed batches of file rows.
pub use wire::executor::v1 as executor;
/// The job master's service (`elastrec.master.v1`): membership, data tasks, scaling, status.
pub use wire::master::v1 as master;
/// The parameter server's service (`elastrec.ps.v1`): embedding rows and dense slices.
pub use wire::ps::v1 as ps;

/// A model server's service (`elastrec.serve.v1`): predictions for raw rows.
pub mod serve {
    tonic::include_proto!("elastrec.serve.v1");
}

/// The cluster brain's service: profiles in, resource plans out.
pub mod brain {
    tonic::include_proto!("elastrec.brain.v1");
}
