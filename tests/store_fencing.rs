//! Nodes sharing one PostgreSQL store (a private server per test): each writes only into the
//! shards it holds a lease on, a steal fences the old owner's next write, a record is
//! created once whoever creates it, and one batch refused in a group fails alone.

use std::{sync::Arc, time::Duration};

use durafiber_store::{
    Backend, Batch, Durability, Leases, PgBackend, RunId, Store, StoreConfig, StoreError,
    shard::{self, SHARDS},
    tables::{Key, decode_sealed, keys},
};
use durafiber_testkit::postgres::PgServer;

const TTL: Duration = Duration::from_secs(2);

/// The record these tests write for a run: text in its storage, in the run's shard.
fn run_key(run_id: &str) -> Key<String> {
    keys::storage(run_id, "value")
}

fn run_put(run_id: &str, value: &str) -> Batch {
    let mut b = Batch::new();
    b.put(run_key(run_id), &value.to_string()).expect("encode");
    b
}

fn run_insert(run_id: &str, value: &str) -> Batch {
    let mut b = Batch::new();
    b.insert(run_key(run_id), &value.to_string()).expect("encode");
    b
}

fn two_nodes() -> (PgServer, String, PgBackend, PgBackend) {
    let server = PgServer::start().expect("a PostgreSQL server");
    let url = server.fresh_database().expect("a database");
    let a = PgBackend::open_node(&url, "a").expect("node a");
    let b = PgBackend::open_node(&url, "b").expect("node b");
    (server, url, a, b)
}

#[test]
fn only_the_owner_of_a_shard_writes_it_and_a_steal_fences_the_old_owner() {
    let (server, url, a, b) = two_nodes();
    assert_eq!(a.acquire(SHARDS as usize, TTL).expect("acquire").len(), SHARDS as usize);
    assert!(b.acquire(SHARDS as usize, TTL).expect("acquire").is_empty(), "every shard is held");

    a.apply(&run_put("run_x", "a1")).expect("the owner writes");
    match b.apply(&run_put("run_x", "b1")) {
        Err(StoreError::Fenced { shard }) => assert_eq!(shard, shard::of_run("run_x")),
        other => panic!("a non-owner wrote: {other:?}"),
    }

    // The leases run out (the database's clock decides): b steals every shard, at a new
    // epoch, and a's next write is refused by the database though a still thinks it owns.
    server.sql(&url, "UPDATE df_shards SET lease_until = now() - interval '1 second'").expect("expire");
    let stolen = b.acquire(SHARDS as usize, TTL).expect("steal");
    assert_eq!(stolen.len(), SHARDS as usize);
    assert!(stolen.iter().all(|l| l.epoch == 2), "each acquisition raises the epoch");
    assert_eq!(a.held().len(), SHARDS as usize, "a has not noticed yet");
    match a.apply(&run_put("run_x", "a2")) {
        Err(StoreError::Fenced { shard }) => assert_eq!(shard, shard::of_run("run_x")),
        other => panic!("the old owner wrote after the steal: {other:?}"),
    }
    assert_eq!(a.renew(TTL).expect("renew").len(), SHARDS as usize, "a learns it lost every shard");
    assert!(a.held().is_empty());
    b.apply(&run_put("run_x", "b2")).expect("the new owner writes");
    let key = run_key("run_x");
    let raw = b.get(key.as_bytes()).expect("get").expect("present");
    let v: String = decode_sealed(key.table(), key.as_bytes(), &raw).expect("decode");
    assert_eq!(v, "b2", "no write of the old owner landed after the steal");
    let stale =
        server.sql(&url, "SELECT count(*) FROM df_shards WHERE owner = 'a' OR epoch <> 2").expect("count");
    assert_eq!(stale.trim(), "0", "no shard carries the old owner or its epoch");

    // A renewal keeps a lease; a release hands it over at once.
    assert!(b.renew(TTL).expect("renew").is_empty());
    b.release(&[shard::of_run("run_x")]).expect("release");
    assert_eq!(a.acquire(1, TTL).expect("acquire").first().map(|l| l.shard), Some(shard::of_run("run_x")));
}

#[test]
fn a_record_is_created_once_whichever_node_creates_it() {
    let (_server, _url, a, b) = two_nodes();
    a.acquire(SHARDS as usize, TTL).expect("acquire");
    // b holds no shard, yet may create a record no one can have written.
    b.apply(&run_insert("run_new", "from b")).expect("a non-owner creates a new record");
    match a.apply(&run_insert("run_new", "from a")) {
        Err(StoreError::Exists { .. }) => {}
        other => panic!("a record was created twice: {other:?}"),
    }
    let mut key_claim = Batch::new();
    key_claim.insert(keys::run_by_key("steps", "k"), &RunId::from("run_1")).expect("e");
    a.apply(&key_claim).expect("first claim");
    assert!(matches!(b.apply(&key_claim), Err(StoreError::Exists { .. })), "second claim refused");
}

