//! The store's reads: typed records by key, ranges of a table, and prefetched walks. A
//! record is opened from its envelope and decoded as the type its table holds; a bad one
//! comes back as its own error, naming its table, key and store.

use serde::de::DeserializeOwned;

use super::Store;
use crate::{
    backend::Entries,
    error::StoreError,
    prefetch::{self, Prefetched},
    tables::{Key, Prefix, TableInfo, decode_sealed},
};

/// Keys with their decoded records; each record decodes (or fails) on its own.
pub type Decoded<V> = Vec<(Key<V>, Result<V, StoreError>)>;

/// The end of the key range that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; 9]
}

impl Store {
    /// The record under `key`.
    pub fn get<V: DeserializeOwned>(&self, key: &Key<V>) -> Result<Option<V>, StoreError> {
        self.decoded(key.table(), key.as_bytes(), self.inner.backend.get(key.as_bytes())?)
    }

    /// The record `sealed` holds for `key`, if any; a bad one names its store.
    fn decoded<V: DeserializeOwned>(
        &self,
        table: TableInfo,
        key: &[u8],
        sealed: Option<Vec<u8>>,
    ) -> Result<Option<V>, StoreError> {
        match sealed {
            None => Ok(None),
            Some(sealed) => decode_sealed(table, key, &sealed).map(Some).map_err(|e| self.located(e)),
        }
    }

    /// Reads the records under `keys` (ascending, as stored bytes of keys of any tables) in
    /// one walk of the span from the first to the last, walking at most `limit` records, for
    /// [`Store::get_prefetched`]: one [`Prefetched`] per key, in order. A span holding more
    /// records is covered as far as the walk went; a backend that cannot tell later
    /// whether a record read now is still current covers nothing (reading each key is then
    /// as good).
    pub fn prefetch(&self, keys: &[Vec<u8>], limit: usize) -> Result<Vec<Prefetched>, StoreError> {
        let (Some(first), Some(last)) = (keys.first(), keys.last()) else { return Ok(Vec::new()) };
        if first > last || limit == 0 {
            return Ok(keys.iter().map(|_| Prefetched::default()).collect());
        }
        let mut end = last.clone();
        end.push(0);
        Ok(match self.inner.backend.range_marked(first, &end, limit)? {
            Some((entries, mark)) => prefetch::deal(entries, keys, limit, mark),
            None => keys.iter().map(|_| Prefetched::default()).collect(),
        })
    }

    /// [`Store::get`], answered from `prefetched` when its walk reached `key` and nothing
    /// wrote the key since; read anew otherwise.
    pub fn get_prefetched<V: DeserializeOwned>(
        &self,
        key: &Key<V>,
        prefetched: Prefetched,
    ) -> Result<Option<V>, StoreError> {
        match prefetched.read {
            Some((value, mark)) if self.inner.backend.unchanged_since(mark, key.as_bytes()) => {
                self.decoded(key.table(), key.as_bytes(), value)
            }
            _ => self.get(key),
        }
    }

    /// A bad record's error names the store it was read from, beside its table and key.
    fn located(&self, e: StoreError) -> StoreError {
        let place = self.inner.backend.location();
        match e {
            StoreError::Corrupt { table, key, reason } => {
                StoreError::Corrupt { table, key, reason: format!("{reason} (store {})", place.display()) }
            }
            other => other,
        }
    }

    /// Up to `limit` records under `prefix` whose key sorts after `after`. A record that
    /// fails to decode comes back as its own error, so one corrupt record never hides the
    /// others.
    pub fn scan<V: DeserializeOwned>(
        &self,
        prefix: &Prefix<V>,
        after: Option<&Key<V>>,
        limit: usize,
    ) -> Result<Decoded<V>, StoreError> {
        self.scan_in(prefix, after, limit, None)
    }

    /// [`Store::scan`], restricted to the runs of `shards` when given (a node's own).
    pub fn scan_in<V: DeserializeOwned>(
        &self,
        prefix: &Prefix<V>,
        after: Option<&Key<V>>,
        limit: usize,
        shards: Option<&[u32]>,
    ) -> Result<Decoded<V>, StoreError> {
        let table = prefix.table();
        Ok(self
            .range(prefix, after, limit, shards)?
            .into_iter()
            .map(|(k, v)| {
                let decoded = decode_sealed(table, &k, &v).map_err(|e| self.located(e));
                (Key::new(table, k), decoded)
            })
            .collect())
    }

