//! Records of one table read together, in one walk of a key span, for reads of single keys
//! among them later: a recovery reads a page of open runs' records this way instead of one
//! lookup each, which in sled is a descent of the tree per record.
//!
//! A record read in the walk is used later only if the backend vouches that nothing wrote
//! its key since ([`crate::backend::Backend::unchanged_since`]); otherwise the key is read
//! anew. So a prefetched read returns what a read at that later moment would.

use crate::backend::{Entries, ReadMark};

/// What a walk found under one key, and when; empty when the walk did not reach the key.
#[derive(Debug, Default)]
pub struct Prefetched {
    /// The sealed value, or `None` when the walk passed the key and found none.
    pub(crate) read: Option<(Option<Vec<u8>>, ReadMark)>,
}

impl Prefetched {
    /// Whether the walk reached the key.
    pub fn is_read(&self) -> bool {
        self.read.is_some()
    }
}

/// Deals the `entries` a walk read (in key order, at most `limit`) to `keys` (ascending):
/// one [`Prefetched`] per key, in order. A walk stopped by its limit answers only for keys
/// up to the last entry it read; a key out of order (not above the one before) gets no
/// answer either, and is read anew.
pub(crate) fn deal(entries: Entries, keys: &[Vec<u8>], limit: usize, mark: ReadMark) -> Vec<Prefetched> {
    let stopped_at = (entries.len() >= limit).then(|| entries.last().map(|(k, _)| k.clone())).flatten();
    let mut entries = entries.into_iter().peekable();
    let mut before: Option<&Vec<u8>> = None;
    keys.iter()
        .map(|key| {
            // The walk's entries are passed only for keys above every key before them.
            if before.is_some_and(|b| key <= b) || stopped_at.as_ref().is_some_and(|last| key > last) {
                return Prefetched::default();
            }
            before = Some(key);
            while entries.next_if(|(k, _)| k < key).is_some() {}
            let value = entries.next_if(|(k, _)| k == key).map(|(_, v)| v);
            Prefetched { read: Some((value, mark)) }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<Vec<u8>> {
        names.iter().map(|n| n.as_bytes().to_vec()).collect()
    }

    fn entries(names: &[&str]) -> Entries {
        names.iter().map(|n| (n.as_bytes().to_vec(), format!("v{n}").into_bytes())).collect()
    }

    fn values(dealt: &[Prefetched]) -> Vec<Option<Option<String>>> {
        dealt
            .iter()
            .map(|p| p.read.as_ref().map(|(v, _)| v.as_ref().map(|v| String::from_utf8_lossy(v).to_string())))
            .collect()
    }

    #[test]
    fn each_key_gets_its_entry_or_a_known_absence_and_others_between_are_skipped() {
        let dealt = deal(entries(&["a", "b", "c", "e"]), &keys(&["a", "c", "d", "e"]), 100, ReadMark(3));
        let some = |v: &str| Some(Some(v.to_string()));
        assert_eq!(values(&dealt), vec![some("va"), some("vc"), Some(None), some("ve")]);
        assert!(dealt.iter().all(|p| p.read.as_ref().is_some_and(|(_, m)| *m == ReadMark(3))));
    }

    #[test]
    fn a_key_out_of_order_is_left_to_be_read_anew() {
        let dealt = deal(entries(&["a", "b", "c"]), &keys(&["a", "a", "c", "b"]), 100, ReadMark(0));
        let some = |v: &str| Some(Some(v.to_string()));
        assert_eq!(values(&dealt), vec![some("va"), None, some("vc"), None]);
    }

    #[test]
    fn a_walk_stopped_by_its_limit_answers_only_up_to_its_last_entry() {
        let dealt = deal(entries(&["a", "b", "c"]), &keys(&["a", "bb", "c", "d"]), 3, ReadMark(0));
        let some = |v: &str| Some(Some(v.to_string()));
        assert_eq!(values(&dealt), vec![some("va"), Some(None), some("vc"), None]);
    }
}
