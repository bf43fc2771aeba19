//! Each run's own key-value storage, the Durable Object way (`ctx.storage()`): typed values
//! under string keys, read back in key order, written in all-or-nothing transactions.
//!
//! A write is applied at once (every later read of the run sees it) and rides the store's
//! group commit as an `Async` batch: the run's next boundary of any kind — or `sync()` —
//! runs a barrier that covers it. A crash loses at most the writes since then, and always
//! whole transactions, never part of one. Writes of one run are serialized by the run's
//! storage lock, which also keeps its key count.
//!
//! Each write also keeps, per key, what the key held before the run's first write to it after
//! the last boundary (`storage_undo`), for the boundaries the run's history keeps: undone back
//! to a boundary, they give the storage as it was there, which a fork of the run starts with
//! ([`as_at`]). A run's storage history is whole from the boundary its `storage_logs` record
//! names: its first write's (0 when its storage was empty), so a run whose storage was
//! written before histories were kept cannot be forked to a boundary before that.
//!
//! A write is not part of the stash that follows it: it may be durable before that stash is
//! (another run's barrier covers it; on PostgreSQL every write is durable once applied). A
//! fiber re-entered at a stash can find storage written after it, before the crash. So what
//! a re-entry reads to rebuild its place — an effect's arguments, say — is keyed by the step
//! it belongs to and never rewritten (`examples/model_agent.rs` keeps one transcript a turn).

use durafiber_store::RunId;
use std::collections::BTreeMap;

use durafiber_store::{
    Batch, Durability, Store,
    tables::{StorageUndo, keys},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    error::{AgentError, RuntimeError},
    json,
    kernel::cell::RunCell,
    kernel::shared::Shared,
    limits,
};

fn check_key(key: &str) -> Result<(), AgentError> {
    if key.is_empty() {
        return Err(AgentError::fail("a storage key is empty"));
    }
    if key.len() > limits::STORAGE_KEY_BYTES_MAX {
        return Err(AgentError::StorageLimit {
            what: "key bytes",
            size: key.len(),
            max: limits::STORAGE_KEY_BYTES_MAX,
        });
    }
    Ok(())
}

fn read_json(store: &Store, run_id: &RunId, key: &str) -> Result<Option<String>, AgentError> {
    Ok(store.get::<String>(&keys::storage(run_id, key))?)
}

/// One page of a run's storage under `prefix`, after `start_after`, in key order: the keys
/// (without the run's part) and their values as JSON text. Shared with inspection.
pub(crate) fn list_json(
    store: &Store,
    run_id: &RunId,
    prefix: &str,
    start_after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, String)>, RuntimeError> {
    let after = start_after.map(|k| keys::storage(run_id, k));
    let limit = limit.min(limits::STORAGE_LIST_MAX);
    let rows = store.scan(&keys::storage_from(run_id, prefix), after.as_ref(), limit)?;
    let mut out = Vec::with_capacity(rows.len());
    for (key, value) in rows {
        let name = keys::storage_name(&key).unwrap_or_default().to_string();
        out.push((name, value?));
    }
    Ok(out)
}

/// A run's storage, from [`crate::Ctx::storage`].
///
/// ```
/// # use durafiber_runtime::{Agent, AgentError, Ctx};
/// # struct Tally;
/// # impl Agent for Tally {
/// #     const KIND: &'static str = "tally";
/// #     type Input = ();
/// #     type Stash = ();
/// #     type Output = u64;
/// #     type Message = String;
/// async fn on_message(&self, ctx: &mut Ctx<Self>, vote: String) -> Result<(), AgentError> {
///     let key = format!("votes/{vote}");
///     ctx.storage()
///         .transaction(|txn| {
///             let n: u64 = txn.get(&key)?.unwrap_or(0);
///             txn.put(&key, &(n + 1))
///         })
///         .await
/// }
/// #     async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u64, AgentError> {
/// #         Ok(ctx.storage().list::<u64>("votes/", None, 100)?.iter().map(|(_, n)| n).sum())
/// #     }
/// # }
/// ```
pub struct Storage<'a> {
    shared: &'a Shared,
    cell: &'a RunCell,
}

impl<'a> Storage<'a> {
    pub(crate) fn new(shared: &'a Shared, cell: &'a RunCell) -> Self {
        Storage { shared, cell }
    }

    fn run_id(&self) -> &RunId {
        &self.cell.run_id
    }

