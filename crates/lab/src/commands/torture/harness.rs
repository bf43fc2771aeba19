//! The harness's side of a server's life: it starts runs, sends each its event once,
//! approves, and remembers what it asked for and what it was told.

use durafiber_runtime::RunId;
use std::collections::{BTreeMap, BTreeSet};

use durafiber_runtime::rng::SeededRng;
use durafiber_testkit::upstream::Upstream;
use serde_json::{Value, json};

use durafiber_client::Client;

/// New runs started per server life, at most.
const STARTS_PER_LIFE_MAX: usize = 3;
/// The orders after which a poison run is started too (`durafiber_demo::poison`).
const POISON_AFTER_ORDERS: [u64; 2] = [2, 60];

/// The agent kind a key's runs are of.
pub(super) fn kind_of(key: &str) -> &'static str {
    if key.starts_with("poison-") { "poison" } else { "order" }
}

/// Whether runs under `key` are forks (made by the harness, not started).
pub(super) fn is_fork(key: &str) -> bool {
    key.starts_with(FORK_PREFIX)
}

/// What a fork's key starts with; the rest is its source's key.
const FORK_PREFIX: &str = "fork-";

/// The step of the order's last boundary: after its child and every effect.
const LAST_STEP: &str = "done";

/// The harness's memory of what it asked for and what it was told.
pub(super) struct Harness {
    pub(super) upstream: Upstream,
    pub(super) rng: SeededRng,
    /// Every run id each key was answered with.
    pub(super) ids: BTreeMap<String, BTreeSet<String>>,
    /// Keys whose start was not answered yet, with their input: the server died under the
    /// call, or the kill timer cut the round while the call was in flight. A key is written
    /// here before its call, so a call dropped half-way is retried, never forgotten.
    pub(super) unanswered: BTreeMap<String, Value>,
    /// The input each key was started with.
    pub(super) inputs: BTreeMap<String, Value>,
    /// Runs whose `packed` event was not acknowledged yet, with their order key.
    pub(super) unsent: BTreeMap<String, String>,
    pub(super) next_order: u64,
    pub(super) runs_max: usize,
    /// The orders forked, by the source's run id: the fork's key. A fork is made at the
    /// order's last boundary, after its child made the label and every effect settled, so it
    /// inherits all of them and pays for nothing again.
    pub(super) forked: BTreeMap<String, String>,
}

impl Harness {
    pub(super) fn input(&mut self, order: u64) -> Value {
        let delays = [self.rng.between(5, 60), self.rng.between(60, 250)];
        // Half the orders take their first alarm from a cron schedule, every other second.
        let cron = self.rng.chance(0.5).then_some("*/2 * * * * *");
        json!({
            "order_id": format!("ord_{order}"),
            "amount_cents": self.rng.between(100, 10_000),
            "upstream": self.upstream.url(),
            "alarm_delays_ms": delays,
            "cool_off_ms": self.rng.between(10, 200),
            "wait_for_packing": true,
            "cron": cron,
            // A third of the orders wait on alarms whose handlers work a while.
            "alarm_handler_ms": if self.rng.chance(0.33) { self.rng.between(50, 300) } else { 0 },
        })
    }

    pub(super) async fn start(&mut self, client: &Client, key: String, input: Value) {
        self.inputs.insert(key.clone(), input.clone());
        self.unanswered.insert(key.clone(), input.clone());
        let kind = kind_of(&key);
        let answer = client.post_json("/runs", &json!({"kind": kind, "input": input}), Some(&key)).await;
        let Some(id) = answer.ok().and_then(|a| a["run_id"].as_str().map(str::to_string)) else {
            return;
        };
        self.unanswered.remove(&key);
        // Only orders wait for an event.
        if kind == "order" && self.ids.get(&key).is_none_or(|ids| !ids.contains(&id)) {
            self.unsent.insert(id.clone(), key.clone());
        }
        self.ids.entry(key).or_default().insert(id);
    }

