//! The first start of a server survives a SIGKILL at any moment: afterwards the data
//! directory's `admin.token` works. The admin token's file is durable before its record is
//! committed, so a killed bootstrap leaves either no record (the next start mints the admin
//! again) or a record whose token is in the file.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

mod common;
use common::{BIN, Served};

/// Kills of a first start.
const KILLS: u32 = 50;

/// A start of `serve` on `data`, killed with SIGKILL after `delay`; whether it had announced
/// its address by then.
fn start_and_kill(data: &std::path::Path, delay: Duration) -> bool {
    let mut child = Command::new(BIN)
        .args(["serve", "--data"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn durafiber serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::thread::sleep(delay);
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    rx.try_iter().any(|line| line.starts_with("listening on"))
}

/// How long a first start takes until its admin token's file appears and until it
/// listens, measured here (the machine's speed and load decide both).
fn first_start_times() -> (Duration, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("admin.token");
    let began = Instant::now();
    let mut child = Command::new(BIN)
        .args(["serve", "--data"])
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn durafiber serve");
    while !file.exists() {
        assert!(began.elapsed() < Duration::from_secs(60), "no admin.token within 60 s");
        std::thread::sleep(Duration::from_micros(200));
    }
    let made = began.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    let dir = tempfile::tempdir().expect("tempdir");
    let began = Instant::now();
    drop(Served::start(dir.path()));
    (made, began.elapsed())
}

/// A small seeded generator: the seed is printed, so a failure can be replayed
/// (`DURAFIBER_SEED`).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A fraction in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_killed_at_any_moment_leaves_an_admin_token_that_works() {
    let seed = std::env::var("DURAFIBER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    }) | 1;
    eprintln!("bootstrap kills: seed {seed}");
    let mut rng = Rng(seed);
    let (made, full) = first_start_times();
    let (mut before_listening, mut with_file) = (0, 0);
    for kill in 0..KILLS {
        let dir = tempfile::tempdir().expect("tempdir");
        // A quarter of the kills anywhere in the start; the rest close around the moment the
        // admin is made, where a kill once left a record whose token no file held.
        let delay =
            if kill % 4 == 0 { full.mul_f64(rng.unit() * 1.1) } else { made.mul_f64(0.8 + rng.unit() * 0.3) };
        if !start_and_kill(dir.path(), delay) {
            before_listening += 1;
        }
        if dir.path().join("admin.token").exists() {
            with_file += 1;
        }
        let server = Served::start(dir.path());
        assert!(
            !server.token.is_empty(),
            "kill {kill} (after {delay:?}): no admin.token after the next start\n{}",
            server.log()
        );
        let status = server.client().get(server.url("/runs")).send().await.expect("an answer").status();
        assert_eq!(
            status,
            200,
            "kill {kill} (after {delay:?}, seed {seed}): the admin token does not work\n{}",
            server.log()
        );
    }
    eprintln!(
        "bootstrap kills: {KILLS} kills, the file made after {made:?}, the server listening after {full:?}; \
         {before_listening} before the server listened, {with_file} left an admin.token"
    );
    assert!(
        before_listening >= KILLS / 4,
        "too few kills landed in the start: {before_listening} of {KILLS}"
    );
}
