//! Runs: accepting them durably ([`start`]), keeping at most one live actor per run id
//! ([`registry`]), and the actor itself ([`actor`]).

pub(crate) mod actor;
pub(crate) mod registry;
pub(crate) mod start;
