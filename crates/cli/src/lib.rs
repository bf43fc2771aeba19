//! The `durafiber` command as a library, so tests and benchmarks call the same code the
//! binary runs: args → config → runtime call → one line of output.
//!
//! - [`args`]: the command line.
//! - [`commands`]: one module per command (`serve`, `drill`, `sim`, `bench`, inspection).
//! - [`http`]: the server's HTTP JSON API and its client.
//! - [`agents`]: the agents `serve` hosts.

pub mod agents;
pub mod args;
pub mod auth;
pub mod commands;
pub mod http;
