//! Raw bindings to libibverbs, loaded at run time.
#![warn(missing_docs)]
