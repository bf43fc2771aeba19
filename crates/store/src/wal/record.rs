//! One record of the write-ahead log: its checksum, and its payload's encoding.

use crate::batch::Op;

use super::{DELETE, PUT};

pub(super) fn checksum(generation: u64, lsn: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&generation.to_le_bytes());
    h.update(&lsn.to_le_bytes());
    h.update(payload);
    h.finalize()
}

pub(super) fn encode_payload(ops: &[Op], out: &mut Vec<u8>) {
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        match op {
            Op::Put { key, value } => {
                out.push(PUT);
                out.extend_from_slice(&(key.len() as u32).to_le_bytes());
                out.extend_from_slice(key);
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            Op::Delete { key } => {
                out.push(DELETE);
                out.extend_from_slice(&(key.len() as u32).to_le_bytes());
                out.extend_from_slice(key);
            }
        }
    }
}

/// Reads a little-endian integer of `N` bytes at `*at`, moving past it.
fn take<const N: usize>(bytes: &[u8], at: &mut usize) -> Option<[u8; N]> {
    let end = at.checked_add(N)?;
    let out = bytes.get(*at..end)?.try_into().ok()?;
    *at = end;
    Some(out)
}

fn take_bytes(bytes: &[u8], at: &mut usize) -> Option<Vec<u8>> {
    let len = u32::from_le_bytes(take::<4>(bytes, at)?) as usize;
    let end = at.checked_add(len)?;
    let out = bytes.get(*at..end)?.to_vec();
    *at = end;
    Some(out)
}

pub(super) fn decode_payload(payload: &[u8]) -> Option<Vec<Op>> {
    let mut at = 0;
    let count = u32::from_le_bytes(take::<4>(payload, &mut at)?);
    let mut ops = Vec::with_capacity((count as usize).min(payload.len()));
    for _ in 0..count {
        let [tag] = take::<1>(payload, &mut at)?;
        let key = take_bytes(payload, &mut at)?;
        ops.push(match tag {
            PUT => Op::Put { key, value: take_bytes(payload, &mut at)? },
            DELETE => Op::Delete { key },
            _ => return None,
        });
    }
    (at == payload.len()).then_some(ops)
}
