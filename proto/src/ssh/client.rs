//! The async SSH client the engine uses to reach agents: host-key pinning,
//! key authentication, one kept-open connection carrying many concurrent
//! channels, per-request timeouts, and reconnection with backoff.
//!
//! [`AgentTransport`] is the engine's view of an agent; [`AgentClient`]
//! implements it over SSH (the agent crate's `LocalAgent` does in-process).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::{ChannelMsg, Disconnect, client};
use tokio::sync::mpsc;

use crate::{Op, Reply, Request, SubscribeArgs, Telemetry};

/// Where and how to reach one agent.
#[derive(Clone)]
pub struct ClientConfig {
    /// `host:port`.
    pub addr: String,
    /// The agent's pinned host key, `SHA256:…`.
    pub host_key_fingerprint: String,
    /// The engine's key.
    pub key: Arc<PrivateKey>,
    pub user: String,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// First reconnect delay; doubles per failure up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig").field("addr", &self.addr).field("host_key", &self.host_key_fingerprint).finish()
    }
}

impl ClientConfig {
    /// Defaults: user `nightshift`, 5 s connect, 30 s per request, backoff
    /// 200 ms → 30 s.
    pub fn new(addr: impl Into<String>, host_key_fingerprint: impl Into<String>, key: Arc<PrivateKey>) -> ClientConfig {
        ClientConfig {
            addr: addr.into(),
            host_key_fingerprint: host_key_fingerprint.into(),
            key,
            user: "nightshift".into(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// Why a call did not get a reply.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to agent at {addr}: {message}")]
    Connect { addr: String, message: String },
    #[error(
        "agent at {addr} presented host key {found}, but the inventory pins {expected}; refusing to talk (if the node was reinstalled, update its host_key in the inventory)"
    )]
    HostKeyMismatch { addr: String, expected: String, found: String },
    #[error(
        "agent at {addr} refused the engine's key for user {user}: add the engine's public key to the agent's authorized keys"
    )]
    AuthRejected { addr: String, user: String },
    #[error("agent at {addr} did not answer within {ms} ms")]
    Timeout { addr: String, ms: u64 },
    #[error("connection to agent at {addr} failed: {message}")]
    Channel { addr: String, message: String },
    #[error("agent at {addr} sent a reply that is not valid: {message}")]
    BadReply { addr: String, message: String },
    #[error("agent at {addr} is unreachable; next reconnect attempt in {retry_in_ms} ms (last error: {last_error})")]
    Backoff { addr: String, retry_in_ms: u64, last_error: String },
}

impl ClientError {
    /// Whether the request may not have reached the agent (so retrying the
    /// same id is the right move: ids are idempotent).
    pub fn is_transport(&self) -> bool {
        !matches!(self, ClientError::BadReply { .. })
    }
}

struct Pinning {
    expected: String,
    seen: Arc<Mutex<Option<String>>>,
}

impl client::Handler for Pinning {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let found = match key {
            PublicKeyOrCertificate::PublicKey { key, .. } => crate::ssh::keys::fingerprint(key),
            PublicKeyOrCertificate::Certificate(_) => "a certificate".to_string(),
        };
        let ok = found == self.expected;
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(found);
        Ok(ok)
    }
}

/// Records the host key a server presents and refuses to go on: what
/// `nightshift fleet import` uses to collect host keys (trust on first use,
/// printed for a person to compare) without authenticating.
struct Scanner {
    seen: Arc<Mutex<Option<String>>>,
}

impl client::Handler for Scanner {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let found = match key {
            PublicKeyOrCertificate::PublicKey { key, .. } => crate::ssh::keys::fingerprint(key),
            PublicKeyOrCertificate::Certificate(_) => "a certificate".to_string(),
        };
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(found);
        Ok(false)
    }
}

/// The host key fingerprint (`SHA256:…`) the SSH server at `addr` presents.
/// Nothing is authenticated or sent after the key exchange.
pub async fn scan_host_key(addr: &str, timeout: Duration) -> Result<String, ClientError> {
    let seen = Arc::new(Mutex::new(None));
    let config = Arc::new(client::Config { inactivity_timeout: Some(timeout), nodelay: true, ..Default::default() });
    let connect = client::connect(config, addr.to_string(), Scanner { seen: seen.clone() });
    let result = tokio::time::timeout(timeout, connect).await;
    if let Some(found) = seen.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        return Ok(found);
    }
    Err(match result {
        Err(_) => ClientError::Timeout { addr: addr.to_string(), ms: timeout.as_millis() as u64 },
        Ok(Err(e)) => ClientError::Connect { addr: addr.to_string(), message: e.to_string() },
        Ok(Ok(_)) => ClientError::Connect { addr: addr.to_string(), message: "no host key was presented".into() },
    })
}

/// One open SSH connection to an agent.
pub struct AgentConnection {
    handle: client::Handle<Pinning>,
    cfg: ClientConfig,
}

