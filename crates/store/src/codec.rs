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

/// Why a record body did not encode or decode.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The value does not encode (a map with keys bincode cannot write, say).
    #[error(transparent)]
    Encode(#[from] bincode::error::EncodeError),
    /// The bytes are not a value of the type asked for.
    #[error(transparent)]
    Decode(#[from] bincode::error::DecodeError),
    /// A value, then bytes that belong to none: a record is exactly one value.
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

/// Encodes a value with the store's bincode configuration.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    encode_onto(value, &mut out)?;
    Ok(out)
}

/// Encodes a value at the end of `out`.
pub fn encode_onto<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
    bincode::serde::encode_into_std_write(value, out, config()).map(drop).map_err(CodecError::from)
}

/// Decodes a value; trailing bytes are an error, because a record is exactly one value.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, used) = bincode::serde::decode_from_slice(bytes, config())?;
    if used != bytes.len() {
        return Err(CodecError::Trailing(bytes.len() - used));
    }
    Ok(value)
}