    /// The value under `key`, or `None`.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, AgentError> {
        check_key(key)?;
        read_json(&self.shared.store, self.run_id(), key)?
            .map(|text| json::parse(&text).map_err(|e| AgentError::Serialization(e.into())))
            .transpose()
    }

    /// The values under `keys` that exist, by key.
    pub fn get_many<T: DeserializeOwned>(&self, keys: &[&str]) -> Result<BTreeMap<String, T>, AgentError> {
        let mut found = BTreeMap::new();
        for key in keys {
            if let Some(value) = self.get(key)? {
                found.insert(key.to_string(), value);
            }
        }
        Ok(found)
    }

    /// Up to `limit` entries (at most `limits::STORAGE_LIST_MAX`) whose keys start with
    /// `prefix`, in key order, after `start_after` when given: page with the last key.
    pub fn list<T: DeserializeOwned>(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, T)>, AgentError> {
        list_json(&self.shared.store, self.run_id(), prefix, start_after, limit)?
            .into_iter()
            .map(|(key, text)| {
                Ok((key, json::parse(&text).map_err(|e| AgentError::Serialization(e.into()))?))
            })
            .collect()
    }

    /// Writes `value` under `key`.
    pub async fn put<T: Serialize>(&self, key: &str, value: &T) -> Result<(), AgentError> {
        self.transaction(|txn| txn.put(key, value)).await
    }

    /// Deletes `key`; true when it was there.
    pub async fn delete(&self, key: &str) -> Result<bool, AgentError> {
        self.transaction(|txn| {
            let had = txn.contains(key)?;
            txn.delete(key)?;
            Ok(had)
        })
        .await
    }

    /// Runs `f` over a transaction and writes what it staged as one batch: all of it or,
    /// when `f` fails (or a limit is passed), none. Reads inside see the staged writes.
    pub async fn transaction<R>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<R, AgentError>,
    ) -> Result<R, AgentError> {
        let shared = self.shared;
        let mut keys_cached = self.cell.storage_keys().lock().await;
        if shared.life.is_closed() {
            return Err(RuntimeError::ShuttingDown.into());
        }
        shared.check_not_evicted(self.cell)?;
        let mut txn = Transaction { store: &shared.store, run_id: self.run_id(), staged: BTreeMap::new() };
        let out = f(&mut txn)?;
        if txn.staged.is_empty() {
            return Ok(out);
        }
        let mut batch = Batch::new();
        let keeps_history = shared.config.history_max > 0;
        let boundary = self.cell.seq.load(std::sync::atomic::Ordering::SeqCst);
        let keys = match *keys_cached {
            Some(n) => n,
            None => self.count_keys(boundary, &mut batch)?,
        };
        let mut keys_after = keys;
        let mut undo_written = false;
        for (key, value) in &txn.staged {
            let before = read_json(&shared.store, self.run_id(), key)?;
            let existed = before.is_some();
            let undo = keys::storage_undo(self.run_id(), boundary, key);
            if keeps_history && shared.store.get(&undo)?.is_none() {
                batch.put(undo, &StorageUndo { before })?;
                undo_written = true;
            }
            let full_key = keys::storage(self.run_id(), key);
            match value {
                Some(text) => {
                    keys_after += usize::from(!existed);
                    batch.put(full_key, &shared.obs.redact(text.clone()))?;
                }
                None => {
                    keys_after = keys_after.saturating_sub(usize::from(existed));
                    batch.delete(full_key);
                }
            }
        }
        // Only a write that adds to the history looks for what it no longer needs.
        if undo_written {
            forget_undone_before(shared, self.run_id(), boundary, &mut batch)?;
        }
        let max = shared.config.storage_keys_max;
        if keys_after > keys && keys_after > max {
            return Err(AgentError::StorageLimit { what: "keys in the run", size: keys_after, max });
        }
        let durability = if shared.config.storage_writes_sync { Durability::Sync } else { Durability::Async };
        shared.store.commit(batch, durability).await?;
        *keys_cached = Some(keys_after);
        tracing::debug!(
            run_id = %self.run_id(),
            writes = txn.staged.len(),
            keys = keys_after,
            "storage written"
        );
        Ok(out)
    }

    /// The run's storage keys, counted at its first write of this activation; that write
    /// starts the storage's history at `boundary` when it has none yet.
    fn count_keys(&self, boundary: u64, batch: &mut Batch) -> Result<usize, AgentError> {
        let store = &self.shared.store;
        let n = store.keys_and_sizes(&keys::STORAGE.of_run(self.run_id()), usize::MAX)?.len();
        let log = keys::storage_log(self.run_id());
        if self.shared.config.history_max > 0 && store.get(&log)?.is_none() {
            batch.put(log, &if n == 0 { 0 } else { boundary })?;
        }
        Ok(n)
    }

    /// Returns once every storage write of the run so far is durable.
    pub async fn sync(&self) -> Result<(), AgentError> {
        Ok(self.shared.store.barrier().await?)
    }
}

/// How many of a run's oldest history entries a write looks at to forget.
const UNDO_FORGET_MAX: usize = 16;

