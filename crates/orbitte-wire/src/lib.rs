//! The OrbitTE wire protocol.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
