//! Child process of the alarm kill tests. Starts (or finds) one run whose alarm handler
//! SIGKILLs this process: on the first delivery only (`kill-once`) or on every delivery
//! (`kill-always`). Prints `attempt <retry_count> <is_retry>` before each kill, `handled`
//! when a delivery succeeds, and `ended <state>` when the run ends. Retries use a 10 ms base
//! so that seven attempts take well under a second.
//!
//! Usage: alarm-child DIR kill-once|kill-always

use std::{io::Write, sync::Arc, time::Duration};

use durafiber_runtime::{Agent, AgentError, AlarmEvent, AlarmSpec, Ctx, Recovered, Runtime, RuntimeConfig};
use durafiber_store::{Store, StoreConfig};
use tokio::sync::Notify;

struct KillAlarm {
    always: bool,
    handled: Arc<Notify>,
}

impl Agent for KillAlarm {
    const KIND: &'static str = "kill_alarm";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        let spec = AlarmSpec::after(Duration::from_millis(20), &"wake")?;
        ctx.set_alarm("default", spec).await?;
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_alarm(&self, _: &mut Ctx<Self>, alarm: AlarmEvent) -> Result<(), AgentError> {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "attempt {} {}", alarm.retry_count, alarm.is_retry);
        let _ = out.flush();
        if self.always || !alarm.is_retry {
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        }
        self.handled.notify_one();
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(mode)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: alarm-child DIR kill-once|kill-always");
        std::process::exit(2);
    };
    let handled = Arc::new(Notify::new());
    let agent = KillAlarm { always: mode == "kill-always", handled: handled.clone() };
    let config = RuntimeConfig { alarm_retry_base: Duration::from_millis(10), ..RuntimeConfig::default() };
    let opened = async {
        let store = Store::open_at(dir, StoreConfig::default())?;
        Ok::<_, Box<dyn std::error::Error>>(Runtime::builder(store).config(config).agent(agent).open().await?)
    };
    let rt = match opened.await {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("alarm-child: {e}");
            std::process::exit(1);
        }
    };
    let run = match rt.start::<KillAlarm>("the-job", &()).await {
        Ok(out) => out.run_id,
        Err(e) => {
            eprintln!("alarm-child: {e}");
            std::process::exit(1);
        }
    };
    tokio::select! {
        status = rt.wait(&run) => println!("ended {}", status.map(|s| s.name().to_string()).unwrap_or_default()),
        () = handled.notified() => {
            // The removal after success is a boundary of its own; let it land before exiting.
            for _ in 0..400 {
                if rt.alarms(&run).map(|a| a.is_empty()).unwrap_or(false) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            println!("handled");
        }
    }
    rt.shutdown().await;
}
