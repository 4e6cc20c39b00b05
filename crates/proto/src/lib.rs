//! gRPC services and messages shared by every elastrec process.
//!
//! Each `.proto` file under `proto/` is compiled at build time (no `protoc` needed) and
//! exposed as a module named after its package. Add a service by dropping a file into
//! `proto/` and a `pub mod` line here.

/// Major version of the wire protocol. Bumped on incompatible message changes.
pub const PROTOCOL_MAJOR: u32 = 1;

/// Messages shared by all services.
pub mod common {
    tonic::include_proto!("elastrec.common.v1");
}
