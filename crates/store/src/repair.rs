//! What an operator does about a damaged or endangered store: verify it, salvage what can
//! be read into a fresh one, back it up while it serves, restore a backup.
//!
//! Every record is checked the way the runtime reads it: envelope (magic, version, CRC over
//! key and body), then decoding into the table's record type. The indexes (`open_runs`,
//! `run_keys`, `alarm_due`) carry nothing the records do not, so salvage rebuilds them from
//! the records it kept instead of trusting what survived of them. A run with any unreadable
//! record is never copied silently changed: it is listed, and it arrives `Escalated{corrupt}`.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Write},
    path::Path,
};

use serde::Serialize;

use crate::{
    barrier::Durability,
    batch::Batch,
    error::StoreError,
    store::Store,
    tables::{
        AlarmRecord, RunRecord, RunStatus, TableInfo, decode_sealed,
        keys::{self, check_record as check, run_of_key},
        printable,
    },
};

/// Records per batch when copying into a fresh store.
const COPY_BATCH_RECORDS: usize = 1_000;

/// A record that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadRecord {
    /// Its table (or `unknown` for a key of no table).
    pub table: &'static str,
    /// Its key, printable.
    pub key: String,
    /// The run it belongs to, when the key says.
    pub run_id: Option<String>,
    /// What failed.
    pub error: String,
}

/// What `verify` found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Readable records per table.
    pub records: BTreeMap<&'static str, u64>,
    /// Every record that could not be read.
    pub bad: Vec<BadRecord>,
}

impl VerifyReport {
    /// Runs with at least one unreadable record.
    pub fn damaged_runs(&self) -> BTreeSet<String> {
        self.bad.iter().filter_map(|b| b.run_id.clone()).collect()
    }
}

/// Calls `f` with every raw entry of the store, in key order, a page at a time.
fn each_entry(store: &Store, mut f: impl FnMut(&[u8], &[u8])) -> Result<(), StoreError> {
    let mut start: Vec<u8> = Vec::new();
    loop {
        let page = store.backend().range(&start, &[0xff; 16], 4_096)?;
        let Some((last, _)) = page.last() else { return Ok(()) };
        start = last.clone();
        start.push(0);
        for (k, v) in &page {
            f(k, v);
        }
        if page.len() < 4_096 {
            return Ok(());
        }
    }
}

/// Reads every record; counts the good ones per table and lists the bad ones.
pub fn verify(store: &Store) -> Result<VerifyReport, StoreError> {
    let mut report = VerifyReport::default();
    each_entry(store, |key, sealed| match TableInfo::of_key(key) {
        None => report.bad.push(BadRecord {
            table: "unknown",
            key: printable(key),
            run_id: None,
            error: "the key belongs to no table".into(),
        }),
        Some(table) => match check(table, key, sealed) {
            Ok(()) => *report.records.entry(table.name).or_default() += 1,
            Err(e) => report.bad.push(BadRecord {
                table: table.name,
                key: printable(key),
                run_id: run_of_key(key).map(str::to_string),
                error: e.to_string(),
            }),
        },
    })?;
    Ok(report)
}

/// What `salvage` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SalvageReport {
    /// Records copied per table (indexes rebuilt, not copied).
    pub copied: BTreeMap<&'static str, u64>,
    /// Runs whose own record was unreadable: gone, with every record of theirs.
    pub lost_runs: Vec<String>,
    /// Runs kept but missing a record: they arrive `Escalated{corrupt}` for a human.
    pub damaged_runs: Vec<String>,
    /// Every record that could not be read.
    pub bad: Vec<BadRecord>,
    /// The log went back in time: commits between these two sequence numbers were lost.
    pub rolled_back: Option<(u64, u64)>,
}

