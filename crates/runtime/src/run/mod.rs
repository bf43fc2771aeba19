//! Runs: accepting them durably ([`start`]), activating them ([`activate`], the only code
//! that spawns an actor), the actor itself ([`actor`]), and the liveness rule checked
//! ([`liveness`]).

pub(crate) mod activate;
pub(crate) mod actor;
pub(crate) mod alarm_delivery;
pub(crate) mod driver;
pub(crate) mod fiber;
pub(crate) mod liveness;
pub(crate) mod recovery;
pub(crate) mod start;
