//! Versions bumped when something waiters look for has moved: a run's status, durable
//! output, a streaming call begun, a pause. A waiter sleeps on one instead of polling.

use tokio::sync::watch;

pub(crate) struct Signals {
    /// Bumped on every status change, so `wait` can sleep until something moved.
    pub status_version: watch::Sender<u64>,
    /// Bumped whenever output chunks become durable, so stream readers sleep until then.
    pub stream_version: watch::Sender<u64>,
    /// Bumped when a streaming effect's call begins on this node: a run's readers look for
    /// its partial chunks then (see `kernel/live_stream.rs`).
    pub live_version: watch::Sender<u64>,
    /// Bumped on every pause and resume, so a held fiber wakes to look again.
    pub pause_version: watch::Sender<u64>,
}

impl Signals {
    pub fn new() -> Self {
        Signals {
            status_version: watch::Sender::new(0),
            stream_version: watch::Sender::new(0),
            live_version: watch::Sender::new(0),
            pause_version: watch::Sender::new(0),
        }
    }

    pub fn status_changed(&self) {
        self.status_version.send_modify(|v| *v += 1);
    }
}
