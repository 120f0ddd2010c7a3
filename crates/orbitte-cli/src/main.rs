//! The `orbitte` command.
#![forbid(unsafe_code)]

fn main() {
    println!("orbitte: not yet implemented");
}
