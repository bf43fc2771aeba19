//! A node's shard leases on a shared database: acquiring, renewing, releasing and stealing
//! them, the heartbeat that says where the node answers, and the fence each write carries.

use std::{collections::BTreeSet, time::Duration};

use super::{PgBackend, db_error};
use crate::{
    backend::{Lease, Leases, ShardOwner},
    batch::{Batch, Op},
    error::StoreError,
    shard,
};

impl PgBackend {
    /// The shards `batch` writes into and the epochs this node holds them at; a shard it
    /// does not hold is refused here, without a round trip. Records a batch creates
    /// (`absent` keys) need no lease: nothing of them can exist to be overwritten.
    pub(super) fn fence_for(&self, batch: &Batch) -> Result<(Vec<i32>, Vec<i64>), StoreError> {
        if self.node.is_none() {
            return Ok((Vec::new(), Vec::new()));
        }
        let created: BTreeSet<&[u8]> = batch.absent.iter().map(Vec::as_slice).collect();
        let written: BTreeSet<u32> = batch
            .ops
            .iter()
            .map(|op| match op {
                Op::Put { key, .. } | Op::Delete { key } => key.as_slice(),
            })
            .filter(|k| !created.contains(k))
            .filter_map(shard::of_key)
            .collect();
        let fence = self.fence.read();
        let mut shards = Vec::with_capacity(written.len());
        let mut epochs = Vec::with_capacity(written.len());
        for s in written {
            let epoch = *fence.get(&s).ok_or(StoreError::Fenced { shard: s })?;
            shards.push(s as i32);
            epochs.push(epoch);
        }
        Ok((shards, epochs))
    }

    fn node_name(&self) -> String {
        self.node.clone().unwrap_or_default()
    }
}

fn ttl_secs(ttl: Duration) -> f64 {
    ttl.as_secs_f64()
}

impl Leases for PgBackend {
    fn node_id(&self) -> &str {
        self.node.as_deref().unwrap_or("")
    }

