//! Canonical JSON and its hashes: how user values (inputs, stashes, args, payloads,
//! receipts) are stored and hashed. Stored text keeps every number exactly, object keys
//! sorted; hashes are RFC 8785 (JCS) SHA-256 with their format version in the text (see
//! [`payload_hash`]), so equal values hash equally and any JCS library agrees.

use serde::{Serialize, de::DeserializeOwned};
use sha2::{Digest, Sha256};

/// A value that is not JSON durafiber can store, or text that is not the JSON asked for.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct JsonError(#[from] serde_json::Error);

/// The refusal as the text an error message carries.
impl From<JsonError> for String {
    fn from(e: JsonError) -> String {
        e.to_string()
    }
}

/// The canonical JSON text of `value`: object keys sorted, no whitespace.
pub fn canonical<T: Serialize + ?Sized>(value: &T) -> Result<String, JsonError> {
    let v = serde_json::to_value(value).map_err(JsonError::from)?;
    serde_json::to_string(&sorted(v)).map_err(JsonError::from)
}

/// Rebuilds every object with its keys inserted in sorted order, so the text is canonical
/// whether or not serde_json's map preserves insertion order (its `preserve_order` feature
/// can be switched on by any crate in the build).
fn sorted(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// Parses stored JSON into a user type.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, JsonError> {
    serde_json::from_str(text).map_err(JsonError::from)
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// `bytes` as lower-case hex digits. Hashes are taken on every alarm delivery: a `format!`
/// per byte was a tenth of a delivery's CPU.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

/// The prefix of a version 2 hash: SHA-256 over the RFC 8785 (JCS) text of the value.
pub const HASH_V2_PREFIX: &str = "jcs-sha256:";

/// The hash of a value as durafiber stores it beside payloads, inputs, effect arguments and
/// receipts. The format version travels in the text, so hashes stored by older builds keep
/// their meaning:
/// - version 2, `jcs-sha256:<hex>`: SHA-256 over the value's RFC 8785 canonical JSON, which
///   any JCS library reproduces (a reviewer's client can check what it was shown);
/// - version 1, bare `<hex>`: SHA-256 over durafiber's own canonical text (keys sorted by
///   bytes). Written by builds before version 2, and still for a value RFC 8785 cannot
///   represent exactly — an integer beyond ±2^53, which JCS would round to a double.
pub fn payload_hash<T: Serialize + ?Sized>(value: &T) -> Result<String, JsonError> {
    let v = serde_json::to_value(value).map_err(JsonError::from)?;
    hash_value(&v)
}

fn hash_value(v: &serde_json::Value) -> Result<String, JsonError> {
    if exact_in_jcs(v) {
        let text = serde_jcs::to_string(v).map_err(JsonError::from)?;
        Ok(format!("{HASH_V2_PREFIX}{}", sha256_hex(text.as_bytes())))
    } else {
        hash_v1(v)
    }
}

fn hash_v1(v: &serde_json::Value) -> Result<String, JsonError> {
    let text = serde_json::to_string(&sorted(v.clone())).map_err(JsonError::from)?;
    Ok(sha256_hex(text.as_bytes()))
}

/// Whether `stored` (a hash of either version) is the hash of `value`, recomputed in the
/// version `stored` was made with.
pub fn hash_matches<T: Serialize + ?Sized>(stored: &str, value: &T) -> Result<bool, JsonError> {
    let v = serde_json::to_value(value).map_err(JsonError::from)?;
    let again = if stored.starts_with(HASH_V2_PREFIX) { hash_value(&v)? } else { hash_v1(&v)? };
    Ok(again == stored)
}

/// Whether every number in `v` survives RFC 8785's IEEE 754 doubles unchanged.
fn exact_in_jcs(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    const EXACT: u64 = 1 << 53;
    match v {
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u <= EXACT,
            (None, Some(i)) => i.unsigned_abs() <= EXACT,
            (None, None) => true,
        },
        Value::Array(items) => items.iter().all(exact_in_jcs),
        Value::Object(map) => map.values().all(exact_in_jcs),
        _ => true,
    }
}

/// Canonical JSON of `value` and its hash ([`payload_hash`]).
pub fn canonical_with_hash<T: Serialize + ?Sized>(value: &T) -> Result<(String, String), JsonError> {
    let v = serde_json::to_value(value).map_err(JsonError::from)?;
    let hash = hash_value(&v)?;
    let text = serde_json::to_string(&sorted(v)).map_err(JsonError::from)?;
    Ok((text, hash))
}

/// Canonical form of JSON text that is already parsed elsewhere (e.g. an HTTP body).
pub fn recanonicalize(text: &str) -> Result<String, JsonError> {
    let v: serde_json::Value = parse(text)?;
    canonical(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_lower_case_hex_of_the_digest() {
        // FIPS 180-2's example for "abc".
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_hex(b"abc"), want);
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }

    fn value(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn key_order_does_not_change_the_hash() {
        let a = recanonicalize(r#"{"b":1,"a":[1,2]}"#).unwrap();
        let b = recanonicalize(r#"{ "a": [1,2], "b": 1 }"#).unwrap();
        assert_eq!(a, b);
        assert_eq!(payload_hash(&value(&a)).unwrap(), payload_hash(&value(&b)).unwrap());
    }

    #[test]
    fn version_2_hashes_the_rfc_8785_text() {
        // RFC 8785 §3.2.2/§3.2.3: keys by UTF-16 code units, numbers as ECMAScript prints them.
        // U+FF5E sorts after U+1F600 in UTF-16 (0xFF5E > 0xD83D), before it in UTF-8 bytes.
        let v = value(r#"{"b":1.0,"a":1e21,"\uff5e":"x","\ud83d\ude00":"y"}"#);
        let jcs = "{\"a\":1e+21,\"b\":1,\"\u{1f600}\":\"y\",\"\u{ff5e}\":\"x\"}";
        assert_eq!(payload_hash(&v).unwrap(), format!("{HASH_V2_PREFIX}{}", sha256_hex(jcs.as_bytes())));
    }

    #[test]
    fn an_integer_jcs_would_round_keeps_an_exact_version_1_hash() {
        let a = value(r#"{"n":9007199254740993}"#);
        let b = value(r#"{"n":9007199254740992}"#);
        let (ha, hb) = (payload_hash(&a).unwrap(), payload_hash(&b).unwrap());
        assert!(!ha.starts_with(HASH_V2_PREFIX) && hb.starts_with(HASH_V2_PREFIX));
        assert_ne!(ha, hb);
        assert!(hash_matches(&ha, &a).unwrap() && !hash_matches(&ha, &b).unwrap());
    }

    #[test]
    fn a_hash_stored_by_an_older_build_still_matches() {
        let v = value(r#"{"z":[1,2.5],"a":"é"}"#);
        let old = sha256_hex(canonical(&v).unwrap().as_bytes());
        assert!(hash_matches(&old, &v).unwrap());
        assert!(!hash_matches(&old, &value(r#"{"z":[1,2.5],"a":"e"}"#)).unwrap());
        assert!(hash_matches(&payload_hash(&v).unwrap(), &v).unwrap());
    }
}
