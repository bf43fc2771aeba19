//! The operational command line for any set of agents, as a library: a user's own binary is
//! one call.
//!
//! ```no_run
//! # use durafiber_runtime::RuntimeBuilder;
//! # fn register(b: RuntimeBuilder) -> RuntimeBuilder { b }
//! fn main() {
//!     durafiber_cli::main(|builder| register(builder) /* .agent(MyAgent) */)
//! }
//! ```
//!
//! That binary has every operational command — `serve`, `runs`, `approvals`, `approve`,
//! `cancel`, `alarms`, `send-event`, `tokens`, `store verify|salvage`, `backup`, `restore`,
//! `check-deploy` — for the agents the closure registers, with one readable error line and a
//! non-zero exit code on failure.
//!
//! - [`args`]: the commands, their flags, and their defaults.
//! - [`commands`]: what each command does; [`commands::run`] dispatches.

pub mod args;
pub mod commands;

use std::future::Future;

use clap::Parser;
use durafiber_runtime::RuntimeBuilder;

pub use args::{Cli, Command};
pub use commands::run;

/// What registers the binary's agents on a runtime's builder.
pub type Agents<'a> = &'a dyn Fn(RuntimeBuilder) -> RuntimeBuilder;

/// The running binary's file name, for messages (`durafiber` when it cannot be told).
pub fn bin_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|arg0| std::path::Path::new(&arg0).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "durafiber".into())
}

/// Parses the command line into `P`, named after the running binary in help and errors.
pub fn parse_args<P: Parser>() -> P {
    let name = bin_name();
    let matches = P::command().name(name.clone()).bin_name(name).get_matches();
    match P::from_arg_matches(&matches) {
        Ok(parsed) => parsed,
        Err(e) => e.exit(),
    }
}

/// Runs `work` on a multi-threaded tokio runtime and exits with its code; an error is
/// printed as one line, prefixed with the binary's name, with exit code 1.
pub fn run_to_exit(work: impl Future<Output = anyhow::Result<i32>>) -> ! {
    let name = bin_name();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    match runtime.block_on(work) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("{name}: {}", format!("{e:#}").replace('\n', " "));
            std::process::exit(1);
        }
    }
}

/// The whole `main` of a binary hosting the agents `agents` registers: parses the command
/// line, runs the command, exits.
pub fn main(agents: impl Fn(RuntimeBuilder) -> RuntimeBuilder) -> ! {
    let cli: Cli = parse_args();
    run_to_exit(run(cli.command, &agents))
}
