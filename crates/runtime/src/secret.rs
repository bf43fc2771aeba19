//! Secrets are never written into a stash, a ledger or a log: a [`Secret`] serializes as a
//! pointer (a name), and its value is resolved from the runtime's [`Secrets`] only at use —
//! for a request, only to a destination the secret is bound to ([`Secrets::resolve_for`]).
//! Every configured value is also redacted from what the runtime stores and shows.

use std::{collections::HashMap, fmt, sync::Arc};

use serde::{Deserialize, Serialize};

/// A pointer to a secret value. Serializes as `{"secret": "<name>"}`, never the value.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
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

/// A destination a secret cannot be bound to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadDestination {
    /// Its scheme is not `http` or `https`.
    #[error("destination {text:?}: scheme {scheme:?} is not http or https")]
    Scheme {
        /// The destination as given.
        text: String,
        /// Its scheme.
        scheme: String,
    },
    /// Its port is not a number from 0 to 65535.
    #[error("destination {text:?}: bad port {port:?}")]
    Port {
        /// The destination as given.
        text: String,
        /// Its port.
        port: String,
    },
    /// It names no host.
    #[error("destination {text:?}: no host")]
    NoHost {
        /// The destination as given.
        text: String,
    },
}

/// Where a secret may be sent: a scheme, a host and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// `https` or `http`; `None` for either.
    scheme: Option<String>,
    host: String,
    port: u16,
}

impl Destination {
    /// Parses `https://host[:port]`, `http://host[:port]`, `host:port` (either scheme, that
    /// port) or `host` (https on 443).
    pub fn parse(text: &str) -> Result<Destination, BadDestination> {
        let text = text.trim().to_ascii_lowercase();
        let (scheme, rest) = match text.split_once("://") {
            Some((s @ ("http" | "https"), rest)) => (Some(s.to_string()), rest.to_string()),
            Some((s, _)) => return Err(BadDestination::Scheme { text: text.clone(), scheme: s.to_string() }),
            None => (None, text.clone()),
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(']') || rest.starts_with('[') => {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| BadDestination::Port { text: text.clone(), port: port.to_string() })?;
                (host.to_string(), port)
            }
            _ => (rest.to_string(), if scheme.as_deref() == Some("http") { 80 } else { 443 }),
        };
        if host.is_empty() || host.contains('/') {
            return Err(BadDestination::NoHost { text });
        }
        let scheme = scheme.or_else(|| (!rest.contains(':')).then(|| "https".to_string()));
        Ok(Destination { scheme, host, port })
    }

    fn allows(&self, url: &url::Url) -> bool {
        let scheme_ok = self.scheme.as_deref().is_none_or(|s| s == url.scheme());
        let host = url.host_str().unwrap_or("").to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        scheme_ok
            && host == self.host.trim_start_matches('[').trim_end_matches(']')
            && url.port_or_known_default() == Some(self.port)
    }
}

#[derive(Clone)]
struct Entry {
    value: String,
    destinations: Vec<Destination>,
}

/// Why a secret was not handed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRefusal {
    /// No secret of that name is configured.
    Unknown,
    /// The URL is not one the secret is bound to (or not a URL).
    Destination(String),
}

/// Where secret values live: given to the runtime, never persisted.
#[derive(Clone, Default)]
pub struct Secrets {
    values: Arc<HashMap<String, Entry>>,
}

impl Secrets {
    /// Secrets from a map of name to value, bound to no destination: `resolve` hands them
    /// out, `resolve_for` never.
    pub fn from_map(values: HashMap<String, String>) -> Self {
        let values =
            values.into_iter().map(|(k, value)| (k, Entry { value, destinations: Vec::new() })).collect();
        Secrets { values: Arc::new(values) }
    }

    /// Binds the secret `name` to the destinations it may be sent to.
    pub fn bind(
        mut self,
        name: &str,
        value: impl Into<String>,
        destinations: &[&str],
    ) -> Result<Self, BadDestination> {
        let destinations =
            destinations.iter().map(|d| Destination::parse(d)).collect::<Result<Vec<_>, _>>()?;
        Arc::make_mut(&mut self.values).insert(name.to_string(), Entry { value: value.into(), destinations });
        Ok(self)
    }

