//! OrbitTE: a transfer engine that moves bytes between registered memory on
//! different hosts with one-sided READ and WRITE requests over RDMA, TCP or
//! shared memory.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use orbitte_engine as engine;
