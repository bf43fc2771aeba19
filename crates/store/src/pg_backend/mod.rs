//! The PostgreSQL backend: the store's sealed records in one table of a shared database.
//!
//! Every record stays the sealed envelope the other backends keep; the database orders keys
//! as bytes (`bytea` compares like `memcmp`), so ranges come back in the store's key order.
//! The writer's whole group is one statement (`apply`): deletes and upserts together, as one
//! implicit transaction, committed with `synchronous_commit = on`. So an `apply` that
//! returned is already durable and `barrier` has nothing left to do: a group costs one round
//! trip and one WAL flush, and the database's own group commit shares that flush with other
//! nodes' commits.
//!
//! The backend methods are synchronous, as the trait is. The connections live on a thread of
//! their own with a single-threaded tokio runtime: a call sends a job there and waits for
//! its answer. Reads share one connection (concurrent reads are pipelined on it); writes
//! have their own, so a read never waits behind a commit's WAL flush. A connection that
//! closed is opened again on the next call.
//!
//! Until runs are owned shard by shard, one process at a time may use a database: the
//! backend holds a session advisory lock for as long as it is open, and a second process
//! gets [`StoreError::DatabaseLocked`]. If the lock's session ends (the database restarted,
//! or an operator terminated it), writes stop with [`StoreError::Database`]: another process
//! may hold the lock by then.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    path::PathBuf,
    pin::Pin,
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio_postgres::NoTls;

use crate::{
    backend::Backend,
    backend::{Entries, Leases},
    batch::Batch,
    batch::Op,
    error::StoreError,
    lock::{Mutex, RwLock},
    shard,
};

mod connection;
mod leases;
mod limits;
mod reconnect;
mod schema;

use connection::{Connection, Connections};
use reconnect::{Lost, own_inserts, reconnecting};
use schema::prepare;

/// The least time any one call may take before it fails: longer is a database that is gone.
/// A store whose statements may run longer (`barrier_timeout`) gives its calls that long,
/// and every call the time to wait out a restart ([`reconnect::RECONNECT_FOR`]) besides.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// One statement applies a whole group, in `df_apply`: the fence check, the absent keys'
/// check, the deletes, then the upserts of the keys' last values (a batch is first reduced
/// to one final state per key).
const APPLY: &str = "SELECT df_apply($1, $2, $3, $4, $5, $6, $7, $8)";

