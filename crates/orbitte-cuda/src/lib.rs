//! CUDA device allocation and synchronized host staging.
#![warn(missing_docs)]