/// Copies every readable record of `from` into the empty store `to`, rebuilding the indexes.
/// The runs a rollback changed (see [`crate::witness`]) count as damaged: they are kept as
/// the log holds them — with the writes the log still held past a gap (`stranded`) applied —
/// and escalated for a human. Every run in `known` (the witness's, [`crate::witness::known_runs`])
/// that is not copied is listed as lost.
pub async fn salvage(
    from: &Store,
    to: &Store,
    rollback: Option<&crate::witness::Rollback>,
    known: &[String],
) -> Result<SalvageReport, StoreError> {
    let verified = verify(from)?;
    let mut damaged = verified.damaged_runs();
    damaged.extend(rollback.iter().flat_map(|r| r.runs.iter().cloned()));
    let report = SalvageReport {
        bad: verified.bad.clone(),
        rolled_back: rollback.map(|r| (r.found_seq, r.expected_seq)),
        ..Default::default()
    };
    let mut entries: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    each_entry(from, |key, sealed| {
        entries.insert(key.to_vec(), sealed.to_vec());
    })?;
    for op in rollback.iter().flat_map(|r| &r.stranded) {
        apply_op(&mut entries, op);
    }
    copy_entries(entries, to, damaged, known, report).await
}

/// The newest value of each key after `op`.
fn apply_op(entries: &mut BTreeMap<Vec<u8>, Vec<u8>>, op: &crate::batch::Op) {
    match op {
        crate::batch::Op::Put { key, value } => {
            entries.insert(key.clone(), value.clone());
        }
        crate::batch::Op::Delete { key } => {
            entries.remove(key);
        }
    }
}

/// A store whose engine (sled) cannot be opened at all, salvaged from its write-ahead log
/// alone: every record the log holds is applied in order and copied into `to` as `salvage`
/// copies; the runs whose records were only in sled are listed as lost (every run of the
/// witness that is not copied), and the runs the log touches arrive escalated, since their
/// older records may be gone.
pub async fn salvage_from_log(
    dir: &Path,
    to: &Store,
    error: &StoreError,
) -> Result<SalvageReport, StoreError> {
    let log = crate::wal::Wal::read(dir)?;
    let mut entries: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut touched = BTreeSet::new();
    for record in &log.records {
        for op in &record.ops {
            let (crate::batch::Op::Put { key, .. } | crate::batch::Op::Delete { key }) = op;
            if let Some(run) = run_of_key(key) {
                touched.insert(run.to_string());
            }
            apply_op(&mut entries, op);
        }
    }
    // A run created within what the log holds has every record there; the rest may not.
    let whole: BTreeSet<String> =
        log.records.first().filter(|first| first.lsn == 1).map(|_| touched.clone()).unwrap_or_default();
    let damaged = touched.difference(&whole).cloned().collect();
    let report = SalvageReport {
        bad: vec![BadRecord {
            table: "engine",
            key: dir.display().to_string(),
            run_id: None,
            error: error.to_string(),
        }],
        ..Default::default()
    };
    copy_entries(entries, to, damaged, &crate::witness::known_runs(dir), report).await
}

/// A record as read: its table, its key and its sealed bytes.
type Sealed = (TableInfo, Vec<u8>, Vec<u8>);

/// Readable `entries` sorted out: the run records that decode, by run id, and every other
/// record that is not an index (indexes are rebuilt from the records).
fn sorted_out(entries: BTreeMap<Vec<u8>, Vec<u8>>) -> (BTreeMap<String, RunRecord>, Vec<Sealed>) {
    let mut runs: BTreeMap<String, RunRecord> = BTreeMap::new();
    let mut kept: Vec<Sealed> = Vec::new();
    for (key, sealed) in entries {
        let Some(table) = TableInfo::of_key(&key) else { continue };
        let index = [keys::OPEN_RUNS.info(), keys::RUN_KEYS.info(), keys::ALARM_DUE.info(), keys::META];
        if check(table, &key, &sealed).is_err() || index.contains(&table) {
            continue;
        }
        if table == keys::RUNS.info()
            && let Ok(run) = decode_sealed::<RunRecord>(table, &key, &sealed)
        {
            runs.insert(run.run_id.to_string(), run);
        } else {
            kept.push((table, key, sealed));
        }
    }
    (runs, kept)
}

