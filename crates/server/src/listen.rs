//! Accepting connections, with limits a slow or hostile client cannot outlast: at most the
//! server's [`Capacity`] open at once and `HTTP_CONNECTIONS_PER_CLIENT_MAX` from one client
//! address (more are closed as they are accepted), request headers within
//! `http_header_timeout` (the body within `http_body_timeout`, `guard::read_body`: a whole
//! request within the two), and a connection idle that long closed. Once the open share is
//! taken, a connection is served only for a caller that signs in (`capacity.rs`); past both,
//! `HTTP_HEALTH_CONNECTIONS_MAX` more connections are served `/health` only, so a server
//! whose slots are all held still answers how it is. On shutdown every connection finishes the request it is serving and
//! closes. With a TLS acceptor every connection is TLS (rustls), the handshake within the
//! header timeout.

use std::{collections::HashMap, future::Future, net::IpAddr, path::Path, pin::pin, sync::Arc};

use axum::Router;
use durafiber_runtime::limits;
use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    net::TcpListener,
    sync::{OwnedSemaphorePermit, Semaphore, watch},
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;

use crate::{
    capacity::{Capacity, SignedInOnly},
    head_guard::HeadGuard,
};

/// Serves `app` on `listener` until `shutdown` completes, then lets open connections finish
/// their request. With `tls`, every connection is TLS.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    header_timeout: std::time::Duration,
    capacity: Capacity,
    shutdown: impl Future<Output = ()>,
) {
    let shares = Shares::new(&capacity);
    let signed_in_app = app.clone().layer(axum::Extension(SignedInOnly));
    let clients = Clients::default();
    let (stopping, stop) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let Some(client) = clients.enter(peer.ip()) else {
            tracing::warn!(%peer, max = limits::HTTP_CONNECTIONS_PER_CLIENT_MAX, "too many connections from this client; closing this one");
            drop(stream);
            continue;
        };
        let Some((permit, share)) = shares.take() else {
            tracing::warn!(%peer, max = capacity.total(), "too many connections; closing this one");
            drop(stream);
            continue;
        };
        let (app, header_timeout) = match share {
            Share::Open => (app.clone(), header_timeout),
            // A caller who signs in sends its headers at once: one that stalls holds a slot
            // kept for the signed-in only briefly.
            Share::SignedIn => {
                (signed_in_app.clone(), header_timeout.min(limits::HTTP_SIGNED_IN_HEADER_TIMEOUT))
            }
            Share::Health => (health_only(app.clone()), header_timeout),
        };
        let _ = stream.set_nodelay(true);
        let (stop, tls) = (stop.clone(), tls.clone());
        connections.spawn(async move {
            serve_tcp(stream, peer, tls, app, stop, header_timeout).await;
            drop(permit);
            drop(client);
        });
    }
    let _ = stopping.send(true);
    while connections.join_next().await.is_some() {}
}

