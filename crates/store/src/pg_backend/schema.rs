//! The database's side: the schema and its `df_apply` function, created once by whichever
//! node comes first, and the owner lock a process alone on the database holds.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio_postgres::{Client, NoTls};

use super::{Connections, db_error};
use crate::{error::StoreError, shard};

/// The advisory lock a process holds while it uses the database.
const OWNER_LOCK: i64 = 0x6475_7261_6669_6272; // "durafibr"

/// The schema version this build writes; a database with a newer one is refused.
const SCHEMA_VERSION: i64 = 1;

/// Serializes the schema's creation between nodes that start together.
const SCHEMA_LOCK: i64 = 0x6466_5f73_6368_656d; // "df_schem"

/// How long `open` waits for the owner lock of a process that just died.
const LOCK_WAIT: Duration = Duration::from_secs(3);

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS df_kv (k bytea PRIMARY KEY, v bytea NOT NULL, shard int);
    CREATE INDEX IF NOT EXISTS df_kv_shard ON df_kv (shard, k);
    CREATE TABLE IF NOT EXISTS df_meta (name text PRIMARY KEY, value bigint NOT NULL);
    CREATE TABLE IF NOT EXISTS df_shards (
        shard_id int PRIMARY KEY, owner text, epoch bigint NOT NULL DEFAULT 0, lease_until timestamptz);
    CREATE TABLE IF NOT EXISTS df_nodes (node_id text PRIMARY KEY, http_addr text NOT NULL, seen_at timestamptz NOT NULL);
    ALTER TABLE df_nodes ADD COLUMN IF NOT EXISTS incarnation text;
    ALTER TABLE df_nodes ADD COLUMN IF NOT EXISTS taking boolean;
    CREATE TABLE IF NOT EXISTS df_limit_slots (
        name text, slot int, holder text NOT NULL, until timestamptz NOT NULL, PRIMARY KEY (name, slot));
    CREATE TABLE IF NOT EXISTS df_limit_rates (name text PRIMARY KEY, tokens double precision NOT NULL, at timestamptz NOT NULL);
    CREATE OR REPLACE FUNCTION df_apply(
        gone bytea[], keys bytea[], vals bytea[], shards int[], absent bytea[],
        fence_shards int[], fence_epochs bigint[], node text) RETURNS void AS $$
    DECLARE
        lost int;
        present bytea;
    BEGIN
        -- The fence: this node still owns, at the epoch it acquired, every shard written.
        -- FOR SHARE holds off a steal until this commits; a steal that came first fails it.
        IF node IS NOT NULL AND cardinality(fence_shards) > 0 THEN
            SELECT f.shard INTO lost FROM unnest(fence_shards, fence_epochs) AS f(shard, epoch)
            WHERE NOT EXISTS (
                SELECT 1 FROM df_shards s
                WHERE s.shard_id = f.shard AND s.owner = node AND s.epoch = f.epoch FOR SHARE)
            LIMIT 1;
            IF lost IS NOT NULL THEN
                RAISE EXCEPTION 'fenced' USING ERRCODE = 'DF001', DETAIL = lost::text;
            END IF;
        END IF;
        SELECT k INTO present FROM df_kv WHERE k = ANY(absent) LIMIT 1;
        IF present IS NOT NULL THEN
            RAISE EXCEPTION 'exists' USING ERRCODE = 'DF002', DETAIL = encode(present, 'hex');
        END IF;
        DELETE FROM df_kv WHERE k = ANY(gone);
        -- Absent keys are inserted plainly: one another node created meanwhile is a
        -- unique violation, never an overwrite.
        INSERT INTO df_kv (k, v, shard)
        SELECT u.k, u.v, u.shard FROM unnest(keys, vals, shards) AS u(k, v, shard) WHERE u.k = ANY(absent);
        INSERT INTO df_kv (k, v, shard)
        SELECT u.k, u.v, u.shard FROM unnest(keys, vals, shards) AS u(k, v, shard) WHERE NOT (u.k = ANY(absent))
        ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v, shard = EXCLUDED.shard;
    EXCEPTION WHEN unique_violation THEN
        -- Another node created an absent key between the check and the insert.
        RAISE EXCEPTION 'exists' USING ERRCODE = 'DF002', DETAIL = '';
    END $$ LANGUAGE plpgsql;
";

/// The session that holds the owner lock, for as long as the process uses the database.
async fn take_owner_lock(
    config: &tokio_postgres::Config,
    lock_lost: Arc<AtomicBool>,
    shown: &str,
) -> Result<Client, StoreError> {
    let (owner, connection) = config.connect(NoTls).await.map_err(db_error)?;
    tokio::spawn(async move {
        let _ = connection.await;
        lock_lost.store(true, Ordering::SeqCst);
        tracing::error!("the PostgreSQL session holding the store's owner lock ended: writes stop");
    });
    // A process killed a moment ago may still hold the lock until the server notices its
    // session ended: wait that long before refusing.
    let deadline = tokio::time::Instant::now() + LOCK_WAIT;
    loop {
        let locked: bool = owner
            .query_one("SELECT pg_try_advisory_lock($1)", &[&OWNER_LOCK])
            .await
            .map_err(db_error)?
            .get(0);
        if locked {
            return Ok(owner);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StoreError::DatabaseLocked { url: shown.to_string() });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Takes the owner lock on a session of its own (for a process alone on the database), and
/// creates or checks the schema.
pub(super) async fn prepare(
    config: &tokio_postgres::Config,
    conns: &Connections,
    lock_lost: Option<Arc<AtomicBool>>,
    shown: &str,
) -> Result<Option<Client>, StoreError> {
    let owner = match lock_lost {
        Some(lock_lost) => Some(take_owner_lock(config, lock_lost, shown).await?),
        None => None,
    };
    let client = conns.writes.client().await?;
    // Nodes starting together create the schema one at a time.
    let schema = format!(
        "BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {SCHEMA} \
         INSERT INTO df_shards (shard_id) SELECT generate_series(0, {}) ON CONFLICT DO NOTHING; COMMIT;",
        shard::SHARDS - 1
    );
    client.batch_execute(&schema).await.map_err(db_error)?;
    client
        .execute(
            "INSERT INTO df_meta (name, value) VALUES ('schema_version', $1) ON CONFLICT (name) DO NOTHING",
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(db_error)?;
    let version: i64 = client
        .query_one("SELECT value FROM df_meta WHERE name = 'schema_version'", &[])
        .await
        .map_err(db_error)?
        .get(0);
    if version > SCHEMA_VERSION {
        return Err(StoreError::Database {
            reason: format!("{shown} has schema version {version}; this build knows up to {SCHEMA_VERSION}"),
        });
    }
    Ok(owner)
}
