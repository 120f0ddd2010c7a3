//! The exported functions of `<infiniband/verbs.h>` as bindgen declares
//! them. Private and never called: nothing links libibverbs. They exist so
//! that the compiler checks every signature in [`crate::Verbs`]'s table
//! against the header (see `check_signatures!` in `library.rs`).

#![allow(
    dead_code,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    unreachable_pub,
    unused_qualifications,
    clippy::all,
    clippy::use_self
)]

include!("generated/declarations.rs");
