//! SSH transport: the agent's server, its keys, and the client the engine
//! uses to reach agents.

pub mod client;
pub mod keys;
pub mod server;
