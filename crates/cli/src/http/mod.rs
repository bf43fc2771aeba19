//! The server's HTTP JSON API ([`server`]) and the client the command line uses
//! ([`client`]).
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
//! | GET, POST | `/ui/...`                           | the reviewer console (HTML; `console/`) |
//!
//! On a store several nodes share, a request that changes a run (any method but GET under
//! `/runs/{id}/`) is passed on to the node that owns the run ([`forward`]).
//!
//! Every error is a JSON object `{"error": "...", "kind": "..."}` with a 4xx status for bad
//! requests and a 5xx status for the runtime's own failures.

mod admin;
pub mod client;
mod console;
mod forward;
pub mod guard;
pub mod listen;
mod openapi;
pub mod routes;
pub mod schema;
pub mod server;
pub mod session;
pub mod state;
mod view;