type Job = Box<dyn FnOnce(Arc<Connections>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The store's records in a PostgreSQL database.
pub struct PgBackend {
    jobs: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Where the store lives, without its password.
    shown: String,
    /// The node this process is, when several share the database; `None` for the one
    /// process that holds the owner lock.
    node: Option<String>,
    /// This process among all that were ever node `node`: random, so that a second live
    /// process under the same id is told apart (and refused) by its heartbeat.
    incarnation: String,
    /// How long a call may take before it fails: the statement timeout (at least
    /// `CALL_TIMEOUT`) and a restart's wait.
    call_timeout: Duration,
    /// The shards this node owns, at the epoch it acquired each: what its writes are
    /// fenced by.
    fence: RwLock<HashMap<u32, i64>>,
    /// Bumped when another node says shards changed hands (`LISTEN df_shards`).
    news: tokio::sync::watch::Sender<u64>,
}

/// How long one statement may run unless the store's owner says otherwise: a shared
/// store's nodes keep it, so a statement stuck behind a paused node's locks fails.
const STATEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn db_error(e: tokio_postgres::Error) -> StoreError {
    // The server's own message (the error's `Display` is only "db error").
    match e.as_db_error() {
        Some(db) if db.code().code() == "DF001" => {
            StoreError::Fenced { shard: db.detail().and_then(|d| d.parse().ok()).unwrap_or(u32::MAX) }
        }
        Some(db) if db.code().code() == "DF002" => {
            StoreError::Exists { key: db.detail().unwrap_or("").into() }
        }
        Some(db) => StoreError::Database { reason: format!("{}: {}", db.code().code(), db.message()) },
        None => StoreError::Database { reason: e.to_string() },
    }
}

/// `postgres://user@host:port/db`, without a password, for errors and inspection.
fn shown(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("");
    let db = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{host}:{port}/{db}")
}

impl PgBackend {
    /// Connects to the database at `url` (`postgres://user[:password]@host:port/db`),
    /// creates the store's tables when they are missing, and takes the owner lock: this
    /// process is the database's one user.
    pub fn open(url: &str) -> Result<PgBackend, StoreError> {
        PgBackend::connect(url, None, STATEMENT_TIMEOUT)
    }

    /// [`PgBackend::open`], with statements allowed to run for `statement_timeout`: the
    /// store's own bound on a barrier ([`crate::StoreConfig::barrier_timeout`]), so that the
    /// database does not give up on a slow commit before the store would.
    pub fn open_with_timeout(
        url: &str,
        statement_timeout: std::time::Duration,
    ) -> Result<PgBackend, StoreError> {
        PgBackend::connect(url, None, statement_timeout)
    }

    /// Connects as node `node_id` of several that share the database: no owner lock; each
    /// node writes only into the shards it holds a lease on ([`Leases`]).
    pub fn open_node(url: &str, node_id: &str) -> Result<PgBackend, StoreError> {
        if node_id.is_empty() || node_id.len() > 200 {
            return Err(StoreError::Database { reason: "a node id is 1 to 200 bytes".into() });
        }
        PgBackend::connect(url, Some(node_id.to_string()), STATEMENT_TIMEOUT)
    }

    fn connect(
        url: &str,
        node: Option<String>,
        statement_timeout: std::time::Duration,
    ) -> Result<PgBackend, StoreError> {
        let config = tokio_postgres::Config::from_str(url)
            .map_err(|e| StoreError::Database { reason: format!("bad PostgreSQL URL: {e}") })?;
        let shown = shown(&config);
        let mut random = [0u8; 16];
        getrandom::fill(&mut random).map_err(|e| StoreError::Database {
            reason: format!("no randomness for the node's incarnation: {e}"),
        })?;
        let incarnation: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let (jobs, rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let lock_lost = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Connections {
            reads: Connection::new(config.clone(), statement_timeout),
            writes: Connection::new(config.clone(), statement_timeout),
            lock_lost: lock_lost.clone(),
        });
        let where_ = shown.clone();
        let alone = node.is_none();
        let news = tokio::sync::watch::Sender::new(0u64);
        let heard = (!alone).then(|| news.clone());
        let thread = std::thread::Builder::new()
            .name("durafiber-postgres".into())
            .spawn(move || serve(config, conns, rx, ready_tx, alone.then_some(lock_lost), heard, where_))
            .map_err(|source| StoreError::Io { path: "postgres thread".into(), source })?;
        let backend = PgBackend {
            jobs: Mutex::new(Some(jobs)),
            thread: Mutex::new(Some(thread)),
            shown,
            node,
            incarnation,
            call_timeout: statement_timeout.max(CALL_TIMEOUT).saturating_add(reconnect::RECONNECT_FOR),
            fence: RwLock::new(HashMap::new()),
            news,
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(backend),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                Err(StoreError::Database { reason: "the PostgreSQL thread ended while opening".into() })
            }
        }
    }

    /// Runs `f` on the connections' thread and waits for its answer.
    fn call<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Connections>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let timeout = self.call_timeout;
        let job: Job = Box::new(move |conns| {
            Box::pin(async move {
                let answer = match tokio::time::timeout(timeout, f(conns)).await {
                    Ok(answer) => answer,
                    Err(_) => Err(StoreError::Database {
                        reason: format!("no answer from PostgreSQL in {} s", timeout.as_secs()),
                    }),
                };
                let _ = tx.send(answer);
            })
        });
        let sent = self.jobs.lock().as_ref().ok_or(StoreError::Closed)?.send(job);
        sent.map_err(|_| StoreError::Closed)?;
        let answer = || rx.recv().map_err(|_| StoreError::Closed);
        // On a worker of a multi-threaded runtime, the worker's other tasks move to another
        // thread while this one waits: a database that stops answering must not stop the
        // runtime's timers (its self-fence deadline among them) with it. Elsewhere (the
        // store's writer thread, a single-threaded runtime) the thread just waits.
        if crate::lock::on_multi_threaded_runtime() {
            tokio::task::block_in_place(answer)?
        } else {
            answer()?
        }
    }
}

/// The connections' thread: opens the database, then runs each job as a task of its own.
fn serve(
    config: tokio_postgres::Config,
    conns: Arc<Connections>,
    mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>,
    ready: std::sync::mpsc::SyncSender<Result<(), StoreError>>,
    lock_lost: Option<Arc<AtomicBool>>,
    news: Option<tokio::sync::watch::Sender<u64>>,
    shown: String,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(source) => {
            let _ = ready.send(Err(StoreError::Io { path: "postgres runtime".into(), source }));
            return;
        }
    };
    runtime.block_on(async move {
        let owner = match prepare(&config, &conns, lock_lost, &shown).await {
            Ok(owner) => owner,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        if let Some(news) = news {
            tokio::spawn(listen(config.clone(), news));
        }
        while let Some(job) = jobs.recv().await {
            tokio::spawn(job(conns.clone()));
        }
        // Closing: the lock goes with its session.
        drop(owner);
    });
}

