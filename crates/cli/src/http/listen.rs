//! Accepting connections, with limits a slow or hostile client cannot outlast: at most
//! `HTTP_CONNECTIONS_MAX` open at once (more are closed as they are accepted), request
//! headers within `HTTP_HEADER_READ_TIMEOUT`, and a connection idle that long closed. On
//! shutdown every connection finishes the request it is serving and closes.

use std::{future::Future, pin::pin, sync::Arc};

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

/// Serves `app` on `listener` until `shutdown` completes, then lets open connections finish
/// their request.
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()>) {
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
        let (app, mut stop) = (app.clone(), stop.clone());
        connections.spawn(async move {
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits::HTTP_HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
            let mut connection = pin!(connection);
            let stopped = tokio::select! {
                _ = connection.as_mut() => false,
                stopping = stop.wait_for(|s| *s) => stopping.is_ok(),
            };
            if stopped {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
            drop(permit);
        });
    }
    let _ = stopping.send(true);
    while connections.join_next().await.is_some() {}
}
