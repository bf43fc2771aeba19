//! What the examples share: their agents, a client of OpenAI-compatible chat models, and a
//! runtime on a fresh data directory.

#[path = "agents.rs"]
pub mod agents;
#[path = "model_agent.rs"]
pub mod model_agent;
#[path = "openai.rs"]
pub mod openai;

use durafiber::{Runtime, RuntimeBuilder};
use durafiber::{Store, StoreConfig};

/// Opens a runtime on a new temporary directory; `register` adds the agent kinds.
pub async fn fresh_runtime(
    register: impl FnOnce(RuntimeBuilder) -> RuntimeBuilder,
) -> anyhow::Result<(Runtime, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let store = Store::open_dir(dir.path(), StoreConfig::default())?;
    Ok((register(Runtime::builder(store)).open().await?, dir))
}
