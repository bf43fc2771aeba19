//! Acknowledged means durable, and a batch is all or nothing — under a real SIGKILL.
//!
//! A child process commits three-record batches in `sync` mode from four threads and prints
//! each acknowledged batch. The parent kills it with SIGKILL at seeded random moments, in
//! rounds on one data directory, reopens the store each time and checks that every
//! acknowledged batch is there whole and that no batch is there in part.
//!
//! A second test does the same with a write-ahead log of 128 KiB, so the log moves between
//! its halves and hands tables to sled every few hundred batches, and every seventh batch
//! (210 KB) is too large for a half and goes into sled at once: kills land in all of it.
//!
//! A third runs the same rounds on the PostgreSQL backend, in a private server.

use std::{
    collections::{BTreeMap, HashSet},
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use durafiber_store::{Store, StoreConfig, tables::keys};
use durafiber_testkit::{SeededRng, postgres::PgServer};

const THREADS: u32 = 4;
/// How long the child may go without an acknowledgement before it counts as stuck: generous,
/// because under a loaded CI machine one `fsync` (of sled's log, or PostgreSQL's WAL) can
/// take many seconds. This is a liveness check, not a timing figure.
const ACK_PATIENCE: Duration = Duration::from_secs(120);

/// One writer at a time: each test's child syncs as fast as the disk allows, and several at
/// once starve one another's syncs for tens of seconds on a loaded machine — long enough for
/// the PostgreSQL writer's call timeout (30 s) to end it, which this test would read as a
/// child that stopped acknowledging. What is tested is durability under SIGKILL, not how
/// fairly the disk shares itself.
static ONE_WRITER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Reads every batch in the store: (thread, seq) → parts present.
fn batches_in(location: &str, wal_bytes: u64) -> BTreeMap<(u32, u64), Vec<u8>> {
    let config = StoreConfig { wal_bytes, ..StoreConfig::default() };
    let store = Store::open_at(location, config).expect("the store reopens after SIGKILL");
    let mut found: BTreeMap<(u32, u64), Vec<u8>> = BTreeMap::new();
    for (_, value) in store.scan(&keys::STORAGE.of_run("kill_test"), None, usize::MAX).expect("scan") {
        let value = value.expect("no record is torn");
        let mut fields = value.split(' ').map(str::parse::<u64>);
        let (Some(Ok(t)), Some(Ok(seq)), Some(Ok(part))) = (fields.next(), fields.next(), fields.next())
        else {
            panic!("a record reads `thread seq part padding`: {}", &value[..value.len().min(40)]);
        };
        found.entry((t as u32, seq)).or_default().push(part as u8);
    }
    found
}

#[test]
fn every_acknowledged_batch_survives_sigkill_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    kill_rounds(dir.path().to_str().expect("utf-8 path"), StoreConfig::default().wal_bytes, 20, 3..40);
}

#[test]
fn every_acknowledged_batch_survives_sigkill_whole_while_the_log_moves_between_halves() {
    let dir = tempfile::tempdir().expect("tempdir");
    kill_rounds(dir.path().to_str().expect("utf-8 path"), 128 * 1024, 12, 30..300);
}

/// Every batch is larger than a log half, so each goes into sled on its own, and most kills
/// land while sled writes one: none may be left in part (they were, while such a batch was
/// written key by key).
#[test]
fn batches_larger_than_a_log_half_survive_sigkill_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    kill_rounds_with(dir.path().to_str().expect("utf-8 path"), 128 * 1024, 1, 12, 2..40);
}

#[test]
fn every_acknowledged_batch_survives_sigkill_whole_on_postgres() {
    let server = PgServer::start().expect("a PostgreSQL server");
    let url = server.fresh_database().expect("a database");
    kill_rounds(&url, StoreConfig::default().wal_bytes, 10, 3..150);
}

fn kill_rounds(location: &str, wal_bytes: u64, rounds: u32, acks: std::ops::Range<u64>) {
    kill_rounds_with(location, wal_bytes, 7, rounds, acks);
}

/// `rounds` SIGKILLs of a writer whose every `large_every`th batch is 210 KB.
fn kill_rounds_with(
    location: &str,
    wal_bytes: u64,
    large_every: u64,
    rounds: u32,
    acks: std::ops::Range<u64>,
) {
    let _one_writer = ONE_WRITER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let seed = std::env::var("KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20_261_130u64);
    println!("seed {seed}, store at {location}, write-ahead log of {wal_bytes} bytes");
    let mut rng = SeededRng::new(seed);
    let mut acked_total: HashSet<(u32, u64)> = HashSet::new();
    let mut next_seq = 0u64;
    for round in 0..rounds {
        let mut child = Command::new(env!("CARGO_BIN_EXE_store-writer"))
            .args([location, &THREADS.to_string(), &next_seq.to_string()])
            .args([wal_bytes.to_string(), large_every.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn store-writer");
        // What the child says when it gives up, for the failure's message.
        let mut stderr = child.stderr.take().expect("piped stderr");
        let said = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        assert_eq!(rx.recv_timeout(ACK_PATIENCE).ok().as_deref(), Some("ready"), "round {round}");
        // Wait for a seeded number of acknowledgements, so the kill lands mid-stream.
        let wait_for = rng.between(acks.start, acks.end);
        let mut acked = 0;
        while acked < wait_for {
            match rx.recv_timeout(ACK_PATIENCE) {
                Ok(line) => {
                    let mut parts =
                        line.split_whitespace().skip(1).map(|p| p.parse::<u64>().expect("number"));
                    let (t, seq) = (parts.next().expect("thread") as u32, parts.next().expect("seq"));
                    acked_total.insert((t, seq));
                    acked += 1;
                }
                Err(e) => {
                    let _ = child.kill();
                    let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                    let said = said.join().unwrap_or_default();
                    panic!("round {round}: child stopped acknowledging ({e}); it {status}, saying:\n{said}");
                }
            }
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        // Lines already printed before the kill were acknowledged too.
        let _ = reader.join();
        for line in rx.try_iter() {
            let mut parts = line.split_whitespace().skip(1).map(|p| p.parse::<u64>().expect("number"));
            acked_total.insert((parts.next().expect("thread") as u32, parts.next().expect("seq")));
        }
        let found = batches_in(location, wal_bytes);
        for (batch, parts) in &found {
            assert_eq!(parts.len(), 3, "seed {seed} round {round}: batch {batch:?} is half-applied");
        }
        for batch in &acked_total {
            assert!(
                found.contains_key(batch),
                "seed {seed} round {round}: acknowledged batch {batch:?} lost"
            );
        }
        next_seq = found.keys().map(|(_, s)| *s).max().unwrap_or(0) + 1_000;
    }
}
