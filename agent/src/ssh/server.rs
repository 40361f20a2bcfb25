//! The agent's SSH server (russh). Each request is one `exec` whose command
//! is a JSON request; the reply is one JSON line on stdout and an exit status
//! (0 ok, 1 refused or failed). `subscribe` streams telemetry lines until the
//! client closes the channel or the server shuts down.
//!
//! Only public keys in the authorized set are accepted. Channels are served
//! concurrently: each exec is spawned, because russh calls a connection's
//! handler one event at a time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use russh::keys::{PrivateKey, PublicKey};
use russh::server::{Auth, Msg, Server as _, Session};
use russh::{Channel, ChannelId, MethodKind, MethodSet};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::service::Agent;
use nightshift_proto::{Op, Reply, Request};

/// What the server needs beyond the agent.
pub struct ServerOptions {
    pub host_key: PrivateKey,
    pub authorized: Vec<PublicKey>,
}

/// A running server; drop or call [`RunningAgentServer::shutdown`] to stop.
pub struct RunningAgentServer {
    pub local_addr: SocketAddr,
    shutdown_tx: watch::Sender<bool>,
    join: tokio::task::JoinHandle<()>,
}

impl RunningAgentServer {
    /// Stop accepting, end streams, disconnect clients.
    pub async fn shutdown(self) {
        let _ = self.shutdown_tx.send(true);
        let _ = self.join.await;
    }

    /// Stop without waiting.
    pub fn abort(&self) {
        let _ = self.shutdown_tx.send(true);
        self.join.abort();
    }
}

#[derive(Clone)]
struct AgentSsh {
    agent: Arc<Agent>,
    authorized: Arc<Vec<PublicKey>>,
    shutdown: watch::Receiver<bool>,
}

struct Conn {
    inner: AgentSsh,
    peer: Option<SocketAddr>,
}

impl russh::server::Server for AgentSsh {
    type Handler = Conn;
    fn new_client(&mut self, peer: Option<SocketAddr>) -> Conn {
        Conn { inner: self.clone(), peer }
    }
}

impl Conn {
    fn is_authorized(&self, key: &PublicKey) -> bool {
        self.inner.authorized.iter().any(|k| k.key_data() == key.key_data())
    }
}

impl russh::server::Handler for Conn {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        _user: &str,
        offer: russh::server::PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        if self.is_authorized(offer.public_key) { Ok(Auth::Accept) } else { Ok(Auth::reject()) }
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: russh::server::VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        if self.is_authorized(key.public_key) {
            tracing::info!(node = %self.inner.agent.node(), peer = ?self.peer, user, "engine authenticated");
            Ok(Auth::Accept)
        } else {
            tracing::warn!(
                node = %self.inner.agent.node(), peer = ?self.peer, user,
                key = %nightshift_proto::ssh::keys::fingerprint(key.public_key),
                "refused a key that is not in the authorized keys"
            );
            Ok(Auth::reject())
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Replies go out through the session handle; keeping the channel
        // object unread would stall the connection.
        drop(channel);
        reply.accept().await;
        Ok(())
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)?;
        let handle = session.handle();
        let inner = self.inner.clone();
        let data = data.to_vec();
        tokio::spawn(async move { serve_exec(inner, handle, channel, data).await });
        Ok(())
    }
}

async fn finish(handle: &russh::server::Handle, channel: ChannelId, status: u32) {
    let _ = handle.exit_status_request(channel, status).await;
    let _ = handle.eof(channel).await;
    let _ = handle.close(channel).await;
}

async fn serve_exec(inner: AgentSsh, handle: russh::server::Handle, channel: ChannelId, data: Vec<u8>) {
    let agent = inner.agent.clone();
    if data.len() <= agent.options().max_request_bytes
        && let Ok(Request { op: Op::Subscribe(args), id, .. }) = Request::parse(&data)
    {
        let interval = args.interval_ms.unwrap_or(agent.options().telemetry_interval_ms).clamp(10, 60_000);
        stream_telemetry(inner, &handle, channel, &id, interval).await;
        finish(&handle, channel, 0).await;
        return;
    }
    let reply = agent.handle_bytes(&data).await;
    let mut line = reply.to_json();
    line.push('\n');
    let _ = handle.data(channel, line.into_bytes()).await;
    finish(&handle, channel, if reply.ok { 0 } else { 1 }).await;
}

async fn stream_telemetry(
    mut inner: AgentSsh,
    handle: &russh::server::Handle,
    channel: ChannelId,
    id: &str,
    interval_ms: u64,
) {
    let agent = inner.agent.clone();
    tracing::info!(node = %agent.node(), subscription = id, interval_ms, "telemetry subscription started");
    loop {
        let line = match agent.telemetry().await {
            Ok(t) => serde_json::to_string(&t).unwrap_or_default(),
            Err((code, msg)) => Reply::err(id, code, msg).to_json(),
        };
        if handle.data(channel, format!("{line}\n").into_bytes()).await.is_err() {
            break;
        }
        tokio::select! {
            _ = agent.clock().sleep(interval_ms) => {}
            _ = inner.shutdown.changed() => break,
        }
        if *inner.shutdown.borrow() {
            break;
        }
    }
    tracing::info!(node = %agent.node(), subscription = id, "telemetry subscription ended");
}

/// Serve `agent` on `listener` until shut down.
pub fn serve(agent: Arc<Agent>, listener: TcpListener, opts: ServerOptions) -> std::io::Result<RunningAgentServer> {
    let local_addr = listener.local_addr()?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut methods = MethodSet::empty();
    methods.push(MethodKind::PublicKey);
    let config = Arc::new(russh::server::Config {
        methods,
        keys: vec![opts.host_key],
        auth_rejection_time: Duration::from_millis(300),
        auth_rejection_time_initial: Some(Duration::from_millis(0)),
        inactivity_timeout: Some(Duration::from_secs(600)),
        maximum_packet_size: 65_535,
        nodelay: true,
        ..Default::default()
    });
    let mut ssh = AgentSsh { agent, authorized: Arc::new(opts.authorized), shutdown: shutdown_rx.clone() };
    let mut stop = shutdown_rx;
    let join = tokio::spawn(async move {
        let running = ssh.run_on_socket(config, &listener);
        let server_handle = running.handle();
        tokio::select! {
            r = running => {
                if let Err(e) = r {
                    tracing::error!(error = %e, "ssh server stopped");
                }
            }
            _ = stop.changed() => {
                server_handle.shutdown("agent shutting down".into());
            }
        }
    });
    Ok(RunningAgentServer { local_addr, shutdown_tx, join })
}
