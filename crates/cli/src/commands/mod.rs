//! One module per group of commands; [`run`] dispatches and prints.

pub mod inspect;
pub mod operate;
pub mod repair;

use durafiber_runtime::{Decision, ListFilter};
use durafiber_server::{ServeError, ServerOptions, TlsFiles};

use crate::{
    Agents,
    args::{AlarmsAction, ApprovalsAction, Command, RunsAction, StorageAction, StoreAction, TokensAction},
};

fn print_json(value: &serde_json::Value) -> anyhow::Result<i32> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(0)
}

/// Runs one command for the agents `agents` registers; the exit code on success.
pub async fn run(command: Command, agents: Agents<'_>) -> anyhow::Result<i32> {
    match command {
        command @ Command::Serve { .. } => serve(command, agents).await,
        Command::Store { action: StoreAction::Verify { data, json } } => repair::verify(&data, json).await,
        Command::Store { action: StoreAction::Salvage { data, out, json } } => {
            repair::salvage(&data, &out, json).await
        }
        Command::Backup { server, data, token, out } => {
            let token = token.or_else(|| data.as_deref().and_then(durafiber_server::read_admin_token));
            repair::backup(server, data.as_deref(), token, &out).await
        }
        Command::Restore { file, data } => repair::restore(&file, &data).await,
        Command::CheckDeploy { data, store, json } => {
            inspect::check_deploy(agents, data.as_deref(), store.as_deref(), json).await
        }
        Command::Tokens { action: TokensAction::Create { role, name, target } } => {
            print_json(&inspect::tokens_create(&target, &name, &role).await?)
        }
        Command::Tokens { action: TokensAction::List { target } } => {
            print_json(&inspect::tokens_list(&target).await?)
        }
        Command::Tokens { action: TokensAction::Revoke { name, target } } => {
            print_json(&inspect::tokens_revoke(&target, &name).await?)
        }
        other => on_runs(other, agents).await,
    }
}

/// The commands about runs: inspecting, deciding, sending, operating.
async fn on_runs(command: Command, agents: Agents<'_>) -> anyhow::Result<i32> {
    match command {
        Command::Runs {
            action: RunsAction::List { state, kind, limit, after, stash_version_below, target },
        } => {
            let state = state.map(|s| s.parse()).transpose()?;
            let filter = ListFilter { state, kind, after, limit, stash_version_below };
            print_json(&inspect::runs_list(agents, &target, filter).await?)
        }
        Command::Runs { action: RunsAction::History { run_id, target } } => {
            print_json(&inspect::history(agents, &target, &run_id).await?)
        }
        Command::Runs { action: RunsAction::Fork { run_id, at, key, input, target } } => {
            print_json(&inspect::fork(agents, &target, &run_id, at, &key, input).await?)
        }
        Command::Runs { action: RunsAction::Delete { run_id, target } } => {
            print_json(&inspect::delete_run(agents, &target, &run_id).await?)
        }
        Command::Runs { action: RunsAction::Show { run_id, target } } => {
            print_json(&inspect::runs_show(agents, &target, &run_id).await?)
        }
        Command::Approvals { action: ApprovalsAction::List { target } } => {
            print_json(&inspect::approvals_list(agents, &target).await?)
        }
        Command::Approve { run_id, approval_id, hash, reject, comment, decider, target } => {
            let decision = Decision { approved: !reject, comment };
            let decider = decider.as_deref();
            print_json(
                &inspect::approve(agents, &target, &run_id, &approval_id, &hash, decision, decider).await?,
            )
        }
        Command::SendEvent { run_id, name, payload, key, target } => {
            print_json(&inspect::send_event(agents, &target, &run_id, &name, &payload, key.as_deref()).await?)
        }
        Command::Cancel { run_id, reason, target } => {
            print_json(&inspect::cancel(agents, &target, &run_id, &reason).await?)
        }
        Command::Alarms { action: AlarmsAction::List { run_id, target } } => {
            print_json(&inspect::alarms_list(agents, &target, &run_id).await?)
        }
        Command::Start { kind, key, input, options, target } => {
            print_json(&operate::start(agents, &target, &kind, &key, &input, options.as_deref()).await?)
        }
        Command::Request { run_id, message, target } => {
            print_json(&operate::request(agents, &target, &run_id, &message).await?)
        }
        Command::Storage { action: StorageAction::Get { run_id, key, target } } => {
            print_json(&operate::storage_get(agents, &target, &run_id, &key).await?)
        }
        Command::Storage { action: StorageAction::List { run_id, prefix, after, limit, target } } => {
            print_json(
                &operate::storage_list(agents, &target, &run_id, &prefix, after.as_deref(), limit).await?,
            )
        }
        Command::Stream { run_id, from, target } => {
            operate::stream(agents, &target, &run_id, from).await?;
            Ok(0)
        }
        Command::Pause { run_id, kind, reason, target } => {
            print_json(&operate::pause(agents, &target, run_id.as_ref(), kind.as_deref(), &reason).await?)
        }
        Command::Resume { run_id, kind, target } => {
            print_json(&operate::resume(agents, &target, run_id.as_ref(), kind.as_deref()).await?)
        }
        other => unreachable_command(&other),
    }
}

/// A command `run` handles itself reached `on_runs`: a mistake in this module, said as an error.
fn unreachable_command(command: &Command) -> anyhow::Result<i32> {
    anyhow::bail!("{}: command {command:?} is not one about runs", crate::bin_name())
}

/// `serve`: the server for the agents, until SIGTERM; a failed store exits at once.
async fn serve(command: Command, agents: Agents<'_>) -> anyhow::Result<i32> {
    let Command::Serve {
        data,
        store,
        node_id,
        lease_ttl,
        advertise,
        forward_timeout,
        listen,
        config,
        allowed_hosts,
        open_metrics,
        tls_cert,
        tls_key,
        insecure_plain_http,
    } = command
    else {
        return unreachable_command(&command);
    };
    init_tracing("info");
    let options = ServerOptions {
        listen,
        data,
        store,
        node_id,
        lease_ttl,
        advertise,
        forward_timeout,
        config,
        allowed_hosts,
        open_metrics,
        tls: tls_cert.zip(tls_key).map(|(cert, key)| TlsFiles { cert, key }),
        insecure_plain_http,
    };
    match durafiber_server::serve(&options, agents).await {
        Ok(()) => Ok(0),
        // Exit at once, so a supervisor restarts the server: it reopens the store and
        // recovers every run.
        Err(e @ ServeError::StoreFailed(_)) => {
            eprintln!("{}: {e}", crate::bin_name());
            std::process::exit(durafiber_server::EXIT_STORE_FAILED);
        }
        Err(e) => Err(e.into()),
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `level`).
pub fn init_tracing(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
