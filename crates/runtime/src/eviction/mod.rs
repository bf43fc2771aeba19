//! The Durable Object lifecycle, simulated (§7): idle runs hibernate, idle runs that cannot
//! hibernate are evicted, keep-alive guards hold them.

pub(crate) mod idle;
pub(crate) mod keep_alive;
