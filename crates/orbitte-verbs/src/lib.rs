//! Safe RDMA verbs over a provider trait.
#![warn(missing_docs)]
