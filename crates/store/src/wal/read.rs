//! Reading the log: each half as far as its records go, told apart from damage (a bad record
//! with valid records of its generation after it), the halves put in LSN order.

use std::{fs::File, os::unix::fs::FileExt, path::Path};

use crate::{error::StoreError, fsync::io};

use super::{
    HEADER_LEN, Record,
    record::{checksum, decode_payload},
};

/// A half of the log file, read a chunk at a time as the records need, each chunk as large
/// as what was read before (from 1 MiB): opening a store reads what its log holds, not the
/// whole file.
struct FileHalf<'a> {
    file: &'a File,
    /// Where the half starts in the file.
    base: u64,
    len: usize,
    read: Vec<u8>,
    failed: Option<std::io::Error>,
}

impl FileHalf<'_> {
    /// Bytes `range` of the half, read in as needed; `None` past its end or when it cannot
    /// be read (`failed` says which).
    fn bytes_at(&mut self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        if range.end > self.len || self.failed.is_some() {
            return None;
        }
        while self.read.len() < range.end {
            let have = self.read.len();
            let chunk = have.max(1 << 20).min(self.len - have);
            self.read.resize(have + chunk, 0);
            if let Err(e) = self.file.read_exact_at(&mut self.read[have..], self.base + have as u64) {
                self.failed = Some(e);
                return None;
            }
        }
        self.read.get(range)
    }
}

/// One record read at `at`: the record and where the next one starts, or `None` when the
/// bytes there are not a valid record of `generation` (any generation when `None`).
fn record_at(bytes: &mut FileHalf, at: usize, generation: Option<u64>) -> Option<(u64, Record, usize)> {
    let header: [u8; HEADER_LEN] = bytes.bytes_at(at..at.checked_add(HEADER_LEN)?)?.try_into().ok()?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let record_generation = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let lsn = u64::from_le_bytes(header[16..24].try_into().ok()?);
    if record_generation == 0 || generation.is_some_and(|g| g != record_generation) {
        return None;
    }
    let start = at + HEADER_LEN;
    let payload = bytes.bytes_at(start..start.checked_add(len)?)?;
    if checksum(record_generation, lsn, payload) != crc {
        return None;
    }
    let ops = decode_payload(payload)?;
    Some((record_generation, Record { lsn, ops }, start + len))
}

/// Where, after `from`, the next valid record of `generation` numbered above `after` starts:
/// a record past a bad one means the bad one is damage, not the end of the log.
fn next_valid(bytes: &mut FileHalf, from: usize, generation: u64, after: u64) -> Option<usize> {
    let pattern = generation.to_le_bytes();
    let mut at = from;
    loop {
        // Read the rest of the half as the search needs it.
        let end = bytes.len;
        let window = bytes.bytes_at(at..end)?;
        let found = memchr::memmem::find(window, &pattern)?;
        // The generation sits 8 bytes into a record's header.
        let candidate = (at + found).checked_sub(8);
        if let Some(start) = candidate.filter(|s| *s >= from)
            && let Some((_, record, _)) = record_at(bytes, start, Some(generation))
            && record.lsn > after
        {
            return Some(start);
        }
        at += found + 1;
    }
}

/// The records of one half: from its start, each valid, of the first record's generation,
/// and numbered one after the other. Reading stops at the first that is not — the log's end
/// after a crash: zeros, an older generation's stale records, or a record the crash cut
/// short. Unless a valid record of the same generation, numbered further on, follows it:
/// then the bad record is damage (a flipped bit, a bad sector), and reading goes on from the
/// next valid record, so that the records past it are seen and the gap in their numbers
/// refuses the open (`Engine::replay`) instead of silently ending the log there.
fn read_half(bytes: &mut FileHalf) -> Vec<Record> {
    let mut records: Vec<Record> = Vec::new();
    let mut at = 0usize;
    let mut generation = None;
    loop {
        let chained = |record: &Record, records: &[Record]| {
            records.last().is_none_or(|last| last.lsn.checked_add(1) == Some(record.lsn))
        };
        match record_at(bytes, at, generation) {
            Some((record_generation, record, next)) if chained(&record, &records) => {
                generation = Some(record_generation);
                records.push(record);
                at = next;
            }
            _ => {
                // Before the first record, the generation its header names: a damaged first
                // record is damage too when its generation's records follow.
                let header_generation = || {
                    let header = bytes.bytes_at(at..at + HEADER_LEN)?;
                    let named = u64::from_le_bytes(header[8..16].try_into().ok()?);
                    (named != 0).then_some(named)
                };
                let Some(generation) = generation.or_else(header_generation) else { break };
                let last = records.last().map_or(0, |r| r.lsn);
                match next_valid(bytes, at, generation, last) {
                    Some(next) => {
                        tracing::error!(
                            offset = at,
                            resumed_at = next,
                            after_lsn = last,
                            "the write-ahead log is damaged: valid records follow a bad one"
                        );
                        at = next;
                        // The records past the damage are read; their numbers do not follow on.
                        match record_at(bytes, at, Some(generation)) {
                            Some((_, record, next)) => {
                                records.push(record);
                                at = next;
                            }
                            None => break,
                        }
                    }
                    None => {
                        if bytes
                            .bytes_at(at..at + HEADER_LEN)
                            .is_some_and(|h| h[8..16] == generation.to_le_bytes())
                        {
                            tracing::info!(
                                offset = at,
                                "the write-ahead log ends in a record a crash cut short"
                            );
                        }
                        break;
                    }
                }
            }
        }
    }
    records
}

/// What a log file holds.
#[derive(Debug, Default)]
pub struct Contents {
    /// Its records in LSN order: the older half's, then the newer half's.
    pub records: Vec<Record>,
    /// The half the newest records are in (0 or 1), when any half holds a record.
    pub newer_half: Option<u64>,
    /// The first LSN of that half.
    pub newer_from: u64,
    /// The file's size; `None` when there is no log.
    pub size: Option<u64>,
}

/// What the log file at `path` holds: each half read only as far as its records go, the
/// older half's records first. Stale records (already in sled) are among them; the caller
/// skips those by LSN.
pub(super) fn read_log(path: &Path) -> Result<Contents, StoreError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Contents::default()),
        Err(e) => return Err(io(path)(e)),
    };
    let size = file.metadata().map_err(io(path))?.len();
    let middle = usize::try_from(size / 2).map_err(|_| {
        io(path)(std::io::Error::new(std::io::ErrorKind::InvalidData, "the log is too large to read"))
    })?;
    let mut halves = [0u64, 1].map(|i| FileHalf {
        file: &file,
        base: i * middle as u64,
        len: middle,
        read: Vec::new(),
        failed: None,
    });
    let records = halves.each_mut().map(read_half);
    if let Some(e) = halves.into_iter().find_map(|h| h.failed) {
        return Err(io(path)(e));
    }
    Ok(in_lsn_order(records, size))
}

/// The two halves' records as one log of `size` bytes, the older half's first.
fn in_lsn_order([first, second]: [Vec<Record>; 2], size: u64) -> Contents {
    let mut halves = [(0u64, first), (1u64, second)];
    halves.sort_by_key(|(_, h)| h.first().map_or(0, |r| r.lsn));
    let [(_, older), (newer_half, newer)] = halves;
    let newer_from = newer.first().map(|r| r.lsn);
    Contents {
        newer_half: newer_from.map(|_| newer_half),
        newer_from: newer_from.unwrap_or(0),
        records: older.into_iter().chain(newer).collect(),
        size: Some(size),
    }
}
