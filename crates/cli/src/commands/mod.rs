//! One module per command; [`run`] dispatches and prints.

pub mod bench;
mod bench_nodes;
mod bench_steps;
pub mod drill;
mod drill_nodes;
pub mod inspect;
mod measure;
mod output;
pub mod repair;
pub mod serve;
pub mod torture;

use durafiber_runtime::{Decision, ListFilter};

use crate::args::{AlarmsAction, ApprovalsAction, Command, RunsAction, Sim, StoreAction, TokensAction};
use durafiber_demo::sim;
use output::print_report;

fn print_json(value: &serde_json::Value) -> anyhow::Result<i32> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(0)
}

/// Runs one command; the exit code on success.
pub async fn run(command: Command) -> anyhow::Result<i32> {
    match command {
        Command::Serve {
            data,
            store,
            node_id,
            lease_ttl,
            advertise,
            listen,
            config,
            allowed_hosts,
            open_metrics,
            tls_cert,
            tls_key,
            insecure_plain_http,
        } => {
            init_tracing("info");
            let tls = tls_cert.zip(tls_key);
            let exposure = serve::Exposure { allowed_hosts, open_metrics, tls, insecure_plain_http };
            let place = serve::Placement { data, store, node_id, lease_ttl, advertise };
            serve::serve(&place, listen, config.as_deref(), exposure).await?;
            Ok(0)
        }
        Command::Drill { json, seed, out, nodes: Some(nodes), pg_url: Some(url), .. } => {
            drill_nodes::run(json, seed, out.as_deref(), nodes, &url).await
        }
        Command::Drill { json, seed, out, stop_at, .. } => {
            drill::run(json, seed, out.as_deref(), &stop_at).await
        }
        Command::Store { action: StoreAction::Verify { data, json } } => repair::verify(&data, json).await,
        Command::Store { action: StoreAction::Salvage { data, out, json } } => {
            repair::salvage(&data, &out, json).await
        }
        Command::Backup { server, data, token, out } => {
            let token = token.or_else(|| data.as_deref().and_then(crate::auth::read_admin_token));
            repair::backup(server, data.as_deref(), token, &out).await
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
        Command::Restore { file, data } => repair::restore(&file, &data).await,
        Command::Torture { json, seed, kills, chaos, out } => {
            torture::run(json, torture::Plan { seed, kills, chaos }, out.as_deref()).await
        }
        Command::Sim { which: Sim::Eviction { json, seed } } => {
            let (lines, report) = sim::eviction(seed).await?;
            print_report(&lines, &report, json)?;
            Ok(0)
        }
        Command::Sim { which: Sim::AlarmRetry { json, fail_times, seed } } => {
            let (lines, report) = sim::alarm_retry(seed, fail_times).await?;
            print_report(&lines, &report, json)?;
            Ok(0)
        }
        Command::Bench { which } => bench::run(which).await,
        Command::Runs {
            action: RunsAction::List { state, kind, limit, after, stash_version_below, target },
        } => {
            let state = state.map(|s| s.parse()).transpose()?;
            let filter = ListFilter { state, kind, after, limit, stash_version_below };
            print_json(&inspect::runs_list(&target, filter).await?)
        }
        Command::Runs { action: RunsAction::Show { run_id, target } } => {
            print_json(&inspect::runs_show(&target, &run_id).await?)
        }
        Command::Approvals { action: ApprovalsAction::List { target } } => {
            print_json(&inspect::approvals_list(&target).await?)
        }
        Command::Approve { run_id, approval_id, hash, reject, comment, target } => {
            let decision = Decision { approved: !reject, comment };
            print_json(&inspect::approve(&target, &run_id, &approval_id, &hash, decision).await?)
        }
        Command::SendEvent { run_id, name, payload, key, target } => {
            print_json(&inspect::send_event(&target, &run_id, &name, &payload, key.as_deref()).await?)
        }
        Command::Cancel { run_id, reason, target } => {
            print_json(&inspect::cancel(&target, &run_id, &reason).await?)
        }
        Command::Alarms { action: AlarmsAction::List { run_id, target } } => {
            print_json(&inspect::alarms_list(&target, &run_id).await?)
        }
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
