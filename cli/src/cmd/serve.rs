//! `nightshift serve`: the engine and the web UI/API until SIGINT/SIGTERM.

use anyhow::Result;

use crate::args::Cli;
use crate::cmd::usage;

/// How long opening the audit store and recovering may take before the
/// store counts as stuck on damaged data.
const STARTUP_LIMIT_SECS: u64 = 300;

pub async fn serve(cli: &Cli, listen: Option<String>) -> Result<u8> {
    let mut config = nightshift_engine::config::EngineConfig::load(&cli.config).map_err(|e| usage(e.to_string()))?;
    if let Some(l) = listen {
        // The override goes through the same rules as the file's value
        // (anonymous access only on loopback).
        config.listen_addr = l;
        config.check_listen().map_err(|m| usage(format!("--listen: {m}")))?;
    }
    let addr = config.listen_addr.clone();
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|e| usage(format!("cannot listen on {addr}: {e}")))?;
    // sled spins, rather than fails, on a damaged page: if opening and
    // recovering the audit store stops making progress, say what to do and
    // exit non-zero instead of hanging as "starting" forever.
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = started.clone();
    let data_dir = config.data_dir.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(STARTUP_LIMIT_SECS));
        if !s2.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!(
                "error: the engine did not finish opening and recovering its audit store in {} within {STARTUP_LIMIT_SECS} s: it may be damaged. Stop here, run `nightshift audit verify`, and if it names a damaged record, `nightshift audit salvage --to NEW_DIR`",
                data_dir.display()
            );
            std::process::exit(2);
        }
    });
    let engine = nightshift_engine::serve::start(config).await.map_err(|e| match e {
        nightshift_engine::serve::StartError::Audit(nightshift_engine::audit::AuditError::Locked { path, .. }) => {
            usage(format!("{} is in use by another nightshift process", path.display()))
        }
        other => usage(other.to_string()),
    })?;
    started.store(true, std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "nightshift serving on http://{} ({} nodes, {} runbooks)",
        listener.local_addr()?,
        engine.node_names().len(),
        engine.runbook_set().runbooks.len()
    );
    // SIGHUP (`systemctl reload`): read fleet.yaml, tokens and runbooks
    // again; audited, and a broken file changes nothing.
    let e3 = engine.clone();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut hup) => {
            engine.add_task(tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: reloading fleet.yaml, tokens and runbooks");
                    let _ = nightshift_engine::serve::reload(&e3, "signal:SIGHUP").await;
                }
            }));
        }
        Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP: reload through the admin API instead"),
    }
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
