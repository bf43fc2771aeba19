//! The write-ahead log in front of sled: one durable write of one pre-written file per barrier.
//!
//! sled makes a batch durable with two trips to the disk (it writes and `sync_file_range`s
//! its buffer before *and* after every atomic batch), and only an `fdatasync` after that
//! reaches the disk's cache flush. Here a batch is encoded into this log and kept in memory
//! (`memtable.rs`); a barrier writes the new records once, durably: a direct write
//! where the filesystem takes one (`direct.rs`), else a `pwrite` and an `fdatasync`.
//! sled receives the batches a whole log half at a time, from a checkpoint thread. After a
//! crash, opening the store applies the records sled lacks.
//!
//! Why a re-apply is safe: each record carries a log sequence number (LSN), and every
//! checkpoint writes into sled, after its keys, the LSN of the last record it covers
//! (`meta`/`wal_lsn`). sled recovers a prefix of its writes, so that LSN is there only with
//! every key before it. Replaying the records after it, in order, rewrites every key a
//! checkpoint cut short touched and yields the state after the last durable record —
//! never a mix of an old and a new batch.
//!
//! The file has a fixed size, two halves, and is written full of zeros when created, so a
//! barrier never changes its length or allocates blocks: its sync flushes data, no
//! metadata. Records go into one half until it is full; then the log moves to the other
//! half, once the checkpoint of what that half held is complete, under a new random
//! *generation*. Reading a half stops at a record of another generation (stale), at a
//! checksum that fails (a write torn by the crash), or at a break in the LSNs — unless a
//! valid record of the same generation follows further on: that is damage, and the records
//! past it are read, so that the open sees their gap and refuses with the runs they hold.
//!
//! Record layout, little endian:
//! ```text
//! payload_len u32 | crc32 u32 (of generation, lsn, payload) | generation u64 | lsn u64 | payload
//! payload: ops u32, then per op: tag u8 (0 put, 1 delete) | key_len u32 | key [| value_len u32 | value]
//! ```

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

mod read;
mod record;

pub use read::Contents;
use read::read_log;
use record::{checksum, encode_payload};

use crate::{
    batch::Op,
    direct::{self, DirectFile},
    error::StoreError,
    fsync::io,
};

/// The log's file name in the data directory.
pub const FILE: &str = "durafiber.wal";
/// Bytes of the log file by default (two halves): sled receives a checkpoint every half.
pub const DEFAULT_BYTES: u64 = 16 * 1024 * 1024;
/// The smallest log accepted.
pub const MIN_BYTES: u64 = 128 * 1024;
const HEADER_LEN: usize = 24;
const PUT: u8 = 0;
const DELETE: u8 = 1;

/// One logged batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Its log sequence number.
    pub lsn: u64,
    /// Its writes, in order.
    pub ops: Vec<Op>,
}

/// The open log: which half is written, where the next record goes, and what is encoded
/// but not yet written.
pub(crate) struct Wal {
    file: File,
    path: PathBuf,
    half_bytes: u64,
    /// The half being written: 0 or 1.
    half: u64,
    generation: u64,
    /// Where the next write starts, within the half.
    offset: u64,
    /// Records encoded since the last sync.
    pending: Vec<u8>,
    /// The file opened for direct writes, when its filesystem takes them and the halves
    /// start on a block; otherwise the log writes through the page cache.
    direct: Option<DirectFile>,
}

/// Whether [`Wal::append`] took the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Logged; durable at the next sync.
    Logged,
    /// It does not fit in what is left of this half: nothing was added.
    Full,
}

/// A generation no earlier log used: random, never 0 (the zeros of a fresh file).
fn new_generation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// Writes a zeroed log file of `capacity` bytes in place of any other, durably.
fn create(dir: &Path, path: &Path, capacity: u64) -> Result<File, StoreError> {
    let tmp = dir.join(format!("{FILE}.partial"));
    {
        let mut f = crate::fsync::create_private(&tmp).map_err(io(&tmp))?;
        let zeros = vec![0u8; 1024 * 1024];
        let mut left = capacity;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            f.write_all(&zeros[..n]).map_err(io(&tmp))?;
            left -= n as u64;
        }
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    crate::fsync::sync_dir(dir)?;
    OpenOptions::new().read(true).write(true).open(path).map_err(io(path))
}

