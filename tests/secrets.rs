//! A secret given to an agent is used, and never written (§4.5): not in any file of the
//! data directory, not in inspection output.

use std::collections::HashMap;

use durafiber_runtime::{Decision, RunStatus, Runtime, Secret, Secrets};
use durafiber_store::{Store, StoreConfig};
use durafiber_testkit::{
    agents::{Refund, RefundInput},
    upstream::Upstream,
};

const SECRET: &str = "sk_live_TOPSECRET_4242_never_on_disk";

fn all_bytes_under(dir: &std::path::Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                bytes.extend(std::fs::read(&path).expect("read"));
            }
        }
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_is_used_upstream_but_never_stored_nor_shown() {
    let upstream = Upstream::start_on("127.0.0.1:0".parse().expect("addr"), Some(SECRET.into()))
        .await
        .expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = Secrets::from_map(HashMap::from([("upstream_key".to_string(), SECRET.to_string())]));
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store).secrets(secrets).agent(Refund::default()).open().await.expect("runtime");
    let input = RefundInput {
        order_id: "ord_7".into(),
        amount_cents: 100,
        customer_email: "bo@example.com".into(),
        upstream: upstream.url(),
        api_key: Some(Secret::named("upstream_key")),
    };
    let run = rt.start::<Refund>("secret-run", &input).await.expect("start").run_id;
    rt.wait_for(&run, |s| matches!(s, RunStatus::WaitingApproval { .. })).await.expect("waits");
    let hash = rt.pending_approvals(Some(&run)).expect("pending")[0].payload_hash.clone();
    rt.approve(&run, "refund", &hash, Decision { approved: true, comment: String::new() })
        .await
        .expect("approve");
    assert!(matches!(rt.wait(&run).await.expect("wait"), RunStatus::Completed { .. }));
    assert_eq!(upstream.objects("refunds").len(), 1, "the secret was resolved and accepted upstream");

    let shown = serde_json::to_string(&rt.inspect(&run).expect("inspect")).expect("json");
    assert!(shown.contains("upstream_key"), "the pointer is shown");
    assert!(!shown.contains(SECRET), "the value is not");
    assert!(!format!("{:?}", Secret::named("upstream_key")).contains(SECRET));
    rt.shutdown().await;
    rt.store().close();
    let disk = all_bytes_under(dir.path());
    assert!(!disk.is_empty());
    assert!(!disk.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "the secret reached the disk");
}
