//! The key layouts' own tests: each key parses back, and ARCHITECTURE.md lists every table.
use super::*;

#[test]
fn alarm_due_keys_sort_by_time_and_parse_back() {
    let a = alarm_due(Timestamp::from_millis(5), "run", "x");
    let b = alarm_due(Timestamp::from_millis(300), "run", "a");
    assert!(a < b);
    assert_eq!(parse_alarm_due(&b), Some((Timestamp::from_millis(300), "run".into(), "a".into())));
}

#[test]
fn a_retried_occurrence_has_its_own_due_name() {
    let due = retry_due_name("tick", Timestamp::from_millis(42));
    assert_eq!(parse_due_name(&due), ("tick", Some(Timestamp::from_millis(42))));
    assert_eq!(parse_due_name("tick"), ("tick", None));
    let key = alarm_due(Timestamp::from_millis(5), "run", &due);
    assert_eq!(parse_alarm_due(&key), Some((Timestamp::from_millis(5), "run".into(), due)));
    assert_eq!(run_of_key(key.as_bytes()), Some("run"));
    assert_eq!(run_of_key(alarm_retry("run", "tick", Timestamp::from_millis(42)).as_bytes()), Some("run"));
    assert_eq!(run_of_key(stream_chunk("run", 7).as_bytes()), Some("run"));
}

#[test]
fn settled_keys_sort_by_how_then_time_and_name_their_run() {
    let early = settled(Settled::Completed, Timestamp::from_millis(5), "run_b");
    let late = settled(Settled::Completed, Timestamp::from_millis(300), "run_a");
    assert!(early < late);
    assert_eq!(parse_settled(&late), Some((Timestamp::from_millis(300), "run_a")));
    assert_eq!(run_of_key(late.as_bytes()), Some("run_a"));
    let completed = settled_of(Settled::Completed);
    assert!(completed.holds(&early) && completed.holds(&late));
    assert!(
        !completed.holds(&settled(Settled::Failed, Timestamp::from_millis(1), "run_c")),
        "another way of settling is another range"
    );
}

#[test]
fn keys_that_end_in_a_number_give_it_back() {
    assert_eq!(event_seq(&event("run", "paid", 9)), Some(9));
    assert_eq!(stream_seq(&stream_chunk("run", 4)), Some(4));
    assert_eq!(audit_seq(&audit_by_run("run", 77)), Some(77));
    assert_eq!(storage_name(&storage("run", "a\u{1}b")), Some("a\u{1}b"));
    assert!(storage_from("run", "a").holds(&storage("run", "ab")));
    assert!(!storage_from("run", "a").holds(&storage("runa", "b")));
    // A boundary of zero bytes in the middle of the key, and a key after it.
    assert_eq!(storage_undo_parts(&storage_undo("run", 256, "t/1")), Some((256, "t/1")));
    assert!(storage_undo("run", 2, "z") < storage_undo("run", 10, "a"), "by boundary first");
}

#[test]
fn the_architecture_lists_every_table_with_its_prefix() {
    let doc = include_str!("../../../../ARCHITECTURE.md");
    for table in ALL {
        let row = format!("| {} | `{}`", table.name, table.prefix as char);
        assert!(doc.contains(&row), "ARCHITECTURE.md's records on disk lack `{row}`");
    }
}

#[test]
fn ids_with_nul_are_refused() {
    assert!(super::super::check_id("effect id", "a\0b").is_err());
    assert!(super::super::check_id("effect id", "").is_err());
    assert!(super::super::check_id("effect id", "refund").is_ok());
}
