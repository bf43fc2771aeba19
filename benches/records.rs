//! The cost of the per-record work on every boundary: encoding and sealing a stash record,
//! opening it again, and hashing a payload for an approval.
//!
//! Run: `cargo bench -p durafiber-benches`

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use durafiber_store::{codec, envelope, tables::StashRecord};

fn stash_record() -> StashRecord {
    StashRecord {
        run_id: "run_019b76daa8006d8a2dbb416aa445".into(),
        attempt: 2,
        step: "refunded".into(),
        seq: 41,
        stash_json: serde_json::json!({"phase": "refunded", "refund_id": "re_1", "notes": "x".repeat(200)})
            .to_string(),
        written_at_ms: durafiber_store::Timestamp::from_millis(1_767_225_600_000),
    }
}

fn records(c: &mut Criterion) {
    let record = stash_record();
    let key = b"srun_019b76daa8006d8a2dbb416aa445".to_vec();
    c.bench_function("encode + seal a stash record", |b| {
        b.iter(|| envelope::seal(&key, &codec::encode(black_box(&record)).unwrap_or_default()));
    });
    let sealed = envelope::seal(&key, &codec::encode(&record).unwrap_or_default());
    c.bench_function("open + decode a stash record", |b| {
        b.iter(|| {
            let body =
                envelope::open("stashes", &key, black_box(&sealed)).map(<[u8]>::to_vec).unwrap_or_default();
            codec::decode::<StashRecord>(&body).ok()
        });
    });
    let payload =
        serde_json::json!({"order_id": "ord_42", "amount_cents": 1999, "reason": "customer request"});
    c.bench_function("canonical JSON + SHA-256 of an approval payload", |b| {
        b.iter(|| {
            durafiber_runtime::canonical_json(black_box(&payload))
                .map(|t| durafiber_runtime::sha256_hex(t.as_bytes()))
        });
    });
}

criterion_group!(benches, records);
criterion_main!(benches);
