//! The agent's SSH server. Keys and the engine's client live in
//! `nightshift_proto::ssh`.

pub mod server;
