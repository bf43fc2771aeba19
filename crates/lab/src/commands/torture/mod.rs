//! `durafiber torture`: the project's own random-kill torture, beside the drill.
//!
//! A real `durafiber serve` hosts the order agent (stashes, two named alarms — for half the
//! runs the first on a cron schedule —, an output stream, a human approval, two effects
//! through the test kit's idempotent upstream (one with its own retry policy), a streaming
//! effect whose receipt goes to the output stream chunk by chunk, a child run that makes the
//! shipping label and is joined, a durable sleep, a wait for the external event `packed`,
//! storage written in transactions). New runs keep being
//! started, sent their event (once per run, with an idempotency key) and approved while the harness SIGKILLs the server at seeded random times — 30%
//! of kills in the first 30 ms of a process's life (store open, recovery scan), the rest
//! within 370 ms of the server answering — and restarts it. Then one last server runs until every run
//! is finished, and every promise is checked against the upstream, which counts objects
//! itself:
//!
//! - one run id per idempotency key, over every start call (each key is started again at
//!   the end);
//! - upstream objects exactly as expected: one charge, one email, one receipt and one label
//!   (made by the order's child run) per order;
//! - every committed ledger receipt equals the upstream object of its key;
//! - every order `Completed` (nothing escalated: no order asks for it, and the deaths the
//!   poison causes are not theirs); every poison run `Escalated` for its hook's deaths;
//! - every alarm delivered at least once;
//! - each completed run's output stream exactly its phases and its receipt, once each and in
//!   order (the agent emits a phase unless its stream holds it, so a re-entry continues the
//!   stream; the receipt's chunks are those of the call that committed, however many calls
//!   a kill cut off);
//! - each completed order's output names the label its child made;
//! - each run's storage as its story says: the charge id of its upstream charge, a sleep
//!   that woke no earlier than its duration after the run first reached it, the payload of
//!   its one event; every event sent again at the end is a `duplicate` or finds the run
//!   finished, never delivered twice;
//! - the store opened on every start; no panic in any log; nothing stuck.
//!
//! Completed orders are forked at their last boundary while the kills go on (and at the end,
//! so that at least one run in four is a fork): a fork inherits the child run that made the
//! label and every effect, so the upstream's one-object-per-order counts hold for forks too;
//! each fork completes, with its own alarms, and its storage and stream tell its source's
//! story. The score requires forks.
//!
//! Halfway through the kills the servers start hosting version 2 of the order agent's stash
//! (`OrderV2`): every run open then is carried across the deploy by `upgrade_stash`, and the
//! score counts the runs whose last stash version 2 wrote or upgraded (`stash_v2`), which the
//! torture needs to be more than none.
//!
//! A third of the orders wait on alarms whose handlers work 50–300 ms, so kills land in the
//! middle of deliveries. Two poison runs (`durafiber_demo::poison`) are started along the
//! way: their recovery hook aborts the process each time it runs, until the runtime escalates
//! them — and only them.
//!
//! The upstream lives in this process, so it outlives every server it kills.

mod harness;
mod report;
mod score;
pub(crate) mod server;

use harness::{Harness, approve_pending, send_packed};
pub use report::{Plan, TortureReport};
use score::{Finished, is_terminal, score};
use server::Server;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use durafiber_runtime::{RunId, rng::SeededRng};
use durafiber_testkit::upstream::Upstream;
use serde_json::{Value, json};

use durafiber_client::Client;
use durafiber_demo::poison::POISON_MARK;

/// How long the last server may take to finish every run.
const FINISH_DEADLINE: Duration = Duration::from_secs(90);
/// How long a server may take to start listening before it counts as not opening.
const LISTEN_DEADLINE: Duration = Duration::from_secs(60);
/// Last servers the poison may take down before the torture gives up on them.
const LAST_SERVERS_MAX: u32 = 10;
/// One run in this many, at least, is a fork of a completed order.
const FORK_EVERY: usize = 4;

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
        unanswered: BTreeMap::new(),
        inputs: BTreeMap::new(),
        unsent: BTreeMap::new(),
        next_order: 0,
        runs_max: (plan.kills as usize).saturating_mul(2).max(10),
        forked: BTreeMap::new(),
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
        // Halfway, version 2 of the order agent's stash is deployed over the open runs.
        let order_version = if life > plan.kills / 2 { 2 } else { 1 };
        let mut server = Server::spawn(exe, &data, &config, &log, order_version)?;
        serve_until_killed(&mut server, &mut h, &data, early, kill_after).await;
        if server.exited() {
            let log = server.log_text();
            if log.contains(POISON_MARK) {
                report.poison_exits += 1;
            } else {
                report.server_exits += 1;
            }
            if log.contains("opening") {
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
    let finished = last_servers(exe, &data, &config, out, &mut h, &mut logs, &mut report).await?;
    score(&h, &finished, &mut report);
    report.forks = h.ids.keys().filter(|key| harness::is_fork(key)).count();
    report.panics =
        logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default().matches("panicked").count()).sum();
    report.elapsed = started.elapsed();
    report.pass = passes(&report);
    write_recording(out, &h, &finished, &report)?;
    Ok(report)
}

