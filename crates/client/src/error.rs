//! What a call of the client can meet: the server unreachable, or a refusal typed by the
//! API's `kind`.

use std::time::Duration;

use durafiber_api::ApiErrorKind;

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
