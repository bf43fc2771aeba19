//! The database sessions of one store: one for reads and one for writes, each opened again
//! when it closed, and whether a lone process's owner lock was lost.

use std::sync::{Arc, atomic::AtomicBool};

use tokio_postgres::{Client, NoTls};

use super::db_error;
use crate::error::StoreError;

/// A connection that is opened again after it closed.
pub(super) struct Connection {
    config: tokio_postgres::Config,
    statement_timeout: std::time::Duration,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
}

/// The store's sessions.
pub(super) struct Connections {
    pub(super) reads: Connection,
    pub(super) writes: Connection,
    /// Set when the session holding the owner lock ended: writes stop.
    pub(super) lock_lost: Arc<AtomicBool>,
}

impl Connection {
    pub(super) fn new(config: tokio_postgres::Config, statement_timeout: std::time::Duration) -> Self {
        Connection { config, statement_timeout, client: tokio::sync::Mutex::new(None) }
    }

    /// The open client, connecting when there is none or the last one closed.
    pub(super) async fn client(&self) -> Result<Arc<Client>, StoreError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref()
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let (client, connection) = self.config.connect(NoTls).await.map_err(db_error)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "a PostgreSQL connection closed");
            }
        });
        // A session paused mid-transaction (a stopped node) must not hold locks for long.
        // PostgreSQL takes up to i32::MAX milliseconds; 0 would mean none at all.
        let timeout_ms = self.statement_timeout.as_millis().clamp(1, i32::MAX as u128);
        client
            .batch_execute(&format!(
                "SET synchronous_commit = on; SET statement_timeout = {timeout_ms}; \
                 SET idle_in_transaction_session_timeout = '10s'"
            ))
            .await
            .map_err(db_error)?;
        let client = Arc::new(client);
        *slot = Some(client.clone());
        Ok(client)
    }
}
