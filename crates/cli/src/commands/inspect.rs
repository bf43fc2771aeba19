//! `runs list|show`, `approvals list`, `approve`, `cancel`, `alarms list`: through a running
//! server when one answers, or straight on the data directory when none runs. On a bare
//! directory the runtime opens passively: it reads and records decisions, and never runs an
//! agent; the next server picks the decision up.

use anyhow::{Context as _, bail};
use durafiber_runtime::{Decision, ListFilter, Runtime};
use durafiber_runtime::{
    RunId, Timestamp,
    clock::{Clock, SystemClock},
};
use durafiber_store::{Store, StoreConfig, StoreError, access};
use serde_json::{Value, json};

use durafiber_client::Client;
use durafiber_server::auth;

use crate::{Agents, args::Target};

/// Where a command's answer comes from.
pub enum Source {
    /// A live server.
    Server(Client),
    /// The data directory itself.
    Direct(Runtime),
}

/// Picks the server when it answers, else the data directory.
pub async fn source(target: &Target, agents: Agents<'_>) -> anyhow::Result<Source> {
    if let Some(addr) = target.server {
        let client = Client::from_addr(addr).with_token(target.token());
        if client.is_up().await {
            return Ok(Source::Server(client));
        }
        if target.data.is_none() {
            bail!("no server answers at {addr}, and no --data directory was given");
        }
    }
    let Some(dir) = &target.data else { bail!("give --server ADDR or --data DIR") };
    // An inspection never creates a store: a typo in --data is an error, not an empty list.
    let store = match Store::open_existing_dir(dir, StoreConfig::default()) {
        Ok(s) => s,
        Err(StoreError::DirLocked { path }) => {
            bail!("{} is in use by a running server; pass --server ADDR to talk to it", path.display())
        }
        Err(e) => return Err(e).with_context(|| format!("opening {}", dir.display())),
    };
    let runtime = agents(Runtime::builder(store)).passive().open().await?;
    Ok(Source::Direct(runtime))
}

/// `check-deploy`: this binary's agents against every open run of a store, read passively.
pub async fn check_deploy(
    agents: Agents<'_>,
    data: Option<&std::path::Path>,
    url: Option<&str>,
    json: bool,
) -> anyhow::Result<i32> {
    let (store, place) = match (data, url) {
        (_, Some(url)) => {
            (Store::open_postgres(url, StoreConfig::default())?, "the PostgreSQL store".to_string())
        }
        (Some(dir), None) => match Store::open_existing_dir(dir, StoreConfig::default()) {
            Ok(s) => (s, dir.display().to_string()),
            Err(StoreError::DirLocked { path }) => bail!(
                "{} is in use by a running server: stop it, or check a restored backup of it",
                path.display()
            ),
            Err(e) => return Err(e).with_context(|| format!("opening {}", dir.display())),
        },
        (None, None) => bail!("give --data DIR or --store postgres://…"),
    };
    let runtime = agents(Runtime::builder(store)).passive().open().await?;
    let problems = runtime.check_deploy();
    let replay = match &problems {
        Ok(_) => Some(runtime.replay_open_runs().await),
        Err(_) => None,
    };
    runtime.shutdown().await;
    let problems = problems?;
    let replay = replay.transpose()?.unwrap_or_default();
    // A run whose input or stash does not decode escalates in the replay too: said once.
    let decoded_badly = |run_id: &RunId| problems.iter().any(|p| &p.run_id == run_id);
    let escalating =
        problems.len() + replay.runs.iter().filter(|r| r.escalates && !decoded_badly(&r.run_id)).count();
    if json {
        println!(
            "{}",
            json!({ "would_escalate": escalating, "runs": problems, "replayed": replay.replayed,
                    "replay": replay.runs, "replay_ms": replay.took.as_millis() as u64 })
        );
    } else {
        for problem in &problems {
            println!("WOULD ESCALATE {problem}");
        }
        for run in &replay.runs {
            for finding in &run.findings {
                let tag = if run.escalates { "WOULD ESCALATE" } else { "DIFFERS" };
                if !(run.escalates && decoded_badly(&run.run_id)) {
                    println!("{tag} {} ({}): {finding}", run.run_id, run.kind);
                }
            }
        }
        println!(
            "{escalating} open runs in {place} would escalate; {} replayed in {} ms, {} treated differently",
            replay.replayed,
            replay.took.as_millis(),
            replay.runs.len()
        );
    }
    Ok(i32::from(escalating > 0))
}

