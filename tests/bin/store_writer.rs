//! Child process of `store_kill`: commits batches of three records in `sync` mode from
//! several threads and prints `ack <thread> <seq>` after each commit returns. The parent
//! SIGKILLs it at a random moment.
//!
//! Usage: `store-writer DIR THREADS FIRST_SEQ [WAL_BYTES [LARGE_EVERY]]`: every
//! `LARGE_EVERY`th batch (7 unless given) holds 210 KB, more than a small log's half.

use std::{io::Write, sync::Arc};

use durafiber_store::{Batch, Durability, Store, StoreConfig, tables::keys};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, threads, first, wal_bytes, large_every) = match &args[..] {
        [_, dir, threads, first] => (dir, threads, first, None, None),
        [_, dir, threads, first, wal] => (dir, threads, first, Some(wal), None),
        [_, dir, threads, first, wal, large] => (dir, threads, first, Some(wal), Some(large)),
        _ => {
            eprintln!("usage: store-writer DIR THREADS FIRST_SEQ [WAL_BYTES [LARGE_EVERY]]");
            std::process::exit(2);
        }
    };
    let large_every = match large_every.map(|l| l.parse::<u64>()) {
        None => 7,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("LARGE_EVERY is a number above 0");
            std::process::exit(2);
        }
    };
    let (Ok(threads), Ok(first)) = (threads.parse::<u32>(), first.parse::<u64>()) else {
        eprintln!("THREADS and FIRST_SEQ are numbers");
        std::process::exit(2);
    };
    // A slow disk under a loaded machine is not a failed one: the parent checks durability,
    // not latency.
    let mut config =
        StoreConfig { barrier_timeout: std::time::Duration::from_secs(120), ..StoreConfig::default() };
    if let Some(wal) = wal_bytes {
        let Ok(wal) = wal.parse::<u64>() else {
            eprintln!("WAL_BYTES is a number");
            std::process::exit(2);
        };
        config.wal_bytes = wal;
    }
    let store = match Store::open_at(dir, config) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("store-writer: {e}");
            std::process::exit(1);
        }
    };
    println!("ready");
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for seq in first.. {
                    let mut batch = Batch::new();
                    for part in 0..3u8 {
                        // One run's storage holds the records: `thread seq part` and padding,
                        // large enough that some batches cross sled's blob threshold.
                        let key = keys::storage("kill_test", &format!("{t:04}/{seq:012}/{part}"));
                        let padding = "x".repeat(if seq % large_every == 0 { 70_000 } else { 64 });
                        if batch.put(key, &format!("{t} {seq} {part} {padding}")).is_err() {
                            std::process::exit(3);
                        }
                    }
                    if let Err(e) = store.commit_blocking(batch, Durability::Sync) {
                        eprintln!("commit: {e}");
                        std::process::exit(4);
                    }
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "ack {t} {seq}");
                    let _ = out.flush();
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
}