    /// Sends each run's `packed` event until the server acknowledges it once.
    pub(super) async fn send_events(&mut self, client: &Client) {
        for (run_id, key) in self.unsent.clone() {
            if send_packed(client, &RunId::from(run_id.as_str()), &key).await.is_ok() {
                self.unsent.remove(&run_id);
            }
        }
    }

    /// One round of a live server's work: retry unanswered starts, start new runs, send
    /// events, approve.
    pub(super) async fn round(&mut self, client: &Client, started_here: &mut usize) {
        for (key, input) in self.unanswered.clone() {
            self.start(client, key, input).await;
        }
        if *started_here < STARTS_PER_LIFE_MAX && self.inputs.len() < self.runs_max {
            self.next_order += 1;
            let order = self.next_order;
            let input = self.input(order);
            // The poison is written down before the order's call: a round cut by the kill
            // timer during that call must not forget it (the next round starts it).
            let poison = POISON_AFTER_ORDERS.contains(&order).then(|| format!("poison-{order}"));
            if let Some(poison) = &poison {
                self.inputs.insert(poison.clone(), Value::Null);
                self.unanswered.insert(poison.clone(), Value::Null);
            }
            self.start(client, format!("order-{order}"), input).await;
            *started_here += 1;
            if let Some(poison) = poison {
                self.start(client, poison, Value::Null).await;
            }
        }
        self.send_events(client).await;
        approve_pending(client).await;
        if self.rng.chance(0.3) {
            self.fork_one(client).await;
        }
    }

    /// Forks a completed order not forked yet (a fork asked again under its key is the same
    /// fork): at its last boundary, so it inherits its label's child run and every effect.
    pub(super) async fn fork_one(&mut self, client: &Client) {
        let unforked: Vec<(String, String)> = self
            .ids
            .iter()
            .filter(|(key, _)| kind_of(key) == "order" && !is_fork(key))
            .flat_map(|(key, ids)| ids.iter().map(move |id| (key.clone(), id.clone())))
            .filter(|(_, id)| !self.forked.contains_key(id))
            .collect();
        for (key, run_id) in unforked {
            let Ok(run) = client.get_json(&format!("/runs/{run_id}")).await else { return };
            if run["run"]["status"].get("completed").is_none() {
                continue;
            }
            let Ok(history) = client.get_json(&format!("/runs/{run_id}/history")).await else { return };
            let at = history.as_array().into_iter().flatten().find(|h| h["step"] == LAST_STEP);
            let Some(at) = at.and_then(|h| h["seq"].as_u64()) else { continue };
            let fork_key = format!("{FORK_PREFIX}{key}");
            // Written down before the call: a fork whose answer a kill cut is asked again.
            self.forked.insert(run_id.clone(), fork_key.clone());
            let answer =
                client.post_json(&format!("/runs/{run_id}/fork"), &json!({"at": at}), Some(&fork_key)).await;
            if let Some(id) = answer.ok().and_then(|a| a["run_id"].as_str().map(str::to_string)) {
                self.ids.entry(fork_key).or_default().insert(id);
            } else {
                self.forked.remove(&run_id);
            }
            return;
        }
    }
}

/// The one `packed` event of the order started under `key`: the outcome the server gave.
pub(super) async fn send_packed(client: &Client, run_id: &RunId, key: &str) -> anyhow::Result<String> {
    let body = json!({"payload": {"box": format!("box-{key}")}, "idempotency_key": format!("packed-{key}")});
    let answer = client.post_json(&format!("/runs/{run_id}/events/packed"), &body, None).await?;
    Ok(answer["outcome"].as_str().unwrap_or("?").to_string())
}

/// Approves every pending `ship` approval with the hash the view shows.
pub(super) async fn approve_pending(client: &Client) {
    let Ok(pending) = client.approvals().await else { return };
    for pending in pending {
        let (run_id, hash) = (pending.run_id, pending.payload_hash);
        let body = json!({"payload_hash": hash, "approved": true, "comment": "torture"});
        let _ = client.post_json(&format!("/runs/{run_id}/approvals/ship"), &body, None).await;
    }
}
