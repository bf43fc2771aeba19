//! Secrets are never written into a stash, a ledger or a log: a [`Secret`] serializes as a
//! pointer (a name), and its value is resolved from the runtime's [`Secrets`] only at use.

use std::{collections::HashMap, fmt, sync::Arc};

use serde::{Deserialize, Serialize};

/// A pointer to a secret value. Serializes as `{"secret": "<name>"}`, never the value.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret {
    /// The name the value is resolved by.
    pub secret: String,
}

impl Secret {
    /// A pointer to the secret called `name`.
    pub fn named(name: impl Into<String>) -> Self {
        Secret { secret: name.into() }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({}: [redacted])", self.secret)
    }
}

/// Where secret values live: given to the runtime, never persisted.
#[derive(Clone, Default)]
pub struct Secrets {
    values: Arc<HashMap<String, String>>,
}

impl Secrets {
    /// Secrets from a map of name to value.
    pub fn from_map(values: HashMap<String, String>) -> Self {
        Secrets { values: Arc::new(values) }
    }

    /// The value of `secret`: from the map, else the environment variable
    /// `DURAFIBER_SECRET_<NAME>` (upper case).
    pub fn resolve(&self, secret: &Secret) -> Option<String> {
        self.values
            .get(&secret.secret)
            .cloned()
            .or_else(|| std::env::var(format!("DURAFIBER_SECRET_{}", secret.secret.to_uppercase())).ok())
    }

    /// Replaces every secret value found in `text` with `[redacted]`, for inspection output.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for v in self.values.values().filter(|v| v.len() >= 4) {
            out = out.replace(v.as_str(), "[redacted]");
        }
        out
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.values.keys()).finish()
    }
}