impl Wal {
    /// What the log in `dir` holds (nothing when there is no log), for the caller to
    /// re-apply what sled lacks before it opens the log for writing.
    pub fn read(dir: &Path) -> Result<Contents, StoreError> {
        read_log(&dir.join(FILE))
    }

    /// The file's size for a log of `capacity` bytes.
    pub fn file_size(capacity: u64) -> u64 {
        capacity.max(MIN_BYTES) / 2 * 2
    }

    /// Opens the log in `dir` for writing, creating it when missing or of another size.
    /// Writing starts in half `half` under a new generation: the caller has put every
    /// record that half held into sled, and every record of the other half too unless the
    /// file keeps its size (then the other half is written again only after a checkpoint).
    pub fn open(dir: &Path, capacity: u64, half: u64) -> Result<Wal, StoreError> {
        let path = dir.join(FILE);
        let capacity = Wal::file_size(capacity);
        let size = std::fs::metadata(&path).map(|m| m.len()).ok();
        let file = if size == Some(capacity) {
            OpenOptions::new().read(true).write(true).open(&path).map_err(io(&path))?
        } else {
            create(dir, &path, capacity)?
        };
        let half_bytes = capacity / 2;
        let direct = match half_bytes % direct::BLOCK as u64 {
            0 => DirectFile::open(&path).map_err(io(&path))?,
            _ => None,
        };
        if direct.is_none() {
            tracing::info!(path = %path.display(), "the write-ahead log writes through the page cache");
        }
        Ok(Wal {
            file,
            path,
            half_bytes,
            half: half.min(1),
            generation: new_generation(),
            offset: 0,
            pending: Vec::new(),
            direct,
        })
    }

    /// Adds a record of `ops` under `lsn`, durable at the next [`Wal::sync`], if it fits in
    /// what is left of this half.
    pub fn append(&mut self, lsn: u64, ops: &[Op]) -> Appended {
        let start = self.pending.len();
        self.pending.extend_from_slice(&[0u8; HEADER_LEN]);
        encode_payload(ops, &mut self.pending);
        let end = self.offset.saturating_add(self.pending.len() as u64);
        let len = u32::try_from(self.pending.len() - start - HEADER_LEN);
        let (Ok(len), true) = (len, end <= self.half_bytes) else {
            self.pending.truncate(start);
            return Appended::Full;
        };
        let crc = checksum(self.generation, lsn, &self.pending[start + HEADER_LEN..]);
        let header = &mut self.pending[start..start + HEADER_LEN];
        header[0..4].copy_from_slice(&len.to_le_bytes());
        header[4..8].copy_from_slice(&crc.to_le_bytes());
        header[8..16].copy_from_slice(&self.generation.to_le_bytes());
        header[16..24].copy_from_slice(&lsn.to_le_bytes());
        Appended::Logged
    }

    /// Writes the pending records and makes them durable: one direct `pwrite`, or one
    /// `pwrite` and one `fdatasync` through the page cache.
    pub fn sync(&mut self) -> Result<(), StoreError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let at = self.half * self.half_bytes + self.offset;
        match self.direct.as_mut().map(|file| file.write(at, &self.pending)) {
            Some(Ok(())) => {}
            Some(Err(e)) if direct::refused(&e) => {
                tracing::warn!(path = %self.path.display(), error = %e,
                    "direct writes refused; the write-ahead log writes through the page cache from now on");
                self.direct = None;
                self.write_buffered(at)?;
            }
            Some(Err(e)) => return Err(io(&self.path)(e)),
            None => self.write_buffered(at)?,
        }
        self.offset += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// The half being written.
    #[cfg(test)]
    pub fn half(&self) -> u64 {
        self.half
    }

    /// Whether the half being written holds at least `1 / share` of its bytes.
    pub fn filled_past(&self, share: u64) -> bool {
        self.offset + self.pending.len() as u64 >= self.half_bytes / share.max(1)
    }

    /// Bytes of the log file.
    pub fn file_bytes(&self) -> u64 {
        2 * self.half_bytes
    }