    /// Every `DURAFIBER_SECRET_<NAME>` of the environment (the name lower-cased), bound to
    /// the comma-separated destinations of `DURAFIBER_SECRET_<NAME>_HOSTS`.
    pub fn from_env() -> Result<Self, BadDestination> {
        let vars: HashMap<String, String> = std::env::vars().collect();
        let mut secrets = Secrets::default();
        for (key, value) in &vars {
            let Some(name) = key.strip_prefix("DURAFIBER_SECRET_") else { continue };
            if name.ends_with("_HOSTS") || name.is_empty() {
                continue;
            }
            let hosts = vars.get(&format!("{key}_HOSTS")).map(String::as_str).unwrap_or("");
            let hosts: Vec<&str> = hosts.split(',').map(str::trim).filter(|h| !h.is_empty()).collect();
            secrets = secrets.bind(&name.to_ascii_lowercase(), value.clone(), &hosts)?;
        }
        Ok(secrets)
    }

    /// The value of `secret`: from the configured ones, else the environment variable
    /// `DURAFIBER_SECRET_<NAME>` (upper case). For a value used inside the process (a
    /// signature, say); one sent anywhere goes through [`Secrets::resolve_for`].
    pub fn resolve(&self, secret: &Secret) -> Option<String> {
        self.values
            .get(&secret.secret)
            .map(|e| e.value.clone())
            .or_else(|| std::env::var(format!("DURAFIBER_SECRET_{}", secret.secret.to_uppercase())).ok())
    }

    /// The value of `secret`, to be sent to `url`: only when `url` is one of the secret's
    /// destinations (scheme, host and port).
    pub fn resolve_for(&self, secret: &Secret, url: &str) -> Result<String, SecretRefusal> {
        let entry = self.values.get(&secret.secret).ok_or(SecretRefusal::Unknown)?;
        let parsed = url::Url::parse(url).map_err(|_| SecretRefusal::Destination(url.to_string()))?;
        if entry.destinations.iter().any(|d| d.allows(&parsed)) {
            Ok(entry.value.clone())
        } else {
            Err(SecretRefusal::Destination(format!(
                "{}://{}:{}",
                parsed.scheme(),
                parsed.host_str().unwrap_or(""),
                parsed.port_or_known_default().unwrap_or(0)
            )))
        }
    }

    /// Replaces every secret value found in `text` with `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for e in self.values.values().filter(|e| e.value.len() >= 4) {
            if out.contains(e.value.as_str()) {
                out = out.replace(e.value.as_str(), "[redacted]");
            }
        }
        out
    }

    /// Whether any secret is configured (redaction has work to do).
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.values.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> Secrets {
        Secrets::default()
            .bind("stripe_key", "sk_live_123456", &["api.stripe.com", "127.0.0.1:9000"])
            .expect("bind")
    }

    #[test]
    fn a_secret_goes_only_to_its_destinations() {
        let (s, key) = (secrets(), Secret::named("stripe_key"));
        assert_eq!(s.resolve_for(&key, "https://api.stripe.com/v1/refunds").as_deref(), Ok("sk_live_123456"));
        assert!(s.resolve_for(&key, "http://127.0.0.1:9000/refunds").is_ok());
        assert!(s.resolve_for(&key, "https://127.0.0.1:9000/").is_ok(), "host:port allows either scheme");
        for url in [
            "http://api.stripe.com/",
            "https://api.stripe.com:8443/",
            "http://127.0.0.1:9001/",
            "https://evil.example/",
            "not a url",
        ] {
            assert!(matches!(s.resolve_for(&key, url), Err(SecretRefusal::Destination(_))), "{url}");
        }
        assert_eq!(
            s.resolve_for(&Secret::named("nope"), "https://api.stripe.com/"),
            Err(SecretRefusal::Unknown)
        );
        let unbound = Secrets::from_map([("k".to_string(), "value1".to_string())].into());
        assert!(unbound.resolve_for(&Secret::named("k"), "https://api.stripe.com/").is_err());
    }

    #[test]
    fn values_are_redacted_and_bad_destinations_refused() {
        assert_eq!(secrets().redact("Bearer sk_live_123456!"), "Bearer [redacted]!");
        assert!(Destination::parse("ftp://x").is_err() && Destination::parse("x:notaport").is_err());
        assert!(Destination::parse("").is_err());
    }
}
