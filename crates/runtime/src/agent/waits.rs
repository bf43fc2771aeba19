//! A fiber's waits: durable sleeps and external events, journaled so a re-entered fiber keeps
//! its wake time and gets the same event; and a sleep in memory only.

use durafiber_api::Timestamp;
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::{Agent, Ctx};
use crate::{budget, clock, error::AgentError, json};

impl<A: Agent> Ctx<A> {
    /// Sleeps durably for `d` under `name` (§2.4): the wake time is committed as a boundary
    /// and the run is `Waiting{alarm}` until then — it may be evicted or hibernated, and it
    /// survives restarts. Names are journaled: re-entered after a recovery, a sleep whose
    /// time has passed returns at once and a pending one keeps its original wake time. Use
    /// a new name for each sleep of a run (`"poll:3"`, not `"poll"` in a loop).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use durafiber_runtime::{Agent, AgentError, Ctx};
    /// # struct Reminder;
    /// # impl Agent for Reminder {
    /// #     const KIND: &'static str = "reminder";
    /// #     type Input = ();
    /// #     type Stash = ();
    /// #     type Output = ();
    /// #     type Message = ();
    /// async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
    ///     ctx.sleep_for("cool-off", Duration::from_secs(3 * 24 * 3600)).await?; // three days
    ///     Ok(())
    /// }
    /// # }
    /// ```
    pub async fn sleep_for(&mut self, name: &str, d: Duration) -> Result<(), AgentError> {
        self.raw.refuse_if_cancelled(&format!("sleep {name}"))?;
        budget::check(&self.raw)?;
        Box::pin(crate::sleep::sleep(&mut self.raw, name, crate::alarm::AlarmAt::In(d))).await
    }

    /// Sleeps durably under `name` until the clock reads `at`; see [`Ctx::sleep_for`].
    pub async fn sleep_until(&mut self, name: &str, at: Timestamp) -> Result<(), AgentError> {
        self.raw.refuse_if_cancelled(&format!("sleep {name}"))?;
        budget::check(&self.raw)?;
        Box::pin(crate::sleep::sleep(&mut self.raw, name, crate::alarm::AlarmAt::At(at))).await
    }

    /// Waits durably for the external event `name` (sent with `Runtime::send_event`): the run
    /// is `Waiting{event}` meanwhile and may be evicted. `None` when `timeout` passes first.
    /// The result is journaled under `name`: re-entered, the call returns it again at once,
    /// so give each wait of a run its own name (`"payment:2"`).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use durafiber_runtime::{Agent, AgentError, Ctx};
    /// # struct Checkout;
    /// # impl Agent for Checkout {
    /// #     const KIND: &'static str = "checkout";
    /// #     type Input = ();
    /// #     type Stash = ();
    /// #     type Output = bool;
    /// #     type Message = ();
    /// async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<bool, AgentError> {
    ///     let paid: Option<String> = ctx.wait_for_event("paid", Some(Duration::from_secs(3600))).await?;
    ///     Ok(paid.is_some())
    /// }
    /// # }
    /// ```
    pub async fn wait_for_event<T: DeserializeOwned>(
        &mut self,
        name: &str,
        timeout: Option<Duration>,
    ) -> Result<Option<T>, AgentError> {
        self.raw.refuse_if_cancelled(&format!("wait for event {name}"))?;
        budget::check(&self.raw)?;
        match Box::pin(crate::event::wait(&mut self.raw, name, timeout)).await? {
            Some(payload) => {
                Ok(Some(json::parse(&payload).map_err(|e| AgentError::Serialization(e.into()))?))
            }
            None => Ok(None),
        }
    }

    /// Sleeps on the runtime's clock, in memory only: an interruption loses the wait, and
    /// recovery re-enters the last boundary. [`Ctx::sleep_for`] is the durable one.
    pub async fn sleep_in_memory(&self, d: Duration) {
        let sleep = clock::sleep(self.raw.shared.time.clock.as_ref(), d);
        self.raw.shared.life.parked(self.raw.in_fiber, sleep).await;
    }
}
