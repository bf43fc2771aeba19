//! How many connections the server holds, and for whom: sized from the process's
//! file-descriptor limit (its soft limit raised to the hard one at start), with a share kept
//! for callers who present a valid token or console session, and a few more for `/health`.
//!
//! A connection is taken from the open share while it lasts; past it, from the signed-in
//! share, where a request is served only for a caller that signs in on its headers
//! ([`SignedInOnly`], checked by `guard::signed_in_only` before any body is read). Addresses that
//! hold stalled requests fill the open share at most, each up to its per-address cap, and an
//! admin still gets in.

use durafiber_runtime::limits;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// The connections a server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Connections served for anyone.
    pub open: usize,
    /// Connections beyond `open`, served only for a caller that signs in.
    pub signed_in: usize,
    /// Connections beyond both, answered on `/health` only.
    pub health: usize,
}

impl Capacity {
    /// `total` connections (at least [`limits::HTTP_CONNECTIONS_MIN`]), the signed-in share
    /// taken from them.
    pub fn of(total: usize) -> Capacity {
        let total = total.max(limits::HTTP_CONNECTIONS_MIN);
        let signed_in = total * limits::HTTP_SIGNED_IN_PERCENT / 100;
        Capacity { open: total - signed_in, signed_in, health: limits::HTTP_HEALTH_CONNECTIONS_MAX }
    }

    /// What `fds` file descriptors allow: half of what is left once the store and the rest
    /// have theirs, within [`limits::HTTP_CONNECTIONS_SIZED_MAX`].
    pub fn sized_from(fds: u64) -> Capacity {
        let spare = fds.saturating_sub(limits::FDS_KEPT_FOR_FILES) / 2;
        let total = usize::try_from(spare).unwrap_or(usize::MAX).min(limits::HTTP_CONNECTIONS_SIZED_MAX);
        Capacity::of(total)
    }

    /// Connections in all, but for `/health`'s.
    pub fn total(&self) -> usize {
        self.open + self.signed_in
    }
}

/// The process's file-descriptor limit, as found and as raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit the process started with.
    pub was: Option<u64>,
    /// The soft limit now.
    pub soft: Option<u64>,
    /// The hard limit, which the soft one was raised to.
    pub hard: Option<u64>,
}

/// Raises the process's soft file-descriptor limit to its hard limit (which needs no
/// privilege), so that connections are sized from what the machine allows. `None` in a
/// limit is unlimited.
pub fn raise_fd_limit() -> FdLimit {
    let Rlimit { current: was, maximum: hard } = getrlimit(Resource::Nofile);
    if was == hard {
        return FdLimit { was, soft: was, hard };
    }
    match setrlimit(Resource::Nofile, Rlimit { current: hard, maximum: hard }) {
        Ok(()) => FdLimit { was, soft: hard, hard },
        Err(e) => {
            tracing::warn!(error = %e, "could not raise the file-descriptor limit; sizing from it as it is");
            FdLimit { was, soft: was, hard }
        }
    }
}

/// The capacity of a server: `configured` connections when the config names them, else sized
/// from the file-descriptor limit (as raised). The log says both.
pub fn capacity(configured: Option<usize>, fds: &FdLimit) -> Capacity {
    let capacity = match configured {
        Some(total) => Capacity::of(total),
        None => Capacity::sized_from(fds.soft.unwrap_or(u64::MAX)),
    };
    tracing::info!(
        fd_soft_limit_was = ?fds.was,
        fd_soft_limit = ?fds.soft,
        fd_hard_limit = ?fds.hard,
        connections = capacity.total(),
        kept_for_the_signed_in = capacity.signed_in,
        health_only = capacity.health,
        "connections sized"
    );
    capacity
}

/// Marks the requests of a connection taken from the signed-in share: each is served only
/// for a caller that presents a valid token or console session on its headers.
#[derive(Debug, Clone, Copy)]
pub struct SignedInOnly;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_sized_from_the_descriptors_left_for_them() {
        assert_eq!(Capacity::sized_from(20_000).total(), (20_000 - 1_024) / 2);
        assert_eq!(
            Capacity::sized_from(1_024).total(),
            limits::HTTP_CONNECTIONS_MIN,
            "never below the floor"
        );
        assert_eq!(Capacity::sized_from(u64::MAX).total(), limits::HTTP_CONNECTIONS_SIZED_MAX);
        let c = Capacity::of(1_000);
        assert_eq!((c.open, c.signed_in), (750, 250));
    }

    #[test]
    fn a_configured_capacity_wins_over_the_descriptors() {
        let fds = FdLimit { was: Some(1_024), soft: Some(20_000), hard: Some(20_000) };
        assert_eq!(capacity(Some(400), &fds).total(), 400);
        assert_eq!(capacity(None, &fds).total(), 9_488);
    }
}
