//! The agent's SSH server (russh). Each request is one `exec` whose command
//! is a JSON request; the reply is one JSON line on stdout and an exit status
//! (0 ok, 1 refused or failed). `subscribe` streams telemetry lines until the
//! client closes the channel or the server shuts down.
//!
//! Only public keys in the authorized set are accepted. Channels are served
//! concurrently: each exec is spawned, because russh calls a connection's
//! handler one event at a time. Shell, pty, subsystem (sftp), env and X11
//! requests are refused at once and their channel closed.
//!
//! The accept loop is ours, not russh's, so that a flood cannot silence the
//! agent: a connection must authenticate within `preauth_timeout`; at most
//! `max_unauthenticated` connections (and `max_unauthenticated_per_source`
//! from one address) may be waiting to; running out of file descriptors
//! (EMFILE, ENFILE) pauses accepting with a backoff instead of ending it. If
//! the listener fails any other way, [`RunningAgentServer::stopped`] says so
//! and the binary exits non-zero for its supervisor to restart it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::keys::{PrivateKey, PublicKey};
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelId, MethodKind, MethodSet};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::service::Agent;
use nightshift_proto::{Op, Reply, Request};

/// What the server needs beyond the agent.
pub struct ServerOptions {
    pub host_key: PrivateKey,
    pub authorized: Vec<PublicKey>,
    /// The file `authorized` came from: read again when it changes (a new
    /// engine key added beside the old one, then the old one removed — a
    /// key rotation without restarting any agent).
    pub authorized_path: Option<std::path::PathBuf>,
    pub limits: ConnLimits,
}

/// The engine keys this agent accepts, and the file they are read from
/// again when it changes (its modification time and length).
pub struct AuthorizedKeys {
    path: Option<std::path::PathBuf>,
    keys: std::sync::RwLock<(Option<Stamp>, Arc<Vec<PublicKey>>)>,
}

/// A file's modification time and length: what says it changed.
type Stamp = (std::time::SystemTime, u64);

impl AuthorizedKeys {
    pub fn new(keys: Vec<PublicKey>, path: Option<std::path::PathBuf>) -> AuthorizedKeys {
        let stamp = path.as_deref().and_then(stamp);
        AuthorizedKeys { path, keys: std::sync::RwLock::new((stamp, Arc::new(keys))) }
    }

    /// The keys in force: the file's, read again if it changed. A file
    /// that no longer reads (half written, a bad line) keeps the keys
    /// before it, and says so.
    pub fn current(&self) -> Arc<Vec<PublicKey>> {
        let Some(path) = &self.path else { return self.keys.read().unwrap_or_else(|e| e.into_inner()).1.clone() };
        let now = stamp(path);
        {
            let k = self.keys.read().unwrap_or_else(|e| e.into_inner());
            if k.0 == now {
                return k.1.clone();
            }
        }
        let mut k = self.keys.write().unwrap_or_else(|e| e.into_inner());
        match nightshift_proto::ssh::keys::load_authorized(path) {
            Ok(keys) => {
                tracing::info!(path = %path.display(), keys = keys.len(), "authorized keys changed: read again");
                *k = (now, Arc::new(keys));
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "authorized keys changed and do not read: the keys before stay");
                k.0 = now;
            }
        }
        k.1.clone()
    }
}

fn stamp(path: &std::path::Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// How many not-yet-authenticated connections the server tolerates, and for
/// how long (`ssh:` in agent.yaml).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnLimits {
    /// A connection that has not authenticated by then is closed.
    #[serde(default = "d_preauth")]
    pub preauth_timeout_secs: u64,
    /// Connections waiting to authenticate, in all.
    #[serde(default = "d_unauth")]
    pub max_unauthenticated: usize,
    /// Connections waiting to authenticate from one address.
    #[serde(default = "d_unauth_source")]
    pub max_unauthenticated_per_source: usize,
}

fn d_preauth() -> u64 {
    10
}
fn d_unauth() -> usize {
    256
}
fn d_unauth_source() -> usize {
    32
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            preauth_timeout_secs: d_preauth(),
            max_unauthenticated: d_unauth(),
            max_unauthenticated_per_source: d_unauth_source(),
        }
    }
}

