//! `durafiber serve`: the runtime with the hosted agents, behind the HTTP JSON API.
//!
//! Prints `listening on ADDR` once it accepts connections. SIGTERM (or Ctrl-C) stops it
//! gracefully; SIGKILL is safe by design, since nothing acknowledged lives only in memory.
//! `DURAFIBER_STOP_AT=<point>` makes the server stop at that boundary (for example
//! `after_effect_call:refund`) and wait there to be killed: the drill's deterministic crash.

use std::{io::Write, net::SocketAddr, path::Path, sync::Arc};

use anyhow::Context as _;
use durafiber_runtime::testing::BuilderTestExt;
use durafiber_runtime::{CrashHook, Runtime, RuntimeConfig, Secrets, limits};
use durafiber_store::Store;

use crate::{
    auth,
    http::{
        routes::router,
        session::Sessions,
        state::{Access, AppState, prometheus},
    },
};

/// Reads a JSON configuration file; defaults when there is none.
pub fn load_config(path: Option<&Path>) -> anyhow::Result<RuntimeConfig> {
    match path {
        None => Ok(RuntimeConfig::default()),
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            RuntimeConfig::from_json(&text).with_context(|| format!("in {}", p.display()))
        }
    }
}

fn stop_at_hook(point: String) -> CrashHook {
    Arc::new(move |run_id: &str, reached: &str| {
        if reached == point {
            tracing::warn!(
                run_id,
                point = reached,
                "stopped at the requested crash point; waiting to be killed"
            );
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "STOPPED AT {reached} run {run_id}");
            let _ = err.flush();
            // Hold this thread here for good: the process is meant to die at this point.
            loop {
                std::thread::park();
            }
        }
        false
    })
}

/// Where the server keeps its runs, and its place among nodes sharing a database.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// The server's own files (the admin token), and the store unless `store` is given.
    pub data: std::path::PathBuf,
    /// A `postgres://` URL: the runs live in that database.
    pub store: Option<String>,
    /// This node's id among several sharing `store`.
    pub node_id: Option<String>,
    /// Their lease on shards, overriding the configuration's `lease_ttl`.
    pub lease_ttl: Option<std::time::Duration>,
    /// Where the others reach this node; the listen address by default.
    pub advertise: Option<String>,
}

/// Opens the store (the database `place.store` names, or the data directory) and the runtime
/// for serving; on a shared database, as node `place.node_id`, advertising `advertise`.
pub async fn open_runtime(
    place: &Placement,
    advertise: &str,
    mut config: RuntimeConfig,
    secrets: Secrets,
) -> anyhow::Result<Runtime> {
    if let Some(ttl) = place.lease_ttl {
        config.lease_ttl = ttl;
    }
    let store_config = config.store_config()?;
    let store = match (&place.store, &place.node_id) {
        (Some(url), _) if !durafiber_store::store::is_database_url(url) => {
            anyhow::bail!("--store takes a postgres:// URL, not {url:?}")
        }
        (Some(url), Some(node)) => Store::with_backend(
            Arc::new(
                durafiber_store::PgBackend::open_node(url, node).context("opening the store's database")?,
            ),
            store_config,
        )?,
        (Some(url), None) => {
            Store::open_postgres(url, store_config).context("opening the store's database")?
        }
        (None, _) => Store::open_dir(&place.data, store_config)
            .with_context(|| format!("opening {}", place.data.display()))?,
    };
    let mut builder = crate::agents::register(Runtime::builder(store).config(config).secrets(secrets));
    if let Ok(point) = std::env::var("DURAFIBER_STOP_AT") {
        builder = builder.crash_hook(stop_at_hook(point));
    }
    Ok(builder.advertise(advertise).open().await?)
}

