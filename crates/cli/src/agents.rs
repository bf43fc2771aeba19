//! The agents `durafiber serve` hosts: the refund job of the drill, the order job of the
//! torture and the `steps` agent of the benchmarks, all from the test kit, so the server, the drill and the tests run the
//! same code.

use durafiber_demo::agents::{Order, Refund, Steps};
use durafiber_runtime::RuntimeBuilder;

/// Registers every hosted agent kind.
pub fn register(builder: RuntimeBuilder) -> RuntimeBuilder {
    builder.agent(Refund::default()).agent(Steps::default()).agent(Order::default())
}