impl ConnLimits {
    /// `(key, message)` for a value that would disable the protection.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !(1..=300).contains(&self.preauth_timeout_secs) {
            return Err((
                "preauth_timeout_secs",
                format!("ssh.preauth_timeout_secs: expected 1 to 300, found {}", self.preauth_timeout_secs),
            ));
        }
        if !(1..=100_000).contains(&self.max_unauthenticated)
            || !(1..=self.max_unauthenticated).contains(&self.max_unauthenticated_per_source)
        {
            return Err((
                "max_unauthenticated",
                format!(
                    "ssh: expected max_unauthenticated 1 to 100000 and max_unauthenticated_per_source 1 to it, found {} and {}",
                    self.max_unauthenticated, self.max_unauthenticated_per_source
                ),
            ));
        }
        Ok(())
    }
}

/// A running server; drop or call [`RunningAgentServer::shutdown`] to stop.
pub struct RunningAgentServer {
    pub local_addr: SocketAddr,
    shutdown_tx: watch::Sender<bool>,
    join: tokio::task::JoinHandle<()>,
    /// Set to the listener's error if accepting ever stops without a
    /// shutdown.
    died: watch::Receiver<Option<String>>,
}

impl RunningAgentServer {
    /// Stop accepting, end streams, disconnect clients.
    pub async fn shutdown(self) {
        let _ = self.shutdown_tx.send(true);
        let _ = self.join.await;
    }

    /// Resolves with the error if the listener dies (never on a shutdown):
    /// the process should exit non-zero so its supervisor restarts it.
    pub async fn stopped(&self) -> String {
        let mut died = self.died.clone();
        loop {
            if let Some(e) = died.borrow().clone() {
                return e;
            }
            if died.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
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
    authorized: Arc<AuthorizedKeys>,
    shutdown: watch::Receiver<bool>,
}

struct Conn {
    inner: AgentSsh,
    peer: Option<SocketAddr>,
    /// Set once the engine's key is accepted (the pre-auth timer stops).
    authed: Arc<AtomicBool>,
    /// Frees this connection's pre-auth slot when it authenticates.
    slot: Option<PreauthSlot>,
}

/// Connections waiting to authenticate, in all and per source.
#[derive(Default)]
struct Waiting {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// One connection's place among those waiting to authenticate; dropped
/// when it authenticates or closes.
struct PreauthSlot {
    waiting: Arc<Mutex<Waiting>>,
    source: IpAddr,
}

impl PreauthSlot {
    fn take(waiting: &Arc<Mutex<Waiting>>, source: IpAddr, limits: &ConnLimits) -> Option<PreauthSlot> {
        let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
        let from_source = w.by_source.get(&source).copied().unwrap_or(0);
        if w.total >= limits.max_unauthenticated || from_source >= limits.max_unauthenticated_per_source {
            return None;
        }
        w.total += 1;
        *w.by_source.entry(source).or_default() += 1;
        Some(PreauthSlot { waiting: waiting.clone(), source })
    }
}

impl Drop for PreauthSlot {
    fn drop(&mut self) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.total = w.total.saturating_sub(1);
        if let Some(n) = w.by_source.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                w.by_source.remove(&self.source);
            }
        }
    }
}

impl Conn {
    fn is_authorized(&self, key: &PublicKey) -> bool {
        self.inner.authorized.current().iter().any(|k| k.key_data() == key.key_data())
    }

