//! The rollback witness. sled's log recovery stops at the first damaged message and drops
//! everything after it *without an error*: a flipped byte in the log can take a store back
//! in time, and every run written since would silently be older. Two things catch it:
//!
//! - every group commit also writes a commit sequence number (`meta`/`commit_seq`) in the
//!   same atomic write, so the store knows how far it got;
//! - a clean close writes `durafiber.witness` beside the store: that number, and a digest
//!   of each run's records.
//!
//! Opening a store whose sequence number is below the witness's is refused with
//! [`StoreError::RolledBack`], naming every run whose records differ from the witness — the
//! runs the lost log tail changed. Writes after the last clean close are not covered: a
//! backup is.

use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

pub use crate::backend::Rollback;
use crate::{
    backend::Backend,
    codec, envelope,
    error::StoreError,
    tables::{Key, keys},
};

/// The key of the commit sequence number.
pub fn seq_key() -> Key<u64> {
    keys::meta("commit_seq")
}

/// The witness file's name in the data directory.
const FILE: &str = "durafiber.witness";
/// The envelope key the witness is sealed under.
const SEAL_KEY: &[u8] = b"durafiber.witness";

#[derive(Debug, Serialize, Deserialize)]
struct Witness {
    commit_seq: u64,
    /// Run id → CRC-32 of its records (keys and sealed values, in key order).
    runs: BTreeMap<String, u32>,
}

/// The commit sequence number the store holds (0 for a new store).
pub fn stored_seq(backend: &dyn Backend) -> Result<u64, StoreError> {
    match backend.get(seq_key().as_bytes())? {
        None => Ok(0),
        Some(sealed) => {
            let body = envelope::open(keys::META.name, seq_key().as_bytes(), &sealed)?;
            codec::decode::<u64>(body).map_err(|reason| StoreError::Corrupt {
                table: keys::META.name,
                key: seq_key().printable(),
                reason: reason.to_string(),
            })
        }
    }
}

/// Entries read at a time: a store of millions of records is digested without holding it
/// all in memory.
const PAGE: usize = 10_000;

fn digests(backend: &dyn Backend) -> Result<BTreeMap<String, u32>, StoreError> {
    let mut hashers: BTreeMap<String, crc32fast::Hasher> = BTreeMap::new();
    let end = [0xffu8; 16];
    let mut start = Vec::new();
    loop {
        let page = backend.range(&start, &end, PAGE)?;
        for (key, value) in &page {
            if let Some(run) = keys::run_of_key(key) {
                let h = hashers.entry(run.to_string()).or_default();
                h.update(key);
                h.update(value);
            }
        }
        match page.last() {
            Some((last, _)) if page.len() == PAGE => {
                start = last.clone();
                start.push(0); // the first key after it
            }
            _ => break,
        }
    }
    Ok(hashers.into_iter().map(|(run, h)| (run, h.finalize())).collect())
}

/// Writes the witness of a cleanly closed store.
pub fn write(dir: &Path, backend: &dyn Backend) -> Result<(), StoreError> {
    let witness = Witness { commit_seq: stored_seq(backend)?, runs: digests(backend)? };
    let body = codec::encode(&witness)
        .map_err(|reason| StoreError::Encode { table: "witness", reason: reason.to_string() })?;
    let path = dir.join(FILE);
    let tmp = dir.join(format!("{FILE}.partial"));
    let io = |source| StoreError::Io { path: path.clone(), source };
    {
        use std::io::Write as _;
        let mut file = crate::fsync::create_private(&tmp).map_err(io)?;
        file.write_all(&envelope::seal(SEAL_KEY, &body)).map_err(io)?;
    }
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    crate::fsync::sync_dir(dir)
}

/// Every run the witness knows of (at the last clean close): what a store that cannot be
/// read at all has lost.
pub fn known_runs(dir: &Path) -> Vec<String> {
    let Ok(sealed) = std::fs::read(dir.join(FILE)) else { return Vec::new() };
    envelope::open("witness", SEAL_KEY, &sealed)
        .ok()
        .and_then(|b| codec::decode::<Witness>(b).ok())
        .map(|w| w.runs.into_keys().collect())
        .unwrap_or_default()
}

/// Compares the store with its witness; `Some` when the store went back in time.
pub fn check(dir: &Path, backend: &dyn Backend) -> Result<Option<Rollback>, StoreError> {
    let Ok(sealed) = std::fs::read(dir.join(FILE)) else { return Ok(None) };
    // A damaged witness proves nothing either way: say so, and carry on.
    let witness = match envelope::open("witness", SEAL_KEY, &sealed).and_then(|b| {
        codec::decode::<Witness>(b).map_err(|reason| StoreError::Corrupt {
            table: "witness",
            key: FILE.into(),
            reason: reason.to_string(),
        })
    }) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "the rollback witness is unreadable; not checked");
            return Ok(None);
        }
    };
    let found_seq = stored_seq(backend)?;
    if found_seq > witness.commit_seq {
        // Written since the clean close: the witness no longer describes the store.
        return Ok(None);
    }
    // Behind the witness, the log lost its tail. Level with it, nothing was written since
    // the clean close, so every run must be as the witness saw it: sled can also drop a
    // damaged message from the middle of its log and keep the later ones, commit number
    // included. One pass over the store, as the clean close made one to write the witness.
    let now = digests(backend)?;
    let mut runs: Vec<String> =
        witness.runs.iter().filter(|(id, d)| now.get(*id) != Some(d)).map(|(id, _)| id.clone()).collect();
    runs.extend(now.keys().filter(|id| !witness.runs.contains_key(*id)).cloned());
    runs.sort();
    runs.dedup();
    if found_seq == witness.commit_seq && runs.is_empty() {
        return Ok(None);
    }
    Ok(Some(Rollback { expected_seq: witness.commit_seq, found_seq, runs, stranded: Vec::new() }))
}
