//! durafiber: durable runs for long-running AI agents. After the host dies, the same run
//! continues from its last safe boundary, without a second side effect.
//!
//! This crate is the one dependency an application needs:
//!
//! - the runtime's API at the top level — [`Agent`], [`Ctx`], [`Runtime`], [`RuntimeConfig`],
//!   effects, approvals, alarms, streams, budgets;
//! - [`Store`], [`StoreConfig`] and the rest of the store a caller touches, and the whole
//!   store crate as [`store`];
//! - with the feature `server`: `server` (the HTTP API, console, tokens, audit, TLS,
//!   Prometheus, OpenAPI, several nodes), `cli` (every operational command for your agents:
//!   `durafiber::cli::main(|b| b.agent(MyAgent))`) and `client` (a typed HTTP client);
//! - with `client` alone: the typed client;
//! - with `postgres`: the PostgreSQL store, for several nodes;
//! - with `testkit` (a dev-dependency): the crash and eviction checker and test helpers;
//! - [`serde`], [`serde_json`] and [`tokio`], so that an agent's types derive with
//!   `#[serde(crate = "durafiber::serde")]` and nothing else needs adding; [`reqwest`], the
//!   HTTP client the runtime itself is built with (rustls, native roots), for effects'
//!   calls: `durafiber::reqwest::Client::new()`.
//!
//! A binary hosting its own agent, in full:
//!
//! ```ignore
//! fn main() {
//!     durafiber::cli::main(|builder| builder.agent(MyAgent))
//! }
//! ```

pub use durafiber_runtime::*;
pub use durafiber_store::{Durability, Store, StoreConfig, StoreError};

/// The store under the runtime: records, the log, backends, repairs.
pub use durafiber_store as store;

#[cfg(feature = "server")]
pub use durafiber_cli as cli;
#[cfg(feature = "client")]
pub use durafiber_client as client;
#[cfg(feature = "server")]
pub use durafiber_server as server;
#[cfg(feature = "testkit")]
pub use durafiber_testkit as testkit;

pub use reqwest;
pub use serde;
pub use serde_json;
pub use tokio;
