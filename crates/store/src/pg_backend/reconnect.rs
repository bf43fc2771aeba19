//! Calls that outlast a database restart. A restart (or a crash and recovery) cuts every
//! session and refuses new ones for a few seconds; a call made meanwhile waits for the
//! database to come back, for up to [`RECONNECT_FOR`], instead of failing the request
//! behind it. Only the connection's failures are waited out: a statement the database
//! refused (a fence, a key that exists, a timeout) fails at once.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio_postgres::Client;

use super::{Connection, db_error};
use crate::error::StoreError;

/// How long a call waits for a database that dropped its connection (a restart takes a
/// few seconds): well inside a request's patience and the store's `barrier_timeout`.
pub(crate) const RECONNECT_FOR: Duration = Duration::from_secs(10);

/// How often a call waiting for the database tries again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// A call's failure, and whether the connection was lost on the way (an earlier try may then
/// have been carried out without its answer arriving).
#[derive(Debug)]
pub(super) struct Lost {
    pub error: StoreError,
    pub reconnected: bool,
}

impl Lost {
    pub fn into_error(self) -> StoreError {
        self.error
    }
}

/// Whether `e` says the connection went away (the database is gone, restarting or starting
/// up: worth waiting for) rather than that a statement was refused.
fn connection_lost(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        // 08: connection exceptions; 57P01–57P03: shut down, crashed, starting up.
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
        }
        None => {
            e.is_closed()
                || std::error::Error::source(e).is_some_and(<dyn std::error::Error>::is::<std::io::Error>)
        }
    }
}

/// Runs `attempt` on `conn`'s session; while the connection is lost, on a new session every
/// [`RECONNECT_PAUSE`], for up to [`RECONNECT_FOR`].
pub(super) async fn reconnecting<T, F, Fut>(conn: &Connection, mut attempt: F) -> Result<T, Lost>
where
    F: FnMut(Arc<Client>) -> Fut,
    Fut: Future<Output = Result<T, tokio_postgres::Error>>,
{
    let give_up = tokio::time::Instant::now() + RECONNECT_FOR;
    let mut reconnected = false;
    loop {
        // No session at all: the database is down or starting up.
        let (error, lost) = match conn.client().await {
            Ok(client) => match attempt(client).await {
                Ok(answer) => return Ok(answer),
                Err(e) => {
                    let lost = connection_lost(&e);
                    (db_error(e), lost)
                }
            },
            Err(e) => (e, true),
        };
        if !lost || tokio::time::Instant::now() >= give_up {
            return Err(Lost { error, reconnected });
        }
        if !reconnected {
            tracing::warn!(%error, "the database connection was lost; waiting for it");
        }
        reconnected = true;
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}

/// Whether every key a group had to create holds the value this group gave it: the group
/// was applied before its connection was lost.
pub(super) async fn own_inserts(
    conn: &Connection,
    absent: &[Vec<u8>],
    keys: &[Vec<u8>],
    values: &[Vec<u8>],
) -> bool {
    let Ok(client) = conn.client().await else { return false };
    let Ok(rows) = client.query("SELECT k, v FROM df_kv WHERE k = ANY($1)", &[&absent]).await else {
        return false;
    };
    let ours: BTreeMap<&[u8], &[u8]> =
        keys.iter().map(Vec::as_slice).zip(values.iter().map(Vec::as_slice)).collect();
    rows.len() == absent.len()
        && rows.iter().all(|r| {
            let (k, v): (Vec<u8>, Vec<u8>) = (r.get(0), r.get(1));
            ours.get(k.as_slice()).is_some_and(|mine| *mine == v.as_slice())
        })
}
