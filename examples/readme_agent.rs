//! The complete agent from the README: a summarizer that stashes after every document, so a
//! crash resumes after the last stashed one instead of starting over.
//!
//! Run: `cargo run -p durafiber-examples --example readme_agent`

use durafiber::{Runtime, Store, StoreConfig};
use durafiber_examples::agents::Summarizer;

#[durafiber::tokio::main(crate = "durafiber::tokio")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Store::open_dir(&std::env::temp_dir().join("durafiber-readme"), StoreConfig::default())?;
    let rt = Runtime::builder(store).agent(Summarizer).open().await?;
    let docs = vec!["The first document.".to_string(), "The second one.".to_string()];
    let run = rt.start::<Summarizer>("batch-2026-11-30", &docs).await?;
    println!("{} -> {:?}", run.run_id, rt.wait(&run.run_id).await?);
    Ok(())
}
