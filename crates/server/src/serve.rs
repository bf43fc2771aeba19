//! Serving a runtime: the store opened from [`ServerOptions`], the caller's agents registered
//! on its [`RuntimeBuilder`], the routes bound, and a graceful stop on SIGTERM or Ctrl-C.
//!
//! Prints `listening on ADDR` on standard output once it accepts connections. SIGKILL is safe
//! by design: nothing acknowledged lives only in memory.

use std::{
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use durafiber_runtime::{Runtime, RuntimeBuilder, RuntimeConfig, RuntimeError, Secrets, limits};
use durafiber_store::{Store, StoreError};

use crate::{
    auth::{self, AccessError, Bootstrap},
    capacity, listen,
    routes::router,
    session::Sessions,
    state::{Access, AppState, Peers, prometheus},
};

/// Everything `serve` needs to know, in one typed place. `listen` and `data` have no useful
/// default; everything else is off or empty by default.
///
/// ```no_run
/// # async fn demo() -> Result<(), durafiber_server::ServeError> {
/// let options = durafiber_server::ServerOptions::new("127.0.0.1:7878".parse().unwrap(), "./data");
/// durafiber_server::serve(&options, |builder| builder /* .agent(MyAgent) */).await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The address to listen on; port 0 picks a free one (the `listening on` line names it).
    pub listen: SocketAddr,
    /// The server's own files (the admin token), and the store unless `store` is given.
    pub data: PathBuf,
    /// A `postgres://` URL: the runs live in that database.
    pub store: Option<String>,
    /// This node's id among several sharing `store`.
    pub node_id: Option<String>,
    /// Their lease on shards, overriding the configuration's `lease_ttl`.
    pub lease_ttl: Option<Duration>,
    /// Where the others reach this node; the listen address by default.
    pub advertise: Option<String>,
    /// How long a request passed on to a run's owner waits for its answer before the caller
    /// gets `503` with `Retry-After`.
    pub forward_timeout: Duration,
    /// A JSON configuration file (durations as "10s", "72h"); defaults without one.
    pub config: Option<PathBuf>,
    /// Names clients may reach it by, beyond the listen address and localhost.
    pub allowed_hosts: Vec<String>,
    /// `GET /metrics` without a token.
    pub open_metrics: bool,
    /// HTTPS: the certificate chain and key files (PEM).
    pub tls: Option<TlsFiles>,
    /// Off loopback without TLS, on purpose (behind a proxy that terminates TLS).
    pub insecure_plain_http: bool,
}

impl ServerOptions {
    /// Options for a lone server on `listen` keeping its runs in `data`.
    pub fn new(listen: SocketAddr, data: impl Into<PathBuf>) -> Self {
        ServerOptions {
            listen,
            data: data.into(),
            store: None,
            node_id: None,
            lease_ttl: None,
            advertise: None,
            forward_timeout: DEFAULT_FORWARD_TIMEOUT,
            config: None,
            allowed_hosts: Vec::new(),
            open_metrics: false,
            tls: None,
            insecure_plain_http: false,
        }
    }
}

/// How long a request passed on to a run's owner waits by default: a few seconds, well
/// past a live node's answer and well inside a client's patience.
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// A certificate chain and its private key, both PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain.
    pub cert: PathBuf,
    /// The certificate's private key.
    pub key: PathBuf,
}

/// Why the server could not start, or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration file could not be read.
    #[error("reading {path}: {source}")]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The configuration is not valid.
    #[error("in {path}: {source}")]
    Config {
        /// The file (or `defaults`).
        path: String,
        /// What is wrong.
        source: RuntimeError,
    },
    /// A `DURAFIBER_SECRET_*` variable is malformed.
    #[error("DURAFIBER_SECRET_*: {0}")]
    Secrets(#[source] durafiber_runtime::BadDestination),
    /// `store` is not a `postgres://` URL.
    #[error("--store takes a postgres:// URL, not {0:?}")]
    NotADatabaseUrl(String),
    /// Listening off loopback over plain HTTP without saying so.
    #[error(
        "{0} is off loopback: tokens would cross the network in clear text; give --tls-cert and --tls-key, or pass --insecure-plain-http behind a proxy that terminates TLS"
    )]
    PlainHttpOffLoopback(SocketAddr),
    /// The certificate or key could not be used.
    #[error("TLS: {0}")]
    Tls(#[from] crate::listen::TlsError),
    /// A file or socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// Others than its owner may write to the data directory.
    #[error(
        "others may write to {path} (mode {mode:o}): chmod 700 it, or choose a directory only you can write"
    )]
    UnsafeDataDir {
        /// The data directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The store could not be opened.
    #[error("opening the store at {place}: {source}")]
    Store {
        /// The directory or database.
        place: String,
        /// Why.
        source: StoreError,
    },
    /// The runtime could not open (an unknown stash version, a store another node holds, …).
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    /// The tokens could not be read or written.
    #[error("{0}")]
    Access(#[from] AccessError),
    /// The store failed while serving; a supervisor should restart the process, which
    /// recovers every run ([`EXIT_STORE_FAILED`] is the exit code for it).
    #[error("the store failed ({0}); exiting so a supervisor can restart the server")]
    StoreFailed(String),
}

/// Exit code when the store failed under a running server (`EX_TEMPFAIL`: try again).
pub const EXIT_STORE_FAILED: i32 = 75;

/// Reads a JSON configuration file; defaults when there is none.
pub fn load_config(path: Option<&Path>) -> Result<RuntimeConfig, ServeError> {
    match path {
        None => Ok(RuntimeConfig::default()),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|source| ServeError::ConfigFile { path: p.to_path_buf(), source })?;
            RuntimeConfig::from_json(&text)
                .map_err(|source| ServeError::Config { path: p.display().to_string(), source })
        }
    }
}

