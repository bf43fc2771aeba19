//! Named limits the nodes share: a limit's concurrency slots as rows leased until a time,
//! and its token bucket as one row, each changed by one statement on the database's clock.

use std::time::Duration;

use super::{PgBackend, db_error};
use crate::{backend::SharedLimits, error::StoreError};

impl SharedLimits for PgBackend {
    fn take_slot(
        &self,
        name: &str,
        slots: u32,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<u32>, StoreError> {
        let (name, holder, secs) = (name.to_string(), holder.to_string(), ttl.as_secs_f64());
        let slots = i32::try_from(slots).unwrap_or(i32::MAX);
        self.call(move |c| async move {
            let client = c.writes.client().await?;
            // The first slot free now; a node that took it meanwhile wins the conflict, and
            // this one finds no row and asks again.
            let row = client
                .query_opt(
                    "WITH free AS ( \
                         SELECT s FROM generate_series(0, $3 - 1) AS s \
                         WHERE NOT EXISTS (SELECT 1 FROM df_limit_slots l \
                                           WHERE l.name = $1 AND l.slot = s AND l.until >= now()) \
                         ORDER BY s LIMIT 1) \
                     INSERT INTO df_limit_slots (name, slot, holder, until) \
                     SELECT $1, s, $2, now() + make_interval(secs => $4) FROM free \
                     ON CONFLICT (name, slot) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until \
                     WHERE df_limit_slots.until < now() \
                     RETURNING slot",
                    &[&name, &holder, &slots, &secs],
                )
                .await
                .map_err(db_error)?;
            Ok(row.map(|r| u32::try_from(r.get::<_, i32>(0)).unwrap_or(0)))
        })
    }

    fn renew_slot(&self, name: &str, slot: u32, holder: &str, ttl: Duration) -> Result<bool, StoreError> {
        let (name, holder, secs) = (name.to_string(), holder.to_string(), ttl.as_secs_f64());
        let slot = i32::try_from(slot).unwrap_or(i32::MAX);
        self.call(move |c| async move {
            let client = c.writes.client().await?;
            let n = client
                .execute(
                    "UPDATE df_limit_slots SET until = now() + make_interval(secs => $4) \
                     WHERE name = $1 AND slot = $2 AND holder = $3 AND until >= now()",
                    &[&name, &slot, &holder, &secs],
                )
                .await
                .map_err(db_error)?;
            Ok(n == 1)
        })
    }

    fn release_slot(&self, name: &str, slot: u32, holder: &str) -> Result<(), StoreError> {
        let (name, holder) = (name.to_string(), holder.to_string());
        let slot = i32::try_from(slot).unwrap_or(i32::MAX);
        self.call(move |c| async move {
            let client = c.writes.client().await?;
            client
                .execute(
                    "DELETE FROM df_limit_slots WHERE name = $1 AND slot = $2 AND holder = $3",
                    &[&name, &slot, &holder],
                )
                .await
                .map_err(db_error)?;
            Ok(())
        })
    }

    fn take_token(&self, name: &str, per_sec: f64, burst: f64) -> Result<Option<Duration>, StoreError> {
        let name = name.to_string();
        self.call(move |c| async move {
            let client = c.writes.client().await?;
            // A new bucket starts empty: a restart never grants a burst the rate did not.
            client
                .execute(
                    "INSERT INTO df_limit_rates (name, tokens, at) VALUES ($1, 0, now()) ON CONFLICT (name) DO NOTHING",
                    &[&name],
                )
                .await
                .map_err(db_error)?;
            let filled = "LEAST($3, tokens + EXTRACT(EPOCH FROM (now() - at))::double precision * $2)";
            let taken = client
                .execute(
                    &format!(
                        "UPDATE df_limit_rates SET tokens = {filled} - 1, at = now() \
                         WHERE name = $1 AND {filled} >= 1"
                    ),
                    &[&name, &per_sec, &burst],
                )
                .await
                .map_err(db_error)?;
            if taken == 1 {
                return Ok(None);
            }
            let row = client
                .query_one(&format!("SELECT {filled} FROM df_limit_rates WHERE name = $1"), &[&name, &per_sec, &burst])
                .await
                .map_err(db_error)?;
            let have: f64 = row.get(0);
            let wait = ((1.0 - have).max(0.0) / per_sec.max(f64::MIN_POSITIVE)).min(3_600.0);
            Ok(Some(Duration::from_secs_f64(wait)))
        })
    }
}
