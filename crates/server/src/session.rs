//! The console's sign-in: a browser presents a token once and gets a session cookie
//! (`HttpOnly`, `SameSite=Strict`, `Secure` over TLS) and a CSRF token every form carries.
//!
//! Sessions live in the server's memory: a restart signs every browser out, which loses no
//! run state. A session stands for its token: each request checks that the token still
//! exists with the same hash, so revoking it ends its sessions at once. The session id is
//! 256 random bits; the server keeps only its SHA-256.

use durafiber_api::Timestamp;
use std::collections::HashMap;

use axum::http::{HeaderMap, HeaderValue, header};
use durafiber_runtime::{limits, sha256_hex};
use durafiber_store::Store;
use parking_lot::Mutex;
use subtle::ConstantTimeEq;

use crate::auth::{self, AccessError, Caller};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "durafiber_session";
/// The sign-in form's CSRF cookie (double submit: the form carries the same value).
pub const SIGN_IN_COOKIE: &str = "durafiber_sign_in";

/// One signed-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    /// Whose token signed in.
    pub caller: Caller,
    /// What every form of this session must carry.
    pub csrf: String,
    token_hash: String,
    expires_at: Timestamp,
}

/// Every signed-in browser, by the hash of its session id.
pub struct Sessions {
    by_id_hash: Mutex<HashMap<String, Session>>,
    /// Whether cookies are marked `Secure` (the server speaks TLS).
    secure: bool,
}

impl Sessions {
    /// No session yet; `secure` when the server speaks TLS.
    pub fn new(secure: bool) -> Self {
        Sessions { by_id_hash: Mutex::new(HashMap::new()), secure }
    }

    /// Signs in with `token`: the new session's cookie value and the session, or `None`
    /// when the token is not valid.
    pub fn sign_in(
        &self,
        store: &Store,
        token: &str,
        now: Timestamp,
    ) -> Result<Option<(String, Session)>, AccessError> {
        let Some(caller) = auth::verify(store, token)? else {
            return Ok(None);
        };
        let id = auth::random_hex()?;
        let session = Session {
            caller,
            csrf: auth::random_hex()?,
            token_hash: sha256_hex(token.as_bytes()),
            expires_at: now.saturating_add(limits::CONSOLE_SESSION_TTL),
        };
        let mut sessions = self.by_id_hash.lock();
        sessions.retain(|_, s| s.expires_at > now);
        if sessions.len() >= limits::CONSOLE_SESSIONS_MAX
            && let Some(oldest) = sessions.iter().min_by_key(|(_, s)| s.expires_at).map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(sha256_hex(id.as_bytes()), session.clone());
        tracing::info!(actor = %session.caller.name, "console sign-in");
        Ok(Some((id, session)))
    }

    /// The session the request's cookie names, if it is current and its token still valid.
    pub fn current(
        &self,
        store: &Store,
        headers: &HeaderMap,
        now: Timestamp,
    ) -> Result<Option<Session>, AccessError> {
        let Some(id) = cookie(headers, SESSION_COOKIE) else {
            return Ok(None);
        };
        let key = sha256_hex(id.as_bytes());
        let Some(session) = self.by_id_hash.lock().get(&key).cloned() else {
            return Ok(None);
        };
        if session.expires_at <= now {
            self.by_id_hash.lock().remove(&key);
            return Ok(None);
        }
        match auth::still_valid(store, &session.caller.name, &session.token_hash)? {
            // The role is read again too: it is the token's, now.
            Some(caller) => Ok(Some(Session { caller, ..session })),
            None => {
                self.by_id_hash.lock().remove(&key);
                Ok(None)
            }
        }
    }

    /// Ends the request's session, if any.
    pub fn sign_out(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, SESSION_COOKIE)
            && let Some(session) = self.by_id_hash.lock().remove(&sha256_hex(id.as_bytes()))
        {
            tracing::info!(actor = %session.caller.name, "console sign-out");
        }
    }

    /// A `Set-Cookie` value for `name=value` (empty and expired: cleared).
    pub fn set_cookie(&self, name: &str, value: &str) -> HeaderValue {
        let lifetime = if value.is_empty() {
            "Max-Age=0".to_string()
        } else {
            format!("Max-Age={}", limits::CONSOLE_SESSION_TTL.as_secs())
        };
        let secure = if self.secure { "; Secure" } else { "" };
        let text = format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict; {lifetime}{secure}");
        // Names are constants and values hex: always a valid header value.
        HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("invalid=; Max-Age=0"))
    }
}

/// Whether a form's CSRF field matches what was expected, compared in constant time.
pub fn csrf_matches(expected: &str, presented: Option<&str>) -> bool {
    presented.is_some_and(|p| bool::from(p.as_bytes().ct_eq(expected.as_bytes())))
}

/// The value of cookie `name` in the request, if present.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_among_others_and_csrf_must_match_exactly() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_static("a=1; durafiber_session=abc; b=2"));
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "missing"), None);
        assert!(csrf_matches("abc", Some("abc")));
        assert!(
            !csrf_matches("abc", Some("abd")) && !csrf_matches("abc", None) && !csrf_matches("abc", Some(""))
        );
    }

    #[test]
    fn cookies_are_http_only_same_site_strict_and_secure_over_tls() {
        let plain = Sessions::new(false).set_cookie(SESSION_COOKIE, "x");
        let plain = plain.to_str().unwrap_or_default();
        assert!(plain.contains("HttpOnly") && plain.contains("SameSite=Strict") && !plain.contains("Secure"));
        let tls = Sessions::new(true).set_cookie(SESSION_COOKIE, "x");
        assert!(tls.to_str().unwrap_or_default().ends_with("; Secure"));
        let cleared = Sessions::new(false).set_cookie(SESSION_COOKIE, "");
        assert!(cleared.to_str().unwrap_or_default().contains("Max-Age=0"));
    }
}
