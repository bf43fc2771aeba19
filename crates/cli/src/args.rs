//! The command line: every command, its flags, and their defaults.

use durafiber_runtime::RunId;
use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand};

/// Durable runs for long-running agents: serve them, inspect and decide on them, keep their
/// store.
#[derive(Debug, Parser)]
#[command(name = "durafiber", version)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Where an inspection command finds the runs: a running server, or a bare data directory.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The server's address (127.0.0.1:PORT). Tried first when given.
    #[arg(long, env = "DURAFIBER_SERVER")]
    pub server: Option<SocketAddr>,
    /// The data directory, opened directly when no server answers.
    #[arg(long, env = "DURAFIBER_DATA")]
    pub data: Option<PathBuf>,
    /// The API token for the server; without it, `DATA/admin.token` when readable.
    #[arg(long, env = "DURAFIBER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl Target {
    /// The token to present: the one given, else the admin token the server wrote into the
    /// data directory, when this user can read it.
    pub fn token(&self) -> Option<String> {
        self.token.clone().or_else(|| self.data.as_deref().and_then(durafiber_server::read_admin_token))
    }
}

/// Every operational command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Host the runtime and its HTTP JSON API.
    Serve {
        /// The data directory: the server's own files (the admin token), and the store
        /// unless `--store` names a database.
        #[arg(long)]
        data: PathBuf,
        /// Keep the runs in a PostgreSQL database instead of the data directory
        /// (`postgres://user[:password]@host:port/db`). One server at a time may use it.
        #[arg(long, env = "DURAFIBER_STORE")]
        store: Option<String>,
        /// Share the `--store` database with other nodes as this node: each runs the runs of
        /// the shards it holds a lease on, and takes over a dead node's shards.
        #[arg(long, requires = "store")]
        node_id: Option<String>,
        /// How long a node's lease on its shards lasts without renewal (with `--node-id`):
        /// a dead node's runs move after at most this.
        #[arg(long, requires = "node_id", value_parser = humantime::parse_duration)]
        lease_ttl: Option<std::time::Duration>,
        /// The `host:port` other nodes send this node's requests to (with `--node-id`);
        /// the listen address by default.
        #[arg(long, requires = "node_id")]
        advertise: Option<String>,
        /// How long a request passed on to the node that runs its run waits for the answer
        /// (with `--node-id`); past it the caller gets 503 with `Retry-After`.
        #[arg(long, requires = "node_id", value_parser = humantime::parse_duration,
              default_value = "5s")]
        forward_timeout: std::time::Duration,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: SocketAddr,
        /// A JSON configuration file (durations as "10s", "72h").
        #[arg(long)]
        config: Option<PathBuf>,
        /// Another name clients may reach the server by (`host` or `host:port`), beyond the
        /// listen address and localhost. Repeatable.
        #[arg(long = "allowed-host")]
        allowed_hosts: Vec<String>,
        /// Serve `GET /metrics` without a token, for a Prometheus scraper.
        #[arg(long)]
        open_metrics: bool,
        /// Serve HTTPS with this certificate chain (PEM); with `--tls-key`.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The certificate's private key (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Listen off loopback over plain HTTP (tokens cross the network in clear text: only
        /// behind a proxy that terminates TLS).
        #[arg(long)]
        insecure_plain_http: bool,
    },
    /// Check or repair a data directory: `verify`, `salvage`.
    Store {
        /// What to do.
        #[command(subcommand)]
        action: StoreAction,
    },
    /// A consistent backup of a store, from a running server or a bare data directory.
    Backup {
        /// The server's address; its store keeps serving while the copy is taken.
        #[arg(long, env = "DURAFIBER_SERVER")]
        server: Option<SocketAddr>,
        /// The data directory, when no server runs on it.
        #[arg(long)]
        data: Option<PathBuf>,
        /// An admin token for the server; without it, `DATA/admin.token` when readable.
        #[arg(long, env = "DURAFIBER_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// The backup file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Restores a backup file into a new data directory.
    Restore {
        /// The backup file.
        file: PathBuf,
        /// The data directory to create (it must not hold a store).
        #[arg(long)]
        data: PathBuf,
    },
    /// Before a deploy, run with the new binary: decodes every open run's input and stash
    /// as its agents would, then re-enters each from its last boundary in a sandbox (a copy
    /// of the store in memory, time stopped, effects answered from the ledger, any new call
    /// stopped before it leaves) and lists what the new code does differently: an effect
    /// called with other arguments, a stash it cannot upgrade, a wait it no longer reaches, a
    /// call it would make, a chunk it re-emits otherwise. Exit code 1 only for runs that
    /// would escalate. Reads only.
    CheckDeploy {
        /// The data directory (with no server running on it: take a backup and restore it
        /// elsewhere to check beside a running server).
        #[arg(long, conflicts_with = "store", required_unless_present = "store")]
        data: Option<PathBuf>,
        /// A PostgreSQL store (`postgres://…`), which may be serving meanwhile.
        #[arg(long, env = "DURAFIBER_STORE")]
        store: Option<String>,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Runs: list, show, history, fork, delete.
    Runs {
        /// What to do.
        #[command(subcommand)]
        action: RunsAction,
    },
    /// API tokens: create, list, revoke (on a server, or a bare data directory).
    Tokens {
        /// What to do.
        #[command(subcommand)]
        action: TokensAction,
    },
    /// Pending approvals.
    Approvals {
        /// What to do.
        #[command(subcommand)]
        action: ApprovalsAction,
    },
    /// Record a human decision on a pending approval.
    Approve {
        /// The run's handle.
        run_id: RunId,
        /// The approval within the run.
        approval_id: String,
        /// The payload hash shown by `approvals list`.
        #[arg(long)]
        hash: String,
        /// Reject instead of approve.
        #[arg(long)]
        reject: bool,
        /// A comment for the record.
        #[arg(long, default_value = "")]
        comment: String,
        /// Who decides, on a data directory (a server counts its caller's token): needed for
        /// an approval that takes more than one person, each counted once.
        #[arg(long = "as", value_name = "NAME")]
        decider: Option<String>,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// Send an external event to a run (for its `wait_for_event`).
    SendEvent {
        /// The run's handle.
        run_id: RunId,
        /// The event's name.
        name: String,
        /// The payload, as JSON.
        #[arg(long, default_value = "null")]
        payload: String,
        /// An idempotency key: the same key twice is delivered once.
        #[arg(long)]
        key: Option<String>,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// Ask a run to stop.
    Cancel {
        /// The run's handle.
        run_id: RunId,
        /// Why.
        #[arg(long, default_value = "cancelled by operator")]
        reason: String,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// A run's alarms.
    Alarms {
        /// What to do.
        #[command(subcommand)]
        action: AlarmsAction,
    },
    /// Start a run: durably, once per idempotency key (the same key again is the same run).
    Start {
        /// The agent kind.
        kind: String,
        /// The idempotency key.
        #[arg(long)]
        key: String,
        /// The input, as JSON.
        #[arg(long, default_value = "null")]
        input: String,
        /// How the run is kept, as JSON (a server): `durability`, `fiber_keep_alive`, `budget`.
        #[arg(long)]
        options: Option<String>,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// Ask a live run a question (its `on_request`) and print the reply (a server).
    Request {
        /// The run's handle.
        run_id: RunId,
        /// The request, as JSON.
        #[arg(long, default_value = "null")]
        message: String,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// A run's own key-value storage: get one key, or list keys.
    Storage {
        /// What to do.
        #[command(subcommand)]
        action: StorageAction,
    },
    /// Follow a run's output stream: one JSON line per item (durable chunks; on a server,
    /// also a streaming effect's partial chunks and resets) until the run ends. A dropped
    /// connection is resumed where it was.
    Stream {
        /// The run's handle.
        run_id: RunId,
        /// The first chunk's sequence number.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// The kill switch: hold a kind's runs, or one run, before their next effect or start.
    Pause {
        /// The run to hold (or `--kind`).
        #[arg(required_unless_present = "kind", conflicts_with = "kind")]
        run_id: Option<RunId>,
        /// The agent kind whose runs to hold.
        #[arg(long)]
        kind: Option<String>,
        /// Why: shown as the runs' state.
        #[arg(long)]
        reason: String,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// Lift a pause of a kind or of one run: its runs continue in the order they were held.
    Resume {
        /// The run to let go (or `--kind`).
        #[arg(required_unless_present = "kind", conflicts_with = "kind")]
        run_id: Option<RunId>,
        /// The agent kind to let go.
        #[arg(long)]
        kind: Option<String>,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
}

/// `storage` subcommands.
#[derive(Debug, Subcommand)]
pub enum StorageAction {
    /// One key's value, as JSON (`null` when absent).
    Get {
        /// The run's handle.
        run_id: RunId,
        /// The key.
        key: String,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// Keys and values under a prefix, in key order, a page at a time.
    List {
        /// The run's handle.
        run_id: RunId,
        /// Only keys that start with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Start after this key (the previous page's last).
        #[arg(long)]
        after: Option<String>,
        /// Page size.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
}

/// `store` subcommands.
#[derive(Debug, Subcommand)]
pub enum StoreAction {
    /// Reads every record; reports counts per table and every bad record.
    Verify {
        /// The data directory.
        #[arg(long)]
        data: PathBuf,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Copies every readable record into a fresh store; lists the runs that lost records.
    Salvage {
        /// The damaged data directory.
        #[arg(long)]
        data: PathBuf,
        /// The new data directory (it must not hold a store).
        #[arg(long)]
        out: PathBuf,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// `runs` subcommands.
#[derive(Debug, Subcommand)]
pub enum RunsAction {
    /// List runs, filtered and paged.
    List {
        /// Only runs in this state.
        #[arg(long)]
        state: Option<String>,
        /// Only runs of this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Page size.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Start after this run id.
        #[arg(long)]
        after: Option<RunId>,
        /// Only open runs whose last stash is older than this STASH_VERSION: what a deploy
        /// of that version still has to upgrade.
        #[arg(long)]
        stash_version_below: Option<u32>,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// Show one run: state, stash, ledger, alarms, approvals (secrets redacted).
    Show {
        /// The run's handle.
        run_id: RunId,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// The boundaries a run's history keeps: each stash as it was written, oldest first.
    History {
        /// The run's handle.
        run_id: RunId,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// Fork a run from a boundary of its history: a new run of the same kind from that stash,
    /// what the run had settled before it inherited (nothing paid twice), the rest made anew.
    Fork {
        /// The run to fork.
        run_id: RunId,
        /// The boundary (a `seq` of `runs history`).
        #[arg(long)]
        at: u64,
        /// The fork's idempotency key: the same key again is the same fork.
        #[arg(long)]
        key: String,
        /// The fork's input as JSON; the run's when absent.
        #[arg(long)]
        input: Option<String>,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
    /// Delete a settled run and every record it owns (an admin token on a server); the
    /// audit trail keeps its entries. A start with its idempotency key starts a new run.
    Delete {
        /// The run's handle.
        run_id: RunId,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
}

/// `tokens` subcommands.
#[derive(Debug, Subcommand)]
pub enum TokensAction {
    /// Creates a token and prints it (the only time it is shown).
    Create {
        /// `reader`, `reviewer`, `operator` or `admin`.
        #[arg(long)]
        role: String,
        /// A unique name, shown in the audit trail.
        #[arg(long)]
        name: String,
        /// Where the store is.
        #[command(flatten)]
        target: Target,
    },
    /// Every token's name, role and creation time.
    List {
        /// Where the store is.
        #[command(flatten)]
        target: Target,
    },
    /// Revokes a token at once.
    Revoke {
        /// The token's name.
        name: String,
        /// Where the store is.
        #[command(flatten)]
        target: Target,
    },
}

/// `approvals` subcommands.
#[derive(Debug, Subcommand)]
pub enum ApprovalsAction {
    /// Pending approvals with their payload, hash and age.
    List {
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
}

/// `alarms` subcommands.
#[derive(Debug, Subcommand)]
pub enum AlarmsAction {
    /// A run's pending alarms.
    List {
        /// The run's handle.
        run_id: RunId,
        /// Where the runs are.
        #[command(flatten)]
        target: Target,
    },
}
