//! The complete agent from the README: a summarizer that stashes after every document, so a
//! crash resumes after the last stashed one instead of starting over.
//!
//! Run: `cargo run -p durafiber-examples --example readme_agent`

use durafiber_runtime::{Agent, AgentError, Ctx, Recovered, Runtime};
use durafiber_store::{Store, StoreConfig};
use serde::{Deserialize, Serialize};

struct Summarizer;

#[derive(Clone, Default, Serialize, Deserialize)]
struct Progress {
    done: usize,
    summaries: Vec<String>,
}

type Summaries = Result<Vec<String>, AgentError>;

impl Agent for Summarizer {
    const KIND: &'static str = "summarizer";
    type Input = Vec<String>;
    type Stash = Progress;
    type Output = Vec<String>;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, docs: Vec<String>) -> Summaries {
        work(ctx, docs, Progress::default()).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Summaries {
        work(ctx, r.input, r.stash.unwrap_or_default()).await // resume after the last stash
    }
}

async fn work(ctx: &mut Ctx<Summarizer>, docs: Vec<String>, mut p: Progress) -> Summaries {
    for doc in &docs[p.done..] {
        p.summaries.push(doc.chars().take(24).collect()); // call your model here
        p.done += 1;
        ctx.stash("summarized", &p).await?; // durable before the next step starts
    }
    Ok(p.summaries)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Store::open_dir(&std::env::temp_dir().join("durafiber-readme"), StoreConfig::default())?;
    let rt = Runtime::builder(store).agent(Summarizer).open().await?;
    let docs = vec!["The first document.".to_string(), "The second one.".to_string()];
    let run = rt.start::<Summarizer>("batch-2026-11-30", &docs).await?;
    println!("{} -> {:?}", run.run_id, rt.wait(&run.run_id).await?);
    Ok(())
}
