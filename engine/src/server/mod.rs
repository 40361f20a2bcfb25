//! What runs the engine, on top of everything else: the production start
//! (`serve.rs`: SSH transports, node and pull loops, recovery, the HA lease
//! loop, the audit anchor) and a reload (`reload.rs`: fleet.yaml, tokens,
//! runbooks and the XID policy read, checked and swapped in). Nothing below
//! uses this folder; the public path stays `nightshift_engine::serve`.

pub(crate) mod reload;
pub mod serve;
