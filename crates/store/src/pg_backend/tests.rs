//! The backend's pure parts: a batch's final states, the URL it shows.

use super::*;
use crate::tables::keys;

#[test]
fn a_batch_reduces_to_each_keys_last_state() {
    let k = |s: &str| keys::meta::<()>(s).into_bytes();
    let mut b = Batch::new();
    b.put_sealed(k("a"), vec![1]).put_sealed(k("b"), vec![2]);
    b.delete_stored(k("a"));
    b.put_sealed(k("b"), vec![3]).put_sealed(k("c"), vec![4]);
    b.delete_stored(k("d"));
    let (gone, keys, values) = final_states(&b);
    assert_eq!(gone, vec![k("a"), k("d")]);
    assert_eq!(keys, vec![k("b"), k("c")]);
    assert_eq!(values, vec![vec![3], vec![4]]);
}

#[test]
fn the_url_shown_has_no_password() {
    let config = tokio_postgres::Config::from_str("postgres://u:secret@127.0.0.1:5433/d").unwrap();
    assert_eq!(shown(&config), "postgres://u@127.0.0.1:5433/d");
}
