//! Accepting connections, with limits a slow or hostile client cannot outlast: at most
//! `HTTP_CONNECTIONS_MAX` open at once (more are closed as they are accepted), request
//! headers within `HTTP_HEADER_READ_TIMEOUT`, and a connection idle that long closed. On
//! shutdown every connection finishes the request it is serving and closes. With a TLS
//! acceptor every connection is TLS (rustls), the handshake within the same timeout.

use std::{future::Future, path::Path, pin::pin, sync::Arc};

use axum::Router;
use durafiber_runtime::limits;
use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;

/// Serves `app` on `listener` until `shutdown` completes, then lets open connections finish
/// their request. With `tls`, every connection is TLS.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits::HTTP_CONNECTIONS_MAX));
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
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max = limits::HTTP_CONNECTIONS_MAX, "too many connections; closing this one");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (app, stop, tls) = (app.clone(), stop.clone(), tls.clone());
        connections.spawn(async move {
            match tls {
                None => serve_one(TokioIo::new(stream), app, stop).await,
                Some(acceptor) => {
                    let handshake = acceptor.accept(stream);
                    match tokio::time::timeout(limits::HTTP_HEADER_READ_TIMEOUT, handshake).await {
                        Ok(Ok(stream)) => serve_one(TokioIo::new(stream), app, stop).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
            drop(permit);
        });
    }
    let _ = stopping.send(true);
    while connections.join_next().await.is_some() {}
}

async fn serve_one<I>(io: TokioIo<I>, app: Router, mut stop: watch::Receiver<bool>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits::HTTP_HEADER_READ_TIMEOUT)
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

/// A TLS acceptor from PEM files: the certificate chain and its private key.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, crate::ServeError> {
    use crate::ServeError::Tls;
    use tokio_rustls::rustls::{
        self,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| Tls(format!("reading {}: {e}", cert.display())))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Tls(format!("a certificate in {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(Tls(format!("{} holds no certificate", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Tls(format!("the private key in {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Tls(format!("TLS protocol versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| Tls(format!("the certificate and key do not make a TLS configuration: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
