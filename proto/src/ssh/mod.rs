//! SSH on the engine's side: the client that reaches agents, and the
//! Ed25519 keys both sides use. The server lives in the agent.

pub mod client;
pub mod keys;
