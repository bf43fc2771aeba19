//! `durafiber`: parses arguments, runs the command, prints one readable error line and
//! exits non-zero on failure.

use clap::Parser;
use durafiber_cli::{args::Cli, commands};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("durafiber: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    match runtime.block_on(commands::run(cli.command)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("durafiber: {}", format!("{e:#}").replace('\n', " "));
            std::process::exit(1);
        }
    }
}
