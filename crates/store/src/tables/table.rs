//! What a table is at the store's seam: a name, a one-byte key prefix and the type of its
//! values ([`Table`]); a key that can only be built here, for one table and its value type
//! ([`Key`]); and the prefix of a range of keys ([`Prefix`]).
//!
//! Keys are built in one place, [`super::keys`], so the layout of every table is written once
//! and a value can only be read and written as the type its table holds.

use std::{cmp::Ordering, fmt, hash, marker::PhantomData};

use serde::de::DeserializeOwned;

pub use crate::error::printable;
use crate::{codec, envelope, error::StoreError};

/// A table's name and prefix, without its value type: for inspection, repair and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableInfo {
    /// Printable name, used in errors and inspection.
    pub name: &'static str,
    /// The key prefix that separates this table from the others.
    pub prefix: u8,
}

/// A logical table whose values are `V`.
pub struct Table<V> {
    info: TableInfo,
    values: PhantomData<fn() -> V>,
}

impl<V> Table<V> {
    /// A table named `name` under the one-byte `prefix`.
    pub(crate) const fn new(name: &'static str, prefix: u8) -> Table<V> {
        Table { info: TableInfo { name, prefix }, values: PhantomData }
    }

    /// Its name and prefix.
    pub const fn info(&self) -> TableInfo {
        self.info
    }

    /// Its printable name.
    pub const fn name(&self) -> &'static str {
        self.info.name
    }

    /// Its key prefix.
    pub const fn prefix(&self) -> u8 {
        self.info.prefix
    }

    /// The key of a record whose key parts are `parts`, joined by NUL.
    pub(crate) fn key(&self, parts: &[&[u8]]) -> Key<V> {
        Key::new(self.info, join(self.info.prefix, parts))
    }

    /// The prefix shared by all keys that start with `parts` (a trailing separator included).
    pub(crate) fn prefix_of(&self, parts: &[&[u8]]) -> Prefix<V> {
        let mut bytes = join(self.info.prefix, parts);
        if !parts.is_empty() {
            bytes.push(0);
        }
        Prefix { table: self.info, bytes, values: PhantomData }
    }

    /// Every key of the table.
    pub fn all(&self) -> Prefix<V> {
        self.prefix_of(&[])
    }

    /// Every key of the table that belongs to run `run_id`, for the tables whose key starts
    /// with the run.
    pub fn of_run(&self, run_id: &str) -> Prefix<V> {
        self.prefix_of(&[run_id.as_bytes()])
    }
}

impl<V> Clone for Table<V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for Table<V> {}

impl<V> fmt::Debug for Table<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Table({})", self.info.name)
    }
}

fn join(prefix: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + parts.iter().map(|p| p.len() + 1).sum::<usize>());
    k.push(prefix);
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            k.push(0);
        }
        k.extend_from_slice(p);
    }
    k
}

/// The full key of one record of a table whose values are `V`, table prefix included.
pub struct Key<V> {
    table: TableInfo,
    bytes: Vec<u8>,
    values: PhantomData<fn() -> V>,
}

impl<V> Key<V> {
    pub(crate) fn new(table: TableInfo, bytes: Vec<u8>) -> Key<V> {
        debug_assert_eq!(bytes.first(), Some(&table.prefix));
        Key { table, bytes, values: PhantomData }
    }

    /// The table it belongs to.
    pub fn table(&self) -> TableInfo {
        self.table
    }

    /// The stored bytes of the key.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The stored bytes of the key, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The key's parts after its table prefix, as they were joined.
    pub(crate) fn parts(&self) -> impl Iterator<Item = &[u8]> {
        self.bytes[1..].split(|b| *b == 0)
    }

    /// The key's last part as text: the name of the record within its run or kind.
    pub fn last_part(&self) -> Option<&str> {
        self.parts().last().and_then(|p| std::str::from_utf8(p).ok())
    }

    /// The key's first part as text: the run (or kind) it belongs to.
    pub fn first_part(&self) -> Option<&str> {
        self.parts().next().and_then(|p| std::str::from_utf8(p).ok())
    }

