//! The ids records are keyed by, as types: a run's id is a [`RunId`], never a bare string.

use std::{fmt, ops::Deref};

use serde::{Deserialize, Serialize};

/// A run's id: the handle `start` mints once and every later call names the run by.
///
/// It dereferences to `&str`, so it passes wherever a run id is asked for.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(value_type = String))]
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(String);

impl RunId {
    /// Wraps an id read from elsewhere (a URL, a list). It is checked when used.
    pub fn new(id: impl Into<String>) -> Self {
        RunId(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl From<String> for RunId {
    fn from(id: String) -> Self {
        RunId(id)
    }
}

impl From<&str> for RunId {
    fn from(id: &str) -> Self {
        RunId(id.to_string())
    }
}

impl From<&RunId> for RunId {
    fn from(id: &RunId) -> Self {
        id.clone()
    }
}

/// Any text parses: an id that names no run is refused where it is used, as unknown.
impl std::str::FromStr for RunId {
    type Err = std::convert::Infallible;

    fn from_str(id: &str) -> Result<Self, Self::Err> {
        Ok(RunId::from(id))
    }
}

impl Deref for RunId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for RunId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> String {
        id.0
    }
}

impl PartialEq<str> for RunId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for RunId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for RunId {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<RunId> for String {
    fn eq(&self, other: &RunId) -> bool {
        *self == other.0
    }
}

impl PartialEq<RunId> for str {
    fn eq(&self, other: &RunId) -> bool {
        self == other.0
    }
}

impl PartialEq<RunId> for &str {
    fn eq(&self, other: &RunId) -> bool {
        *self == other.0
    }
}
