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
//! caller to register its agents, and serves until SIGTERM. The routes:
//!
//! | method | path                                   | what                                  |
//! |--------|----------------------------------------|---------------------------------------|
//! | GET    | `/health`                              | liveness                              |
//! | POST   | `/runs` (`Idempotency-Key` header)     | start `{kind, input, options?}`       |
//! | GET    | `/runs?state=&kind=&limit=&after=`     | list runs, paged                      |
//! | GET    | `/runs/{id}`                           | state, stash, ledger, alarms, approvals (secrets redacted) |
//! | POST   | `/runs/{id}/cancel`                    | `{reason}`                            |
//! | POST   | `/runs/{id}/messages`                  | a message for `on_message`            |
//! | POST   | `/runs/{id}/requests`                  | a request for `on_request`: `{reply}` |
//! | POST   | `/runs/{id}/events/{name}`             | `{payload, idempotency_key?}`         |
//! | GET    | `/runs/{id}/storage?prefix=&start_after=&limit=` | the run's storage, paged    |
//! | GET    | `/approvals`                           | pending approvals: payload, hash, age |
//! | POST   | `/runs/{id}/approvals/{approval_id}`   | `{payload_hash, approved, comment}`   |
//! | GET    | `/runs/{id}/alarms`                    | the run's alarms                      |
//! | PUT    | `/runs/{id}/alarms/{name}`             | `{delay_ms | at_ms, payload, every_ms}` |
//! | DELETE | `/runs/{id}/alarms/{name}`             | cancel an alarm                       |
//! | GET    | `/metrics`, `/metrics.json`            | Prometheus text; this runtime's counters and histograms as JSON |
//! | GET    | `/events?run_id=&after=`               | the event log; server-sent events with `Accept: text/event-stream` |
//! | POST, GET, DELETE | `/tokens`, `/tokens/{name}`, GET `/audit` | tokens and the audit trail (admin) |
//! | GET    | `/openapi.json`                        | this API as an OpenAPI 3.1 document   |
//! | GET, POST | `/ui/...`                           | the reviewer console (HTML) |
//!
//! On a store several nodes share, a request that changes a run (any method but GET under
//! `/runs/{id}/`) is passed on to the node that owns the run (`forward.rs`).
//!
//! Every error is a JSON object `{"error": "...", "kind": "..."}` with a 4xx status for bad
//! requests and a 5xx status for the runtime's own failures.

mod admin;
pub mod auth;
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
