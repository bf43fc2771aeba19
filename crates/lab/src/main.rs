//! `durafiber`: the demo agents behind every operational command, and the lab's commands.
//! Prints one readable error line and exits non-zero on failure.

use durafiber_lab::{agents::Hosting, args::LabCli, commands};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    small_pages_only();
    let cli: LabCli = durafiber_cli::parse_args();
    let hosting = Hosting { order_stash_version: cli.order_stash_version, stop_at: cli.stop_at };
    durafiber_cli::run_to_exit(commands::run(cli.command, hosting))
}

/// Keeps the kernel from backing this process's memory with transparent huge pages, unless
/// the environment asks for them (`MIMALLOC_ALLOW_THP=1`). mimalloc asks for them on every
/// arena it maps. A virtual machine whose balloon reports free memory to its host (as this
/// project's does) hands back exactly the free 2 MiB blocks a huge page is made from, so the
/// host must back each huge page anew at its first touch, as slowly as the host's moment
/// makes it. Without them, a recovery of 100,000 runs there, started as a process of its
/// own, took 1,118–1,431 ms instead of 1,159–2,059 ms, with 45 MB less memory; inside `bench
/// recover --repeat`, whose recoveries follow each other closely, the medians were alike
/// (`benches/RESULTS.md`). Small pages cost a little more CPU, huge pages an unpredictable
/// wait, and a recovery has a deadline. The setting is the process's (`prctl`): it holds for
/// pages mapped before `main` too, and the command's child processes inherit it.
#[cfg(target_os = "linux")]
fn small_pages_only() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    // A kernel that refuses leaves the process as it was: slower to recover, no less correct.
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

#[cfg(not(target_os = "linux"))]
fn small_pages_only() {}
