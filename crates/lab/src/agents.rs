//! The agents the `durafiber` binary hosts: the refund job of the drill, the order job of the
//! torture with its label child and its poison, the `steps` agent of the benchmarks and the
//! `writer` of the output-stream tests, all from the demo crate, so the server, the drill
//! and the tests run the same code.

use durafiber_runtime::RunId;
use std::{io::Write as _, sync::Arc};

use durafiber_demo::{
    agents::{Label, Order, OrderV2, Refund, Steps, Writer},
    poison::Poison,
};
use durafiber_runtime::{Boundary, CrashHook, RuntimeBuilder, testing::BuilderTestExt as _};

/// How the lab's global flags shape the hosted runtime.
#[derive(Debug, Clone, Default)]
pub struct Hosting {
    /// The order agent's stash version: 1, or 2 for the torture's deploy of a new shape.
    pub order_stash_version: u32,
    /// Hold the process at this boundary until it is killed.
    pub stop_at: Option<Boundary>,
}

/// Registers every demo agent kind, and the stop point if one is asked for.
pub fn register(builder: RuntimeBuilder, hosting: &Hosting) -> RuntimeBuilder {
    let builder = builder
        .agent(Refund::default())
        .agent(Steps::default())
        .agent(Writer)
        .agent(Poison)
        .agent(Label::default());
    let builder = match hosting.order_stash_version {
        2 => builder.agent(OrderV2::default()),
        _ => builder.agent(Order::<u32>::default()),
    };
    match &hosting.stop_at {
        Some(point) => builder.crash_hook(stop_at_hook(point.clone())),
        None => builder,
    }
}

/// A crash hook that holds the process at `point` for good, saying so on stderr: the drill
/// kills it there.
fn stop_at_hook(point: Boundary) -> CrashHook {
    Arc::new(move |run_id: &RunId, reached: &Boundary| {
        if *reached == point {
            tracing::warn!(
                %run_id,
                point = %reached,
                "stopped at the requested crash point; waiting to be killed"
            );
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "STOPPED AT {reached} run {run_id}");
            let _ = err.flush();
            // Hold this thread here for good: the process is meant to die at this point.
            loop {
                std::thread::park();
            }
        }
        false
    })
}
