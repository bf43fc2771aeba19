//! The versioned, checksummed envelope around every stored record.
//!
//! Layout (little endian):
//! ```text
//! magic "DF" (2) | format version u16 (2) | crc32 u32 (4) | body ...
//! ```
//! The checksum covers the record's key, the version and the body, so a record copied under
//! another key is caught as well as a flipped bit.

use crate::error::StoreError;

/// The format version this build writes. Bump it when a record type changes shape.
pub const FORMAT_VERSION: u16 = 1;
const MAGIC: [u8; 2] = *b"DF";
/// Bytes before the body.
pub const HEADER_LEN: usize = 8;

fn checksum(key: &[u8], version: u16, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&(key.len() as u64).to_le_bytes());
    h.update(key);
    h.update(&version.to_le_bytes());
    h.update(body);
    h.finalize()
}

/// Wraps an encoded body for storage under `key`.
pub fn seal(key: &[u8], body: &[u8]) -> Vec<u8> {
    let Ok(sealed) = seal_encoded::<std::convert::Infallible>(key, |out| {
        out.extend_from_slice(body);
        Ok(())
    });
    sealed
}

/// [`seal`] of the body `encode` writes, encoded in place: one buffer, no copy of the body.
pub fn seal_encoded<E>(key: &[u8], encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>) -> Result<Vec<u8>, E> {
    // Most records are a few hundred bytes: one allocation holds them.
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    encode(&mut out)?;
    let sum = checksum(key, FORMAT_VERSION, &out[HEADER_LEN..]);
    out[4..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// Checks and unwraps a stored value; `table` only names the record in errors.
pub fn open<'a>(table: &'static str, key: &[u8], sealed: &'a [u8]) -> Result<&'a [u8], StoreError> {
    let corrupt = |reason: &str| StoreError::Corrupt {
        table,
        key: crate::error::printable(key),
        reason: reason.to_string(),
    };
    if sealed.len() < HEADER_LEN {
        return Err(corrupt("shorter than the envelope header"));
    }
    if sealed[0..2] != MAGIC {
        return Err(corrupt("bad magic"));
    }
    let version = u16::from_le_bytes([sealed[2], sealed[3]]);
    let stored = u32::from_le_bytes([sealed[4], sealed[5], sealed[6], sealed[7]]);
    let body = &sealed[HEADER_LEN..];
    // A wrong checksum comes first: a flipped version byte is corruption, not a newer format.
    if checksum(key, version, body) != stored {
        return Err(corrupt("checksum mismatch"));
    }
    if version != FORMAT_VERSION {
        return Err(StoreError::UnknownVersion { table, key: crate::error::printable(key), version });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_sealed_body_opens_to_itself(key in proptest::collection::vec(any::<u8>(), 0..64),
                                         body in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let sealed = seal(&key, &body);
            prop_assert_eq!(open("t", &key, &sealed).ok(), Some(&body[..]));
        }

        #[test]
        fn a_body_encoded_in_place_seals_as_a_copied_one(key in proptest::collection::vec(any::<u8>(), 0..64),
                                                         body in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let in_place = seal_encoded::<()>(&key, |out| {
                crate::codec::encode_onto(&body, out).map_err(drop)
            });
            let copied = seal(&key, &crate::codec::encode(&body).expect("encodes"));
            prop_assert_eq!(in_place, Ok(copied));
        }

        #[test]
        fn arbitrary_bytes_are_rejected_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            // Any outcome but a panic is fine; a random buffer passing crc32 is 2^-32 unlikely.
            let _ = open("t", b"k", &bytes);
        }

        #[test]
        fn any_single_flipped_bit_is_caught(body in proptest::collection::vec(any::<u8>(), 1..512), bit in 0usize..4096) {
            let mut sealed = seal(b"key", &body);
            let bit = bit % (sealed.len() * 8);
            sealed[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(open("t", b"key", &sealed).is_err());
        }
    }

    #[test]
    fn a_record_moved_to_another_key_is_corrupt() {
        let sealed = seal(b"a", b"body");
        assert!(matches!(open("t", b"b", &sealed), Err(StoreError::Corrupt { .. })));
    }

    #[test]
    fn a_newer_format_version_is_named_as_such() {
        let body = b"body";
        let mut sealed = seal(b"k", body);
        sealed[2..4].copy_from_slice(&7u16.to_le_bytes());
        let crc = checksum(b"k", 7, body);
        sealed[4..8].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(open("t", b"k", &sealed), Err(StoreError::UnknownVersion { version: 7, .. })));
    }
}
