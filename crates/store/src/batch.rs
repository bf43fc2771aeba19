//! One boundary = one atomic batch of puts and deletes over any tables.

use serde::Serialize;

use crate::{codec, envelope, error::StoreError, tables::Key};

/// One write in a batch: a sealed value, or a removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Store `value` (already sealed) under `key`.
    Put {
        /// Full key, table prefix included.
        key: Vec<u8>,
        /// Sealed bytes.
        value: Vec<u8>,
    },
    /// Remove `key`.
    Delete {
        /// Full key, table prefix included.
        key: Vec<u8>,
    },
}

impl Op {
    /// The full key this op writes or removes.
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Put { key, .. } | Op::Delete { key } => key,
        }
    }
}

/// Writes that land together or not at all, even across a crash.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// The writes, applied in order.
    pub ops: Vec<Op>,
    /// Keys that must not exist before the batch ([`Batch::insert`]): if one does, nothing of
    /// the batch is applied and it fails with [`StoreError::Exists`]. A put of such a key
    /// creates a record no one else can have written, so no shard's owner fences it.
    pub absent: Vec<Vec<u8>>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Encodes `value`, seals it in its envelope and adds it under `key`.
    pub fn put<V: Serialize>(&mut self, key: Key<V>, value: &V) -> Result<&mut Self, StoreError> {
        let table = key.table().name;
        let key = key.into_bytes();
        let value = envelope::seal_encoded(&key, |out| codec::encode_onto(value, out))
            .map_err(|reason| StoreError::Encode { table, reason: reason.to_string() })?;
        self.ops.push(Op::Put { key, value });
        Ok(self)
    }

    /// Like [`Batch::put`], for a key that must not exist yet: the batch fails whole with
    /// [`StoreError::Exists`] when it does. Uniqueness comes from the store, so it holds
    /// across processes that share one.
    pub fn insert<V: Serialize>(&mut self, key: Key<V>, value: &V) -> Result<&mut Self, StoreError> {
        self.absent.push(key.as_bytes().to_vec());
        self.put(key, value)
    }

    /// Every key the batch puts must not exist yet: a batch that creates a new record set
    /// (a run's first records) fails whole with [`StoreError::Exists`] if one does.
    pub fn all_new(&mut self) -> &mut Self {
        for op in &self.ops {
            if let Op::Put { key, .. } = op
                && !self.absent.contains(key)
            {
                self.absent.push(key.clone());
            }
        }
        self
    }

    /// Puts a value that is already sealed (copied from another store, checked there).
    pub fn put_sealed(&mut self, key: Vec<u8>, sealed: Vec<u8>) -> &mut Self {
        self.ops.push(Op::Put { key, value: sealed });
        self
    }

    /// Number of puts and deletes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Adds a removal of `key`.
    pub fn delete<V>(&mut self, key: Key<V>) -> &mut Self {
        self.ops.push(Op::Delete { key: key.into_bytes() });
        self
    }

    /// Adds a removal of a key read from the store as it is (repairs, copies).
    pub fn delete_stored(&mut self, key: Vec<u8>) -> &mut Self {
        self.ops.push(Op::Delete { key });
        self
    }

    /// Adds every write of `other`, after this batch's own.
    pub fn extend(&mut self, other: Batch) -> &mut Self {
        self.ops.extend(other.ops);
        self.absent.extend(other.absent);
        self
    }

    /// The first key of `absent` that `exists` says is there.
    pub fn first_present(
        &self,
        mut exists: impl FnMut(&[u8]) -> Result<bool, StoreError>,
    ) -> Result<Option<&[u8]>, StoreError> {
        for key in &self.absent {
            if exists(key)? {
                return Ok(Some(key));
            }
        }
        Ok(None)
    }

    /// No writes at all.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Bytes of keys and values, for limits and metrics.
    pub fn size_bytes(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value } => key.len() + value.len(),
                Op::Delete { key } => key.len(),
            })
            .sum()
    }
}