    /// The key in a readable form, for errors and logs.
    pub fn printable(&self) -> String {
        printable(&self.bytes)
    }
}

impl<V> Clone for Key<V> {
    fn clone(&self) -> Self {
        Key::new(self.table, self.bytes.clone())
    }
}

impl<V> fmt::Debug for Key<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", printable(&self.bytes))
    }
}

impl<V> PartialEq for Key<V> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl<V> Eq for Key<V> {}

impl<V> PartialOrd for Key<V> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<V> Ord for Key<V> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.bytes.cmp(&other.bytes)
    }
}

impl<V> hash::Hash for Key<V> {
    fn hash<H: hash::Hasher>(&self, state: &mut H) {
        self.bytes.hash(state);
    }
}

/// The first bytes shared by a range of keys of one table.
pub struct Prefix<V> {
    table: TableInfo,
    bytes: Vec<u8>,
    values: PhantomData<fn() -> V>,
}

impl<V> Prefix<V> {
    /// The table it belongs to.
    pub fn table(&self) -> TableInfo {
        self.table
    }

    /// The bytes every key in the range starts with.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether `key` is in the range.
    pub fn holds(&self, key: &Key<V>) -> bool {
        key.bytes.starts_with(&self.bytes)
    }

    /// The same range narrowed to keys whose next bytes are `more` (no separator added): the
    /// keys of a run's storage that start with a user's prefix.
    pub(crate) fn narrowed(&self, more: &[u8]) -> Prefix<V> {
        let mut bytes = self.bytes.clone();
        bytes.extend_from_slice(more);
        Prefix { table: self.table, bytes, values: PhantomData }
    }
}

impl<V> Clone for Prefix<V> {
    fn clone(&self) -> Self {
        Prefix { table: self.table, bytes: self.bytes.clone(), values: PhantomData }
    }
}

impl<V> fmt::Debug for Prefix<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Prefix({})", printable(&self.bytes))
    }
}

/// Opens and decodes one sealed record of `table`.
pub fn decode_sealed<V: DeserializeOwned>(
    table: TableInfo,
    key: &[u8],
    sealed: &[u8],
) -> Result<V, StoreError> {
    let body = envelope::open(table.name, key, sealed)?;
    codec::decode(body).map_err(|reason| StoreError::Corrupt {
        table: table.name,
        key: printable(key),
        reason: reason.to_string(),
    })
}

/// Why an id cannot be used as part of a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidId {
    /// It has no characters.
    #[error("{what} is empty")]
    Empty {
        /// What the id names (`"effect id"`, `"idempotency key"`).
        what: String,
    },
    /// It has more than [`ID_CHARS_MAX`] characters.
    #[error("{what} is {chars} characters, more than {ID_CHARS_MAX}")]
    TooLong {
        /// What the id names.
        what: String,
        /// How many characters it has.
        chars: usize,
    },
    /// It holds a NUL byte, which separates a key's parts.
    #[error("{what} contains a NUL byte")]
    Nul {
        /// What the id names.
        what: String,
    },
}

/// An id's refusal as the text an error message carries.
impl From<InvalidId> for String {
    fn from(e: InvalidId) -> String {
        e.to_string()
    }
}

/// Whether `id` can be used as part of a key; why not otherwise.
pub fn check_id(what: &str, id: &str) -> Result<(), InvalidId> {
    if id.is_empty() {
        return Err(InvalidId::Empty { what: what.to_string() });
    }
    let chars = id.chars().count();
    if chars > ID_CHARS_MAX {
        return Err(InvalidId::TooLong { what: what.to_string(), chars });
    }
    if id.contains('\0') {
        return Err(InvalidId::Nul { what: what.to_string() });
    }
    Ok(())
}

/// Ids (run ids, keys, effect ids, alarm names) are bounded so keys stay small: at most this
/// many characters (2 KiB of UTF-8), as the API's document declares them.
pub const ID_CHARS_MAX: usize = 512;
