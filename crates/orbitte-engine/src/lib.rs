//! The OrbitTE transfer engine.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
