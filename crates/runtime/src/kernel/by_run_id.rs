//! A table of values that each hold their run's id, found by it. The tables every live run
//! has an entry in (its cell in the registry, its state in the activity tracker) keep no key
//! beside the value, only the key's hash: a map keyed by a copy of the id cost each live run
//! a string or a pointer more, a million waiting runs a million times.

use std::hash::BuildHasher;

/// A value that names its run.
pub(crate) trait HasRunId {
    fn run_id(&self) -> &str;
}

/// Values found by the run id they hold, at most one a run.
pub(crate) struct ByRunId<T> {
    table: hashbrown::HashTable<Hashed<T>>,
    /// Run ids are minted by the runtime (128 random bits), so they are hashed with foldhash
    /// rather than SipHash: a recovery looks each run up a dozen times.
    hasher: foldhash::fast::RandomState,
}

/// A value with its run id's hash. Kept beside the value so that growing the table moves
/// entries without reading their run ids again (a cache miss each, then the hash): a
/// recovery of a million runs grows each table about twenty times, and the activity
/// tracker's inserts were 9% of its CPU.
struct Hashed<T> {
    hash: u64,
    value: T,
}

impl<T> Default for ByRunId<T> {
    fn default() -> Self {
        ByRunId { table: hashbrown::HashTable::new(), hasher: foldhash::fast::RandomState::default() }
    }
}

impl<T: HasRunId> ByRunId<T> {
    pub fn get(&self, id: &str) -> Option<&T> {
        let hash = self.hasher.hash_one(id);
        self.table.find(hash, |held| held.is(hash, id)).map(|held| &held.value)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut T> {
        let hash = self.hasher.hash_one(id);
        self.table.find_mut(hash, |held| held.is(hash, id)).map(|held| &mut held.value)
    }

    /// Adds `value`, in place of its run's value if there was one.
    pub fn insert(&mut self, value: T) {
        let id = value.run_id();
        let hash = self.hasher.hash_one(id);
        match self.table.entry(hash, |held| held.is(hash, id), |held| held.hash) {
            hashbrown::hash_table::Entry::Occupied(mut entry) => entry.get_mut().value = value,
            hashbrown::hash_table::Entry::Vacant(entry) => {
                entry.insert(Hashed { hash, value });
            }
        }
    }

    /// Puts `make(old)` in place of the run's value, or adds it when the run had none, in
    /// one probe of the table; returns the value put. `make` returns a value of `run_id`.
    pub fn replace_with(&mut self, id: &str, make: impl FnOnce(Option<&T>) -> T) -> &mut T {
        let hash = self.hasher.hash_one(id);
        let held = match self.table.entry(hash, |held| held.is(hash, id), |held| held.hash) {
            hashbrown::hash_table::Entry::Occupied(entry) => {
                let held = entry.into_mut();
                held.value = make(Some(&held.value));
                held
            }
            hashbrown::hash_table::Entry::Vacant(entry) => {
                entry.insert(Hashed { hash, value: make(None) }).into_mut()
            }
        };
        debug_assert_eq!(held.value.run_id(), id);
        &mut held.value
    }

    pub fn remove(&mut self, id: &str) -> Option<T> {
        let hash = self.hasher.hash_one(id);
        let entry = self.table.find_entry(hash, |held| held.is(hash, id)).ok()?;
        Some(entry.remove().0.value)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.table.iter().map(|held| &held.value)
    }
}

impl<T: HasRunId> Hashed<T> {
    /// Whether this entry holds the run of id `id`, whose hash is `hash`: the id is read only when the
    /// hashes agree.
    fn is(&self, hash: u64, id: &str) -> bool {
        self.hash == hash && self.value.run_id() == id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(String, u32);

    impl HasRunId for Named {
        fn run_id(&self) -> &str {
            &self.0
        }
    }

    #[test]
    fn a_value_is_found_by_its_run_id_and_replaced_by_the_next_of_the_same_run() {
        let mut table = ByRunId::default();
        for i in 0..1_000 {
            table.insert(Named(format!("run-{i}"), i));
        }
        table.insert(Named("run-7".into(), 70));
        assert_eq!(table.len(), 1_000);
        assert_eq!(table.get("run-7").map(|n| n.1), Some(70));
        if let Some(n) = table.get_mut("run-8") {
            n.1 = 80;
        }
        assert_eq!(table.get("run-8").map(|n| n.1), Some(80));
        assert_eq!(table.remove("run-9").map(|n| n.1), Some(9));
        assert!(table.get("run-9").is_none() && table.remove("run-9").is_none());
        assert_eq!(table.values().count(), 999);
    }

    #[test]
    fn replacing_a_value_sees_the_old_one_and_adding_one_sees_none() {
        let mut table = ByRunId::default();
        table.insert(Named("run-1".into(), 1));
        let put = table.replace_with("run-1", |old| Named("run-1".into(), old.map_or(0, |n| n.1) + 10));
        put.1 += 1;
        let added = table.replace_with("run-2", |old| Named("run-2".into(), old.map_or(100, |n| n.1)));
        assert_eq!(added.1, 100);
        assert_eq!(table.get("run-1").map(|n| n.1), Some(12));
        assert_eq!(table.len(), 2);
    }
}
