//! durafiber's server as a library: the HTTP JSON API, the reviewer console, tokens, roles
//! and the audit trail, Host/Origin checks, TLS, request limits, Prometheus, OpenAPI,
//! server-sent events, backups, and several nodes on PostgreSQL with forwarding — for
//! whatever agents the caller registers.
//!
//! ```no_run
//! use durafiber_server::{ServerOptions, serve};
//! # async fn demo() -> Result<(), durafiber_server::ServeError> {
//! let options = ServerOptions::new("127.0.0.1:7878".parse().unwrap(), "./data");
//! serve(&options, |builder| builder /* .agent(MyAgent) */).await
//! # }
//! ```
//!
//! [`serve`] opens the store [`ServerOptions`] names, hands the runtime's builder to the
//! caller to register its agents, and serves until SIGTERM. The routes, one operation a row
//! as the OpenAPI document lists them (`crates/lab/tests/openapi.rs` checks that they are the
//! same), and the console:
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/health` | 200 while the store takes writes; 503 while it cannot |
//! | GET | `/openapi.json` | this API's document |
//! | GET | `/metrics` | Prometheus text (`--open-metrics`: no token) |
//! | GET | `/metrics.json` | counters and histogram summaries as JSON |
//! | GET | `/events` | the event log, as JSON or server-sent events |
//! | GET | `/runs` | a page of runs, filtered by state, kind, stash version |
//! | POST | `/runs` | start a run (`Idempotency-Key`: the same key is the same run) |
//! | GET | `/runs/{id}` | everything about a run, with its audit entries |
//! | DELETE | `/runs/{id}` | delete a settled run and what it owns |
//! | POST | `/runs/{id}/cancel` | ask a run to stop |
//! | POST | `/runs/{id}/pause` | hold one run before its next effect |
//! | POST | `/runs/{id}/resume` | let a held run go |
//! | POST | `/runs/{id}/events/{name}` | send an external event (with its idempotency key) |
//! | POST | `/runs/{id}/messages` | a message for the run's `on_message` |
//! | POST | `/runs/{id}/requests` | a request answered by the run's `on_request` |
//! | POST | `/runs/{id}/approvals/{approval_id}` | decide an approval, quoting its payload hash |
//! | GET | `/runs/{id}/history` | the boundaries the run's history keeps |
//! | POST | `/runs/{id}/fork` | fork the run from a boundary of its history |
//! | GET | `/runs/{id}/storage` | a page of the run's storage |
//! | GET | `/runs/{id}/stream` | the output stream, as JSON or server-sent events (`Last-Event-ID`) |
//! | GET | `/runs/{id}/alarms` | a page of the run's pending alarms |
//! | PUT | `/runs/{id}/alarms/{name}` | set an alarm |
//! | DELETE | `/runs/{id}/alarms/{name}` | cancel an alarm |
//! | GET | `/approvals` | a page of the approvals waiting for a decision |
//! | POST | `/kinds/{kind}/pause` | the kill switch: hold a kind's runs |
//! | POST | `/kinds/{kind}/resume` | lift a kind's pause |
//! | GET | `/paused` | the paused kinds and a page of the paused runs |
//! | GET | `/tokens` | every token's name, role and creation time |
//! | POST | `/tokens` | create a token (shown this once) |
//! | DELETE | `/tokens/{name}` | revoke a token |
//! | GET | `/audit` | a page of the audit trail |
//! | GET | `/backup` | a consistent backup, taken while serving |
//! | GET, POST | `/ui/...` | the reviewer console (HTML) |
//!
//! On a store several nodes share, a request that changes a run (any method but GET under
//! `/runs/{id}/`) is passed on to the node that owns the run (`forward.rs`).
//!
//! Every error is a JSON object `{"error": "...", "kind": "..."}` with a 4xx status for bad
//! requests and a 5xx status for the runtime's own failures.
//!
//! # Module map
//! - `serve`: options, the store, the caller's builder, the listener, until SIGTERM;
//!   [`listen`]: connections accepted within their limits, TLS; [`capacity`]: how many
//!   connections, sized from the file-descriptor limit, a share kept for the signed-in.
//! - [`routes`]: the router; [`guard`]: Host, Origin, tokens and roles, body limits, every
//!   refusal as JSON; `head_guard`: request heads too large, refused as JSON; `forward`: a
//!   request passed on to the node that owns its run.
//! - [`state`]: what every handler shares, errors as API errors, paging; `handlers`: runs,
//!   events, approvals, alarms, storage, pauses; `watch`: metrics, events, streams, backup,
//!   health; `admin`: tokens and the audit trail; `view`: a run as the API shows it.
//! - [`auth`]: tokens and roles; [`session`]: the console's cookie sessions.
//! - [`schema`]: the bodies and answers as the OpenAPI document declares them; `openapi`:
//!   the document, with the agents' own input schemas.
//! - `console`: the reviewer console's pages.

mod admin;
pub mod auth;
pub mod capacity;
mod console;
mod forward;
pub mod guard;
mod handlers;
mod head_guard;
pub mod listen;
mod openapi;
pub mod routes;
pub mod schema;
mod serve;
pub mod session;
pub mod state;
mod view;
mod watch;

pub use auth::{Role, read_admin_token};
pub use serve::{
    DEFAULT_FORWARD_TIMEOUT, EXIT_STORE_FAILED, ServeError, ServerOptions, TlsFiles, load_config,
    open_runtime, open_store, serve,
};