#[test]
fn one_batch_refused_in_a_group_fails_alone() {
    let (_server, _url, a, b) = two_nodes();
    // a owns one shard; b owns the rest.
    let mine = shard::of_run("run_mine");
    b.acquire(SHARDS as usize, TTL).expect("acquire");
    b.release(&[mine]).expect("release");
    assert_eq!(a.acquire(1, TTL).expect("acquire").len(), 1);
    let store = Store::with_backend(Arc::new(a), StoreConfig::default()).expect("store");
    let other = (0..)
        .map(|i| format!("run_other_{i}"))
        .find(|r| shard::of_run(r) != mine)
        .expect("a run of another shard");
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    let (ok, refused) = rt.block_on(async {
        let s1 = store.clone();
        let s2 = store.clone();
        let other = other.clone();
        tokio::join!(async move { s1.commit(run_put("run_mine", "v"), Durability::Sync).await }, async move {
            s2.commit(run_put(&other, "v"), Durability::Sync).await
        },)
    });
    ok.expect("the batch into an owned shard commits");
    assert!(matches!(refused, Err(StoreError::Fenced { .. })), "{refused:?}");
    store.close();
}

#[test]
fn one_shard_is_taken_alone_only_when_no_one_holds_it() {
    let (server, url, a, b) = two_nodes();
    a.acquire(SHARDS as usize, TTL).expect("acquire");
    let s = shard::of_run("run_orphan");
    assert_eq!(b.acquire_shard(s, TTL).expect("try"), None, "a held shard is not taken");
    server
        .sql(
            &url,
            &format!("UPDATE df_shards SET lease_until = now() - interval '1 second' WHERE shard_id = {s}"),
        )
        .expect("expire");
    let lease = b.acquire_shard(s, TTL).expect("take").expect("an expired shard is taken");
    assert_eq!((lease.shard, lease.epoch), (s, 2));
    b.apply(&run_put("run_orphan", "b")).expect("the new owner writes");
    assert!(matches!(a.apply(&run_put("run_orphan", "a")), Err(StoreError::Fenced { .. })));
}

#[test]
fn a_node_learns_when_the_first_lease_of_another_node_runs_out() {
    let (server, url, a, b) = two_nodes();
    assert_eq!(b.next_expiry().expect("ask"), None, "no lease is held");
    a.acquire(SHARDS as usize, Duration::from_secs(600)).expect("acquire");
    assert_eq!(a.next_expiry().expect("ask"), None, "a node's own leases do not count");
    let s = shard::of_run("run_soon");
    server
        .sql(
            &url,
            &format!("UPDATE df_shards SET lease_until = now() + interval '60 seconds' WHERE shard_id = {s}"),
        )
        .expect("shorten");
    let left = b.next_expiry().expect("ask").expect("a lease of a runs out");
    assert!(left > Duration::from_secs(30) && left <= Duration::from_secs(60), "the soonest: {left:?}");
    server.sql(&url, "UPDATE df_shards SET lease_until = now() - interval '1 second'").expect("expire");
    assert_eq!(b.next_expiry().expect("ask"), None, "an expired lease is not awaited");
}

#[test]
fn a_process_whose_node_id_was_taken_over_takes_and_renews_no_shard() {
    let server = PgServer::start().expect("a PostgreSQL server");
    let url = server.fresh_database().expect("a database");
    let zombie = PgBackend::open_node(&url, "a").expect("node a");
    zombie.heartbeat("127.0.0.1:1", TTL, true).expect("joins");
    let s = shard::of_run("run_held");
    zombie.acquire_shard(s, TTL).expect("take").expect("a free shard is taken");
    // The process stops for longer than a lease (a paused VM): another process takes the
    // node id, and the old one, woken, must take nothing more nor keep what it held.
    server.sql(&url, "UPDATE df_nodes SET seen_at = now() - interval '1 hour'").expect("unseen");
    let heir = PgBackend::open_node(&url, "a").expect("node a again");
    heir.heartbeat("127.0.0.1:2", TTL, true).expect("the heir takes the node id");
    let free = shard::of_run("run_free");
    assert_eq!(zombie.acquire_shard(free, TTL).expect("try"), None, "a zombie takes no free shard");
    assert!(zombie.acquire(SHARDS as usize, TTL).expect("try").is_empty(), "nor any shard at all");
    assert_eq!(zombie.renew(TTL).expect("renew"), vec![s], "nor renews the one it held");
    let lease = heir.acquire_shard(free, TTL).expect("take").expect("the heir takes it");
    assert_eq!(lease.shard, free);
}
