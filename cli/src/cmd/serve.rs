//! `nightshift serve`: the engine and the web UI/API until SIGINT/SIGTERM.

use anyhow::Result;

use crate::args::Cli;
use crate::cmd::usage;

/// How long opening the audit store and recovering may take before the
/// store counts as stuck on damaged data.
const STARTUP_LIMIT_SECS: u64 = 300;

/// The exit status of an engine that lost its lease (EX_TEMPFAIL).
pub const DEPOSED_EXIT: u8 = 75;

/// The exit status of an engine whose audit store stopped at a write
/// failure and stayed stopped (EX_IOERR).
pub const STORE_STOPPED_EXIT: u8 = 74;

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
    // Standbys forward writes to the leader's advertised URL: by default
    // the address this engine really listens on.
    if let Some(pg) = config.audit.postgres.as_mut()
        && pg.advertise_url.is_none()
    {
        pg.advertise_url = Some(format!("http://{}", listener.local_addr()?));
    }
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
    // While the store opens (PostgreSQL may be down) and recovery runs,
    // the port answers: not ready, and why (a clone of the listening
    // socket, handed back once the engine is up).
    let (starting_tx, starting_rx) = tokio::sync::oneshot::channel::<()>();
    let why = match &config.audit.postgres {
        Some(_) if config.audit.backend == nightshift_engine::config::AuditBackend::Postgres => {
            "opening the audit store in PostgreSQL (waiting for the database if it is down) and recovering".to_string()
        }
        _ => format!("opening the audit store in {} and recovering", config.data_dir.display()),
    };
    let starting = match listener.into_std().and_then(|l| Ok((l.try_clone()?, l))) {
        Ok((clone, own)) => {
            let clone = tokio::net::TcpListener::from_std(clone)?;
            let task = tokio::spawn(nightshift_web::serve_starting(clone, why, async move {
                let _ = starting_rx.await;
            }));
            (task, tokio::net::TcpListener::from_std(own)?)
        }
        Err(e) => return Err(usage(format!("cannot listen on {addr}: {e}"))),
    };
    let (starting_task, listener) = starting;
    let started_engine = nightshift_engine::serve::start(config).await;
    let _ = starting_tx.send(());
    let _ = starting_task.await;
    let engine = started_engine.map_err(|e| match e {
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
            // Ends with the engine.
            let mut stopping = engine.shutdown_signal();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        got = hup.recv() => {
                            if got.is_none() {
                                return;
                            }
                            tracing::info!("SIGHUP: reloading fleet.yaml, tokens and runbooks");
                            let _ = nightshift_engine::api::reload(&e3, "signal:SIGHUP").await;
                        }
                        _ = stopping.changed() => return,
                    }
                }
            });
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
    // Deposed (the lease lost to another engine, or the database gone for
    // longer than the TTL): this process stops here, and the service manager
    // starts it again as a standby.
    let deposed = engine.audit().postgres().map(|p| p.leadership.deposed());
    let stepped_down = async move {
        match deposed {
            Some(mut rx) => loop {
                if let Some(why) = rx.borrow_and_update().clone() {
                    break why;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            },
            None => std::future::pending().await,
        }
    };
    // A store stopped at a write failure stays stopped: after answering
    // 503 with why for `audit.exit_after_stop_secs`, exit non-zero so the
    // service manager starts the engine again (and pages through it).
    let exit_after = std::time::Duration::from_secs(engine.config().audit.exit_after_stop_secs);
    let store = engine.audit().clone();
    let store_stopped = async move {
        let mut since: Option<std::time::Instant> = None;
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            match (store.stopped(), since) {
                (None, _) => since = None,
                (Some(_), None) => since = Some(std::time::Instant::now()),
                (Some(why), Some(t)) if t.elapsed() >= exit_after => break why,
                (Some(_), Some(_)) => {}
            }
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), listener, async move {
        tokio::select! {
            _ = shutdown => {}
            _ = stop_rx => {}
        }
    }));
    tokio::select! {
        r = web => { r??; Ok(0) }
        why = store_stopped => {
            eprintln!(
                "error: the audit store stopped ({why}) {} s ago and takes no writes: exiting (74) so the service manager starts this engine again (audit.exit_after_stop_secs)",
                exit_after.as_secs()
            );
            let _ = stop_tx.send(());
            Ok(STORE_STOPPED_EXIT)
        }
        why = stepped_down => {
            if why.contains("shut down") {
                // Our own shutdown handed the lease back; the web server
                // is ending too.
                return Ok(0);
            }
            eprintln!("nightshift: deposed: {why}; exiting so the service manager starts this engine again as a standby");
            engine.shutdown().await;
            let _ = stop_tx.send(());
            Ok(DEPOSED_EXIT)
        }
    }
}
