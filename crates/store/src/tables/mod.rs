//! The logical tables: their value types, key layout and record types.
//!
//! All tables live in one ordered key space under one-byte prefixes, so a boundary that
//! touches several tables (stash + run status + ledger entry) is one atomic batch. Each table
//! is a [`Table`] that names the type of its values; [`keys`] holds the table list and the
//! functions that build their keys, the only place a key is built.

mod family_keys;
mod key_parts;
pub mod keys;
mod list;
mod table;

pub use durafiber_api::{family_records::*, records::*};
pub use table::{ID_CHARS_MAX, InvalidId, Key, Prefix, Table, TableInfo, check_id, decode_sealed, printable};