/// Serves one accepted connection, in TLS when there is an acceptor (its handshake within
/// the header timeout).
async fn serve_tcp(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    tls: Option<TlsAcceptor>,
    app: Router,
    stop: watch::Receiver<bool>,
    header_timeout: std::time::Duration,
) {
    let Some(acceptor) = tls else {
        return serve_one(TokioIo::new(HeadGuard::new(stream)), app, stop, header_timeout).await;
    };
    match tokio::time::timeout(header_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => serve_one(TokioIo::new(HeadGuard::new(stream)), app, stop, header_timeout).await,
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

/// Which share of the server's connections one was taken from.
enum Share {
    Open,
    SignedIn,
    Health,
}

/// The connections left in each share.
struct Shares {
    open: Arc<Semaphore>,
    signed_in: Arc<Semaphore>,
    health: Arc<Semaphore>,
}

impl Shares {
    fn new(capacity: &Capacity) -> Shares {
        Shares {
            open: Arc::new(Semaphore::new(capacity.open)),
            signed_in: Arc::new(Semaphore::new(capacity.signed_in)),
            health: Arc::new(Semaphore::new(capacity.health)),
        }
    }

    /// A slot for a new connection: from the open share while it lasts, then from the one
    /// kept for the signed-in, then from `/health`'s; `None` when all are taken.
    fn take(&self) -> Option<(OwnedSemaphorePermit, Share)> {
        let in_share =
            |share: &Arc<Semaphore>, which| share.clone().try_acquire_owned().ok().map(|p| (p, which));
        in_share(&self.open, Share::Open)
            .or_else(|| in_share(&self.signed_in, Share::SignedIn))
            .or_else(|| in_share(&self.health, Share::Health))
    }
}

/// The app as a connection past the global limit sees it: `/health`, and 503 for the rest.
fn health_only(app: Router) -> Router {
    use axum::{
        http::StatusCode,
        response::{IntoResponse, Response},
    };
    let busy = || async {
        let body = serde_json::json!({
            "error": "the server holds as many connections as it takes; try again shortly",
            "kind": "Busy",
        });
        let mut response: Response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
        response
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        response
            .headers_mut()
            .insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        response
    };
    Router::new().route("/health", axum::routing::any_service(app)).fallback(busy)
}

/// Open connections per client address.
#[derive(Clone, Default)]
struct Clients(Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>>);

/// One client's connection, counted until it is dropped.
struct ClientSlot {
    clients: Clients,
    ip: IpAddr,
}

impl Clients {
    /// A slot for one more connection from `ip`, unless it holds the most one client may.
    fn enter(&self, ip: IpAddr) -> Option<ClientSlot> {
        let mut open = self.0.lock();
        let count = open.entry(ip).or_insert(0);
        if *count >= limits::HTTP_CONNECTIONS_PER_CLIENT_MAX {
            return None;
        }
        *count += 1;
        Some(ClientSlot { clients: self.clone(), ip })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.0.lock();
        if let Some(count) = open.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

async fn serve_one<I>(
    io: TokioIo<I>,
    app: Router,
    mut stop: watch::Receiver<bool>,
    header_timeout: std::time::Duration,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(io, TowerToHyperService::new(app));
    let mut connection = pin!(connection);
    let stopped = tokio::select! {
        _ = connection.as_mut() => false,
        stopping = stop.wait_for(|s| *s) => stopping.is_ok(),
    };
    if stopped {
        connection.as_mut().graceful_shutdown();
        let _ = connection.await;
    }
}

/// TLS that cannot be set up from the files given: what is wrong, and with which file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

/// The certificates of a PEM chain file.
fn certificates(
    cert: &Path,
) -> Result<Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>, TlsError> {
    use tokio_rustls::rustls::pki_types::{CertificateDer, pem::PemObject};
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| TlsError(format!("reading {}: {e}", cert.display())))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError(format!("a certificate in {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!("{} holds no certificate", cert.display())));
    }
    Ok(certs)
}

/// The client a node passes requests on to the others with. With the server's certificate
/// chain, it speaks TLS and trusts the certificates of that chain (the nodes' own, or the
/// authority that signed theirs): a peer is accepted only with a certificate for the name
/// or address it advertises.
pub fn peer_client(cert: Option<&Path>) -> Result<reqwest::Client, TlsError> {
    use tokio_rustls::rustls;
    let Some(cert) = cert else { return Ok(reqwest::Client::new()) };
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(cert)? {
        roots
            .add(c)
            .map_err(|e| TlsError(format!("a certificate in {} cannot be trusted: {e}", cert.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS protocol versions: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .build()
        .map_err(|e| TlsError(format!("a TLS client for the other nodes: {e}")))
}

/// A TLS acceptor from PEM files: the certificate chain and its private key.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    use tokio_rustls::rustls::{
        self,
        pki_types::{PrivateKeyDer, pem::PemObject},
    };
    let certs = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError(format!("the private key in {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS protocol versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError(format!("the certificate and key do not make a TLS configuration: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
