//! The records of a run's past and family: its history (each boundary's stash, what its
//! storage held before each write), where a fork came from, and the runs it started or was
//! started by.

use serde::{Deserialize, Serialize};

use crate::records::StashRecord;
use crate::{ids::RunId, time::Timestamp};

/// One boundary of a run's history (`history`): its stash as written then, so that a run can
/// be forked from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryRecord {
    /// The stash as it was written.
    pub stash: StashRecord,
    /// The agent's `STASH_VERSION` that wrote it.
    pub version: u32,
    /// Where the fiber stood in its output stream, when it had moved since the stash before.
    pub stream_mark: Option<u64>,
}

/// What a run's storage key held before the run's first write to it after a boundary
/// (`storage_undo`): undone, the writes after that boundary give the storage as it was
/// there, for a fork.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageUndo {
    /// The value as canonical JSON, or `None` when the key held none.
    pub before: Option<String>,
}

/// Where a fork came from (`forks`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkRecord {
    /// The run it was forked from.
    pub source_run_id: RunId,
    /// The boundary of the source it starts from (a stash's `seq`).
    pub at_seq: u64,
    /// The effects it inherited, committed: their receipts are returned, never called again.
    pub inherited_effects: Vec<String>,
    /// The approvals it inherited, decided.
    pub inherited_approvals: Vec<String>,
    /// When it was forked, ms.
    pub forked_at_ms: Timestamp,
}

/// A run a run started as its child (`children`, keyed by the parent and the child's name).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildRecord {
    /// The child's run.
    pub child_run_id: RunId,
    /// Its agent kind.
    pub kind: String,
    /// When the parent started it, ms.
    pub started_at_ms: Timestamp,
}

/// The run that started a run as its child, and the name it gave it (`parents`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRecord {
    /// The parent's run.
    pub parent_run_id: RunId,
    /// The child's name among the parent's children.
    pub name: String,
}