fn to_json<T: serde::Serialize>(value: T) -> anyhow::Result<Value> {
    Ok(serde_json::to_value(value)?)
}

/// `runs list`.
pub async fn runs_list(agents: Agents<'_>, target: &Target, filter: ListFilter) -> anyhow::Result<Value> {
    match source(target, agents).await? {
        Source::Server(c) => {
            let mut q = vec![("limit", filter.limit.to_string())];
            if let Some(below) = filter.stash_version_below {
                q.push(("stash_version_below", below.to_string()));
            }
            let state = filter.state.map(|s| s.name().to_string());
            for (k, v) in
                [("state", state), ("kind", filter.kind), ("after", filter.after.map(RunId::into_string))]
            {
                if let Some(v) = v {
                    q.push((k, v));
                }
            }
            Ok(c.get_query("/runs", &q).await?)
        }
        Source::Direct(rt) => to_json(rt.list(&filter)?),
    }
}

/// `runs show`.
pub async fn runs_show(agents: Agents<'_>, target: &Target, run_id: &RunId) -> anyhow::Result<Value> {
    match source(target, agents).await? {
        Source::Server(c) => Ok(c.get_json(&format!("/runs/{run_id}")).await?),
        Source::Direct(rt) => to_json(rt.inspect(run_id)?),
    }
}

/// `approvals list`.
pub async fn approvals_list(agents: Agents<'_>, target: &Target) -> anyhow::Result<Value> {
    match source(target, agents).await? {
        Source::Server(c) => to_json(c.approvals().await?),
        Source::Direct(rt) => to_json(rt.pending_approvals(None)?),
    }
}

/// `approve`.
pub async fn approve(
    agents: Agents<'_>,
    target: &Target,
    run_id: &RunId,
    approval_id: &str,
    hash: &str,
    decision: Decision,
    decider: Option<&str>,
) -> anyhow::Result<Value> {
    match source(target, agents).await? {
        Source::Server(c) => {
            if decider.is_some() {
                anyhow::bail!("--as is for a data directory: the server counts the token that asks");
            }
            let body =
                json!({"payload_hash": hash, "approved": decision.approved, "comment": decision.comment});
            Ok(c.post_json(&format!("/runs/{run_id}/approvals/{approval_id}"), &body, None).await?)
        }
        Source::Direct(rt) => match decider {
            // Whoever holds the data directory may decide as any reviewer.
            Some(name) => {
                let decider =
                    durafiber_runtime::Decider::new(name, &["reader", "reviewer", "operator", "admin"]);
                to_json(rt.approve_as(run_id, approval_id, hash, decision, &decider).await?)
            }
            None => to_json(rt.approve(run_id, approval_id, hash, decision).await?),
        },
    }
}

/// `send-event`.
pub async fn send_event(
    agents: Agents<'_>,
    target: &Target,
    run_id: &RunId,
    name: &str,
    payload_json: &str,
    key: Option<&str>,
) -> anyhow::Result<Value> {
    let payload: Value = serde_json::from_str(payload_json).context("--payload is not JSON")?;
    match source(target, agents).await? {
        Source::Server(c) => {
            let body = json!({"payload": payload, "idempotency_key": key});
            Ok(c.post_json(&format!("/runs/{run_id}/events/{name}"), &body, None).await?)
        }
        Source::Direct(rt) => {
            let outcome = rt.send_event_json(run_id, name, &payload.to_string(), key).await?;
            to_json(json!({"run_id": run_id, "name": name, "outcome": outcome}))
        }
    }
}

/// `cancel`.
pub async fn cancel(
    agents: Agents<'_>,
    target: &Target,
    run_id: &RunId,
    reason: &str,
) -> anyhow::Result<Value> {
    match source(target, agents).await? {
        Source::Server(c) => {
            Ok(c.post_json(&format!("/runs/{run_id}/cancel"), &json!({"reason": reason}), None).await?)
        }
        Source::Direct(rt) => to_json(json!({"run_id": run_id, "status": rt.cancel(run_id, reason).await?})),
    }
}

