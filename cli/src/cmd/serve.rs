//! `nightshift serve`: the engine and the web UI/API until SIGINT/SIGTERM.

use anyhow::Result;

use crate::args::Cli;
use crate::cmd::usage;

pub async fn serve(cli: &Cli, listen: Option<String>) -> Result<u8> {
    let mut config = nightshift_engine::config::EngineConfig::load(&cli.config).map_err(|e| usage(e.to_string()))?;
    if let Some(l) = listen {
        config.listen_addr = l;
    }
    let addr = config.listen_addr.clone();
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|e| usage(format!("cannot listen on {addr}: {e}")))?;
    let engine = nightshift_engine::serve::start(config).await.map_err(|e| match e {
        nightshift_engine::serve::StartError::Audit(nightshift_engine::audit::AuditError::Locked { path, .. }) => {
            usage(format!("{} is in use by another nightshift process", path.display()))
        }
        other => usage(other.to_string()),
    })?;
    eprintln!(
        "nightshift serving on http://{} ({} nodes, {} runbooks)",
        listener.local_addr()?,
        engine.node_names().len(),
        engine.runbook_set().runbooks.len()
    );
    let e2 = engine.clone();
    let shutdown = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("shutting down");
        e2.shutdown().await;
    };
    nightshift_web::serve(engine, listener, shutdown).await?;
    Ok(0)
}
