//! Canonical JSON and its SHA-256: how user values (inputs, stashes, args, payloads,
//! receipts) are stored and hashed. Object keys are sorted, so equal values hash equally.

use serde::{Serialize, de::DeserializeOwned};
use sha2::{Digest, Sha256};

/// The canonical JSON text of `value`: object keys sorted, no whitespace.
pub fn canonical<T: Serialize + ?Sized>(value: &T) -> Result<String, String> {
    let v = serde_json::to_value(value).map_err(|e| e.to_string())?;
    serde_json::to_string(&sorted(v)).map_err(|e| e.to_string())
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
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Canonical JSON of `value` and its hash.
pub fn canonical_with_hash<T: Serialize + ?Sized>(value: &T) -> Result<(String, String), String> {
    let text = canonical(value)?;
    let hash = sha256_hex(text.as_bytes());
    Ok((text, hash))
}

/// Canonical form of JSON text that is already parsed elsewhere (e.g. an HTTP body).
pub fn recanonicalize(text: &str) -> Result<String, String> {
    let v: serde_json::Value = parse(text)?;
    canonical(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_does_not_change_the_hash() {
        let a = recanonicalize(r#"{"b":1,"a":[1,2]}"#).unwrap();
        let b = recanonicalize(r#"{ "a": [1,2], "b": 1 }"#).unwrap();
        assert_eq!(sha256_hex(a.as_bytes()), sha256_hex(b.as_bytes()));
    }
}