/// Opens the store `options` names (the database of `options.store`, or the data directory),
/// as node `options.node_id` when several share it.
pub fn open_store(options: &ServerOptions, config: &RuntimeConfig) -> Result<Store, ServeError> {
    let store_config =
        config.store_config().map_err(|source| ServeError::Config { path: "config".into(), source })?;
    let opened = match (&options.store, &options.node_id) {
        (Some(url), _) if !durafiber_store::store::is_database_url(url) => {
            return Err(ServeError::NotADatabaseUrl(url.clone()));
        }
        (Some(url), Some(node)) => durafiber_store::PgBackend::open_node(url, node)
            .and_then(|backend| Store::with_backend(Arc::new(backend), store_config)),
        (Some(url), None) => Store::open_postgres(url, store_config),
        (None, _) => Store::open_dir(&options.data, store_config),
    };
    opened.map_err(|source| ServeError::Store { place: store_place(options), source })
}

/// The store's place for messages: the data directory, or the database without its password.
fn store_place(options: &ServerOptions) -> String {
    match &options.store {
        Some(url) => match url::Url::parse(url) {
            Ok(mut parsed) => {
                let _ = parsed.set_password(None);
                parsed.to_string()
            }
            Err(_) => "the --store database".into(),
        },
        None => options.data.display().to_string(),
    }
}

/// The data directory, created 0700 when missing; refused when others may write to it (they
/// could replace the store or the admin token), with a warning when others may read it.
fn private_data_dir(data: &Path) -> Result<(), ServeError> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    let io = |what: &str| {
        let what = format!("{what} {}", data.display());
        move |source| ServeError::Io { what, source }
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(data).map_err(io("creating"))?;
    let mode = std::fs::metadata(data).map_err(io("reading"))?.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(ServeError::UnsafeDataDir { path: data.to_path_buf(), mode: mode & 0o777 });
    }
    if mode & 0o044 != 0 {
        tracing::warn!(path = %data.display(), mode = format!("{:o}", mode & 0o777), "others may read the data directory: chmod 700 it");
        eprintln!(
            "durafiber: WARNING: others may read {} (mode {:o}); its files are 0600, but chmod 700 it",
            data.display(),
            mode & 0o777
        );
    }
    Ok(())
}

/// Opens the store and the runtime for serving, with the agents `register` adds: on a shared
/// database as node `options.node_id`, advertising `advertise`.
pub async fn open_runtime(
    options: &ServerOptions,
    advertise: &str,
    mut config: RuntimeConfig,
    secrets: Secrets,
    register: impl FnOnce(RuntimeBuilder) -> RuntimeBuilder,
) -> Result<Runtime, ServeError> {
    if let Some(ttl) = options.lease_ttl {
        config.lease_ttl = ttl;
    }
    let store = open_store(options, &config)?;
    let builder = register(Runtime::builder(store).config(config).secrets(secrets));
    Ok(builder.advertise(advertise).open().await?)
}

/// The TLS acceptor of the options' files, if any; plain HTTP off loopback only when asked
/// for, and said loudly.
fn checked_tls(options: &ServerOptions) -> Result<Option<tokio_rustls::TlsAcceptor>, ServeError> {
    let tls = match &options.tls {
        Some(files) => Some(listen::tls_acceptor(&files.cert, &files.key)?),
        None => None,
    };
    let addr = options.listen;
    if !addr.ip().is_loopback() && tls.is_none() {
        if !options.insecure_plain_http {
            return Err(ServeError::PlainHttpOffLoopback(addr));
        }
        tracing::warn!(%addr, "serving plain HTTP off loopback; tokens and payloads cross the network unencrypted");
        eprintln!(
            "durafiber: WARNING: serving plain HTTP on {addr}; tokens and payloads cross the network unencrypted"
        );
    }
    Ok(tls)
}

