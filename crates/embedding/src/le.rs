//! Little-endian bulk encoding of number slices for snapshots and checkpoint parts.
//!
//! Checkpoints move hundreds of megabytes; encoding value by value runs at a fraction of
//! memory bandwidth. On little-endian machines (every target elastrec runs on) the
//! in-memory bytes already are the encoding, so a slice is copied whole; other targets
//! take the value-by-value path and produce the same bytes.

/// Appends `values` as little-endian `f32`s.
pub fn put_f32s(out: &mut Vec<u8>, values: &[f32]) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(values));
    } else {
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Appends `values` as little-endian `u64`s.
pub fn put_u64s(out: &mut Vec<u8>, values: &[u64]) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(values));
    } else {
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Decodes little-endian `f32`s (`bytes.len()` must be a multiple of 4; a shorter tail is
/// ignored).
pub fn get_f32s(bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / 4;
    if cfg!(target_endian = "little") {
        let mut out = vec![0f32; n];
        bytemuck::cast_slice_mut::<f32, u8>(&mut out).copy_from_slice(&bytes[..n * 4]);
        out
    } else {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    }
}

/// Decodes little-endian `u64`s (see [`get_f32s`]).
pub fn get_u64s(bytes: &[u8]) -> Vec<u64> {
    let n = bytes.len() / 8;
    if cfg!(target_endian = "little") {
        let mut out = vec![0u64; n];
        bytemuck::cast_slice_mut::<u64, u8>(&mut out).copy_from_slice(&bytes[..n * 8]);
        out
    } else {
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_encoding_is_the_little_endian_layout() {
        let f = [1.5f32, -0.0, f32::MAX, 3.25e-7];
        let u = [0u64, 1, u64::MAX, 0x0102_0304_0506_0708];
        let mut out = Vec::new();
        put_f32s(&mut out, &f);
        put_u64s(&mut out, &u);
        let want: Vec<u8> = f
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .chain(u.iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        assert_eq!(out, want);
        assert_eq!(get_f32s(&out[..16]), f);
        assert_eq!(get_u64s(&out[16..]), u);
    }
}