    /// The keys under `prefix` after `after`, without their records, restricted to the runs
    /// of `shards` when given: for indexes whose keys carry all there is to know.
    pub fn keys_in<V>(
        &self,
        prefix: &Prefix<V>,
        after: Option<&Key<V>>,
        limit: usize,
        shards: Option<&[u32]>,
    ) -> Result<Vec<Key<V>>, StoreError> {
        let table = prefix.table();
        Ok(self.range(prefix, after, limit, shards)?.into_iter().map(|(k, _)| Key::new(table, k)).collect())
    }

    /// Up to `limit` keys under `prefix` and the sizes of their records.
    pub fn keys_and_sizes<V>(
        &self,
        prefix: &Prefix<V>,
        limit: usize,
    ) -> Result<Vec<(Key<V>, usize)>, StoreError> {
        let table = prefix.table();
        Ok(self
            .range(prefix, None, limit, None)?
            .into_iter()
            .map(|(k, v)| (Key::new(table, k), v.len()))
            .collect())
    }

    /// Up to `limit` keys from `first` to `last`, both included, of one table.
    pub fn keys_from_to<V>(
        &self,
        first: &Key<V>,
        last: &Key<V>,
        limit: usize,
    ) -> Result<Vec<Key<V>>, StoreError> {
        let mut end = last.as_bytes().to_vec();
        end.push(0);
        let rows = self.inner.backend.range(first.as_bytes(), &end, limit)?;
        Ok(rows.into_iter().map(|(k, _)| Key::new(first.table(), k)).collect())
    }

    /// The stored entries under `prefix` after `after`.
    fn range<V>(
        &self,
        prefix: &Prefix<V>,
        after: Option<&Key<V>>,
        limit: usize,
        shards: Option<&[u32]>,
    ) -> Result<Entries, StoreError> {
        let prefix = prefix.as_bytes();
        let start = match after.map(Key::as_bytes) {
            Some(a) if a >= prefix => {
                let mut s = a.to_vec();
                s.push(0);
                s
            }
            _ => prefix.to_vec(),
        };
        let end = prefix_end(prefix);
        match shards {
            None => self.inner.backend.range(&start, &end, limit),
            Some(shards) => self.inner.backend.range_in_shards(&start, &end, limit, shards),
        }
    }

    /// Every stored entry of a table as it is, for inspection and tests.
    pub fn raw_scan(&self, table: TableInfo, limit: usize) -> Result<Entries, StoreError> {
        self.inner.backend.range(&[table.prefix], &prefix_end(&[table.prefix]), limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Batch, Durability, StoreConfig, tables::keys};

    #[tokio::test]
    async fn a_prefetched_read_answers_as_a_read_now_would() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("open");
        let key = |i: u32| keys::storage("run", &format!("k{i:03}"));
        let put = |i: u32, v: &str| {
            let mut batch = Batch::new();
            batch.put(key(i), &v.to_string()).expect("put");
            batch
        };
        for i in (0..20).step_by(2) {
            store.commit(put(i, "old"), Durability::Sync).await.expect("commit");
        }
        let wanted: Vec<Vec<u8>> = (0..20).map(|i| key(i).into_bytes()).collect();
        // A walk of at most 8 records reaches key 14 and answers for nothing after it.
        let prefetched = store.prefetch(&wanted, 8).expect("prefetch");
        let reached: Vec<bool> = prefetched.iter().map(Prefetched::is_read).collect();
        assert_eq!(reached, (0..20).map(|i| i <= 14).collect::<Vec<_>>());

        store.commit(put(4, "new"), Durability::Sync).await.expect("commit");
        store.commit(put(5, "created"), Durability::Sync).await.expect("commit");
        let read: Vec<Option<String>> = prefetched
            .into_iter()
            .zip(0..)
            .map(|(p, i)| store.get_prefetched(&key(i), p).expect("read"))
            .collect();
        let want: Vec<Option<String>> = (0..20)
            .map(|i| match i {
                4 => Some("new".into()),
                5 => Some("created".into()),
                i if i % 2 == 0 => Some("old".into()),
                _ => None,
            })
            .collect();
        assert_eq!(read, want);
    }

    #[test]
    fn prefix_end_is_the_next_prefix() {
        assert_eq!(prefix_end(b"ab"), b"ac".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
    }
}
