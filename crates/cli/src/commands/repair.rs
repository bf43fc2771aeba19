//! Operator commands for a store in trouble: `store verify`, `store salvage`, `backup` and
//! `restore`. Each opens only a directory that already holds a store (or, for the
//! destinations, one that holds none), so a typo never creates or overwrites anything.

use std::{net::SocketAddr, path::Path};

use anyhow::{Context as _, bail};
use durafiber_store::{Store, StoreConfig, StoreError, repair, sled_backend::is_store, witness::Rollback};

use durafiber_client::Client;

fn in_use(path: &Path) -> anyhow::Error {
    anyhow::anyhow!("{} is in use by a running server; stop it, or use `backup --server`", path.display())
}

fn open_existing(dir: &Path) -> anyhow::Result<Store> {
    match Store::open_existing_dir(dir, StoreConfig::default()) {
        Ok(store) => Ok(store),
        Err(StoreError::DirLocked { path }) => Err(in_use(&path)),
        Err(e) => Err(e).with_context(|| format!("opening {}", dir.display())),
    }
}

/// Opens a store whatever happened to it; a rollback comes back beside it.
fn open_for_repair(dir: &Path) -> anyhow::Result<(Store, Option<Rollback>)> {
    match Store::open_for_repair(dir, StoreConfig::default()) {
        Ok(opened) => Ok(opened),
        Err(StoreError::DirLocked { path }) => Err(in_use(&path)),
        Err(e) => Err(e).with_context(|| format!("opening {}", dir.display())),
    }
}

/// A new data directory: refused when it already holds a store.
fn open_new(dir: &Path) -> anyhow::Result<Store> {
    if is_store(dir) {
        bail!("{} already holds a store; choose a new directory", dir.display());
    }
    Store::open_dir(dir, StoreConfig::default()).with_context(|| format!("creating {}", dir.display()))
}

/// `store verify`: exit 0 when every record reads and the log is whole, 1 otherwise.
pub async fn verify(data: &Path, json: bool) -> anyhow::Result<i32> {
    let (store, rollback) = open_for_repair(data)?;
    let report = repair::verify(&store)?;
    store.close();
    let mut damaged = report.damaged_runs();
    damaged.extend(rollback.iter().flat_map(|r| r.runs.iter().cloned()));
    let healthy = report.bad.is_empty() && rollback.is_none();
    if json {
        let line = serde_json::json!({
            "data": data.display().to_string(), "records": report.records,
            "bad_records": report.bad.len(), "bad": report.bad, "damaged_runs": damaged,
            "rolled_back": rollback,
        });
        println!("{line}");
    } else {
        for (table, n) in &report.records {
            println!("{table:<14} {n} records");
        }
        for bad in &report.bad {
            let run = bad.run_id.as_deref().unwrap_or("?");
            println!("BAD {} {} (run {run}): {}", bad.table, bad.key, bad.error);
        }
        if let Some(rb) = &rollback {
            println!(
                "ROLLED BACK: the log holds commit {} of {}; {} runs changed: run `store salvage`",
                rb.found_seq,
                rb.expected_seq,
                rb.runs.len()
            );
        }
        println!("{} bad records in {}", report.bad.len(), data.display());
    }
    Ok(i32::from(!healthy))
}

/// `store salvage`: copies what reads into `out` and lists what did not.
pub async fn salvage(data: &Path, out: &Path, json: bool) -> anyhow::Result<i32> {
    let report = match Store::open_for_repair(data, StoreConfig::default()) {
        Ok((from, rollback)) => {
            let to = open_new(out)?;
            let known = durafiber_store::witness::known_runs(data);
            let report = repair::salvage(&from, &to, rollback.as_ref(), &known).await?;
            from.close();
            to.close();
            report
        }
        Err(StoreError::DirLocked { path }) => return Err(in_use(&path)),
        Err(e @ StoreError::Engine(_)) => {
            eprintln!(
                "{}: the engine cannot read {} ({e}); salvaging what its write-ahead log holds",
                crate::bin_name(),
                data.display()
            );
            let to = open_new(out)?;
            let report = repair::salvage_from_log(data, &to, &e).await?;
            to.close();
            report
        }
        Err(e) => return Err(e).with_context(|| format!("opening {}", data.display())),
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for (table, n) in &report.copied {
            println!("{table:<14} {n} copied");
        }
        for run in &report.lost_runs {
            println!("LOST {run}: its run record could not be read");
        }
        for run in &report.damaged_runs {
            println!("DAMAGED {run}: kept, escalated for a human (records lost or older)");
        }
        println!(
            "salvaged into {}: {} bad records, {} runs lost, {} damaged",
            out.display(),
            report.bad.len(),
            report.lost_runs.len(),
            report.damaged_runs.len()
        );
    }
    Ok(0)
}

/// `backup`: from a running server when one answers, else from the bare directory.
pub async fn backup(
    server: Option<SocketAddr>,
    data: Option<&Path>,
    token: Option<String>,
    out: &Path,
) -> anyhow::Result<i32> {
    let bytes = match (server, data) {
        (Some(addr), _) if Client::from_addr(addr).is_up().await => Client::from_addr(addr)
            .with_token(token)
            .get_bytes("/backup")
            .await
            .with_context(|| format!("backup from {addr}"))?,
        (_, Some(dir)) => {
            let store = open_existing(dir)?;
            let bytes = repair::backup_bytes(&store).await?;
            store.close();
            bytes
        }
        (Some(addr), None) => bail!("no server answers at {addr}, and no --data directory was given"),
        (None, None) => bail!("give --server ADDR or --data DIR"),
    };
    repair::write_backup_file(&bytes, out)?;
    let entries = repair::read_backup(out).with_context(|| format!("checking {}", out.display()))?.len();
    println!("backup of {entries} records in {}", out.display());
    Ok(0)
}

/// `restore`: into a directory that holds no store.
pub async fn restore(file: &Path, data: &Path) -> anyhow::Result<i32> {
    // Check the whole file before creating anything.
    repair::read_backup(file).with_context(|| format!("reading {}", file.display()))?;
    let store = open_new(data)?;
    let n = repair::restore(file, &store).await?;
    store.close();
    println!("restored {n} records into {}", data.display());
    Ok(0)
}
