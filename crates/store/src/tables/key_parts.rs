//! Reading keys back: the parts of a table's key (a sequence number, a name, a due time) that
//! scans hand back. Their layouts are `keys.rs`'s.

use durafiber_api::Timestamp;
use durafiber_api::{family_records::*, records::*};

use super::table::Key;

/// The name a `children` key gives its child.
pub fn child_name(key: &Key<ChildRecord>) -> Option<String> {
    let parent = key.first_part()?;
    let rest = key.as_bytes().get(1 + parent.len() + 1..)?;
    std::str::from_utf8(rest).ok().map(str::to_string)
}

/// Splits a due-index name back into the alarm's name and, for a retried occurrence, the time
/// it was scheduled for.
pub fn parse_due_name(due_name: &str) -> (&str, Option<Timestamp>) {
    match due_name.split_once('\0') {
        Some((name, at)) => match at.parse() {
            Ok(at) => (name, Some(Timestamp::from_millis(at))),
            Err(_) => (due_name, None),
        },
        None => (due_name, None),
    }
}

/// The sequence number of a stream chunk's key.
pub fn stream_seq(key: &Key<StreamChunkRecord>) -> Option<u64> {
    tail_number(key)
}

/// The sequence number of a buffered event's key.
pub fn event_seq(key: &Key<EventRecord>) -> Option<u64> {
    tail_number(key)
}

/// The key in a run's own storage that a storage key names.
pub fn storage_name(key: &Key<String>) -> Option<&str> {
    let run_id = key.first_part()?;
    let rest = key.as_bytes().get(1 + run_id.len() + 1..)?;
    std::str::from_utf8(rest).ok()
}

/// The boundary and the storage key a `storage_undo` key names.
pub fn storage_undo_parts(key: &Key<StorageUndo>) -> Option<(u64, &str)> {
    let run_id = key.first_part()?;
    let rest = key.as_bytes().get(1 + run_id.len() + 1..)?;
    let seq = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let name = rest.get(9..)?;
    std::str::from_utf8(name).ok().map(|name| (seq, name))
}

/// The number a key of `audit` or `audit_by_run` ends with.
pub fn audit_seq<V>(key: &Key<V>) -> Option<u64> {
    tail_number(key)
}

/// The big-endian number the last eight bytes of a key hold.
fn tail_number<V>(key: &Key<V>) -> Option<u64> {
    let bytes = key.as_bytes();
    let tail = bytes.get(bytes.len().checked_sub(8)?..)?;
    Some(u64::from_be_bytes(tail.try_into().ok()?))
}
