//! Which recovery hooks run at once, so that a process death is blamed only on the run that
//! caused it (§3.6).
//!
//! A recovery is counted before its hook runs (`recover_attempts`), so a hook that kills the
//! process is counted too. But when the process dies, every hook then in flight was counted,
//! and the death is only one's fault — or none's, when the process was killed from outside.
//! So a count is a suspicion, never a verdict. A *suspect* — a run whose last recovery made
//! no progress — is recovered **alone**: its hook starts only when no other hook is in
//! flight, and none starts until it settles. Its lone recovery (a *probe*) is counted in
//! `tables::HOOK_PROBES` before the hook runs and cleared when the hook settles (its first
//! boundary, a durable wait, its end). A process that dies during a probe died of that hook
//! or by chance in a window of a few milliseconds; `max_recover_attempts` such deaths in a
//! row escalate the run. Bystanders are never counted beyond suspicion.
//!
//! A hook that runs long without settling stops holding probes back after
//! `limits::HOOK_SETTLE_MAX`, and a probe stops holding hooks back after
//! `limits::PROBE_ALONE_MAX`: no run waits for ever behind one that hangs.

use durafiber_api::Timestamp;
use std::{collections::BTreeMap, sync::Arc};

use durafiber_store::lock::Mutex;

use crate::limits;

/// The hooks in flight in this process.
#[derive(Default)]
pub(crate) struct HookGate {
    state: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    next_ticket: u64,
    /// Hooks in flight and not settled: ticket → when each started.
    hooks: BTreeMap<u64, Timestamp>,
    /// The probe in flight: its ticket and when it started.
    probe: Option<(u64, Timestamp)>,
    /// When a suspect last asked for its probe and was held back.
    probe_asked_at: Option<Timestamp>,
}

/// A hook's place at the gate, held by its run's cell until the hook settles.
pub(crate) struct HookPermit {
    gate: Arc<HookGate>,
    ticket: u64,
    probe: bool,
}

impl HookPermit {
    /// Whether this is a suspect's lone recovery, counted in `tables::HOOK_PROBES`.
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

impl Drop for HookPermit {
    fn drop(&mut self) {
        let mut state = self.gate.state.lock();
        if self.probe {
            if state.probe.is_some_and(|(ticket, _)| ticket == self.ticket) {
                state.probe = None;
            }
        } else {
            state.hooks.remove(&self.ticket);
        }
    }
}

impl HookGate {
    /// A place for the hook of a run that is not a suspect; `None` while a probe runs or
    /// a suspect waits for its turn.
    pub fn try_hook(self: &Arc<Self>, now: Timestamp) -> Option<HookPermit> {
        let mut state = self.state.lock();
        let probing = state.probe.is_some_and(|(_, at)| now.saturating_since(at) < limits::PROBE_ALONE_MAX);
        let asked = state.probe_asked_at.is_some_and(|at| now.saturating_since(at) < limits::PROBE_ASK_HOLD);
        if probing || asked {
            return None;
        }
        let ticket = state.take_ticket();
        state.hooks.insert(ticket, now);
        Some(HookPermit { gate: self.clone(), ticket, probe: false })
    }

    /// The place for a suspect's lone recovery; `None` while another probe runs or a hook
    /// in flight has not settled — then new hooks wait for a while, so its turn comes.
    pub fn try_probe(self: &Arc<Self>, now: Timestamp) -> Option<HookPermit> {
        let mut state = self.state.lock();
        let probing = state.probe.is_some_and(|(_, at)| now.saturating_since(at) < limits::PROBE_ALONE_MAX);
        let busy = state.hooks.values().any(|at| now.saturating_since(*at) < limits::HOOK_SETTLE_MAX);
        if probing || busy {
            state.probe_asked_at = Some(now);
            return None;
        }
        let ticket = state.take_ticket();
        state.probe = Some((ticket, now));
        state.probe_asked_at = None;
        Some(HookPermit { gate: self.clone(), ticket, probe: true })
    }
}

impl GateState {
    fn take_ticket(&mut self) -> u64 {
        self.next_ticket = self.next_ticket.wrapping_add(1);
        self.next_ticket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn a_probe_runs_alone_and_hooks_wait_for_it() {
        let gate = Arc::new(HookGate::default());
        let hook = gate.try_hook(at(0)).expect("a hook starts on an idle gate");
        assert!(gate.try_probe(at(10)).is_none(), "a hook in flight holds the probe back");
        assert!(gate.try_hook(at(20)).is_none(), "a suspect asked: new hooks wait");
        drop(hook);
        let probe = gate.try_probe(at(30)).expect("the gate is idle");
        assert!(probe.is_probe());
        assert!(gate.try_hook(at(40)).is_none() && gate.try_probe(at(40)).is_none(), "the probe runs alone");
        drop(probe);
        assert!(gate.try_hook(at(50)).is_none(), "the suspect that asked at 40 goes first");
        drop(gate.try_probe(at(60)).expect("its turn"));
        assert!(gate.try_hook(at(70)).is_some());
    }

    #[test]
    fn a_hook_or_probe_that_does_not_settle_stops_holding_others_back() {
        let gate = Arc::new(HookGate::default());
        let _hook = gate.try_hook(at(0)).expect("hook");
        let settle = limits::HOOK_SETTLE_MAX.as_millis() as u64;
        let _probe = gate.try_probe(at(settle)).expect("a hook that long in flight no longer counts");
        let alone = limits::PROBE_ALONE_MAX.as_millis() as u64;
        assert!(gate.try_hook(at(settle + 1)).is_none());
        assert!(gate.try_hook(at(settle + alone)).is_some(), "a hung probe holds no one for ever");
    }
}
