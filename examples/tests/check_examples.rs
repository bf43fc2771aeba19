//! Every example agent through the crash and eviction checker: crashed after every boundary
//! and with every store write lost, killed between effects' calls and receipts, evicted at
//! every boundary and by seeded chaos — each ends as its uninterrupted run did.

use std::sync::Arc;

use durafiber::Decision;
use durafiber::testkit::{check::AgentCheck, upstream::Upstream};
use durafiber_demo::agents::{Refund, RefundInput};
use durafiber_examples::agents::{Event, InvoicePaid, Summarizer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_summarizer_survives_every_crash_and_eviction() {
    let docs: Vec<String> = (1..=5).map(|n| format!("document number {n}, long enough to be cut")).collect();
    AgentCheck::new(Summarizer)
        .input(&docs)
        .crash_at_every_boundary()
        .eviction_matrix()
        .run()
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_handler_survives_every_crash_and_eviction() {
    AgentCheck::new(InvoicePaid)
        .input(&Event { invoice: "in_42".into(), cents: 1_999 })
        .crash_at_every_boundary()
        .eviction_matrix()
        .run()
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refund_agent_refunds_and_emails_once_under_every_crash_and_eviction() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let input = RefundInput {
        order_id: "ord_7".into(),
        amount_cents: 1_250,
        customer_email: "grace@example.com".into(),
        upstream: upstream.url(),
        api_key: None,
        approval_rule: None,
    };
    AgentCheck::new(Refund::default())
        .input(&input)
        .upstream(upstream)
        .approve_with(|_| Decision { approved: true, comment: "checked".into() })
        .crash_at_every_boundary()
        .kill_during_effects()
        .eviction_matrix()
        .run()
        .await
        .assert_ok();
}