    fn heartbeat(&self, http_addr: &str, ttl: Duration, taking: bool) -> Result<u64, StoreError> {
        let (node, addr, me, secs) =
            (self.node_name(), http_addr.to_string(), self.incarnation.clone(), ttl_secs(ttl));
        self.call(move |c| async move {
            let client = c.writes.client().await?;
            // The row is this process's, or taken over from one not seen within the lease
            // (it died, or was stopped that long): never from a live one.
            let mine = client
                .query_opt(
                    "INSERT INTO df_nodes (node_id, http_addr, seen_at, incarnation, taking) \
                         VALUES ($1, $2, now(), $3, $5) \
                     ON CONFLICT (node_id) DO UPDATE \
                         SET http_addr = EXCLUDED.http_addr, seen_at = now(), \
                             incarnation = EXCLUDED.incarnation, taking = EXCLUDED.taking \
                     WHERE df_nodes.incarnation IS NOT DISTINCT FROM EXCLUDED.incarnation \
                        OR df_nodes.seen_at <= now() - make_interval(secs => $4) \
                     RETURNING (extract(epoch FROM now()) * 1000)::bigint",
                    &[&node, &addr, &me, &secs, &taking],
                )
                .await
                .map_err(db_error)?;
            if let Some(row) = mine {
                return Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0));
            }
            let holder = client
                .query_opt("SELECT http_addr FROM df_nodes WHERE node_id = $1", &[&node])
                .await
                .map_err(db_error)?;
            let addr = holder.map(|r| r.get::<_, String>(0)).unwrap_or_default();
            Err(StoreError::NodeIdTaken { node, addr })
        })
    }

    fn live_nodes(&self, ttl: Duration) -> Result<usize, StoreError> {
        let secs = ttl_secs(ttl);
        self.call(move |c| async move {
            let client = c.reads.client().await?;
            let row = client
                .query_one(
                    "SELECT count(*) FROM df_nodes \
                     WHERE seen_at > now() - make_interval(secs => $1) AND taking IS NOT FALSE",
                    &[&secs],
                )
                .await
                .map_err(db_error)?;
            Ok(usize::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        })
    }

    fn acquire(&self, want: usize, ttl: Duration) -> Result<Vec<Lease>, StoreError> {
        if want == 0 {
            return Ok(Vec::new());
        }
        let (node, secs, want) = (self.node_name(), ttl_secs(ttl), i64::try_from(want).unwrap_or(i64::MAX));
        let me = self.incarnation.clone();
        let leases = self.call(move |c| async move {
            let client = c.writes.client().await?;
            // The database's clock decides expiry; SKIP LOCKED lets nodes acquire side by
            // side, and a shard a writer holds FOR SHARE waits for its commit. A process whose
            // node id another took over (a zombie) takes nothing.
            let rows = client
                .query(
                    "UPDATE df_shards s SET owner = $1, epoch = s.epoch + 1, \
                         lease_until = now() + make_interval(secs => $2) \
                     FROM (SELECT shard_id FROM df_shards \
                           WHERE owner IS NULL OR lease_until IS NULL OR lease_until < now() \
                           ORDER BY shard_id LIMIT $3 FOR UPDATE SKIP LOCKED) f \
                     WHERE s.shard_id = f.shard_id AND NOT EXISTS (SELECT 1 FROM df_nodes n \
                           WHERE n.node_id = $1 AND n.incarnation IS DISTINCT FROM $4) \
                     RETURNING s.shard_id, s.epoch",
                    &[&node, &secs, &want, &me],
                )
                .await
                .map_err(db_error)?;
            Ok(rows
                .iter()
                .map(|r| Lease { shard: r.get::<_, i32>(0) as u32, epoch: r.get(1) })
                .collect::<Vec<_>>())
        })?;
        let mut fence = self.fence.write();
        for l in &leases {
            fence.insert(l.shard, l.epoch);
        }
        Ok(leases)
    }

    fn acquire_shard(&self, shard: u32, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        let (node, secs, id, me) = (self.node_name(), ttl_secs(ttl), shard as i32, self.incarnation.clone());
        let epoch: Option<i64> = self.call(move |c| async move {
            let client = c.writes.client().await?;
            let row = client
                .query_opt(
                    "UPDATE df_shards SET owner = $1, epoch = epoch + 1, \
                         lease_until = now() + make_interval(secs => $2) \
                     WHERE shard_id = $3 AND (owner IS NULL OR lease_until IS NULL OR lease_until < now()) \
                       AND NOT EXISTS (SELECT 1 FROM df_nodes n \
                           WHERE n.node_id = $1 AND n.incarnation IS DISTINCT FROM $4) \
                     RETURNING epoch",
                    &[&node, &secs, &id, &me],
                )
                .await
                .map_err(db_error)?;
            Ok(row.map(|r| r.get::<_, i64>(0)))
        })?;
        Ok(epoch.map(|epoch| {
            self.fence.write().insert(shard, epoch);
            Lease { shard, epoch }
        }))
    }

    fn renew(&self, ttl: Duration) -> Result<Vec<u32>, StoreError> {
        let held: Vec<(i32, i64)> = self.fence.read().iter().map(|(s, e)| (*s as i32, *e)).collect();
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let (shards, epochs): (Vec<i32>, Vec<i64>) = held.iter().copied().unzip();
        let (node, secs, me) = (self.node_name(), ttl_secs(ttl), self.incarnation.clone());
        let renewed: BTreeSet<u32> = self.call(move |c| async move {
            let client = c.writes.client().await?;
            // A zombie renews nothing either: its shards run out and go to the living.
            let rows = client
                .query(
                    "UPDATE df_shards s SET lease_until = now() + make_interval(secs => $2) \
                     FROM unnest($3::int[], $4::bigint[]) AS h(shard, epoch) \
                     WHERE s.shard_id = h.shard AND s.epoch = h.epoch AND s.owner = $1 \
                       AND NOT EXISTS (SELECT 1 FROM df_nodes n \
                           WHERE n.node_id = $1 AND n.incarnation IS DISTINCT FROM $5) \
                     RETURNING s.shard_id",
                    &[&node, &secs, &shards, &epochs, &me],
                )
                .await
                .map_err(db_error)?;
            Ok(rows.iter().map(|r| r.get::<_, i32>(0) as u32).collect())
        })?;
        let lost: Vec<u32> = held.iter().map(|(s, _)| *s as u32).filter(|s| !renewed.contains(s)).collect();
        self.forget(&lost);
        Ok(lost)
    }

    fn forget(&self, shards: &[u32]) {
        let mut fence = self.fence.write();
        for s in shards {
            fence.remove(s);
        }
    }

    fn release(&self, shards: &[u32]) -> Result<(), StoreError> {
        // At the epochs held: a lease acquired since by another process (a later one under
        // this node id among them) is not this one's to release.
        let (shards, epochs): (Vec<i32>, Vec<i64>) = {
            let fence = self.fence.read();
            shards.iter().filter_map(|s| fence.get(s).map(|e| (*s as i32, *e))).unzip()
        };
        let released: Vec<u32> = shards.iter().map(|s| *s as u32).collect();
        self.forget(&released);
        let node = self.node_name();
        self.call(move |c| async move {
            let client = c.writes.client().await?;
            client
                .execute(
                    "UPDATE df_shards s SET owner = NULL, lease_until = NULL \
                     FROM unnest($2::int[], $3::bigint[]) AS h(shard, epoch) \
                     WHERE s.shard_id = h.shard AND s.epoch = h.epoch AND s.owner = $1",
                    &[&node, &shards, &epochs],
                )
                .await
                .map_err(db_error)?;
            client.execute("SELECT pg_notify('df_shards', $1)", &[&node]).await.map_err(db_error)?;
            Ok(())
        })
    }

    fn leave(&self) -> Result<(), StoreError> {
        self.release(&self.held())?;
        let (node, me) = (self.node_name(), self.incarnation.clone());
        self.call(move |c| async move {
            let client = c.writes.client().await?;
            // Only this process's row: a later process under the same id stays counted.
            client
                .execute("DELETE FROM df_nodes WHERE node_id = $1 AND incarnation = $2", &[&node, &me])
                .await
                .map_err(db_error)?;
            client.execute("SELECT pg_notify('df_shards', $1)", &[&node]).await.map_err(db_error)?;
            Ok(())
        })
    }

    fn announce(&self, shard: u32) -> Result<(), StoreError> {
        let what = format!("accepted:{shard}");
        self.call(move |c| async move {
            let client = c.writes.client().await?;
            client.execute("SELECT pg_notify('df_shards', $1)", &[&what]).await.map_err(db_error)?;
            Ok(())
        })
    }

    fn news(&self) -> tokio::sync::watch::Receiver<u64> {
        self.news.subscribe()
    }

    fn held(&self) -> Vec<u32> {
        let mut held: Vec<u32> = self.fence.read().keys().copied().collect();
        held.sort_unstable();
        held
    }

    fn owners(&self) -> Result<Vec<ShardOwner>, StoreError> {
        self.call(|c| async move {
            let client = c.reads.client().await?;
            let rows = client
                .query(
                    "SELECT s.shard_id, s.owner, n.http_addr FROM df_shards s \
                     LEFT JOIN df_nodes n ON n.node_id = s.owner \
                     WHERE s.owner IS NOT NULL AND s.lease_until > now() ORDER BY s.shard_id",
                    &[],
                )
                .await
                .map_err(db_error)?;
            Ok(rows
                .iter()
                .map(|r| ShardOwner {
                    shard: r.get::<_, i32>(0) as u32,
                    node_id: r.get(1),
                    http_addr: r.get(2),
                })
                .collect())
        })
    }

    fn next_expiry(&self) -> Result<Option<Duration>, StoreError> {
        let node = self.node_name();
        let secs: Option<f64> = self.call(move |c| async move {
            let client = c.reads.client().await?;
            let row = client
                .query_one(
                    "SELECT extract(epoch FROM min(lease_until) - now())::float8 FROM df_shards \
                     WHERE owner IS NOT NULL AND owner <> $1 AND lease_until > now()",
                    &[&node],
                )
                .await
                .map_err(db_error)?;
            Ok(row.get(0))
        })?;
        Ok(secs.map(|s| {
            if s > 0.0 { Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX) } else { Duration::ZERO }
        }))
    }
}
