//! `start`, `request`, `storage get|list`, `stream`, `pause`, `resume`: what an operator
//! does to runs beyond deciding and cancelling, through a running server when one answers,
//! or on the data directory when none runs (a run started or paused there is picked up by
//! the next server). A request needs the run live, so a server.

use anyhow::{Context as _, bail};
use durafiber_runtime::RunId;
use durafiber_runtime::StartRequest;
use futures::StreamExt as _;
use serde_json::{Value, json};

use super::inspect::{Source, source};
use crate::{Agents, args::Target};

/// Parses a JSON argument, naming the flag when it is not JSON.
fn parse_json(flag: &str, text: &str) -> anyhow::Result<Value> {
    serde_json::from_str(text).with_context(|| format!("{flag} is not JSON"))
}

/// `start`.
pub async fn start(
    agents: Agents<'_>,
    target: &Target,
    kind: &str,
    key: &str,
    input: &str,
    options: Option<&str>,
) -> anyhow::Result<Value> {
    let input = parse_json("--input", input)?;
    let options = options.map(|o| parse_json("--options", o)).transpose()?;
    match source(target, agents).await? {
        Source::Server(c) => {
            let body = json!({"kind": kind, "input": input, "options": options});
            Ok(c.post_json("/runs", &body, Some(key)).await?)
        }
        Source::Direct(rt) => {
            if options.is_some() {
                bail!("--options is for a server; on a data directory a run starts with the defaults");
            }
            let started = rt.start_run(StartRequest::new(kind, key, input.clone())).await?;
            Ok(serde_json::to_value(started)?)
        }
    }
}

/// `request`.
pub async fn request(
    agents: Agents<'_>,
    target: &Target,
    run_id: &RunId,
    message: &str,
) -> anyhow::Result<Value> {
    let message = parse_json("--message", message)?;
    match source(target, agents).await? {
        Source::Server(c) => Ok(c.post_json(&format!("/runs/{run_id}/requests"), &message, None).await?),
        Source::Direct(_) => {
            bail!("a request is answered by the live run: give --server ADDR of a running server")
        }
    }
}