    /// Refuse a request this agent never serves, say why on stderr, and
    /// close the channel (the client does not wait for a timeout).
    fn refuse(&self, channel: ChannelId, session: &mut Session, what: &str) -> Result<(), russh::Error> {
        tracing::warn!(node = %self.inner.agent.node(), peer = ?self.peer, what, "refused a request the agent never serves");
        session.channel_failure(channel)?;
        let msg =
            format!("nightshift-agent serves one JSON request per exec (see its README); {what} is not available\n");
        session.extended_data(channel, 1, msg.into_bytes())?;
        session.exit_status_request(channel, 1)?;
        session.eof(channel)?;
        session.close(channel)?;
        Ok(())
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
            self.authed.store(true, Ordering::SeqCst);
            self.slot = None;
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

    async fn shell_request(&mut self, channel: ChannelId, session: &mut Session) -> Result<(), Self::Error> {
        self.refuse(channel, session, "a shell")
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _col_width: u32,
        _row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.refuse(channel, session, "a terminal")
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.refuse(channel, session, &format!("the {name:?} subsystem"))
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        _name: &str,
        _value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Environment requests are refused but the channel stays: OpenSSH
        // sends LANG and friends before its exec.
        session.channel_failure(channel)?;
        Ok(())
    }

    async fn x11_request(
        &mut self,
        channel: ChannelId,
        _single: bool,
        _proto: &str,
        _cookie: &str,
        _screen: u32,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.refuse(channel, session, "X11 forwarding")
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
    let (died_tx, died) = watch::channel(None);
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
    let ssh = AgentSsh {
        agent,
        authorized: Arc::new(AuthorizedKeys::new(opts.authorized, opts.authorized_path)),
        shutdown: shutdown_rx.clone(),
    };
    let limits = opts.limits;
    let join = tokio::spawn(async move {
        if let Err(e) = accept_loop(ssh, config, listener, limits, shutdown_rx).await {
            tracing::error!(error = %e, "the ssh listener died; the agent cannot be reached");
            let _ = died_tx.send(Some(e.to_string()));
        }
    });
    Ok(RunningAgentServer { local_addr, shutdown_tx, join, died })
}

/// Accept errors that mean "out of a resource for now": wait and go on.
fn transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(e.kind(), K::ConnectionAborted | K::ConnectionReset | K::Interrupted | K::WouldBlock | K::OutOfMemory)
        // EMFILE 24, ENFILE 23, ENOBUFS 105, ENOMEM 12 (Linux numbers)
        || matches!(e.raw_os_error(), Some(23 | 24 | 105 | 12))
}

async fn accept_loop(
    ssh: AgentSsh,
    config: Arc<russh::server::Config>,
    listener: TcpListener,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let waiting: Arc<Mutex<Waiting>> = Arc::default();
    let preauth = Duration::from_secs(limits.preauth_timeout_secs);
    let node = ssh.agent.node().to_string();
    let mut backoff = Duration::from_millis(5);
    let mut refused_since_log = 0u64;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => break,
        };
        let (socket, peer) = match accepted {
            Ok(x) => {
                backoff = Duration::from_millis(5);
                x
            }
            Err(e) if transient(&e) => {
                tracing::warn!(node = %node, error = %e, backoff_ms = backoff.as_millis() as u64, "cannot accept a connection now; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
            Err(e) => return Err(e),
        };
        let Some(slot) = PreauthSlot::take(&waiting, peer.ip(), &limits) else {
            refused_since_log += 1;
            if refused_since_log == 1 || refused_since_log.is_multiple_of(1000) {
                tracing::warn!(node = %node, peer = %peer, refused = refused_since_log, "too many connections waiting to authenticate: closing new ones");
            }
            drop(socket);
            continue;
        };
        refused_since_log = 0;
        let authed = Arc::new(AtomicBool::new(false));
        let handler = Conn { inner: ssh.clone(), peer: Some(peer), authed: authed.clone(), slot: Some(slot) };
        let config = config.clone();
        let node = node.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let _ = socket.set_nodelay(true);
            // The version exchange is inside the pre-auth time too.
            let session = match tokio::time::timeout(preauth, russh::server::run_stream(config, socket, handler)).await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(node = %node, peer = %peer, error = %e, "ssh connection setup failed");
                    return;
                }
                Err(_) => {
                    tracing::info!(node = %node, peer = %peer, "closed a connection that sent no ssh version in time");
                    return;
                }
            };
            let handle = session.handle();
            tokio::pin!(session);
            let timer = async {
                tokio::time::sleep(preauth).await;
                if authed.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                r = &mut session => {
                    if let Err(e) = r {
                        tracing::debug!(node = %node, peer = %peer, error = %e, "ssh connection ended with an error");
                    }
                }
                _ = timer => {
                    tracing::info!(node = %node, peer = %peer, timeout_secs = preauth.as_secs(), "closed a connection that did not authenticate in time");
                    let _ = handle
                        .disconnect(russh::Disconnect::ByApplication, "authentication timed out".into(), String::new())
                        .await;
                }
                _ = stop.changed() => {
                    let _ = handle
                        .disconnect(russh::Disconnect::ByApplication, "agent shutting down".into(), String::new())
                        .await;
                }
            }
        });
    }
    Ok(())
}
