//! The `kind` of an API error (`{"error": "...", "kind": "..."}`): what a client branches on.

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

    /// The kind's name on the wire.
    pub fn name(&self) -> &str {
        use ApiErrorKind::*;
        match self {
            UnknownRun => "UnknownRun",
            NotOwner => "NotOwner",
            UnknownKind => "UnknownKind",
            KeyConflict => "KeyConflict",
            StaleApproval => "StaleApproval",
            NotPending => "NotPending",
            AlreadyDecided => "AlreadyDecided",
            AlreadyVoted => "AlreadyVoted",
            NotAReviewer => "NotAReviewer",
            DeciderUnknown => "DeciderUnknown",
            ForkRefused => "ForkRefused",
            RunFinished => "RunFinished",
            RunOpen => "RunOpen",
            KeptWithParent => "KeptWithParent",
            InvalidInput => "InvalidInput",
            Agent => "Agent",
            WrongMessage => "WrongMessage",
            ShuttingDown => "ShuttingDown",
            Evicted => "Evicted",
            NoOwner => "NoOwner",
            OwnerUnreachable => "OwnerUnreachable",
            StorageFull => "StorageFull",
            StoreFailed => "StoreFailed",
            NotFound => "NotFound",
            Unauthorized => "Unauthorized",
            Forbidden => "Forbidden",
            NameTaken => "NameTaken",
            LastAdmin => "LastAdmin",
            BadRequest => "BadRequest",
            HostNotAllowed => "HostNotAllowed",
            OriginNotAllowed => "OriginNotAllowed",
            UnsupportedMediaType => "UnsupportedMediaType",
            PayloadTooLarge => "PayloadTooLarge",
            UriTooLong => "UriTooLong",
            HeadersTooLarge => "HeadersTooLarge",
            RequestTimeout => "RequestTimeout",
            Busy => "Busy",
            MethodNotAllowed => "MethodNotAllowed",
            Internal => "Internal",
            Other(name) => name,
        }
    }
}

impl std::fmt::Display for ApiErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Written as its name, as the `kind` of an error body.
impl serde::Serialize for ApiErrorKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// Any name reads: one this crate does not know is [`ApiErrorKind::Other`].
impl<'de> serde::Deserialize<'de> for ApiErrorKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Ok(ApiErrorKind::parse(&name))
    }
}

#[cfg(test)]
mod tests {
    use super::ApiErrorKind;

    #[test]
    fn every_kind_parses_back_from_its_name() {
        for name in ["UnknownRun", "KeyConflict", "StaleApproval", "Busy", "Internal", "SomethingNew"] {
            assert_eq!(ApiErrorKind::parse(name).name(), name);
        }
        assert_eq!(ApiErrorKind::parse("SomethingNew"), ApiErrorKind::Other("SomethingNew".into()));
        let body = serde_json::json!({"kind": ApiErrorKind::StaleApproval});
        assert_eq!(body.to_string(), r#"{"kind":"StaleApproval"}"#);
        let read: ApiErrorKind =
            serde_json::from_value(body["kind"].clone()).unwrap_or(ApiErrorKind::Internal);
        assert_eq!(read, ApiErrorKind::StaleApproval);
    }
}
