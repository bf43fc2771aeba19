//! Runs: accepting them durably ([`start`]), keeping at most one live actor per run id
//! ([`registry`]), the actor itself ([`actor`]), and the liveness rule checked ([`liveness`]).

pub(crate) mod actor;
pub(crate) mod liveness;
pub(crate) mod registry;
pub(crate) mod start;
