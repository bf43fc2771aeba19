//! Durable appends that bypass the page cache: the log's writes with `O_DIRECT | O_DSYNC`.
//!
//! Through the page cache a barrier is a `pwrite` into cached pages, then an `fdatasync`
//! that finds them, starts their writeback and waits for it and the disk's cache flush.
//! Opened `O_DIRECT | O_DSYNC`, one `pwrite` hands the blocks to the disk and returns once
//! they and the flush are done. On this project's machines that took 10–15% off a lone
//! sync a millisecond after the last (`benches/RESULTS.md`, "2 December, late night").
//!
//! Direct writes must be whole blocks, from a block-aligned buffer, at a block-aligned
//! offset. Appends are not: the block the last write ended in is kept here and written
//! again, with the same bytes, in front of the next records. Bytes past the end of a
//! write within its block are zeros on disk, which a reader of the log takes for its end,
//! as it does the stale records they replace.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::Path,
};

/// The block every direct write is aligned to, in memory and in the file: a multiple of
/// every logical block size in use.
pub(crate) const BLOCK: usize = 4096;

/// A file opened for durable direct writes, and the block its last write ended in.
pub(crate) struct DirectFile {
    file: File,
    /// The bytes of the block the next write starts in, before the next write's offset.
    tail: Vec<u8>,
    /// Scratch for the aligned write, a block larger than the largest so far.
    scratch: Vec<u8>,
}

impl DirectFile {
    /// Opens `path` for durable direct writes; `None` when its filesystem does not take
    /// them, and the caller writes through the page cache.
    pub(crate) fn open(path: &Path) -> io::Result<Option<DirectFile>> {
        let flags = rustix::fs::OFlags::DIRECT | rustix::fs::OFlags::DSYNC;
        let opened = OpenOptions::new().write(true).custom_flags(flags.bits() as i32).open(path);
        match opened {
            Ok(file) => Ok(Some(DirectFile { file, tail: Vec::new(), scratch: Vec::new() })),
            Err(e) if refused(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The next write starts at a block boundary, over whatever the file holds there.
    pub(crate) fn restart(&mut self) {
        self.tail.clear();
    }

    /// Writes `data` at `at` and returns once it is durable. `at` is where the last write
    /// ended, or a block boundary after [`DirectFile::restart`]; the file is as long as
    /// `at + data.len()` rounded up to a block. An error leaves the kept block as it was.
    pub(crate) fn write(&mut self, at: u64, data: &[u8]) -> io::Result<()> {
        let tail = self.tail.len();
        let start = at.checked_sub(tail as u64).filter(|s| s % BLOCK as u64 == 0).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "a direct write must continue where the last one ended",
            )
        })?;
        let used = tail + data.len();
        let len = used.div_ceil(BLOCK) * BLOCK;
        if self.scratch.len() < len + BLOCK {
            self.scratch.resize(len + BLOCK, 0);
        }
        let skip = self.scratch.as_ptr().align_offset(BLOCK);
        let buf = self
            .scratch
            .get_mut(skip..skip + len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no aligned buffer"))?;
        buf[..tail].copy_from_slice(&self.tail);
        buf[tail..used].copy_from_slice(data);
        buf[used..].fill(0);
        self.file.write_all_at(buf, start)?;
        self.tail.clear();
        self.tail.extend_from_slice(&buf[used - used % BLOCK..used]);
        Ok(())
    }
}

/// The filesystem or device does not take direct writes (or not of this alignment).
pub(crate) fn refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_of_any_length_land_where_buffered_ones_would() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        std::fs::write(&path, vec![0x5au8; 8 * BLOCK]).expect("write");
        let Some(mut file) = DirectFile::open(&path).expect("open") else {
            panic!("the test directory's filesystem takes no direct writes");
        };
        let mut expected = Vec::new();
        for len in [1usize, 300, 4095, 1, 4096, 5000, 2] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            file.write(expected.len() as u64, &data).expect("write");
            expected.extend_from_slice(&data);
            let on_disk = std::fs::read(&path).expect("read");
            assert_eq!(on_disk[..expected.len()], expected[..]);
            // The rest of the last block written is zeros; the blocks after it untouched.
            let block_end = expected.len().div_ceil(BLOCK) * BLOCK;
            assert!(on_disk[expected.len()..block_end].iter().all(|b| *b == 0));
            assert!(on_disk[block_end..].iter().all(|b| *b == 0x5a));
        }
        // A write that does not continue the last is refused, and nothing changes.
        assert!(file.write(3, b"x").is_err());
        file.restart();
        file.write(BLOCK as u64, b"again").expect("write at a block");
        assert_eq!(&std::fs::read(&path).expect("read")[BLOCK..BLOCK + 5], b"again");
    }
}
