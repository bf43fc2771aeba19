//! The batches logged since sled's last checkpoint, in memory, in front of sled for reads.
//!
//! Two tables at most: the *active* one, which takes every applied batch, and a *frozen* one
//! whose log half is full and which the checkpoint thread is writing into sled. A read looks
//! in the active table, then the frozen one, then sled. A delete is kept as a tombstone
//! (`None`) until sled has it.

use std::{
    collections::BTreeMap,
    ops::Bound::{Excluded, Included},
    sync::Arc,
};

use crate::{backend::Entries, batch::Op, error::StoreError};

/// Keys to their newest value, or `None` for a delete.
pub(crate) type Table = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The two tables, how many checkpoints have completed (a reader that spans one starts
/// again), and which batches it has taken and let go of, by LSN.
#[derive(Default)]
pub(crate) struct Overlay {
    pub active: Table,
    pub frozen: Option<Arc<Table>>,
    pub checkpoints: u64,
    /// The LSN of the newest batch applied.
    pub applied_lsn: u64,
    /// Every batch up to this LSN has left the overlay: sled holds it.
    pub dropped_through: u64,
}

impl Overlay {
    /// Applies the writes of batch `lsn`, in order, to the active table.
    pub fn apply(&mut self, lsn: u64, ops: &[Op]) {
        apply_to(&mut self.active, ops);
        self.applied_lsn = self.applied_lsn.max(lsn);
    }

    /// Whether nothing can have written `key` since the overlay had applied batch `lsn`: a
    /// later batch stays in the overlay until a checkpoint drops it, which raises
    /// `dropped_through` past `lsn`. Conservative: any write of the key the overlay holds
    /// counts, however old.
    pub fn unchanged_since(&self, lsn: u64, key: &[u8]) -> bool {
        self.dropped_through <= lsn && !self.holds(key)
    }

    /// What the overlay says of `key`: `Some(None)` when it was deleted, `None` when only
    /// sled can tell.
    pub fn get(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        if let Some(v) = self.active.get(key) {
            return Some(v.clone());
        }
        self.frozen.as_ref().and_then(|f| f.get(key).cloned())
    }

    /// Whether the overlay holds a write of `key` (a value or a delete).
    fn holds(&self, key: &[u8]) -> bool {
        self.active.contains_key(key) || self.frozen.as_ref().is_some_and(|f| f.contains_key(key))
    }

    /// The overlay's entries with `start <= key < end`, the active table winning, up to and
    /// including the `limit`-th live one: a merge that stops at `limit` entries never needs
    /// an overlay entry after that.
    pub fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Table {
        let mut out = Table::new();
        if start >= end {
            return out;
        }
        let bounds = (Included(start), Excluded(end));
        let mut active = self.active.range::<[u8], _>(bounds).peekable();
        let mut frozen =
            self.frozen.as_ref().map(|f| f.range::<[u8], _>(bounds)).into_iter().flatten().peekable();
        let mut live = 0;
        while live < limit {
            let next = match (active.peek(), frozen.peek()) {
                (None, None) => break,
                (Some(_), None) => active.next(),
                (None, Some(_)) => frozen.next(),
                (Some((a, _)), Some((f, _))) => match a.cmp(f) {
                    std::cmp::Ordering::Less => active.next(),
                    std::cmp::Ordering::Greater => frozen.next(),
                    std::cmp::Ordering::Equal => {
                        frozen.next();
                        active.next()
                    }
                },
            };
            let Some((key, value)) = next else { break };
            live += usize::from(value.is_some());
            out.insert(key.clone(), value.clone());
        }
        out
    }

    /// Moves the active table to `frozen`, for the checkpoint thread. The frozen slot must
    /// be empty.
    pub fn freeze(&mut self) -> Arc<Table> {
        let table = Arc::new(std::mem::take(&mut self.active));
        self.frozen = Some(table.clone());
        table
    }
}

/// Applies `ops` in order to `table`.
pub(crate) fn apply_to(table: &mut Table, ops: &[Op]) {
    for op in ops {
        match op {
            Op::Put { key, value } => table.insert(key.clone(), Some(value.clone())),
            Op::Delete { key } => table.insert(key.clone(), None),
        };
    }
}

/// Merges overlay entries over sled's, in key order, up to `limit` live entries.
pub(crate) fn merge(
    overlay: Table,
    sled: impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>>,
    limit: usize,
) -> Result<Entries, StoreError> {
    let mut out = Vec::new();
    let mut over = overlay.into_iter().peekable();
    let mut sled = sled.peekable();
    while out.len() < limit {
        let take_overlay = match (over.peek(), sled.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((ok, _)), Some(Ok((sk, _)))) => ok <= sk,
            (Some(_), Some(Err(_))) => false,
        };
        if take_overlay {
            let Some((key, value)) = over.next() else { break };
            // The overlay's word on a key is newer than sled's.
            if sled.peek().is_some_and(|s| s.as_ref().is_ok_and(|(sk, _)| *sk == key)) {
                sled.next();
            }
            if let Some(value) = value {
                out.push((key, value));
            }
        } else if let Some(item) = sled.next() {
            out.push(item?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str, v: &str) -> Op {
        Op::Put { key: k.as_bytes().to_vec(), value: v.as_bytes().to_vec() }
    }

    #[test]
    fn a_limited_range_reads_past_tombstones_to_the_live_entries_behind_them() {
        let mut o = Overlay::default();
        o.apply(1, &(0..10).map(|i| put(&format!("k{i}"), "old")).collect::<Vec<_>>());
        o.freeze();
        o.apply(1, &(0..5).map(|i| Op::Delete { key: format!("k{i}").into_bytes() }).collect::<Vec<_>>());
        let none = std::iter::empty();
        let merged = merge(o.range(b"k", b"l", 3), none, 3).expect("merge");
        let keys: Vec<String> =
            merged.into_iter().map(|(k, _)| String::from_utf8(k).expect("utf-8")).collect();
        assert_eq!(keys, ["k5", "k6", "k7"]);
    }

    #[test]
    fn the_active_table_wins_over_the_frozen_one_and_both_over_sled() {
        let mut o = Overlay::default();
        o.apply(1, &[put("a", "1"), put("b", "1")]);
        o.freeze();
        o.apply(1, &[put("b", "2"), Op::Delete { key: b"c".to_vec() }]);
        assert_eq!(o.get(b"a"), Some(Some(b"1".to_vec())));
        assert_eq!(o.get(b"b"), Some(Some(b"2".to_vec())));
        assert_eq!(o.get(b"c"), Some(None));
        assert_eq!(o.get(b"d"), None);
        let sled = || {
            [("a", "0"), ("c", "0"), ("d", "0"), ("e", "0")]
                .map(|(k, v)| Ok((k.as_bytes().to_vec(), v.as_bytes().to_vec())))
                .into_iter()
        };
        let merged = merge(o.range(b"a", b"z", usize::MAX), sled(), usize::MAX).expect("merge");
        let text: Vec<(String, String)> = merged
            .into_iter()
            .map(|(k, v)| (String::from_utf8(k).expect("utf-8"), String::from_utf8(v).expect("utf-8")))
            .collect();
        let want =
            [("a", "1"), ("b", "2"), ("d", "0"), ("e", "0")].map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(text, want.to_vec());
        let limited = merge(o.range(b"a", b"z", 3), sled(), 3).expect("merge");
        assert_eq!(limited.len(), 3);
        assert!(o.range(b"z", b"a", 10).is_empty());
    }
}