    /// Moves to the other half, from its start, under a new generation. The caller has
    /// synced this half, and sled holds everything the other half logged.
    pub fn switch(&mut self) {
        self.half = 1 - self.half;
        self.generation = new_generation();
        self.offset = 0;
        self.pending.clear();
        if let Some(file) = &mut self.direct {
            file.restart();
        }
    }

    /// The pending records at `at` through the page cache, then `fdatasync`.
    fn write_buffered(&self, at: u64) -> Result<(), StoreError> {
        self.file.write_all_at(&self.pending, at).map_err(io(&self.path))?;
        self.file.sync_data().map_err(io(&self.path))
    }

    /// Whether the log's writes bypass the page cache.
    #[cfg(test)]
    pub fn writes_direct(&self) -> bool {
        self.direct.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(i: u8) -> Vec<Op> {
        vec![Op::Put { key: vec![b'w', i], value: vec![i; 3] }, Op::Delete { key: vec![b'w', i, 1] }]
    }

    fn lsns(dir: &Path) -> Vec<u64> {
        Wal::read(dir).expect("read").records.iter().map(|r| r.lsn).collect()
    }

    /// The records of a log file holding `bytes`.
    fn records_of(bytes: &[u8]) -> Vec<Record> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE), bytes).expect("write");
        Wal::read(dir.path()).expect("read").records
    }

    #[test]
    fn records_round_trip_and_reading_stops_at_a_torn_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(Wal::read(dir.path()).expect("read").records.is_empty());
        let mut wal = Wal::open(dir.path(), MIN_BYTES, 0).expect("open");
        for lsn in 1..=3 {
            assert_eq!(wal.append(lsn, &ops(lsn as u8)), Appended::Logged);
        }
        wal.sync().expect("sync");
        let bytes = std::fs::read(dir.path().join(FILE)).expect("read");
        let records = records_of(&bytes);
        assert_eq!(records.iter().map(|r| r.lsn).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(records[1].ops, ops(2));

        // A flipped byte in the third record ends the log after the second.
        let mut torn = bytes.clone();
        let record_len = HEADER_LEN + 4 + (1 + 4 + 2 + 4 + 3) + (1 + 4 + 3);
        torn[2 * record_len + HEADER_LEN + 2] ^= 0x40;
        assert_eq!(records_of(&torn).len(), 2);
    }

    #[test]
    fn the_halves_are_read_in_lsn_order_and_a_rewritten_half_hides_its_stale_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::open(dir.path(), MIN_BYTES, 0).expect("open");
        let mut lsn = 0;
        // Fill half 0, then write three records into half 1.
        while wal.append(lsn + 1, &ops(1)) == Appended::Logged {
            lsn += 1;
        }
        wal.sync().expect("sync");
        let first_half = lsn;
        wal.switch();
        for _ in 0..3 {
            lsn += 1;
            assert_eq!(wal.append(lsn, &ops(2)), Appended::Logged);
        }
        wal.sync().expect("sync");
        assert_eq!(lsns(dir.path()), (1..=lsn).collect::<Vec<_>>());
        // Back in half 0: its one new record comes after half 1's; the older records
        // behind it are of another generation and end the reading.
        wal.switch();
        lsn += 1;
        assert_eq!(wal.append(lsn, &ops(3)), Appended::Logged);
        wal.sync().expect("sync");
        assert_eq!(lsns(dir.path()), vec![first_half + 1, first_half + 2, first_half + 3, lsn]);
    }

    #[test]
    fn records_synced_one_at_a_time_read_back_whole_across_blocks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::open(dir.path(), MIN_BYTES, 0).expect("open");
        assert!(wal.writes_direct(), "the test directory's filesystem takes direct writes");
        let sized = |lsn: u64| {
            vec![Op::Put { key: lsn.to_be_bytes().to_vec(), value: vec![lsn as u8; lsn as usize * 7 % 900] }]
        };
        for lsn in 1..=120 {
            assert_eq!(wal.append(lsn, &sized(lsn)), Appended::Logged);
            wal.sync().expect("sync");
        }
        let records = Wal::read(dir.path()).expect("read").records;
        assert_eq!(records.len(), 120);
        assert!(records.iter().zip(1..).all(|(r, lsn)| r.lsn == lsn && r.ops == sized(lsn)));
    }

    #[test]
    fn a_log_whose_halves_start_within_a_block_writes_through_the_page_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::open(dir.path(), MIN_BYTES + 2 * 1000, 0).expect("open");
        assert!(!wal.writes_direct());
        for lsn in 1..=3 {
            assert_eq!(wal.append(lsn, &ops(lsn as u8)), Appended::Logged);
            wal.sync().expect("sync");
        }
        wal.switch();
        assert_eq!(wal.append(4, &ops(4)), Appended::Logged);
        wal.sync().expect("sync");
        assert_eq!(lsns(dir.path()), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_record_larger_than_a_half_never_fits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::open(dir.path(), MIN_BYTES, 0).expect("open");
        let big = [Op::Put { key: vec![b'w'], value: vec![0; 70_000] }];
        assert_eq!(wal.append(1, &big), Appended::Full);
        wal.switch();
        assert_eq!(wal.append(1, &big), Appended::Full);
        assert_eq!(wal.append(1, &ops(1)), Appended::Logged);
    }

    #[test]
    fn a_log_read_a_chunk_at_a_time_yields_every_record_and_reads_past_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Halves of 4 MiB: a megabyte and a half of records spans two chunks of the first.
        let mut wal = Wal::open(dir.path(), 8 << 20, 0).expect("open");
        let big = |i: u64| vec![Op::Put { key: i.to_be_bytes().to_vec(), value: vec![i as u8; 1000] }];
        for lsn in 1..=1_500 {
            assert_eq!(wal.append(lsn, &big(lsn)), Appended::Logged);
        }
        wal.sync().expect("sync");
        let read = Wal::read(dir.path()).expect("read");
        assert_eq!(read.records.len(), 1_500);
        assert!(read.records.iter().zip(1..).all(|(r, lsn)| r.lsn == lsn && r.ops == big(lsn)));
        assert_eq!((read.newer_half, read.size), (Some(0), Some(8 << 20)));

        // Bytes damaged where the second chunk begins, with valid records after them: the
        // damaged record is missing, and every record past it is read, with a gap in the
        // numbers that the open refuses.
        let file = OpenOptions::new().write(true).open(dir.path().join(FILE)).expect("open");
        file.write_all_at(&[0xff; 8], 1 << 20).expect("damage");
        let damaged = Wal::read(dir.path()).expect("read").records;
        assert_eq!(damaged.len(), 1_499, "one record lost to the damage");
        let gap = damaged.windows(2).position(|w| w[1].lsn != w[0].lsn + 1).expect("a gap");
        assert!(gap > 1_000, "the damage is past the first chunk: {gap}");
        assert_eq!(damaged[..=gap], read.records[..=gap]);
        assert_eq!(damaged[gap + 1..], read.records[gap + 2..]);
    }

    #[test]
    fn a_bad_first_record_followed_by_valid_ones_is_damage_and_a_bad_last_one_is_the_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::open(dir.path(), MIN_BYTES, 0).expect("open");
        for lsn in 1..=5 {
            assert_eq!(wal.append(lsn, &ops(lsn as u8)), Appended::Logged);
        }
        wal.sync().expect("sync");
        let bytes = std::fs::read(dir.path().join(FILE)).expect("read");
        let record_len = HEADER_LEN + 4 + (1 + 4 + 2 + 4 + 3) + (1 + 4 + 3);
        // The first record's payload damaged: the four after it are read.
        let mut first = bytes.clone();
        first[HEADER_LEN + 3] ^= 0x01;
        assert_eq!(records_of(&first).iter().map(|r| r.lsn).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
        // The last record's: the log ends after the fourth, as after a torn write.
        let mut last = bytes.clone();
        last[4 * record_len + HEADER_LEN + 3] ^= 0x01;
        assert_eq!(records_of(&last).iter().map(|r| r.lsn).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        // A middle record's length field damaged: the records after it are still found.
        let mut length = bytes;
        length[2 * record_len] ^= 0x04;
        assert_eq!(records_of(&length).iter().map(|r| r.lsn).collect::<Vec<_>>(), vec![1, 2, 4, 5]);
    }

    #[test]
    fn zeros_and_garbage_read_as_an_empty_log() {
        assert!(records_of(&[0u8; 4096]).is_empty());
        assert!(records_of(&[0x5au8; 4096]).is_empty());
        assert!(records_of(&[]).is_empty());
    }
}