/// Who the server is exposed to, from the command line.
#[derive(Debug, Clone, Default)]
pub struct Exposure {
    /// Names clients may reach it by, beyond the listen address and localhost.
    pub allowed_hosts: Vec<String>,
    /// `GET /metrics` without a token.
    pub open_metrics: bool,
    /// HTTPS: the certificate chain and key files (PEM).
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Off loopback without TLS, on purpose.
    pub insecure_plain_http: bool,
}

/// Serves until SIGTERM or Ctrl-C.
pub async fn serve(
    place: &Placement,
    listen: SocketAddr,
    config: Option<&Path>,
    exposure: Exposure,
) -> anyhow::Result<()> {
    let tls = match &exposure.tls {
        Some((cert, key)) => Some(crate::http::listen::tls_acceptor(cert, key)?),
        None => None,
    };
    if !listen.ip().is_loopback() && tls.is_none() {
        if !exposure.insecure_plain_http {
            anyhow::bail!(
                "{listen} is off loopback: tokens would cross the network in clear text; give --tls-cert and --tls-key, or pass --insecure-plain-http behind a proxy that terminates TLS"
            );
        }
        eprintln!(
            "durafiber: WARNING: serving plain HTTP on {listen}; tokens and payloads cross the network unencrypted"
        );
    }
    // Installed before the runtime opens, so the recoveries at open are counted too.
    let prometheus = prometheus();
    let config = load_config(config)?;
    let secrets = Secrets::from_env().map_err(|e| anyhow::anyhow!("DURAFIBER_SECRET_*: {e}"))?;
    let data = place.data.as_path();
    std::fs::create_dir_all(data).with_context(|| format!("creating {}", data.display()))?;
    // Bound first, so that a node can tell the others the address it really listens on.
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    let advertise = place.advertise.clone().unwrap_or_else(|| addr.to_string());
    let runtime = open_runtime(place, &advertise, config, secrets.clone()).await?;
    if let Some(path) = auth::bootstrap(runtime.store(), data, runtime.now_ms()).await? {
        eprintln!("durafiber: created the admin token; it is in {} (readable by you only)", path.display());
    }
    let access = Access::new(addr, &exposure.allowed_hosts, exposure.open_metrics);
    let (stop_streams, stopping) = tokio::sync::watch::channel(false);
    let sessions = Arc::new(Sessions::new(tls.is_some()));
    let app = router(AppState { runtime: runtime.clone(), secrets, prometheus, access, sessions, stopping });
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, data = %data.display(), "serving");
    let shutdown = async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tracing::info!(tls = tls.is_some(), "accepting connections");
    let server = crate::http::listen::serve(listener, app, tls, async move {
        shutdown.await;
        // Event streams never finish on their own: end them so their connections close.
        let _ = stop_streams.send(true);
        let _ = stop_tx.send(());
    });
    let mut failed = runtime.store().failed_signal();
    tokio::select! {
        () = server => {}
        // Requests waiting for disk space must not hold a stop forever.
        () = async {
            let _ = stop_rx.await;
            tokio::time::sleep(limits::STOP_GRACE).await;
        } => tracing::warn!("requests still open after the stop grace period; stopping anyway"),
        reason = failed.wait_for(|f| f.is_some()) => {
            let reason = reason.map(|r| r.clone().unwrap_or_default()).unwrap_or_default();
            // sled cannot be trusted in this process any more: exit so a supervisor restarts
            // the server, which reopens the store and recovers every run.
            eprintln!("durafiber: the store failed ({reason}); exiting so a supervisor can restart the server");
            std::process::exit(EXIT_STORE_FAILED);
        }
    }
    tracing::info!("stopping");
    let stop = async {
        runtime.shutdown().await;
        runtime.store().close();
    };
    if tokio::time::timeout(limits::STOP_GRACE, stop).await.is_err() {
        tracing::warn!("the store did not stop within the grace period; exiting");
    }
    Ok(())
}

/// Exit code when the store failed under a running server (`EX_TEMPFAIL`: try again).
pub const EXIT_STORE_FAILED: i32 = 75;
