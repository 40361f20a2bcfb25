//! An agent in the same process: the real request handling with no
//! transport, for the simulated fleet, scenario tests and benchmarks.

use std::sync::Arc;

use futures::future::BoxFuture;
use nightshift_proto::ssh::client::{AgentTransport, ClientError};
use nightshift_proto::{Reply, Request};

use crate::service::Agent;

/// [`AgentTransport`] straight into an [`Agent`].
#[derive(Clone)]
pub struct LocalAgent(pub Arc<Agent>);

impl AgentTransport for LocalAgent {
    fn call(&self, req: Request) -> BoxFuture<'_, Result<Reply, ClientError>> {
        Box::pin(async move { Ok(self.0.handle(req).await) })
    }
}