/// Hears other nodes say that shards changed hands (a node left, or joined), so that this one
/// looks at once instead of at its next lease tick. Only a hint: correctness never depends
/// on it. A lost session is opened again after a second.
async fn listen(config: tokio_postgres::Config, news: tokio::sync::watch::Sender<u64>) {
    loop {
        if let Ok((client, mut connection)) = config.connect(NoTls).await {
            let listening = client.batch_execute("LISTEN df_shards");
            let mut listening = std::pin::pin!(listening);
            let mut listened = false;
            loop {
                // Drive the connection (it carries the notifications) and the LISTEN together.
                let message = std::future::poll_fn(|cx| {
                    if !listened && listening.as_mut().poll(cx).is_ready() {
                        listened = true;
                    }
                    connection.poll_message(cx)
                })
                .await;
                match message {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(_))) => {
                        news.send_modify(|n| *n += 1);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                }
            }
        }
        if news.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Keys (or values), as one SQL array.
type Column = Vec<Vec<u8>>;

/// A batch reduced to each key's final state: the keys to delete, and the keys and values
/// to put.
fn final_states(batch: &Batch) -> (Column, Column, Column) {
    let mut last: BTreeMap<&[u8], Option<&[u8]>> = BTreeMap::new();
    for op in &batch.ops {
        match op {
            Op::Put { key, value } => last.insert(key, Some(value)),
            Op::Delete { key } => last.insert(key, None),
        };
    }
    let (mut gone, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for (k, v) in last {
        match v {
            Some(v) => {
                keys.push(k.to_vec());
                values.push(v.to_vec());
            }
            None => gone.push(k.to_vec()),
        }
    }
    (gone, keys, values)
}

impl Backend for PgBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let key = key.to_vec();
        self.call(move |c| async move {
            let key = &key;
            let row = reconnecting(&c.reads, |client| async move {
                client.query_opt("SELECT v FROM df_kv WHERE k = $1", &[key]).await
            })
            .await
            .map_err(Lost::into_error)?;
            Ok(row.map(|r| r.get::<_, Vec<u8>>(0)))
        })
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Entries, StoreError> {
        if start >= end || limit == 0 {
            return Ok(Vec::new());
        }
        let (start, end) = (start.to_vec(), end.to_vec());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(move |c| async move {
            let (start, end, limit) = (&start, &end, &limit);
            let rows = reconnecting(&c.reads, |client| async move {
                client
                    .query(
                        "SELECT k, v FROM df_kv WHERE k >= $1 AND k < $2 ORDER BY k LIMIT $3",
                        &[start, end, limit],
                    )
                    .await
            })
            .await
            .map_err(Lost::into_error)?;
            Ok(rows.into_iter().map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1))).collect())
        })
    }

    fn range_in_shards(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        shards: &[u32],
    ) -> Result<Entries, StoreError> {
        if start >= end || limit == 0 || shards.is_empty() {
            return Ok(Vec::new());
        }
        let (start, end) = (start.to_vec(), end.to_vec());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let shards: Vec<i32> = shards.iter().map(|s| *s as i32).collect();
        self.call(move |c| async move {
            let (start, end, limit, shards) = (&start, &end, &limit, &shards);
            let rows = reconnecting(&c.reads, |client| async move {
                client
                    .query(
                        "SELECT k, v FROM df_kv WHERE k >= $1 AND k < $2 AND shard = ANY($4) ORDER BY k LIMIT $3",
                        &[start, end, limit, shards],
                    )
                    .await
            })
            .await
            .map_err(Lost::into_error)?;
            Ok(rows.into_iter().map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1))).collect())
        })
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (gone, keys, values) = final_states(batch);
        let shards: Vec<Option<i32>> = keys.iter().map(|k| shard::of_key(k).map(|s| s as i32)).collect();
        let (fence_shards, fence_epochs) = self.fence_for(batch)?;
        let absent = batch.absent.clone();
        let node = self.node.clone();
        self.call(move |c| async move {
            if c.lock_lost.load(Ordering::SeqCst) {
                return Err(StoreError::Database {
                    reason:
                        "the session holding the store's owner lock ended; another process may own it now"
                            .into(),
                });
            }
            // A database that restarts drops every session and refuses new ones for a few
            // seconds: the group waits for it (its callers with it) rather than failing.
            let args: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
                [&gone, &keys, &values, &shards, &absent, &fence_shards, &fence_epochs, &node];
            let args = &args;
            match reconnecting(&c.writes, |client| async move { client.execute(APPLY, args).await }).await {
                Ok(_) => Ok(()),
                // A group applied just before its connection was lost finds its own inserts on
                // the next try: that is its success, not a conflict.
                Err(Lost { error: StoreError::Exists { key }, reconnected: true })
                    if own_inserts(&c.writes, &absent, &keys, &values).await =>
                {
                    tracing::debug!(key, "the write had landed before the connection was lost");
                    Ok(())
                }
                Err(lost) => Err(lost.error),
            }
        })
    }

    /// Nothing to do: every `apply` was committed with `synchronous_commit = on`.
    fn barrier(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn disk_bytes(&self) -> u64 {
        self.call(|c| async move {
            let client = c.reads.client().await?;
            let row =
                client.query_one("SELECT pg_total_relation_size('df_kv')", &[]).await.map_err(db_error)?;
            Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        })
        .unwrap_or(0)
    }

    fn location(&self) -> PathBuf {
        PathBuf::from(&self.shown)
    }

    fn leases(&self) -> Option<&dyn Leases> {
        self.node.as_ref().map(|_| self as &dyn Leases)
    }

    fn shared_limits(&self) -> Option<&dyn crate::backend::SharedLimits> {
        self.node.as_ref().map(|_| self as &dyn crate::backend::SharedLimits)
    }
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        // Ends the thread's job loop; its runtime then closes every connection, and the
        // owner lock goes with its session.
        drop(self.jobs.lock().take());
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
