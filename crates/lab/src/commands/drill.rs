//! `durafiber drill`: the kill-and-resume drill, end to end, with real processes.
//!
//! 1. start the refund job on a server; it reaches the human approval pause;
//! 2. SIGKILL the server mid-wait; restart it;
//! 3. approve using only the stored handle and the hash the pending-approval view shows;
//! 4. SIGKILL it again between the upstream refund call and the receipt commit (the server
//!    is told to stop exactly there); restart it; wait for completion;
//! 5. score the five metrics against the upstream, which counts objects itself.
//!
//! The upstream lives in this process, so it outlives every server it is killing.

use durafiber_runtime::RunId;
use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use durafiber_demo::agents::RefundDraft;
use durafiber_runtime::payload_hash;
use durafiber_testkit::upstream::Upstream;
use serde::Serialize;
use serde_json::{Value, json};

use durafiber_client::Client;

/// The drill's score and the facts behind it.
#[derive(Debug, Clone, Serialize)]
pub struct DrillReport {
    /// The same run id continued across both kills; no run was invented.
    pub same_run_id: bool,
    /// One refund and one email, counted upstream.
    pub side_effects_once: bool,
    /// The state after each restart is the state before its kill.
    pub state_position: bool,
    /// After the restart, the approval view shows the pending payload.
    pub human_sees_context: bool,
    /// The ledger's receipt hashes equal the upstream objects'.
    pub ledger_matches_upstream: bool,
    /// All five.
    pub pass: bool,
    /// The run's handle.
    pub run_id: String,
    /// The seed.
    pub seed: u64,
    /// Refund objects upstream.
    pub upstream_refunds: usize,
    /// Email objects upstream.
    pub upstream_emails: usize,
    /// Wall time of the whole drill (`elapsed_ms`).
    #[serde(rename = "elapsed_ms", with = "durafiber_api::time::millis_duration")]
    pub elapsed: Duration,
    /// Where the recording is.
    pub recording: String,
}

pub(super) struct Server {
    pub child: Child,
    pub client: Client,
    pub log: PathBuf,
}

fn spawn_server(exe: &Path, data: &Path, log: &Path, stop_at: Option<&str>) -> anyhow::Result<Server> {
    spawn_server_with(exe, data, log, stop_at, &[])
}

/// `durafiber serve` on a free loopback port, with `extra` arguments, its stderr in `log`.
pub(super) fn spawn_server_with(
    exe: &Path,
    data: &Path,
    log: &Path,
    stop_at: Option<&str>,
    extra: &[&str],
) -> anyhow::Result<Server> {
    let log_file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(exe);
    if let Some(point) = stop_at {
        cmd.args(["--stop-at", point]);
    }
    cmd.args(["serve", "--data"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file);
    let mut child = cmd.spawn().with_context(|| format!("starting {}", exe.display()))?;
    let stdout = child.stdout.take().context("server stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).context("the server did not start listening")?;
    let addr: SocketAddr = line
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("unexpected first line from the server: {line}"))?;
    let client = Client::from_addr(addr)
        .with_retry_budget(Duration::ZERO)
        .with_token(durafiber_server::read_admin_token(data));
    Ok(Server { child, client, log: log.to_path_buf() })
}

pub(super) fn sigkill(server: &mut Server) {
    let _ = server.child.kill(); // SIGKILL
    let _ = server.child.wait();
}

pub(super) fn sigterm(server: &mut Server) {
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_child(&server.child),
        rustix::process::Signal::TERM,
    );
    let _ = server.child.wait();
}

