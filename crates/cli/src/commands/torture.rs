//! `durafiber torture`: the project's own random-kill torture, beside the drill.
//!
//! A real `durafiber serve` hosts the order agent (stashes, two named alarms, a human
//! approval, two effects through the test kit's idempotent upstream, a durable sleep, a wait
//! for the external event `packed`, storage written in transactions). New runs keep being
//! started, sent their event (once per run, with an idempotency key) and approved while the harness SIGKILLs the server at seeded random times — 30%
//! of kills in the first 30 ms of a process's life (store open, recovery scan), the rest
//! within 370 ms of the server answering — and restarts it. Then one last server runs until every run
//! is finished, and every promise is checked against the upstream, which counts objects
//! itself:
//!
//! - one run id per idempotency key, over every start call (each key is started again at
//!   the end);
//! - upstream objects exactly as expected: one charge and one email per order;
//! - every committed ledger receipt equals the upstream object of its key;
//! - every run `Completed` (nothing escalated: no agent here asks for it);
//! - every alarm delivered at least once;
//! - each run's storage as its story says: the charge id of its upstream charge, a sleep
//!   that woke no earlier than its duration after the run first reached it, the payload of
//!   its one event; every event sent again at the end is a `duplicate` or finds the run
//!   finished, never delivered twice;
//! - the store opened on every start; no panic in any log; nothing stuck.
//!
//! The upstream lives in this process, so it outlives every server it kills.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use durafiber_runtime::{canonical_json, rng::SeededRng, sha256_hex};
use durafiber_testkit::{agents::ORDER_ALARMS, upstream::Upstream};
use serde::Serialize;
use serde_json::{Value, json};

use crate::http::client::Client;

/// What the torture is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Seed of every random choice.
    pub seed: u64,
    /// SIGKILLs to deliver.
    pub kills: u32,
    /// The server's chaos eviction rate.
    pub chaos: f64,
}

/// The torture's score: every failure count must be 0.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TortureReport {
    /// The seed.
    pub seed: u64,
    /// SIGKILLs delivered.
    pub kills: u32,
    /// Runs started (distinct run ids).
    pub runs: usize,
    /// Runs that ended `Completed`.
    pub completed: usize,
    /// Runs that ended `Escalated`.
    pub escalated: usize,
    /// The most run ids any one idempotency key was answered with (must be 1).
    pub ids_per_key_max: usize,
    /// Upstream objects beyond one per order and effect.
    pub duplicate_effects: usize,
    /// Orders missing an upstream object.
    pub missing_effects: usize,
    /// Committed ledger receipts that differ from (or lack) their upstream object.
    pub ledger_mismatches: usize,
    /// Alarms of completed runs never delivered.
    pub alarms_lost: usize,
    /// Completed runs whose storage is not what their story says (see the module doc).
    pub storage_mismatches: usize,
    /// Events sent again at the end that were delivered or buffered a second time.
    pub events_twice: usize,
    /// Server starts that could not open the store.
    pub store_unopenable: usize,
    /// Panics found in the server logs.
    pub panics: usize,
    /// Runs not finished when the last server gave up waiting, or finished otherwise than
    /// `Completed` or `Escalated`.
    pub stuck: usize,
    /// Servers that exited by themselves, before their kill.
    pub server_exits: usize,
    /// Wall time, ms.
    pub elapsed_ms: u64,
    /// All failure counts are 0 and every run completed.
    pub pass: bool,
}

/// How long the last server may take to finish every run.
const FINISH_DEADLINE: Duration = Duration::from_secs(90);
/// How long a server may take to start listening before it counts as not opening.
const LISTEN_DEADLINE: Duration = Duration::from_secs(60);
/// New runs started per server life, at most.
const STARTS_PER_LIFE_MAX: usize = 3;

struct Server {
    child: Child,
    lines: mpsc::Receiver<String>,
    addr: Option<SocketAddr>,
    log: PathBuf,
    born: Instant,
}

