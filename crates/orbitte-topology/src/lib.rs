//! RDMA topology discovery, NIC IDs and selection.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