/// Polls the run until `pred` holds. The drill orchestrates real processes in real time.
pub(super) async fn wait_run(
    client: &Client,
    run_id: &RunId,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(run) = client.get_json(&format!("/runs/{run_id}")).await
            && pred(&run)
        {
            return Ok(run);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for the run to {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server's log as text, empty when it cannot be read. Read lossily: a server killed while
/// it wrote a line can leave half a character at the end (its lines carry `µs`), and a
/// strict read would then see no log at all.
pub(super) fn read_log(path: &Path) -> String {
    std::fs::read(path).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default()
}

async fn wait_log(path: &Path, needle: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !read_log(path).contains(needle) {
        if Instant::now() > deadline {
            bail!("timed out waiting for {needle:?} in {}", path.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn position(run: &Value) -> (Value, Value) {
    (run["run"]["status"].clone(), run["stash"]["seq"].clone())
}

fn ledger_entry<'a>(run: &'a Value, effect: &str) -> Option<&'a Value> {
    run["ledger"].as_array()?.iter().find(|e| e["effect_id"] == effect)
}

pub(super) fn hash_of(value: &Value) -> String {
    payload_hash(value).unwrap_or_default()
}

/// The refund a drill asks for, by its seed.
pub(super) fn refund_draft(seed: u64) -> RefundDraft {
    RefundDraft {
        order_id: format!("ord_{seed}"),
        amount_cents: 1_000 + seed % 9_000,
        reason: "customer request".into(),
    }
}

/// Starts the refund job of `draft` through `server` and waits until it pauses for a human;
/// its run id and its view then.
pub(super) async fn start_refund(
    server: &Server,
    seed: u64,
    draft: &RefundDraft,
    upstream: &Upstream,
) -> anyhow::Result<(RunId, Value)> {
    let input = json!({
        "order_id": draft.order_id, "amount_cents": draft.amount_cents,
        "customer_email": "customer@example.com", "upstream": upstream.url(), "api_key": null,
    });
    let key = format!("drill-{seed}");
    let started =
        server.client.post_json("/runs", &json!({"kind": "refund", "input": input}), Some(&key)).await?;
    let run_id = RunId::from(started["run_id"].as_str().context("no run id")?);
    let waiting = wait_run(&server.client, &run_id, "pause for approval", |r| {
        r["run"]["status"].get("waiting_approval").is_some()
    })
    .await?;
    Ok((run_id, waiting))
}

/// Whether the approvals `server` lists show the run's pause with the draft and its hash, and
/// the hash to quote.
pub(super) async fn pending_approval(
    server: &Server,
    run_id: &RunId,
    draft: &RefundDraft,
) -> anyhow::Result<(bool, String)> {
    let view = serde_json::to_value(server.client.approvals().await?)?;
    let pending = view.as_array().and_then(|a| a.iter().find(|p| p["run_id"] == run_id.as_str())).cloned();
    let draft_json = serde_json::to_value(draft)?;
    let human_sees_context = pending
        .as_ref()
        .is_some_and(|p| p["payload"] == draft_json && p["payload_hash"] == hash_of(&draft_json).as_str());
    let hash = pending.as_ref().and_then(|p| p["payload_hash"].as_str()).context("no pending approval")?;
    Ok((human_sees_context, hash.to_string()))
}

/// Runs the drill with the `durafiber` binary at `exe`; the recording goes to `out`.
pub async fn drill(exe: &Path, seed: u64, out: &Path, stop_at: &str) -> anyhow::Result<DrillReport> {
    if !stop_at.ends_with(":refund") || !stop_at.starts_with("after_effect_") {
        bail!(
            "--stop-at must be after_effect_prepare:refund, after_effect_call:refund or after_effect_commit:refund"
        );
    }
    let started = Instant::now();
    let data = out.join("data");
    if data.exists() {
        std::fs::remove_dir_all(&data).with_context(|| format!("clearing {}", data.display()))?;
    }
    std::fs::create_dir_all(out)?;
    let upstream = Upstream::start().await.context("starting the upstream")?;
    let draft = refund_draft(seed);

    eprintln!("drill: [1/5] start the refund job; it pauses for a human");
    let mut s1 = spawn_server(exe, &data, &out.join("server-1.log"), None)?;
    let (run_id, before_kill_1) = start_refund(&s1, seed, &draft, &upstream).await?;

    eprintln!("drill: [2/5] SIGKILL the server mid-wait, restart it");
    sigkill(&mut s1);
    let mut s2 = spawn_server(exe, &data, &out.join("server-2.log"), Some(stop_at))?;
    let after_kill_1 = s2.client.get_json(&format!("/runs/{run_id}")).await?;
    let (human_sees_context, hash) = pending_approval(&s2, &run_id, &draft).await?;

    eprintln!("drill: [3/5] approve with the stored handle and the hash the view shows");
    s2.client
        .post_json(
            &format!("/runs/{run_id}/approvals/refund"),
            &json!({"payload_hash": hash, "approved": true, "comment": "drill"}),
            None,
        )
        .await?;
    wait_log(&s2.log, &format!("STOPPED AT {stop_at}")).await?;
    let before_kill_2 = s2.client.get_json(&format!("/runs/{run_id}")).await?;

    eprintln!("drill: [4/5] SIGKILL at {stop_at}, restart");
    sigkill(&mut s2);
    let mut s3 = spawn_server(exe, &data, &out.join("server-3.log"), None)?;
    let after_kill_2 = s3.client.get_json(&format!("/runs/{run_id}")).await?;
    let done =
        wait_run(&s3.client, &run_id, "complete", |r| r["run"]["status"].get("completed").is_some()).await?;
    let runs = s3.client.get_query("/runs", &[("kind", "refund".into()), ("limit", "100".into())]).await?;
    sigterm(&mut s3);

    eprintln!("drill: [5/5] score against the upstream");
    let snaps = Snapshots { before_kill_1, after_kill_1, before_kill_2, after_kill_2, done, runs };
    let logs: Vec<String> = (1..=3).map(|i| read_log(&out.join(format!("server-{i}.log")))).collect();
    let outcome = Outcome { snaps, run_id, stop_at, logs, human_sees_context, seed, started };
    conclude(outcome, &upstream, out, true, json!({}))
}

/// What a drill saw, to be scored.
pub(super) struct Outcome<'a> {
    pub snaps: Snapshots,
    pub run_id: RunId,
    pub stop_at: &'a str,
    /// The logs of the servers that ran the run.
    pub logs: Vec<String>,
    pub human_sees_context: bool,
    pub seed: u64,
    pub started: Instant,
}

/// Scores `o` against the upstream, writes the recording (with `extra`'s fields) into
/// `out`, and returns the report; `also` is a further metric that must pass.
pub(super) fn conclude(
    o: Outcome,
    upstream: &Upstream,
    out: &Path,
    also: bool,
    extra: Value,
) -> anyhow::Result<DrillReport> {
    let (refunds, emails) = (upstream.objects("refunds"), upstream.objects("emails"));
    let scores = score(&o.snaps, &o.run_id, o.stop_at, &o.logs, &refunds, &emails);
    let report = DrillReport {
        pass: scores.iter().all(|ok| *ok) && o.human_sees_context && also,
        same_run_id: scores[0],
        side_effects_once: scores[1],
        state_position: scores[2],
        human_sees_context: o.human_sees_context,
        ledger_matches_upstream: scores[3],
        run_id: o.run_id.into_string(),
        seed: o.seed,
        upstream_refunds: refunds.len(),
        upstream_emails: emails.len(),
        elapsed: o.started.elapsed(),
        recording: out.display().to_string(),
    };
    let s = &o.snaps;
    let mut recording = json!({
        "report": report, "upstream": {"refunds": refunds, "emails": emails},
        "snapshots": {"before_kill_1": s.before_kill_1, "after_kill_1": s.after_kill_1,
                      "before_kill_2": s.before_kill_2, "after_kill_2": s.after_kill_2,
                      "final": s.done},
    });
    if let (Some(r), Some(fields)) = (recording.as_object_mut(), extra.as_object()) {
        r.extend(fields.clone());
    }
    std::fs::write(out.join("report.json"), serde_json::to_string_pretty(&recording)?)?;
    Ok(report)
}

/// What the drill saw of the run around each kill, as the API showed it.
pub(super) struct Snapshots {
    pub before_kill_1: Value,
    pub after_kill_1: Value,
    pub before_kill_2: Value,
    pub after_kill_2: Value,
    pub done: Value,
    pub runs: Value,
}

/// Scores four of the five metrics (the fifth, the approval view, is seen live):
/// `[same_run_id, side_effects_once, state_position, ledger_matches_upstream]`.
fn score(
    s: &Snapshots,
    run_id: &RunId,
    stop_at: &str,
    logs: &[String],
    refunds: &[Value],
    emails: &[Value],
) -> [bool; 4] {
    let key_before = ledger_entry(&s.before_kill_2, "refund").map(|e| e["idempotency_key"].clone());
    let key_after = ledger_entry(&s.after_kill_2, "refund").map(|e| e["idempotency_key"].clone());
    let committed_before_kill = stop_at == "after_effect_commit:refund";
    let state_position = position(&s.before_kill_1) == position(&s.after_kill_1)
        && key_before.is_some()
        && key_before == key_after
        && ledger_entry(&s.before_kill_2, "refund")
            .is_some_and(|e| e["committed"].is_null() != committed_before_kill)
        && s.done["approvals"].as_array().is_some_and(|a| a.len() == 1);
    let same_run_id =
        s.runs["runs"].as_array().is_some_and(|r| r.len() == 1 && r[0]["run_id"] == run_id.as_str())
            && s.done["run"]["run_id"] == run_id.as_str()
            && logs.iter().all(|l| l.contains(run_id.as_str()));
    let receipt_matches = |effect: &str, objects: &[Value]| {
        objects.len() == 1
            && ledger_entry(&s.done, effect)
                .is_some_and(|e| e["committed"]["receipt_hash"] == hash_of(&objects[0]).as_str())
    };
    let ledger_matches_upstream =
        receipt_matches("refund", refunds) && receipt_matches("email:confirmation", emails);
    let side_effects_once = refunds.len() == 1 && emails.len() == 1;
    [same_run_id, side_effects_once, state_position, ledger_matches_upstream]
}

/// `durafiber drill`: prints the score table; exit 0 only if every metric passes.
pub async fn run(json_line: bool, seed: u64, out: Option<&Path>, stop_at: &str) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("locating the durafiber binary")?;
    let r = drill(&exe, seed, &out_dir(out, seed), stop_at).await?;
    Ok(print_report(&r, None, json_line))
}

/// Where the recording goes: `out`, or a fresh directory under the system's temporary one.
pub(super) fn out_dir(out: Option<&Path>, seed: u64) -> PathBuf {
    match out {
        Some(dir) => dir.to_path_buf(),
        None => std::env::temp_dir().join(format!("durafiber-drill-{seed}-{}", std::process::id())),
    }
}

/// Across nodes: how many, the failover, and whether the stopped node was fenced.
pub(super) struct AcrossNodes {
    pub nodes: usize,
    pub failover: Duration,
    pub zombie_fenced: bool,
}

/// Prints the score table (and the JSON line); the exit code: 0 only if every metric passes.
pub(super) fn print_report(r: &DrillReport, across: Option<&AcrossNodes>, json_line: bool) -> i32 {
    let mark = |ok: bool| if ok { "PASS" } else { "FAIL" };
    println!("{:<26} result", "metric");
    println!("{:<26} {}", "same run id continues", mark(r.same_run_id));
    println!(
        "{:<26} {} ({} refund, {} email upstream)",
        "side effects once",
        mark(r.side_effects_once),
        r.upstream_refunds,
        r.upstream_emails
    );
    println!("{:<26} {}", "state-machine position", mark(r.state_position));
    println!("{:<26} {}", "human sees prior context", mark(r.human_sees_context));
    println!("{:<26} {}", "ledger matches upstream", mark(r.ledger_matches_upstream));
    if let Some(a) = across {
        println!(
            "{:<26} {} ({} nodes; failover {} ms)",
            "stopped node fenced",
            mark(a.zombie_fenced),
            a.nodes,
            a.failover.as_millis()
        );
    }
    println!("run {} in {} ms; recording in {}", r.run_id, r.elapsed.as_millis(), r.recording);
    if json_line {
        let mut line = json!({
            "same_run_id": r.same_run_id, "side_effects_once": r.side_effects_once, "state_position": r.state_position,
            "human_sees_context": r.human_sees_context, "ledger_matches_upstream": r.ledger_matches_upstream,
            "pass": r.pass, "run_id": r.run_id, "seed": r.seed,
        });
        if let Some(a) = across {
            line["nodes"] = json!(a.nodes);
            line["failover_ms"] = json!(a.failover.as_millis() as u64);
            line["zombie_fenced"] = json!(a.zombie_fenced);
        }
        println!("{line}");
    }
    i32::from(!r.pass)
}