/// Tells the operator where the admin token is, after the store's first start or another's.
fn say_bootstrap(bootstrap: Bootstrap, data: &Path) {
    match bootstrap {
        Bootstrap::Created(path) => {
            eprintln!(
                "durafiber: created the admin token; it is in {} (readable by you only)",
                path.display()
            );
        }
        Bootstrap::Existing if auth::read_admin_token(data).is_none() => {
            tracing::info!("the store's tokens were made elsewhere; no admin.token here");
            eprintln!(
                "durafiber: the store's admin token was made by another node (or an earlier server); \
                 use the admin.token in that node's data directory, or `durafiber tokens create` \
                 with an admin token"
            );
        }
        Bootstrap::StaleFileRemoved(path) => {
            tracing::warn!(file = %path.display(), "admin.token held no token of the store; removed");
            eprintln!(
                "durafiber: {} held a token the store does not know (a start stopped before its \
                 record was written, or a revoked token); removed it. Use the admin.token of the \
                 node that made the store's admin, or `durafiber tokens create` with an admin token",
                path.display()
            );
        }
        Bootstrap::Existing => {}
    }
}

/// Serves the agents `register` adds until SIGTERM or Ctrl-C; then stops gracefully.
///
/// `register` is handed the builder of the runtime, with its store, configuration and
/// secrets already set; it adds the agents (and may change anything else a builder can).
pub async fn serve(
    options: &ServerOptions,
    register: impl FnOnce(RuntimeBuilder) -> RuntimeBuilder,
) -> Result<(), ServeError> {
    // Taken over before anything else: a SIGTERM from the first moment (say, right after the
    // `listening on` line) stops the server gracefully instead of killing the process.
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| tracing::warn!(error = %e, "SIGTERM cannot be handled; only Ctrl-C stops gracefully"))
        .ok();
    let tls = checked_tls(options)?;
    let addr = options.listen;
    // Raised before the store opens its files: connections are sized from what is left.
    let fds = capacity::raise_fd_limit();
    // Installed before the runtime opens, so the recoveries at open are counted too.
    let prometheus = prometheus();
    let config = load_config(options.config.as_deref())?;
    let secrets = Secrets::from_env().map_err(ServeError::Secrets)?;
    let data = options.data.as_path();
    private_data_dir(data)?;
    // Bound first, so that a node can tell the others the address it really listens on.
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Io { what: format!("binding {addr}"), source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| ServeError::Io { what: "reading the bound address".into(), source })?;
    let advertise = options.advertise.clone().unwrap_or_else(|| addr.to_string());
    let runtime = open_runtime(options, &advertise, config, secrets.clone(), register).await?;
    say_bootstrap(auth::bootstrap(runtime.store(), data, runtime.now()).await?, data);
    let access = Access::new(addr, &options.allowed_hosts, options.open_metrics);
    let (stop_streams, stopping) = tokio::sync::watch::channel(false);
    let sessions = Arc::new(Sessions::new(tls.is_some()));
    let app = router(AppState {
        runtime: runtime.clone(),
        secrets,
        prometheus,
        access,
        sessions,
        stopping,
        peers: Peers {
            client: listen::peer_client(options.tls.as_ref().map(|t| t.cert.as_path()))?,
            tls: options.tls.is_some(),
            timeout: options.forward_timeout,
        },
    });
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, data = %data.display(), "serving");
    let shutdown = stop_asked(term);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tracing::info!(tls = tls.is_some(), "accepting connections");
    let header_timeout = runtime.config().http_header_timeout;
    let capacity = capacity::capacity(runtime.config().http_connections_max, &fds);
    let server = listen::serve(listener, app, tls, header_timeout, capacity, async move {
        shutdown.await;
        // Event streams never finish on their own: end them so their connections close.
        let _ = stop_streams.send(true);
        let _ = stop_tx.send(());
    });
    run_until_stopped(&runtime, server, stop_rx).await
}

/// Completes at SIGTERM (when it can be handled) or Ctrl-C.
async fn stop_asked(mut term: Option<tokio::signal::unix::Signal>) {
    let terminated = async {
        match term.as_mut() {
            Some(term) => {
                term.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = terminated => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Serves until `server` ends or its stop's grace period runs out, then stops the runtime and
/// the store; an error when the store failed meanwhile.
async fn run_until_stopped(
    runtime: &Runtime,
    server: impl std::future::Future<Output = ()>,
    stop_rx: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), ServeError> {
    let mut failed = runtime.store().failed_signal();
    tokio::select! {
        () = server => {}
        // Requests waiting for disk space must not hold a stop forever.
        () = async {
            let _ = stop_rx.await;
            tokio::time::sleep(limits::STOP_GRACE).await;
        } => tracing::warn!("requests still open after the stop grace period; stopping anyway"),
        reason = failed.wait_for(std::option::Option::is_some) => {
            let reason = reason.map(|r| r.clone().unwrap_or_default()).unwrap_or_default();
            // sled cannot be trusted in this process any more: the caller exits so that a
            // supervisor restarts the server, which reopens the store and recovers every run.
            return Err(ServeError::StoreFailed(reason));
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