impl AgentConnection {
    /// Connect, check the pinned host key, authenticate.
    pub async fn connect(cfg: &ClientConfig) -> Result<AgentConnection, ClientError> {
        let seen = Arc::new(Mutex::new(None));
        let handler = Pinning { expected: cfg.host_key_fingerprint.clone(), seen: seen.clone() };
        let config = Arc::new(client::Config {
            inactivity_timeout: None,
            keepalive_interval: Some(Duration::from_secs(60)),
            keepalive_max: 3,
            nodelay: true,
            maximum_packet_size: 65_535,
            ..Default::default()
        });
        let addr = cfg.addr.clone();
        let connect = client::connect(config, addr.clone(), handler);
        let mut handle = match tokio::time::timeout(cfg.connect_timeout, connect).await {
            Err(_) => return Err(ClientError::Timeout { addr, ms: cfg.connect_timeout.as_millis() as u64 }),
            Ok(Err(e)) => {
                let found = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
                return Err(match found {
                    Some(found) if found != cfg.host_key_fingerprint => {
                        ClientError::HostKeyMismatch { addr, expected: cfg.host_key_fingerprint.clone(), found }
                    }
                    _ => ClientError::Connect { addr, message: e.to_string() },
                });
            }
            Ok(Ok(h)) => h,
        };
        let key = PrivateKeyWithHashAlg::new(cfg.key.clone(), None);
        let auth = tokio::time::timeout(cfg.connect_timeout, handle.authenticate_publickey(cfg.user.clone(), key))
            .await
            .map_err(|_| ClientError::Timeout { addr: cfg.addr.clone(), ms: cfg.connect_timeout.as_millis() as u64 })?
            .map_err(|e| ClientError::Connect { addr: cfg.addr.clone(), message: e.to_string() })?;
        if !auth.success() {
            return Err(ClientError::AuthRejected { addr: cfg.addr.clone(), user: cfg.user.clone() });
        }
        Ok(AgentConnection { handle, cfg: cfg.clone() })
    }

    /// Whether the connection has closed.
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    fn chan_err(&self, e: impl std::fmt::Display) -> ClientError {
        ClientError::Channel { addr: self.cfg.addr.clone(), message: e.to_string() }
    }

    /// Send a raw command; returns stdout and the exit status.
    pub async fn exec_raw(&self, command: &[u8]) -> Result<(Vec<u8>, Option<u32>), ClientError> {
        self.exec_raw_within(command, self.cfg.request_timeout).await
    }

    /// [`Connection::exec_raw`] with its own time limit.
    pub async fn exec_raw_within(
        &self,
        command: &[u8],
        request_timeout: Duration,
    ) -> Result<(Vec<u8>, Option<u32>), ClientError> {
        let work = async {
            let mut channel = self.handle.channel_open_session().await.map_err(|e| self.chan_err(e))?;
            channel.exec(true, command.to_vec()).await.map_err(|e| self.chan_err(e))?;
            let mut out = Vec::new();
            let mut status = None;
            while let Some(msg) = channel.wait().await {
                match msg {
                    ChannelMsg::Data { data } => out.extend_from_slice(&data),
                    ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
                    ChannelMsg::Close => break,
                    _ => {}
                }
            }
            Ok((out, status))
        };
        tokio::time::timeout(request_timeout, work)
            .await
            .map_err(|_| ClientError::Timeout { addr: self.cfg.addr.clone(), ms: request_timeout.as_millis() as u64 })?
    }

    /// Send one request and read its reply (an op that runs the vendor's
    /// tools on the node gets the time they may take: [`Op::reply_within`]).
    pub async fn call(&self, req: &Request) -> Result<Reply, ClientError> {
        let within = req.op.reply_within().map_or(self.cfg.request_timeout, |d| d.max(self.cfg.request_timeout));
        let (out, _status) = self.exec_raw_within(req.to_json().as_bytes(), within).await?;
        if out.is_empty() {
            return Err(self.chan_err("the channel closed before a reply arrived"));
        }
        Reply::parse(&out).map_err(|message| ClientError::BadReply { addr: self.cfg.addr.clone(), message })
    }

    /// Subscribe to telemetry. Samples arrive on the receiver until the
    /// connection drops (then the receiver yields `None`).
    pub async fn subscribe(
        &self,
        id: &str,
        interval_ms: Option<u64>,
    ) -> Result<mpsc::Receiver<Telemetry>, ClientError> {
        let req = Request::new(id, Op::Subscribe(SubscribeArgs { interval_ms }));
        let mut channel = self.handle.channel_open_session().await.map_err(|e| self.chan_err(e))?;
        channel.exec(true, req.to_json().into_bytes()).await.map_err(|e| self.chan_err(e))?;
        let (tx, rx) = mpsc::channel(64);
        let addr = self.cfg.addr.clone();
        tokio::spawn(async move {
            let mut buf: Vec<u8> = Vec::new();
            while let Some(msg) = channel.wait().await {
                match msg {
                    ChannelMsg::Data { data } => {
                        buf.extend_from_slice(&data);
                        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = buf.drain(..=pos).collect();
                            match serde_json::from_slice::<Telemetry>(&line) {
                                Ok(t) => {
                                    if tx.send(t).await.is_err() {
                                        let _ = channel.close().await;
                                        return;
                                    }
                                }
                                Err(e) => tracing::warn!(agent = %addr, error = %e, "unreadable telemetry line"),
                            }
                        }
                        if buf.len() > 1 << 20 {
                            buf.clear();
                        }
                    }
                    ChannelMsg::Close | ChannelMsg::Eof => break,
                    _ => {}
                }
            }
        });
        Ok(rx)
    }

    /// Close the connection politely.
    pub async fn close(&self) {
        let _ = self.handle.disconnect(Disconnect::ByApplication, "engine closing", "en").await;
    }
}