/// One server's life: the harness's rounds of work until its kill time (counted from the
/// spawn for an early kill, else from the moment it answers), or until it exits by itself
/// or never listens.
async fn serve_until_killed(
    server: &mut Server,
    h: &mut Harness,
    data: &Path,
    early: bool,
    kill_after: Duration,
) {
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
            let token = durafiber_server::read_admin_token(data);
            client = Some(
                Client::from_addr(addr)
                    .with_timeout(Duration::from_secs(2))
                    .with_retry_budget(Duration::ZERO)
                    .with_token(token),
            );
            kill_at.get_or_insert(Instant::now() + kill_after);
        }
        if let (Some(client), Some(at)) = (&client, kill_at) {
            let remaining = at.saturating_duration_since(Instant::now());
            let _ = tokio::time::timeout(remaining, h.round(client, &mut started_here)).await;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// Last servers until one finishes every run: a poison run not escalated yet still takes a
/// last server down with it, so another starts (at most [`LAST_SERVERS_MAX`]).
async fn last_servers(
    exe: &Path,
    data: &Path,
    config: &Path,
    out: &Path,
    h: &mut Harness,
    logs: &mut Vec<PathBuf>,
    report: &mut TortureReport,
) -> anyhow::Result<Finished> {
    let mut last = 0;
    loop {
        last += 1;
        let log = out.join(format!("server-final-{last}.log"));
        let mut server = Server::spawn(exe, data, config, &log, 2)?;
        logs.push(log);
        let finished = finish(h, &mut server, data, report).await;
        let poisoned = server.exited() && server.log_text().contains(POISON_MARK);
        server.kill();
        match finished {
            Ok(finished) if !poisoned => return Ok(finished),
            _ if poisoned && last < LAST_SERVERS_MAX => report.poison_exits += 1,
            Ok(finished) => return Ok(finished),
            Err(e) => return Err(e),
        }
        // Its recovery backoff doubles with each death: the next server waits it out.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `report.json`: the report, the upstream's objects and every run as the last server showed it.
fn write_recording(
    out: &Path,
    h: &Harness,
    finished: &Finished,
    report: &TortureReport,
) -> anyhow::Result<()> {
    let recording = json!({
        "report": report,
        "upstream": {
            "charges": h.upstream.objects("charges"),
            "emails": h.upstream.objects("emails"),
            "receipts": h.upstream.objects("receipts"),
            "labels": h.upstream.objects("labels"),
        },
        "runs": finished.runs,
    });
    std::fs::write(out.join("report.json"), serde_json::to_string_pretty(&recording)?)?;
    Ok(())
}

/// Whether the torture passed: every order completed, every poison run escalated, forks
/// and a deploy's stashes among them, and every failure count 0.
fn passes(report: &TortureReport) -> bool {
    report.completed + report.poison_runs == report.runs
        && report.poison_escalated == report.poison_runs
        && report.runs > 0
        && report.stash_v2 > 0
        && report.forks > 0
        && report.ids_per_key_max == 1
        && [
            report.escalated,
            report.duplicate_effects,
            report.missing_effects,
            report.ledger_mismatches,
            report.alarms_lost,
            report.storage_mismatches,
            report.streams_wrong,
            report.children_wrong,
            report.events_twice,
            report.store_unopenable,
            report.panics,
            report.stuck,
            report.server_exits,
        ]
        .iter()
        .all(|n| *n == 0)
}

/// Lets the last server finish every run, approving as needed; re-sends every start.
async fn finish(
    h: &mut Harness,
    server: &mut Server,
    data: &std::path::Path,
    report: &mut TortureReport,
) -> anyhow::Result<Finished> {
    let listen_by = Instant::now() + LISTEN_DEADLINE;
    let addr = loop {
        if let Some(addr) = server.poll_addr() {
            break addr;
        }
        if server.exited() && server.log_text().contains(POISON_MARK) {
            bail!("the poison ended the last server");
        }
        if server.exited() || Instant::now() > listen_by {
            report.store_unopenable += 1;
            bail!("the last server did not start: {}", server.log_text().lines().last().unwrap_or(""));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let client = Client::from_addr(addr)
        .with_timeout(Duration::from_secs(10))
        .with_retry_budget(Duration::ZERO)
        .with_token(durafiber_server::read_admin_token(data));
    // A poison run started now would never be killed, so never recovered and never
    // escalated: only orders are started here for the first time.
    for (key, input) in h.unanswered.clone() {
        if harness::kind_of(&key) == "order" {
            h.start(&client, key, input).await;
        }
    }
    // Every key once more, with its input: the answer must be the run it already has.
    for (key, input) in h.inputs.clone() {
        if harness::kind_of(&key) == "order" || h.ids.contains_key(&key) {
            h.start(&client, key, input).await;
        }
    }
    let deadline = Instant::now() + FINISH_DEADLINE;
    let mut runs = BTreeMap::new();
    let mut run_ids: BTreeSet<String>;
    loop {
        h.send_events(&client).await;
        approve_pending(&client).await;
        // A fork of an order at least every fourth order, those the kills left unforked
        // made now, and waited for like every run.
        if h.forked.len().saturating_mul(FORK_EVERY) < h.ids.len() {
            h.fork_one(&client).await;
        }
        run_ids = h.ids.values().flatten().cloned().collect();
        runs.clear();
        for id in &run_ids {
            if let Ok(run) = client.get_json(&format!("/runs/{id}")).await {
                runs.insert(id.clone(), run);
            }
        }
        let open = run_ids.iter().filter(|id| runs.get(*id).is_none_or(|r| !is_terminal(r))).count();
        if open == 0 || Instant::now() > deadline {
            break;
        }
        if server.exited() && server.log_text().contains(POISON_MARK) {
            bail!("the poison ended the last server");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    resend_events(h, &client, report).await;
    let (streams, storage) = records_of(&client, &run_ids).await;
    Ok(Finished { runs, storage, streams })
}

/// Every event once more: a duplicate whatever became of the run, once a send of it was
/// acknowledged; one never acknowledged may find its run finished. Anything else counts as
/// an event delivered twice.
async fn resend_events(h: &Harness, client: &Client, report: &mut TortureReport) {
    // A fork waits for no event: what its source was sent settled before its point.
    for (key, ids) in
        h.ids.iter().filter(|(key, _)| harness::kind_of(key) == "order" && !harness::is_fork(key))
    {
        for run_id in ids {
            let acknowledged = !h.unsent.contains_key(run_id);
            match send_packed(client, &RunId::from(run_id.as_str()), key).await {
                Ok(outcome) if outcome != "duplicate" => report.events_twice += 1,
                Err(e) if acknowledged || !e.to_string().contains("has finished") => report.events_twice += 1,
                _ => {}
            }
        }
    }
}

/// Each run's output stream and storage, as the last server shows them.
async fn records_of(
    client: &Client,
    run_ids: &BTreeSet<String>,
) -> (BTreeMap<String, Vec<Value>>, BTreeMap<String, BTreeMap<String, Value>>) {
    let mut streams = BTreeMap::new();
    for id in run_ids {
        if let Ok(chunks) = client.get_json(&format!("/runs/{id}/stream")).await {
            streams.insert(id.clone(), chunks.as_array().cloned().unwrap_or_default());
        }
    }
    let mut storage = BTreeMap::new();
    for id in run_ids {
        if let Ok(page) = client.get_json(&format!("/runs/{id}/storage")).await {
            let entries = page["entries"].as_array().cloned().unwrap_or_default();
            let by_key: BTreeMap<String, Value> = entries
                .into_iter()
                .filter_map(|e| Some((e["key"].as_str()?.to_string(), e["value"].clone())))
                .collect();
            storage.insert(id.clone(), by_key);
        }
    }
    (streams, storage)
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
        "torture seed {}: {} kills, {} runs, {} completed, {} escalated, {} of {} poison runs escalated \
         ({} lives it ended) in {} ms; recording in {}",
        r.seed,
        r.kills,
        r.runs,
        r.completed,
        r.escalated,
        r.poison_escalated,
        r.poison_runs,
        r.poison_exits,
        r.elapsed.as_millis(),
        out.display()
    );
    println!(
        "ids per key (max) {}, duplicate effects {}, missing effects {}, ledger mismatches {}, alarms lost {}, \
         storage mismatches {}, streams wrong {}, children wrong {}, stash version 2 {}, forks {}, events twice {}, store unopenable {}, panics {}, stuck {}, server exits {}: {}",
        r.ids_per_key_max,
        r.duplicate_effects,
        r.missing_effects,
        r.ledger_mismatches,
        r.alarms_lost,
        r.storage_mismatches,
        r.streams_wrong,
        r.children_wrong,
        r.stash_v2,
        r.forks,
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
    Ok(i32::from(!r.pass))
}