impl Server {
    fn spawn(exe: &Path, data: &Path, config: &Path, log: &Path) -> anyhow::Result<Server> {
        let log_file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new(exe)
            .args(["serve", "--data"])
            .arg(data)
            .args(["--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("RUST_LOG", "warn")
            .env_remove("DURAFIBER_STOP_AT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Ok(Server { child, lines, addr: None, log: log.to_path_buf(), born: Instant::now() })
    }

    /// The address, once the server has said it listens.
    fn poll_addr(&mut self) -> Option<SocketAddr> {
        if self.addr.is_none()
            && let Ok(line) = self.lines.try_recv()
        {
            self.addr = line.strip_prefix("listening on ").and_then(|a| a.parse().ok());
        }
        self.addr
    }

    /// Whether the process ended by itself.
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL on Unix
        let _ = self.child.wait();
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The harness's memory of what it asked for and what it was told.
struct Harness {
    upstream: Upstream,
    rng: SeededRng,
    /// Every run id each key was answered with.
    ids: BTreeMap<String, BTreeSet<String>>,
    /// Keys whose start was never answered (the server died under the call).
    unanswered: Vec<(String, Value)>,
    /// The input each key was started with.
    inputs: BTreeMap<String, Value>,
    /// Runs whose `packed` event was not acknowledged yet, with their order key.
    unsent: BTreeMap<String, String>,
    next_order: u64,
    runs_max: usize,
}

impl Harness {
    fn input(&mut self, order: u64) -> Value {
        let delays = [self.rng.between(5, 60), self.rng.between(60, 250)];
        json!({
            "order_id": format!("ord_{order}"),
            "amount_cents": self.rng.between(100, 10_000),
            "upstream": self.upstream.url(),
            "alarm_delays_ms": delays,
            "cool_off_ms": self.rng.between(10, 200),
            "wait_for_packing": true,
        })
    }

    async fn start(&mut self, client: &Client, key: String, input: Value) {
        self.inputs.insert(key.clone(), input.clone());
        match client.post("/runs", &json!({"kind": "order", "input": input}), Some(&key)).await {
            Ok(answer) => {
                if let Some(id) = answer["run_id"].as_str() {
                    if self.ids.get(&key).is_none_or(|ids| !ids.contains(id)) {
                        self.unsent.insert(id.to_string(), key.clone());
                    }
                    self.ids.entry(key).or_default().insert(id.to_string());
                }
            }
            Err(_) => self.unanswered.push((key, input)),
        }
    }

    /// Sends each run's `packed` event until the server acknowledges it once.
    async fn send_events(&mut self, client: &Client) {
        for (run_id, key) in self.unsent.clone() {
            if send_packed(client, &run_id, &key).await.is_ok() {
                self.unsent.remove(&run_id);
            }
        }
    }

    /// One round of a live server's work: retry unanswered starts, start new runs, send
    /// events, approve.
    async fn round(&mut self, client: &Client, started_here: &mut usize) {
        for (key, input) in std::mem::take(&mut self.unanswered) {
            self.start(client, key, input).await;
        }
        if *started_here < STARTS_PER_LIFE_MAX && self.inputs.len() < self.runs_max {
            self.next_order += 1;
            let order = self.next_order;
            let input = self.input(order);
            self.start(client, format!("order-{order}"), input).await;
            *started_here += 1;
        }
        self.send_events(client).await;
        approve_pending(client).await;
    }
}

/// The one `packed` event of the order started under `key`: the outcome the server gave.
async fn send_packed(client: &Client, run_id: &str, key: &str) -> anyhow::Result<String> {
    let body = json!({"payload": {"box": format!("box-{key}")}, "idempotency_key": format!("packed-{key}")});
    let answer = client.post(&format!("/runs/{run_id}/events/packed"), &body, None).await?;
    Ok(answer["outcome"].as_str().unwrap_or("?").to_string())
}

/// Approves every pending `ship` approval with the hash the view shows.
async fn approve_pending(client: &Client) {
    let Ok(view) = client.get("/approvals").await else { return };
    for pending in view.as_array().cloned().unwrap_or_default() {
        let (Some(run_id), Some(hash)) = (pending["run_id"].as_str(), pending["payload_hash"].as_str())
        else {
            continue;
        };
        let body = json!({"payload_hash": hash, "approved": true, "comment": "torture"});
        let _ = client.post(&format!("/runs/{run_id}/approvals/ship"), &body, None).await;
    }
}

fn server_config(out: &Path, plan: Plan) -> anyhow::Result<PathBuf> {
    let path = out.join("config.json");
    let config = json!({"chaos_evict_rate": plan.chaos, "seed": plan.seed});
    std::fs::write(&path, config.to_string()).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Runs the torture with the `durafiber` binary at `exe`; logs and the report go to `out`.
pub async fn torture(exe: &Path, plan: Plan, out: &Path) -> anyhow::Result<TortureReport> {
    let started = Instant::now();
    if !(0.0..=1.0).contains(&plan.chaos) {
        bail!("--chaos must be within 0..=1");
    }
    let data = out.join("data");
    if data.exists() {
        std::fs::remove_dir_all(&data).with_context(|| format!("clearing {}", data.display()))?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let config = server_config(out, plan)?;
    let upstream = Upstream::start().await.context("starting the upstream")?;
    let mut h = Harness {
        upstream,
        rng: SeededRng::new(plan.seed),
        ids: BTreeMap::new(),
        unanswered: Vec::new(),
        inputs: BTreeMap::new(),
        unsent: BTreeMap::new(),
        next_order: 0,
        runs_max: (plan.kills as usize).saturating_mul(2).max(10),
    };
    let mut report = TortureReport { seed: plan.seed, ..Default::default() };
    let mut logs = Vec::new();
    for life in 1..=plan.kills {
        // Early kills count from the spawn; the others from the moment the server answers,
        // so a slow start on a loaded machine does not turn every kill into an early one.
        let early = h.rng.chance(0.3);
        let kill_after =
            Duration::from_millis(if early { h.rng.between(0, 30) } else { h.rng.between(0, 370) });
        let log = out.join(format!("server-{life}.log"));
        let mut server = Server::spawn(exe, &data, &config, &log)?;
        let mut kill_at = if early { Some(server.born + kill_after) } else { None };
        let listen_by = server.born + LISTEN_DEADLINE;
        let mut started_here = 0;
        let mut client = None;
        while kill_at.is_none_or(|at| Instant::now() < at) && Instant::now() < listen_by {
            if server.exited() {
                break;
            }
            if client.is_none()
                && let Some(addr) = server.poll_addr()
            {
                client = Some(Client::with_timeout(addr, Duration::from_secs(2)));
                kill_at.get_or_insert(Instant::now() + kill_after);
            }
            if let (Some(client), Some(at)) = (&client, kill_at) {
                let remaining = at.saturating_duration_since(Instant::now());
                let _ = tokio::time::timeout(remaining, h.round(client, &mut started_here)).await;
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        if server.exited() {
            report.server_exits += 1;
            if server.log_text().contains("opening") {
                report.store_unopenable += 1;
            }
        }
        server.kill();
        report.kills += 1;
        logs.push(server.log.clone());
        if life % 25 == 0 {
            eprintln!("torture: {life} of {} kills, {} runs started", plan.kills, h.ids.len());
        }
    }
    eprintln!("torture: last server, until every run finishes");
    let log = out.join("server-final.log");
    let mut server = Server::spawn(exe, &data, &config, &log)?;
    logs.push(log);
    let finished = finish(&mut h, &mut server, &mut report).await;
    server.kill();
    let finished = finished?;
    score(&h, &finished, &mut report);
    report.panics =
        logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default().matches("panicked").count()).sum();
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    report.pass = report.completed == report.runs
        && report.runs > 0
        && report.ids_per_key_max == 1
        && [
            report.escalated,
            report.duplicate_effects,
            report.missing_effects,
            report.ledger_mismatches,
            report.alarms_lost,
            report.storage_mismatches,
            report.events_twice,
            report.store_unopenable,
            report.panics,
            report.stuck,
            report.server_exits,
        ]
        .iter()
        .all(|n| *n == 0);
    let recording = json!({
        "report": report,
        "upstream": {"charges": h.upstream.objects("charges"), "emails": h.upstream.objects("emails")},
        "runs": finished.runs,
    });
    std::fs::write(out.join("report.json"), serde_json::to_string_pretty(&recording)?)?;
    Ok(report)
}

/// What the last server showed of every run.
struct Finished {
    runs: BTreeMap<String, Value>,
    /// Each run's storage, by key.
    storage: BTreeMap<String, BTreeMap<String, Value>>,
}

/// Lets the last server finish every run, approving as needed; re-sends every start.
async fn finish(
    h: &mut Harness,
    server: &mut Server,
    report: &mut TortureReport,
) -> anyhow::Result<Finished> {
    let listen_by = Instant::now() + LISTEN_DEADLINE;
    let addr = loop {
        if let Some(addr) = server.poll_addr() {
            break addr;
        }
        if server.exited() || Instant::now() > listen_by {
            report.store_unopenable += 1;
            bail!("the last server did not start: {}", server.log_text().lines().last().unwrap_or(""));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let client = Client::with_timeout(addr, Duration::from_secs(10));
    for (key, input) in std::mem::take(&mut h.unanswered) {
        h.start(&client, key, input).await;
    }
    // Every key once more, with its input: the answer must be the run it already has.
    for (key, input) in h.inputs.clone() {
        h.start(&client, key, input).await;
    }
    let run_ids: BTreeSet<String> = h.ids.values().flatten().cloned().collect();
    let deadline = Instant::now() + FINISH_DEADLINE;
    let mut runs = BTreeMap::new();
    loop {
        h.send_events(&client).await;
        approve_pending(&client).await;
        runs.clear();
        for id in &run_ids {
            if let Ok(run) = client.get(&format!("/runs/{id}")).await {
                runs.insert(id.clone(), run);
            }
        }
        let open = run_ids.iter().filter(|id| runs.get(*id).is_none_or(|r| !is_terminal(r))).count();
        if open == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every event once more: a duplicate for an open run, refused for a finished one.
    for (key, ids) in &h.ids {
        for run_id in ids {
            match send_packed(&client, run_id, key).await {
                Ok(outcome) if outcome != "duplicate" => report.events_twice += 1,
                Err(e) if !e.to_string().contains("has finished") => report.events_twice += 1,
                _ => {}
            }
        }
    }
    let mut storage = BTreeMap::new();
    for id in &run_ids {
        if let Ok(page) = client.get(&format!("/runs/{id}/storage")).await {
            let entries = page["entries"].as_array().cloned().unwrap_or_default();
            let by_key: BTreeMap<String, Value> = entries
                .into_iter()
                .filter_map(|e| Some((e["key"].as_str()?.to_string(), e["value"].clone())))
                .collect();
            storage.insert(id.clone(), by_key);
        }
    }
    Ok(Finished { runs, storage })
}

fn is_terminal(run: &Value) -> bool {
    let status = &run["run"]["status"];
    ["completed", "failed", "cancelled", "escalated"].iter().any(|s| status.get(*s).is_some())
}

fn hash_of(value: &Value) -> String {
    sha256_hex(canonical_json(value).unwrap_or_default().as_bytes())
}

/// Fills in every count of the report from what the harness and the upstream saw.
fn score(h: &Harness, finished: &Finished, report: &mut TortureReport) {
    report.runs = finished.runs.len().max(h.ids.values().flatten().count());
    report.ids_per_key_max = h.ids.values().map(BTreeSet::len).max().unwrap_or(0);
    let upstream = |collection: &str| h.upstream.objects(collection);
    let (charges, emails, alarms) = (upstream("charges"), upstream("emails"), upstream(ORDER_ALARMS));
    for run in finished.runs.values() {
        let status = &run["run"]["status"];
        if status.get("completed").is_some() {
            report.completed += 1;
        } else if status.get("escalated").is_some() {
            report.escalated += 1;
        } else {
            report.stuck += 1;
        }
    }
    report.stuck += h.ids.values().flatten().filter(|id| !finished.runs.contains_key(*id)).count();
    for objects in [&charges, &emails] {
        let mut per_order: BTreeMap<String, usize> = BTreeMap::new();
        for o in objects.iter() {
            let order = o["request"]["order_id"].as_str().unwrap_or("?").to_string();
            *per_order.entry(order).or_default() += 1;
        }
        report.duplicate_effects += per_order.values().map(|n| n.saturating_sub(1)).sum::<usize>();
        for run in finished.runs.values() {
            let order = run["run"]["input_json"]
                .as_str()
                .and_then(|i| serde_json::from_str::<Value>(i).ok())
                .and_then(|i| i["order_id"].as_str().map(str::to_string))
                .unwrap_or_default();
            if run["run"]["status"].get("completed").is_some() && !per_order.contains_key(&order) {
                report.missing_effects += 1;
            }
        }
    }
    for run in finished.runs.values() {
        for entry in run["ledger"].as_array().cloned().unwrap_or_default() {
            if entry["committed"].is_null() {
                continue;
            }
            let collection = if entry["effect_id"] == "charge" { &charges } else { &emails };
            let object = collection.iter().find(|o| o["idempotency_key"] == entry["idempotency_key"]);
            let matches = object.is_some_and(|o| entry["committed"]["receipt_hash"] == hash_of(o).as_str());
            if !matches {
                report.ledger_mismatches += 1;
            }
        }
        if run["run"]["status"].get("completed").is_none() {
            continue;
        }
        let run_id = run["run"]["run_id"].as_str().unwrap_or_default();
        let input: Value = run["run"]["input_json"]
            .as_str()
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or(Value::Null);
        if !storage_as_told(run, &input, finished.storage.get(run_id), &charges) {
            report.storage_mismatches += 1;
        }
        let expected = input["alarm_delays_ms"].as_array().map(Vec::len).unwrap_or(0);
        for i in 0..expected {
            let key = format!("{run_id}:alarm:{i}");
            if !alarms.iter().any(|o| o["idempotency_key"] == key.as_str()) {
                report.alarms_lost += 1;
            }
        }
    }
}

/// Whether a completed order's storage tells its story: the id of the upstream charge its
/// ledger committed, a sleep that lasted at least its duration, the payload of its event.
fn storage_as_told(
    run: &Value,
    input: &Value,
    stored: Option<&BTreeMap<String, Value>>,
    charges: &[Value],
) -> bool {
    let Some(stored) = stored else { return false };
    let charge_key = run["ledger"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["effect_id"] == "charge"))
        .map(|e| e["idempotency_key"].clone());
    let charge = charges.iter().find(|o| Some(&o["idempotency_key"]) == charge_key.as_ref());
    let charge_ok = charge.is_some_and(|c| stored.get("charge_id") == Some(&c["id"]));
    let cool_off = input["cool_off_ms"].as_u64().unwrap_or(0);
    let slept = stored.get("cool_off").and_then(|c| Some((c[0].as_u64()?, c[1].as_u64()?)));
    let sleep_ok = slept.is_some_and(|(at, woke)| woke >= at.saturating_add(cool_off));
    let order = input["order_id"].as_str().unwrap_or_default().trim_start_matches("ord_");
    let packed_ok = stored.get("packed") == Some(&json!({"box": format!("box-order-{order}")}));
    charge_ok && sleep_ok && packed_ok
}

/// `durafiber torture`: prints the counts; the last line is the JSON report with `--json`.
/// Exit 0 only if it passes.
pub async fn run(json_line: bool, plan: Plan, out: Option<&Path>) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("locating the durafiber binary")?;
    let out = match out {
        Some(dir) => dir.to_path_buf(),
        None => std::env::temp_dir().join(format!("durafiber-torture-{}-{}", plan.seed, std::process::id())),
    };
    let r = torture(&exe, plan, &out).await?;
    println!(
        "torture seed {}: {} kills, {} runs, {} completed, {} escalated in {} ms; recording in {}",
        r.seed,
        r.kills,
        r.runs,
        r.completed,
        r.escalated,
        r.elapsed_ms,
        out.display()
    );
    println!(
        "ids per key (max) {}, duplicate effects {}, missing effects {}, ledger mismatches {}, alarms lost {}, \
         storage mismatches {}, events twice {}, store unopenable {}, panics {}, stuck {}, server exits {}: {}",
        r.ids_per_key_max,
        r.duplicate_effects,
        r.missing_effects,
        r.ledger_mismatches,
        r.alarms_lost,
        r.storage_mismatches,
        r.events_twice,
        r.store_unopenable,
        r.panics,
        r.stuck,
        r.server_exits,
        if r.pass { "PASS" } else { "FAIL" }
    );
    if json_line {
        println!("{}", serde_json::to_string(&r)?);
    }
    Ok(if r.pass { 0 } else { 1 })
}