/// Copies readable `entries` into `to` (see [`salvage`]): indexes rebuilt, records of a run
/// without its run record dropped with it, `damaged` runs escalated, runs of `known` not
/// copied listed as lost.
async fn copy_entries(
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
    to: &Store,
    damaged: BTreeSet<String>,
    known: &[String],
    mut report: SalvageReport,
) -> Result<SalvageReport, StoreError> {
    let (runs, kept) = sorted_out(entries);
    let mut lost: BTreeSet<String> = damaged.iter().filter(|id| !runs.contains_key(*id)).cloned().collect();
    lost.extend(known.iter().filter(|id| !runs.contains_key(*id)).cloned());
    report.lost_runs = lost.into_iter().collect();
    let mut batch = Batch::new();
    for (table, key, sealed) in kept {
        // Records of a run whose own record is gone would be orphans: they go with it.
        if run_of_key(&key).is_some_and(|id| !runs.contains_key(id)) {
            continue;
        }
        if table == keys::ALARMS.info()
            && let Ok(alarm) = decode_sealed::<AlarmRecord>(table, &key, &sealed)
        {
            batch.put(keys::alarm_due(alarm.due_at_ms, &alarm.run_id, &alarm.name), &())?;
        }
        if table == keys::ALARM_RETRIES.info()
            && let Ok(retry) = decode_sealed::<AlarmRecord>(table, &key, &sealed)
        {
            let due_name = keys::retry_due_name(&retry.name, retry.scheduled_at_ms);
            batch.put(keys::alarm_due(retry.due_at_ms, &retry.run_id, &due_name), &())?;
        }
        batch.put_sealed(key, sealed);
        *report.copied.entry(table.name).or_default() += 1;
        if batch.len() >= COPY_BATCH_RECORDS {
            to.commit(std::mem::take(&mut batch), Durability::Async).await?;
        }
    }
    for (run_id, mut run) in runs {
        if damaged.contains(&run_id) {
            report.damaged_runs.push(run_id.clone());
            if !run.status.is_terminal() {
                run.status = RunStatus::Escalated { reason: "corrupt: records lost in salvage".into() };
            }
        }
        batch.put(keys::run_by_key(&run.kind, &run.key), &run.run_id)?;
        match keys::Settled::of(&run.status) {
            Some(how) => batch.put(keys::settled(how, run.updated_at_ms, &run_id), &())?,
            None => batch.put(keys::open_run(&run_id), &())?,
        };
        batch.put(keys::run(&run_id), &run)?;
        *report.copied.entry(keys::RUNS.name()).or_default() += 1;
        if batch.len() >= COPY_BATCH_RECORDS {
            to.commit(std::mem::take(&mut batch), Durability::Async).await?;
        }
    }
    to.commit(batch, Durability::Sync).await?;
    Ok(report)
}

/// A store the engine cannot open at all: nothing can be copied, so every run the
/// rollback witness knew of is listed as lost — the operator restores a backup.
pub fn salvage_unopenable(dir: &Path, error: &StoreError) -> SalvageReport {
    SalvageReport {
        lost_runs: crate::witness::known_runs(dir),
        bad: vec![BadRecord {
            table: "engine",
            key: dir.display().to_string(),
            run_id: None,
            error: error.to_string(),
        }],
        ..Default::default()
    }
}

/// The first bytes of a backup file.
const BACKUP_MAGIC: &[u8; 8] = b"DFBACKUP";
/// The backup format this build writes and reads.
const BACKUP_VERSION: u16 = 1;

