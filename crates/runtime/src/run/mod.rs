//! Runs: accepting them durably ([`start`]) or as forks of another's history ([`fork`]), activating them and their actor ([`actor`],
//! the only code that spawns one), their fibers ([`fiber`]), each attempt's end ([`fiber_end`]) and its span
//! ([`attempt_span`]), recovery ([`recovery`]) and the
//! scan that finds interrupted runs ([`rescan`]), alarm delivery ([`alarm_delivery`]), the
//! loop that moves them on time ([`driver`]), the liveness rule checked ([`liveness`]), and
//! a node's shards on a shared store ([`leases`]).

pub(crate) mod actor;
pub(crate) mod alarm_delivery;
pub(crate) mod attempt_span;
pub(crate) mod driver;
pub(crate) mod fiber;
pub(crate) mod fiber_end;
pub(crate) mod fork;
pub(crate) mod leases;
pub(crate) mod liveness;
pub(crate) mod recovery;
pub(crate) mod rescan;
pub(crate) mod start;
