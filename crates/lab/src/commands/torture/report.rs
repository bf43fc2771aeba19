//! What the torture is asked to do, and its score.

use serde::Serialize;
use std::time::Duration;

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
    /// Order runs that ended `Escalated` (must be 0: only the poison may).
    pub escalated: usize,
    /// Poison runs started: their recovery hook aborts the process.
    pub poison_runs: usize,
    /// Poison runs that ended `Escalated` for their hook's deaths (must be all of them).
    pub poison_escalated: usize,
    /// Server lives the poison ended (not counted as server exits).
    pub poison_exits: usize,
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
    /// Completed runs whose output stream is not their phases and receipt, once each and in
    /// order.
    pub streams_wrong: usize,
    /// Completed orders whose output does not name the label their child run made.
    pub children_wrong: usize,
    /// Runs whose last stash was written (or upgraded) by version 2 of the order agent, deployed
    /// halfway: more than none, or the deploy carried nothing.
    pub stash_v2: usize,
    /// Completed orders forked at their last boundary, by the harness, under kills: each
    /// counted among the runs and scored as one (more than none).
    pub forks: usize,
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
    /// Wall time (`elapsed_ms`).
    #[serde(rename = "elapsed_ms", with = "durafiber_api::time::millis_duration")]
    pub elapsed: Duration,
    /// All failure counts are 0, every order completed and every poison run escalated.
    pub pass: bool,
}