/// `runs delete`.
pub async fn delete_run(agents: Agents<'_>, target: &Target, run_id: &RunId) -> anyhow::Result<Value> {
    match source(target, agents).await? {
        Source::Server(c) => Ok(c.delete_json(&format!("/runs/{run_id}")).await?),
        Source::Direct(rt) => to_json(rt.delete_run(run_id).await?),
    }
}

/// `runs history`.
pub async fn history(agents: Agents<'_>, target: &Target, run_id: &RunId) -> anyhow::Result<Value> {
    match source(target, agents).await? {
        Source::Server(c) => Ok(c.get_json(&format!("/runs/{run_id}/history")).await?),
        Source::Direct(rt) => to_json(rt.history(run_id)?),
    }
}

/// `runs fork`: on a data directory the fork is written, and the next `serve` runs it.
pub async fn fork(
    agents: Agents<'_>,
    target: &Target,
    run_id: &RunId,
    at: u64,
    key: &str,
    input: Option<String>,
) -> anyhow::Result<Value> {
    let parsed: Option<Value> = input
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--input: {e}"))?;
    match source(target, agents).await? {
        Source::Server(c) => {
            let body = json!({"at": at, "input": parsed});
            Ok(c.post_json(&format!("/runs/{run_id}/fork"), &body, Some(key)).await?)
        }
        Source::Direct(rt) => {
            let options = durafiber_runtime::ForkOptions { input_json: input, ..Default::default() };
            to_json(rt.fork(run_id, at, key, options).await?)
        }
    }
}

/// `alarms list`.
pub async fn alarms_list(agents: Agents<'_>, target: &Target, run_id: &RunId) -> anyhow::Result<Value> {
    match source(target, agents).await? {
        Source::Server(c) => to_json(c.alarms(run_id).await?),
        Source::Direct(rt) => to_json(rt.alarms(run_id)?),
    }
}

/// The store of a bare data directory, for `tokens` when no server runs on it.
async fn bare_store(target: &Target) -> anyhow::Result<Store> {
    let Some(dir) = &target.data else { bail!("give --server ADDR or --data DIR") };
    match Store::open_existing_dir(dir, StoreConfig::default()) {
        Ok(s) => Ok(s),
        Err(StoreError::DirLocked { path }) => {
            bail!("{} is in use by a running server; pass --server ADDR to talk to it", path.display())
        }
        Err(e) => Err(e).with_context(|| format!("opening {}", dir.display())),
    }
}

/// The server's client when one answers on `target`, else `None`.
async fn server_of(target: &Target) -> Option<Client> {
    let client = Client::from_addr(target.server?).with_token(target.token());
    client.is_up().await.then_some(client)
}

/// The time now, on this machine's clock: the command runs without a runtime.
fn now() -> Timestamp {
    SystemClock.now()
}

/// `tokens create`.
pub async fn tokens_create(target: &Target, name: &str, role: &str) -> anyhow::Result<Value> {
    if let Some(c) = server_of(target).await {
        return Ok(c.post_json("/tokens", &json!({"name": name, "role": role}), None).await?);
    }
    let store = bare_store(target).await?;
    let role: auth::Role = role.parse()?;
    let token = auth::create(&store, name, role, now()).await?;
    access::append(
        &store,
        "durafiber-cli",
        "token_create",
        None,
        &format!("name={name:?} role={role}"),
        now(),
    )
    .await?;
    store.close();
    Ok(json!({"name": name, "role": role, "token": token}))
}

/// `tokens list`.
pub async fn tokens_list(target: &Target) -> anyhow::Result<Value> {
    if let Some(c) = server_of(target).await {
        return Ok(c.get_json("/tokens").await?);
    }
    let store = bare_store(target).await?;
    let tokens = auth::shown(&store)?;
    store.close();
    Ok(json!(tokens))
}

/// `tokens revoke`.
pub async fn tokens_revoke(target: &Target, name: &str) -> anyhow::Result<Value> {
    if let Some(c) = server_of(target).await {
        return Ok(c.delete_json(&format!("/tokens/{name}")).await?);
    }
    let store = bare_store(target).await?;
    let revoked = auth::revoke(&store, name).await?;
    access::append(&store, "durafiber-cli", "token_revoke", None, &format!("name={name:?}"), now()).await?;
    store.close();
    Ok(json!({"name": name, "revoked": revoked}))
}