/// Stages the removal of the run's oldest history entries that no boundary its history keeps
/// needs any more: those of boundaries more than `history_max` before `boundary`.
fn forget_undone_before(
    shared: &Shared,
    run_id: &RunId,
    boundary: u64,
    batch: &mut Batch,
) -> Result<(), AgentError> {
    let kept = u64::from(shared.config.history_max).saturating_add(1);
    let Some(oldest_needed) = boundary.checked_sub(kept) else { return Ok(()) };
    for key in shared.store.keys_in(&keys::STORAGE_UNDO.of_run(run_id), None, UNDO_FORGET_MAX, None)? {
        match keys::storage_undo_parts(&key) {
            Some((seq, _)) if seq < oldest_needed => {
                batch.delete(key);
            }
            _ => break,
        }
    }
    Ok(())
}

/// A run's storage: each key's value.
pub(crate) type Entries = BTreeMap<String, String>;

/// The storage of `run_id` as it was at boundary `at`, by key: today's, with every write
/// made after `at` undone. `Err` with the reason when the history cannot tell (the run's
/// storage was written before it kept one, from a later boundary).
pub(crate) fn as_at(store: &Store, run_id: &RunId, at: u64) -> Result<Entries, AsAtError> {
    let mut storage = Entries::new();
    for (key, value) in store.scan(&keys::STORAGE.of_run(run_id), None, usize::MAX)? {
        storage.insert(keys::storage_name(&key).unwrap_or_default().to_string(), value?);
    }
    let undone = store.scan(&keys::STORAGE_UNDO.of_run(run_id), None, usize::MAX)?;
    if storage.is_empty() && undone.is_empty() {
        return Ok(storage);
    }
    match store.get(&keys::storage_log(run_id))? {
        Some(whole_from) if whole_from <= at => {}
        Some(whole_from) => {
            return Err(AsAtError::Unknown(format!(
                "its storage was written before it kept a history; that history is whole from boundary {whole_from}"
            )));
        }
        None => return Err(AsAtError::Unknown("its storage was written before it kept a history".into())),
    }
    // The first write to a key after `at` holds what the key held at `at`.
    let mut seen = std::collections::BTreeSet::new();
    for (key, undo) in undone {
        let Some((seq, name)) = keys::storage_undo_parts(&key) else { continue };
        if seq < at || !seen.insert(name.to_string()) {
            continue;
        }
        match undo?.before {
            Some(before) => storage.insert(name.to_string(), before),
            None => storage.remove(name),
        };
    }
    Ok(storage)
}

/// Why [`as_at`] gives no storage.
#[derive(Debug)]
pub(crate) enum AsAtError {
    /// The history cannot tell, for this reason.
    Unknown(String),
    /// The store failed.
    Store(durafiber_store::StoreError),
}

impl From<durafiber_store::StoreError> for AsAtError {
    fn from(e: durafiber_store::StoreError) -> Self {
        AsAtError::Store(e)
    }
}

/// The writes of one [`Storage::transaction`], staged until it returns.
pub struct Transaction<'a> {
    store: &'a Store,
    run_id: &'a RunId,
    /// Key → new value as JSON text, or `None` for a delete.
    staged: BTreeMap<String, Option<String>>,
}

impl Transaction<'_> {
    /// The value under `key` as this transaction sees it.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, AgentError> {
        check_key(key)?;
        let text = match self.staged.get(key) {
            Some(staged) => staged.clone(),
            None => read_json(self.store, self.run_id, key)?,
        };
        text.map(|t| json::parse(&t).map_err(|e| AgentError::Serialization(e.into()))).transpose()
    }

    /// Whether `key` holds a value, as this transaction sees it.
    pub fn contains(&self, key: &str) -> Result<bool, AgentError> {
        check_key(key)?;
        match self.staged.get(key) {
            Some(staged) => Ok(staged.is_some()),
            None => Ok(read_json(self.store, self.run_id, key)?.is_some()),
        }
    }

    /// Stages `value` under `key`.
    pub fn put<T: Serialize>(&mut self, key: &str, value: &T) -> Result<(), AgentError> {
        check_key(key)?;
        let text = json::canonical(value).map_err(|e| AgentError::Serialization(e.into()))?;
        if text.len() > limits::STORAGE_VALUE_BYTES_MAX {
            return Err(AgentError::StorageLimit {
                what: "value bytes",
                size: text.len(),
                max: limits::STORAGE_VALUE_BYTES_MAX,
            });
        }
        self.staged.insert(key.to_string(), Some(text));
        Ok(())
    }

    /// Stages the deletion of `key`.
    pub fn delete(&mut self, key: &str) -> Result<(), AgentError> {
        check_key(key)?;
        self.staged.insert(key.to_string(), None);
        Ok(())
    }
}
