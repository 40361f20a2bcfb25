//! `nightshift`: the on-call CLI.
#![forbid(unsafe_code)]
fn main() {}
