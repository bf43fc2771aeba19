//! The one bincode configuration. Every record body goes through here, so that changing the
//! encoding is a format-version bump in one place.

use serde::{Serialize, de::DeserializeOwned};

fn config() -> impl bincode::config::Config {
    // Fixed-width little-endian integers: a record's size does not depend on its values, and
    // a limit on the decoder stops a corrupt length prefix from allocating the world.
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<{ 64 * 1024 * 1024 }>()
}

/// Encodes a value with the store's bincode configuration.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    encode_onto(value, &mut out)?;
    Ok(out)
}

/// Encodes a value at the end of `out`.
pub fn encode_onto<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), String> {
    bincode::serde::encode_into_std_write(value, out, config()).map(drop).map_err(|e| e.to_string())
}

/// Decodes a value; trailing bytes are an error, because a record is exactly one value.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let (value, used) = bincode::serde::decode_from_slice(bytes, config()).map_err(|e| e.to_string())?;
    if used != bytes.len() {
        return Err(format!("{} trailing bytes", bytes.len() - used));
    }
    Ok(value)
}
