//! The agents `durafiber serve` hosts: the refund job of the drill, the order job of the
//! torture, the `steps` agent of the benchmarks and the `writer` of the output-stream tests,
//! all from the demo crate, so the server, the drill and the tests run the same code.

use durafiber_demo::agents::{Order, Refund, Steps, Writer};
use durafiber_runtime::RuntimeBuilder;

/// Registers every hosted agent kind.
pub fn register(builder: RuntimeBuilder) -> RuntimeBuilder {
    builder.agent(Refund::default()).agent(Steps::default()).agent(Order::default()).agent(Writer)
}
