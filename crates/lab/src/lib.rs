//! The lab behind the project's own `durafiber` binary: the demo agents hosted with every
//! operational command of `durafiber-cli`, and the commands that exercise them — the
//! kill-and-resume drill, the random-kill torture, the simulations and the benchmarks.
//! None of this is part of the product a user builds on.
//!
//! - [`args`]: the lab's command line, with the operational commands flattened in.
//! - [`agents`]: the demo agents the binary hosts.
//! - [`commands`]: one module per lab command; [`commands::run`] dispatches.

pub mod agents;
pub mod args;
pub mod commands;