/// Every entry of the store as one consistent backup: the entries are read inside the
/// writer thread, between two groups, so no commit is half in it.
pub async fn backup_bytes(store: &Store) -> Result<Vec<u8>, StoreError> {
    let entries = store.snapshot().await?;
    let mut body = Vec::new();
    body.extend_from_slice(BACKUP_MAGIC);
    body.extend_from_slice(&BACKUP_VERSION.to_le_bytes());
    body.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (k, v) in &entries {
        body.extend_from_slice(&(k.len() as u32).to_le_bytes());
        body.extend_from_slice(k);
        body.extend_from_slice(&(v.len() as u32).to_le_bytes());
        body.extend_from_slice(v);
    }
    let crc = crc32fast::hash(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    Ok(body)
}

/// Writes a backup file durably: beside `out`, synced, then renamed into place.
pub fn write_backup_file(bytes: &[u8], out: &Path) -> Result<(), StoreError> {
    let io = |source| StoreError::Io { path: out.to_path_buf(), source };
    let tmp = out.with_extension("partial");
    let mut file = crate::fsync::create_private(&tmp).map_err(io)?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(io)?;
    std::fs::rename(&tmp, out).map_err(io)?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        crate::fsync::sync_dir(parent)?;
    }
    Ok(())
}

/// [`backup_bytes`] written to `out`; returns how many entries it holds.
pub async fn backup(store: &Store, out: &Path) -> Result<u64, StoreError> {
    let bytes = backup_bytes(store).await?;
    write_backup_file(&bytes, out)?;
    Ok(read_backup_bytes(&bytes, out)?.len() as u64)
}

/// Reads a backup file, checking its checksum and every record in it.
pub fn read_backup(file: &Path) -> Result<crate::backend::Entries, StoreError> {
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| StoreError::Io { path: file.to_path_buf(), source })?;
    read_backup_bytes(&bytes, file)
}

/// Parses backup bytes (read from `file`, named in errors).
fn read_backup_bytes(bytes: &[u8], file: &Path) -> Result<crate::backend::Entries, StoreError> {
    let bad = |reason: &str| StoreError::Corrupt {
        table: "backup",
        key: file.display().to_string(),
        reason: reason.into(),
    };
    if bytes.len() < 22 || &bytes[..8] != BACKUP_MAGIC {
        return Err(bad("not a durafiber backup"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let crc = u32::from_le_bytes(crc.try_into().map_err(|_| bad("short file"))?);
    if crc32fast::hash(body) != crc {
        return Err(bad("checksum mismatch: the file is damaged or incomplete"));
    }
    let version = u16::from_le_bytes([body[8], body[9]]);
    if version != BACKUP_VERSION {
        return Err(bad(&format!("backup format version {version}, this build reads {BACKUP_VERSION}")));
    }
    let mut at = 18usize;
    let mut entries = Vec::new();
    let take = |at: &mut usize| -> Result<Vec<u8>, StoreError> {
        let len_end = at.checked_add(4).filter(|e| *e <= body.len()).ok_or_else(|| bad("truncated entry"))?;
        let len =
            u32::from_le_bytes(body[*at..len_end].try_into().map_err(|_| bad("truncated entry"))?) as usize;
        let end =
            len_end.checked_add(len).filter(|e| *e <= body.len()).ok_or_else(|| bad("truncated entry"))?;
        *at = end;
        Ok(body[len_end..end].to_vec())
    };
    while at < body.len() {
        let key = take(&mut at)?;
        let value = take(&mut at)?;
        let table = TableInfo::of_key(&key).ok_or_else(|| bad("an entry belongs to no table"))?;
        check(table, &key, &value)?;
        entries.push((key, value));
    }
    Ok(entries)
}

/// Restores a backup into the empty store `to`.
pub async fn restore(file: &Path, to: &Store) -> Result<u64, StoreError> {
    let entries = read_backup(file)?;
    let count = entries.len() as u64;
    let mut batch = Batch::new();
    for (key, value) in entries {
        batch.put_sealed(key, value);
        if batch.len() >= COPY_BATCH_RECORDS {
            to.commit(std::mem::take(&mut batch), Durability::Async).await?;
        }
    }
    to.commit(batch, Durability::Sync).await?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_has_a_decoder() {
        for &table in keys::ALL {
            let key = [&[table.prefix][..], b"run_x\0k"].concat();
            let sealed = crate::envelope::seal(&key, b"\xff\xff\xff");
            if let Err(StoreError::Corrupt { reason, .. }) = check(table, &key, &sealed) {
                assert_ne!(reason, "no such table", "{} has no decoder in verify", table.name);
            }
        }
    }
}
