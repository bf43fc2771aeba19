//! What a call of the client can meet: the server unreachable, or a refusal typed by the
//! API's `kind`.

use std::time::Duration;

/// The `kind` of an API error (`{"error": "...", "kind": "..."}`), one variant per kind the
/// server sends; a kind this client does not know yet is kept as [`ApiErrorKind::Other`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiErrorKind {
    /// No run has that id.
    UnknownRun,
    /// Another node owns the run now (421): send it again.
    NotOwner,
    /// No agent of that kind is registered.
    UnknownKind,
    /// The idempotency key was used with another input.
    KeyConflict,
    /// The approval's payload changed since it was shown: the hash quoted is stale.
    StaleApproval,
    /// Nothing waits for that approval.
    NotPending,
    /// Another decision was recorded first.
    AlreadyDecided,
    /// This person has already decided the approval differently: one person counts once.
    AlreadyVoted,
    /// The approval's rule does not let this person decide it (403).
    NotAReviewer,
    /// An approval that takes more than one person was decided without a name to count.
    DeciderUnknown,
    /// What a fork would need cannot be known (409).
    ForkRefused,
    /// The run has finished.
    RunFinished,
    /// The run is still open: only a settled run can be deleted (409).
    RunOpen,
    /// The run is a child of a run that still exists, and goes with it (409).
    KeptWithParent,
    /// The request is malformed or its values out of range.
    InvalidInput,
    /// The agent refused it (409).
    Agent,
    /// The run's agent does not take this message or request (409).
    WrongMessage,
    /// The server is stopping.
    ShuttingDown,
    /// The run left memory while the request waited.
    Evicted,
    /// The run's shard has no live owner yet (503, with `Retry-After`).
    NoOwner,
    /// The run's owner did not answer the node that passed the request on in time (503,
    /// with `Retry-After`: send it again).
    OwnerUnreachable,
    /// The server's disk is below its reserve (507).
    StorageFull,
    /// The server's store failed (503).
    StoreFailed,
    /// No such endpoint, or nothing at that path.
    NotFound,
    /// No valid token was presented (401).
    Unauthorized,
    /// The token's role may not do this (403).
    Forbidden,
    /// A token of that name exists.
    NameTaken,
    /// The last admin token cannot be revoked (409).
    LastAdmin,
    /// The request is malformed.
    BadRequest,
    /// The `Host` header names no allowed host.
    HostNotAllowed,
    /// A browser request from an origin not allowed.
    OriginNotAllowed,
    /// A body that is not JSON where JSON is required.
    UnsupportedMediaType,
    /// The body is over the server's limit.
    PayloadTooLarge,
    /// The URI is over the server's limit.
    UriTooLong,
    /// The headers are over the server's limit.
    HeadersTooLarge,
    /// The request's body did not arrive in time (408).
    RequestTimeout,
    /// The server holds as many connections as it takes (503, with `Retry-After`).
    Busy,
    /// That method is not served at that path.
    MethodNotAllowed,
    /// The server's own failure.
    Internal,
    /// A kind this client does not know.
    Other(String),
}

impl ApiErrorKind {
    /// The kind named `name` on the wire.
    pub fn parse(name: &str) -> Self {
        use ApiErrorKind::*;
        match name {
            "UnknownRun" => UnknownRun,
            "NotOwner" => NotOwner,
            "UnknownKind" => UnknownKind,
            "KeyConflict" => KeyConflict,
            "StaleApproval" => StaleApproval,
            "NotPending" => NotPending,
            "AlreadyDecided" => AlreadyDecided,
            "AlreadyVoted" => AlreadyVoted,
            "NotAReviewer" => NotAReviewer,
            "DeciderUnknown" => DeciderUnknown,
            "ForkRefused" => ForkRefused,
            "RunFinished" => RunFinished,
            "RunOpen" => RunOpen,
            "KeptWithParent" => KeptWithParent,
            "InvalidInput" => InvalidInput,
            "Agent" => Agent,
            "WrongMessage" => WrongMessage,
            "ShuttingDown" => ShuttingDown,
            "Evicted" => Evicted,
            "NoOwner" => NoOwner,
            "OwnerUnreachable" => OwnerUnreachable,
            "StorageFull" => StorageFull,
            "StoreFailed" => StoreFailed,
            "NotFound" => NotFound,
            "Unauthorized" => Unauthorized,
            "Forbidden" => Forbidden,
            "NameTaken" => NameTaken,
            "LastAdmin" => LastAdmin,
            "BadRequest" => BadRequest,
            "HostNotAllowed" => HostNotAllowed,
            "OriginNotAllowed" => OriginNotAllowed,
            "UnsupportedMediaType" => UnsupportedMediaType,
            "PayloadTooLarge" => PayloadTooLarge,
            "UriTooLong" => UriTooLong,
            "HeadersTooLarge" => HeadersTooLarge,
            "RequestTimeout" => RequestTimeout,
            "Busy" => Busy,
            "MethodNotAllowed" => MethodNotAllowed,
            "Internal" => Internal,
            other => Other(other.to_string()),
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not a server's URL.
    #[error("{0:?} is not a server address (http://host:port or host:port)")]
    BadAddress(String),
    /// No answer: the server is down, or the network is.
    #[error("server unreachable at {base}: {source}")]
    Unreachable {
        /// The server.
        base: String,
        /// What the HTTP stack said.
        source: reqwest::Error,
    },
    /// The server refused or failed, saying why.
    #[error("{message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The error's kind.
        kind: ApiErrorKind,
        /// The server's message.
        message: String,
        /// When the server said to try again.
        retry_after: Option<Duration>,
    },
    /// The answer is not what this API answers.
    #[error("the server's answer does not read as expected: {0}")]
    Decode(String),
    /// A value to send could not be made JSON.
    #[error("cannot send this value as JSON: {0}")]
    Encode(String),
    /// A wait ran out of time.
    #[error("run {run_id} did not finish within {waited:?}")]
    Timeout {
        /// The run.
        run_id: String,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The run finished without an output: failed, cancelled or escalated.
    #[error("run {run_id} ended {state}: {detail}")]
    NoOutput {
        /// The run.
        run_id: String,
        /// `failed`, `cancelled` or `escalated`.
        state: String,
        /// Why.
        detail: String,
    },
}

impl ClientError {
    /// The API error's kind, when the server answered with one.
    pub fn kind(&self) -> Option<&ApiErrorKind> {
        match self {
            ClientError::Api { kind, .. } => Some(kind),
            _ => None,
        }
    }
}
