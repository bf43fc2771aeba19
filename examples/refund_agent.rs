//! The refund job, as the drill runs it: draft → human approval → refund through an
//! idempotent upstream → confirmation email, each side effect through the ledger. If nobody
//! answers, the escalation alarm (72 h by default) escalates the run.
//!
//! The agent itself is `durafiber_demo::agents::Refund` (crates/demo/src/agents.rs);
//! this example drives it the way a reviewer's screen would: list the pending approval,
//! approve it by quoting the payload hash it showed, then check the upstream.
//!
//! Run: `cargo run -p durafiber-examples --example refund_agent`

use durafiber::testkit::upstream::Upstream;
use durafiber::{Decision, RunStatus};
use durafiber_demo::agents::{Refund, RefundInput, RefundOutput};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let (rt, _dir) = durafiber_examples::fresh_runtime(|b| b.agent(Refund::default())).await?;
    let input = RefundInput {
        order_id: "ord_42".into(),
        amount_cents: 1_999,
        customer_email: "ada@example.com".into(),
        upstream: upstream.url(),
        api_key: None,
        approval_rule: None,
    };
    let run = rt.start::<Refund>("refund:ord_42", &input).await?.run_id;
    println!("started {run}");
    rt.wait_for(&run, |s| matches!(s, RunStatus::WaitingApproval { .. })).await?;

    let pending = rt.pending_approvals(Some(&run))?;
    let p = &pending[0];
    println!("a reviewer sees: {} (hash {})", p.payload, p.payload_hash);
    rt.approve(&run, &p.approval_id, &p.payload_hash, Decision { approved: true, comment: "ok".into() })
        .await?;

    rt.wait(&run).await?;
    let out: Option<RefundOutput> = rt.output(&run)?;
    println!("output: {out:?}");
    println!(
        "upstream refunds: {}, emails: {}",
        upstream.objects("refunds").len(),
        upstream.objects("emails").len()
    );
    for entry in rt.inspect(&run)?.ledger {
        println!(
            "ledger {}: key {} committed={}",
            entry.effect_id,
            entry.idempotency_key,
            entry.committed.is_some()
        );
    }
    rt.shutdown().await;
    Ok(())
}
