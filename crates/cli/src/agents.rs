//! The agents `durafiber serve` hosts: the refund job of the drill, the order job of the
//! torture, the `steps` agent of the benchmarks and the `writer` of the output-stream tests,
//! all from the demo crate, so the server, the drill and the tests run the same code.

use durafiber_demo::agents::{Order, OrderV2, Refund, Steps, Writer};
use durafiber_runtime::RuntimeBuilder;

/// Set to `2` to host version 2 of the order agent's stash: how the torture deploys a new
/// stash shape over a store full of version 1 runs.
pub const ORDER_STASH_VERSION_ENV: &str = "DURAFIBER_DEMO_ORDER_STASH_VERSION";

/// Registers every hosted agent kind.
pub fn register(builder: RuntimeBuilder) -> RuntimeBuilder {
    let builder = builder.agent(Refund::default()).agent(Steps::default()).agent(Writer);
    match std::env::var(ORDER_STASH_VERSION_ENV).as_deref() {
        Ok("2") => builder.agent(OrderV2::default()),
        _ => builder.agent(Order::<u32>::default()),
    }
}
