//! Shards: runs are split into [`SHARDS`] groups by their id, so that nodes sharing one store
//! can each own some (`pg_backend`'s leases) and only the owner of a run's shard writes it.
//! The embedded stores are one owner of every shard.

use crate::tables;

/// How many shards runs are split into.
pub const SHARDS: u32 = 1024;

/// The shard of a run: FNV-1a of its id, so every node and every version agree.
pub fn of_run(run_id: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in run_id.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(SHARDS)) as u32
}

/// The shard of a record, from its key; `None` for records that belong to no run (run keys,
/// tokens, the audit trail, the store's own bookkeeping).
pub fn of_key(key: &[u8]) -> Option<u32> {
    tables::keys::run_of_key(key).map(of_run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_records_share_its_shard_and_records_of_no_run_have_none() {
        let run = "run_0190aabbccdd0123456789abcdef0123456789ab";
        let s = of_run(run);
        assert!(s < SHARDS);
        assert_eq!(of_key(tables::keys::run(run).as_bytes()), Some(s));
        assert_eq!(
            of_key(
                tables::keys::alarm_due(durafiber_api::Timestamp::from_millis(42), run, "tick").as_bytes()
            ),
            Some(s)
        );
        assert_eq!(of_key(tables::keys::run_by_key("steps", "k1").as_bytes()), None);
        // Fixed forever: nodes of different versions must agree.
        assert_eq!(of_run("run_a"), of_run("run_a"));
        assert_ne!(of_run("run_a"), of_run("run_b"));
    }
}
