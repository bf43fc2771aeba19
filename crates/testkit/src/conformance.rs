//! The store conformance suite. Every backend runs it — the sled one and the simulated one
//! here, and any future backend — so the runtime can rely on the same four promises.

use durafiber_store::{
    Backend, Batch,
    tables::{Key, decode_sealed, keys},
};

/// The records it writes: `u32`s in a table that holds them, under ids in number order.
fn typed_key(i: u32) -> Key<u32> {
    keys::stash_version(&format!("conformance_{i:08}"))
}

fn key(i: u32) -> Vec<u8> {
    typed_key(i).into_bytes()
}

fn batch_of(range: std::ops::Range<u32>) -> Batch {
    let mut b = Batch::new();
    for i in range {
        b.put(typed_key(i), &i).expect("a u32 always encodes");
    }
    b
}

/// A batch's writes are all visible after `apply`, in key order.
pub fn applied_batches_are_visible_whole(backend: &dyn Backend) {
    backend.apply(&batch_of(0..10)).expect("apply");
    let rows = backend.range(&key(0), &key(10), 100).expect("range");
    assert_eq!(rows.len(), 10);
    assert!(rows.windows(2).all(|w| w[0].0 < w[1].0), "range is in key order");
}

/// Deletes and overwrites inside one batch land together.
pub fn deletes_and_overwrites_apply_in_order(backend: &dyn Backend) {
    let mut b = batch_of(100..103);
    b.delete(typed_key(101));
    b.put(typed_key(102), &7u32).expect("encode");
    backend.apply(&b).expect("apply");
    assert!(backend.get(&key(101)).expect("get").is_none());
    let raw = backend.get(&key(102)).expect("get").expect("present");
    let v: u32 = decode_sealed(keys::STASH_VERSIONS.info(), &key(102), &raw).expect("decodes");
    assert_eq!(v, 7);
}

/// `range` honours its limit and its bounds.
pub fn ranges_respect_limits_and_bounds(backend: &dyn Backend) {
    backend.apply(&batch_of(200..220)).expect("apply");
    assert_eq!(backend.range(&key(200), &key(220), 5).expect("range").len(), 5);
    assert_eq!(backend.range(&key(205), &key(207), 100).expect("range").len(), 2);
    assert!(backend.range(&key(207), &key(205), 100).expect("range").is_empty());
}

/// A range restricted to some shards returns exactly their runs' records, in key order.
pub fn ranges_in_shards_keep_only_those_shards(backend: &dyn Backend) {
    use durafiber_store::shard;
    let ids: Vec<String> = (0..40).map(|i| format!("run_conformance_{i:02}")).collect();
    let mut b = Batch::new();
    for id in &ids {
        b.put(keys::open_run(id), &()).expect("a unit always encodes");
    }
    backend.apply(&b).expect("apply");
    let wanted: Vec<u32> = ids.iter().take(10).map(|id| shard::of_run(id)).collect();
    let (start, end) =
        (keys::open_run("run_conformance_").into_bytes(), keys::open_run("run_conformance_~").into_bytes());
    let rows = backend.range_in_shards(&start, &end, 1_000, &wanted).expect("range");
    let expected: Vec<Vec<u8>> = ids
        .iter()
        .filter(|id| wanted.contains(&shard::of_run(id)))
        .map(|id| keys::open_run(id).into_bytes())
        .collect();
    assert_eq!(rows.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), expected);
    let two = backend.range_in_shards(&start, &end, 2, &wanted).expect("range");
    assert_eq!(two.len(), 2, "the limit holds");
}

/// A barrier succeeds on a healthy backend.
pub fn barriers_succeed(backend: &dyn Backend) {
    backend.apply(&batch_of(300..301)).expect("apply");
    backend.barrier().expect("barrier");
}

/// Runs every check above.
pub fn run_all(backend: &dyn Backend) {
    applied_batches_are_visible_whole(backend);
    deletes_and_overwrites_apply_in_order(backend);
    ranges_respect_limits_and_bounds(backend);
    ranges_in_shards_keep_only_those_shards(backend);
    barriers_succeed(backend);
}
