//! A full disk is an error, never a hang — on a real filesystem that really fills.
//!
//! The test mounts a 48 MiB tmpfs (CI runs as root), serves a store on it with a 16 MiB
//! reserve (so a 4 MiB floor), keeps runs committing, then fills the disk with a plain file:
//! below the reserve, new runs and alarm sets are refused with 507 while running boundaries
//! go on; below the floor they wait; `/health` and reads still answer. Freeing the space lets
//! every run finish without a restart. Filled again, the server still stops within the
//! grace period on SIGTERM, and a restart finds every acknowledged run.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

mod common;

/// A tmpfs mounted for the test's life.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mounting a tmpfs needs root (CI runs as root): {status}");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn free_bytes(&self) -> u64 {
        let stat = rustix::fs::statvfs(self.path()).expect("statvfs");
        stat.f_bavail * stat.f_frsize
    }

    /// Writes a file that leaves about `leave` bytes free.
    fn fill_to(&self, name: &str, leave: u64) -> PathBuf {
        let path = self.path().join(name);
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("filler");
        let chunk = vec![0xa5u8; 256 * 1024];
        while self.free_bytes() > leave + chunk.len() as u64 {
            if file.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = file.flush();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

struct Server {
    served: common::Served,
    http: reqwest::Client,
}

impl Server {
    fn start(data: &Path, config: &Path) -> Server {
        let served = common::Served::start_with(data, &["--config".as_ref(), config.as_os_str()]);
        let http = served.client();
        Server { served, http }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_keyed(method, path, body, "k").await
    }

    async fn call_keyed(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        key: &str,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, self.served.url(path));
        if let Some(body) = body {
            req = req.header("Idempotency-Key", key).json(&body);
        }
        let res = req.send().await.unwrap_or_else(|e| panic!("{path}: no answer (a hang?): {e}"));
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    async fn start_run(&self, key: &str) -> (u16, Value) {
        let body = json!({"kind": "steps", "input": {"steps": 150, "pause_ms": 10}});
        self.call_keyed(reqwest::Method::POST, "/runs", Some(body), key).await
    }

    async fn status(&self, run_id: &str) -> String {
        let (_, run) = self.call(reqwest::Method::GET, &format!("/runs/{run_id}"), None).await;
        run["run"]["status"]
            .as_object()
            .and_then(|o| o.keys().next().cloned())
            .unwrap_or_else(|| run["run"]["status"].as_str().unwrap_or("?").to_string())
    }
}

async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_new_work_parks_boundaries_and_resumes_when_space_returns() {
    let fs = Tmpfs::mount("48m");
    let data = fs.path().join("data");
    let config = fs.path().join("config.json");
    std::fs::write(&config, r#"{"disk_reserve": "16MiB"}"#).expect("config");
    let server = Server::start(&data, &config);
    let mut runs = Vec::new();
    for i in 0..8 {
        let (status, answer) = server.start_run(&format!("r{i}")).await;
        assert_eq!(status, 201, "{answer}");
        runs.push(answer["run_id"].as_str().expect("run id").to_string());
    }

    // Below the reserve: new work is refused, running boundaries go on.
    let filler = fs.fill_to("filler", 10 * 1024 * 1024);
    let (status, answer) = server.start_run("refused").await;
    assert_eq!((status, answer["kind"].as_str()), (507, Some("StorageFull")), "{answer}");
    let alarm = json!({"delay_ms": 1000, "payload": null});
    let (status, answer) =
        server.call(reqwest::Method::PUT, &format!("/runs/{}/alarms/late", runs[0]), Some(alarm)).await;
    assert_eq!(status, 507, "{answer}");
    let (status, health) = server.call(reqwest::Method::GET, "/health", None).await;
    assert_eq!((status, health["low_on_space"].as_bool()), (200, Some(true)), "{health}");

    // Below the floor: boundaries wait; the server still answers.
    let floor_filler = fs.fill_to("filler-2", 2 * 1024 * 1024);
    wait_until("boundaries park below the floor", Duration::from_secs(30), || async {
        server.call(reqwest::Method::GET, "/health", None).await.1["parked"] == true
    })
    .await;
    let (status, _) = server.call(reqwest::Method::GET, "/runs", None).await;
    assert_eq!(status, 200, "reads answer while writes wait");

    // Space returns: every run finishes without a restart, and new work is taken again.
    std::fs::remove_file(&floor_filler).expect("free");
    std::fs::remove_file(&filler).expect("free");
    for run in &runs {
        wait_until(&format!("{run} completes"), Duration::from_secs(90), || async {
            server.status(run).await == "completed"
        })
        .await;
    }
    let (status, answer) = server.start_run("after").await;
    assert_eq!(status, 201, "{answer}");
    runs.push(answer["run_id"].as_str().expect("run id").to_string());

    // Full again, with writes waiting: SIGTERM still stops the server promptly.
    let _filler = fs.fill_to("filler-3", 1024 * 1024);
    let mut server = server;
    let stopping = Instant::now();
    server.served.sigterm();
    assert!(stopping.elapsed() < Duration::from_secs(5), "SIGTERM took {:?}", stopping.elapsed());
    drop(server);
    std::fs::remove_file(fs.path().join("filler-3")).expect("free");

    // Nothing acknowledged is lost.
    let server = Server::start(&data, &config);
    for run in &runs {
        wait_until(&format!("{run} completes after the restart"), Duration::from_secs(90), || async {
            server.status(run).await == "completed"
        })
        .await;
    }
}

/// A disk another process fills to the last byte: every write request is answered within
/// `barrier_timeout` (507, the audit entry included), `/health` says the store is parked,
/// and when space returns every acknowledged run finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_filled_to_the_last_byte_answers_every_write_in_bounded_time() {
    let fs = Tmpfs::mount("48m");
    let data = fs.path().join("data");
    let config = fs.path().join("config.json");
    std::fs::write(&config, r#"{"disk_reserve": "16MiB", "barrier_timeout": "3s"}"#).expect("config");
    let server = Server::start(&data, &config);
    let mut runs = Vec::new();
    for i in 0..6 {
        let (status, answer) = server.start_run(&format!("r{i}")).await;
        assert_eq!(status, 201, "{answer}");
        runs.push(answer["run_id"].as_str().expect("run id").to_string());
    }

    // Another process takes every byte: the running runs' boundaries park.
    let filler = fs.fill_to("filler", 0);
    wait_until("the store parks for space", Duration::from_secs(30), || async {
        server.call(reqwest::Method::GET, "/health", None).await.1["parked"] == true
    })
    .await;
    let (status, health) = server.call(reqwest::Method::GET, "/health", None).await;
    assert_eq!((status, health["ok"].as_bool()), (503, Some(false)), "{health}");

    let bound = Duration::from_secs(3 + 2);
    let began = Instant::now();
    let (status, answer) = server.start_run("refused").await;
    assert_eq!((status, answer["kind"].as_str()), (507, Some("StorageFull")), "{answer}");
    let alarm = json!({"delay_ms": 1000, "payload": null});
    let (status, answer) =
        server.call(reqwest::Method::PUT, &format!("/runs/{}/alarms/late", runs[0]), Some(alarm)).await;
    assert_eq!(status, 507, "{answer}");
    let (status, answer) = server
        .call(reqwest::Method::POST, &format!("/runs/{}/cancel", runs[1]), Some(json!({"reason": "x"})))
        .await;
    assert_eq!(status, 507, "{answer}");
    assert!(began.elapsed() < bound, "three writes took {:?}", began.elapsed());

    // Space returns: every acknowledged run finishes, and new work is taken again.
    std::fs::remove_file(&filler).expect("free");
    for run in &runs {
        wait_until(&format!("{run} completes"), Duration::from_secs(90), || async {
            server.status(run).await == "completed"
        })
        .await;
    }
    let (status, answer) = server.start_run("after").await;
    assert_eq!(status, 201, "{answer}");
}