/// The engine's view of one agent.
pub trait AgentTransport: Send + Sync {
    /// Send a request and wait for its reply.
    fn call(&self, req: Request) -> BoxFuture<'_, Result<Reply, ClientError>>;
}

struct Backoff {
    failures: u32,
    next_attempt: Option<Instant>,
    last_error: String,
}

/// A reconnecting client for one agent. The connection is opened lazily and
/// reopened after failures, waiting min·2ⁿ (capped) between attempts.
pub struct AgentClient {
    cfg: ClientConfig,
    conn: tokio::sync::Mutex<Option<Arc<AgentConnection>>>,
    backoff: Mutex<Backoff>,
}

impl AgentClient {
    pub fn new(cfg: ClientConfig) -> AgentClient {
        AgentClient {
            cfg,
            conn: tokio::sync::Mutex::new(None),
            backoff: Mutex::new(Backoff { failures: 0, next_attempt: None, last_error: String::new() }),
        }
    }

    /// The agent's address.
    pub fn addr(&self) -> &str {
        &self.cfg.addr
    }

    /// The open connection, connecting if needed (respecting backoff).
    pub async fn connection(&self) -> Result<Arc<AgentConnection>, ClientError> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref()
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        *guard = None;
        {
            let b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(at) = b.next_attempt {
                let now = Instant::now();
                if at > now {
                    return Err(ClientError::Backoff {
                        addr: self.cfg.addr.clone(),
                        retry_in_ms: (at - now).as_millis() as u64,
                        last_error: b.last_error.clone(),
                    });
                }
            }
        }
        match AgentConnection::connect(&self.cfg).await {
            Ok(c) => {
                let c = Arc::new(c);
                *guard = Some(c.clone());
                let mut b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
                b.failures = 0;
                b.next_attempt = None;
                tracing::info!(agent = %self.cfg.addr, "connected to agent");
                Ok(c)
            }
            Err(e) => {
                let mut b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
                let delay = backoff_delay(self.cfg.backoff_min, self.cfg.backoff_max, b.failures);
                b.failures += 1;
                b.next_attempt = Some(Instant::now() + delay);
                b.last_error = e.to_string();
                tracing::warn!(agent = %self.cfg.addr, error = %e, retry_in_ms = delay.as_millis() as u64, "agent connection failed");
                Err(e)
            }
        }
    }

    /// Forget the current connection (after a transport failure).
    pub async fn reset(&self) {
        if let Some(c) = self.conn.lock().await.take() {
            c.close().await;
        }
    }

    /// Send a request. A transport failure on a connection that had been
    /// working is retried once on a fresh connection with the same id —
    /// safe, because the agent never applies an id twice.
    pub async fn request(&self, req: &Request) -> Result<Reply, ClientError> {
        let conn = self.connection().await?;
        match conn.call(req).await {
            Ok(r) => Ok(r),
            Err(e) if e.is_transport() && !matches!(e, ClientError::Timeout { .. }) => {
                drop(conn);
                self.reset().await;
                let conn = self.connection().await?;
                conn.call(req).await
            }
            Err(e) => {
                if matches!(e, ClientError::Timeout { .. }) {
                    self.reset().await;
                }
                Err(e)
            }
        }
    }
}

impl AgentTransport for AgentClient {
    fn call(&self, req: Request) -> BoxFuture<'_, Result<Reply, ClientError>> {
        Box::pin(async move { self.request(&req).await })
    }
}
/// The wait before reconnect attempt `failures + 1`: `min` doubled per
/// failure up to `max`, then a random point in its upper half ("equal
/// jitter"), so a fleet of clients that lost their agents at the same
/// moment does not come back in lockstep.
pub fn backoff_delay(min: Duration, max: Duration, failures: u32) -> Duration {
    let base = min.saturating_mul(1u32 << failures.min(16)).min(max);
    base.mul_f64(rand::random_range(0.5..1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_waits_double_within_bounds_and_spread_out() {
        let (min, max) = (Duration::from_millis(200), Duration::from_secs(30));
        for failures in 0..20 {
            let base = min.saturating_mul(1u32 << failures.min(16)).min(max);
            let waits: Vec<Duration> = (0..200).map(|_| backoff_delay(min, max, failures)).collect();
            for w in &waits {
                assert!(*w >= base.mul_f64(0.5) && *w < base, "{failures}: {w:?} outside [{:?}, {base:?})", base / 2);
            }
            // 200 clients that failed together do not retry together.
            let distinct: std::collections::BTreeSet<Duration> = waits.iter().copied().collect();
            assert!(distinct.len() > 150, "{failures}: only {} distinct waits", distinct.len());
        }
    }
}
