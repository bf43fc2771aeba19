//! A stored stash read back as the code's `Stash`: decoded, or upgraded from the version
//! that wrote it (`Agent::upgrade_stash`).
//!
//! Each stash is stored with the agent's `STASH_VERSION` (`kernel/stash_record.rs`), so that
//! code deployed later knows which shape it holds. `Ctx::stash` (`agent/ctx.rs`) writes it,
//! through the boundary committer.

use serde::de::DeserializeOwned;

pub(crate) use crate::kernel::stash_record::{Stored, read};
use crate::{error::AgentError, json};

/// A stored stash as the code's `Stash` (version `code_version`): decoded when its version
/// is the code's, upgraded by `upgrade` when older; escalating, with both versions named,
/// when newer, when there is no upgrade, or when it does not decode as the version it claims.
pub(crate) fn decode_versioned<T: DeserializeOwned>(
    stored: &Stored,
    code_version: u32,
    upgrade: impl FnOnce(u32, serde_json::Value) -> Result<T, AgentError>,
) -> Result<T, AgentError> {
    let (from, to) = (stored.version, code_version);
    let text = &stored.record.stash_json;
    match from.cmp(&to) {
        std::cmp::Ordering::Equal => json::parse(text).map_err(|e| {
            AgentError::escalate(format!(
                "stash_version: the stored stash (version {from}) does not decode as this code's Stash \
                 (version {to}): {e}; bump Agent::STASH_VERSION and upgrade it in Agent::upgrade_stash"
            ))
        }),
        std::cmp::Ordering::Less => {
            let old =
                json::parse::<serde_json::Value>(text).map_err(|e| AgentError::Serialization(e.into()))?;
            upgrade(from, old)
        }
        std::cmp::Ordering::Greater => Err(AgentError::escalate(format!(
            "stash_version: the stored stash is version {from}, newer than this code's version {to}: \
             deploy the newer code, or add a downgrade"
        ))),
    }
}