/// `storage list`: one page.
pub async fn storage_list(
    agents: Agents<'_>,
    target: &Target,
    run_id: &RunId,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> anyhow::Result<Value> {
    match source(target, agents).await? {
        Source::Server(c) => Ok(serde_json::to_value(storage_page(&c, run_id, prefix, after, limit).await?)?),
        Source::Direct(rt) => {
            let entries = rt.storage_list(run_id, prefix, after, limit)?;
            let next = (entries.len() == limit).then(|| entries.last().map(|(k, _)| k.clone())).flatten();
            let entries: Vec<Value> = entries
                .into_iter()
                .map(|(key, value)| Ok(json!({"key": key, "value": parse_json("a stored value", &value)?})))
                .collect::<anyhow::Result<_>>()?;
            Ok(json!({"run_id": run_id, "entries": entries, "next": next}))
        }
    }
}

async fn storage_page(
    c: &durafiber_client::Client,
    run_id: &RunId,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> anyhow::Result<Value> {
    let page = c.storage(run_id, prefix, after, Some(limit)).await?;
    let entries: Vec<Value> =
        page.entries.into_iter().map(|e| json!({"key": e.key, "value": e.value})).collect();
    Ok(json!({"run_id": page.run_id, "entries": entries, "next": page.next}))
}

/// `storage get`: the key's value, `null` when absent.
pub async fn storage_get(
    agents: Agents<'_>,
    target: &Target,
    run_id: &RunId,
    key: &str,
) -> anyhow::Result<Value> {
    // The first key at or after `key` under the prefix `key` is `key` itself when it exists.
    let page = storage_list(agents, target, run_id, key, None, 1).await?;
    let found = page["entries"].as_array().and_then(|e| e.first()).filter(|e| e["key"] == json!(key));
    Ok(found.map_or(Value::Null, |e| e["value"].clone()))
}

/// `stream`: prints each item as a JSON line until the run ends; the number printed.
pub async fn stream(agents: Agents<'_>, target: &Target, run_id: &RunId, from: u64) -> anyhow::Result<u64> {
    let mut printed = 0u64;
    match source(target, agents).await? {
        Source::Server(c) => {
            let mut items = Box::pin(c.stream(run_id, from));
            while let Some(item) = items.next().await {
                println!("{}", shown(&item?)?);
                printed += 1;
            }
        }
        Source::Direct(rt) => {
            // No fiber runs here: what is durable is all there is to show.
            let mut next = from;
            loop {
                let chunks = rt.stream_chunks(run_id, next, 1_000)?;
                let Some(last) = chunks.last().map(|c| c.seq) else { break };
                for chunk in chunks {
                    println!("{}", shown(&durafiber_runtime::StreamItem::Chunk(chunk))?);
                    printed += 1;
                }
                next = last.saturating_add(1);
            }
        }
    }
    Ok(printed)
}

/// A stream item as one JSON line: its chunk as JSON (`data`), not as JSON text.
fn shown(item: &durafiber_runtime::StreamItem) -> anyhow::Result<String> {
    let mut value = serde_json::to_value(item)?;
    if let Some(fields) = value.as_object_mut() {
        // When a chunk was emitted is the run's; over a stream the server does not say it.
        fields.remove("emitted_at_ms");
        if let Some(Value::String(text)) = fields.remove("data_json") {
            fields.insert("data".into(), parse_json("a chunk", &text)?);
        }
    }
    Ok(serde_json::to_string(&value)?)
}

/// `pause`: a kind, or one run.
pub async fn pause(
    agents: Agents<'_>,
    target: &Target,
    run_id: Option<&RunId>,
    kind: Option<&str>,
    reason: &str,
) -> anyhow::Result<Value> {
    let body = json!({"reason": reason});
    match (source(target, agents).await?, run_id, kind) {
        (Source::Server(c), Some(run_id), _) => {
            Ok(c.post_json(&format!("/runs/{run_id}/pause"), &body, None).await?)
        }
        (Source::Server(c), None, Some(kind)) => {
            Ok(c.post_json(&format!("/kinds/{kind}/pause"), &body, None).await?)
        }
        (Source::Direct(rt), Some(run_id), _) => {
            rt.pause_run(run_id, reason).await?;
            Ok(json!({"target": run_id, "paused": true, "changed": true}))
        }
        (Source::Direct(rt), None, Some(kind)) => {
            rt.pause_kind(kind, reason).await?;
            Ok(json!({"target": kind, "paused": true, "changed": true}))
        }
        (_, None, None) => bail!("give a run id or --kind"),
    }
}

/// `resume`: a kind, or one run.
pub async fn resume(
    agents: Agents<'_>,
    target: &Target,
    run_id: Option<&RunId>,
    kind: Option<&str>,
) -> anyhow::Result<Value> {
    match (source(target, agents).await?, run_id, kind) {
        (Source::Server(c), Some(run_id), _) => {
            Ok(c.post_json(&format!("/runs/{run_id}/resume"), &json!({}), None).await?)
        }
        (Source::Server(c), None, Some(kind)) => {
            Ok(c.post_json(&format!("/kinds/{kind}/resume"), &json!({}), None).await?)
        }
        (Source::Direct(rt), Some(run_id), _) => {
            let changed = rt.resume_run(run_id).await?;
            Ok(json!({"target": run_id, "paused": false, "changed": changed}))
        }
        (Source::Direct(rt), None, Some(kind)) => {
            let changed = rt.resume_kind(kind).await?;
            Ok(json!({"target": kind, "paused": false, "changed": changed}))
        }
        (_, None, None) => bail!("give a run id or --kind"),
    }
}
