//! Little-endian bulk encoding of number slices for snapshots and checkpoint parts.
//!
//! Checkpoints move hundreds of megabytes; encoding value by value runs at a fraction of
//! memory bandwidth. On little-endian machines (every target elastrec runs on) the
//! in-memory bytes already are the encoding, so a slice is copied whole; other targets
//! take the value-by-value path and produce the same bytes.
//!
//! [`Reader`] is the one cursor the hand-written binary formats (saved models, checkpoint
//! parts) decode with, so "never read past the end" is checked in one place.

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

/// A read past the end of a [`Reader`]'s bytes; `what` names the field being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    /// The field that did not fit.
    pub what: &'static str,
}

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "truncated {}", self.what)
    }
}

impl std::error::Error for Truncated {}

/// A cursor over little-endian bytes that never reads past the end. Formats decode
/// untrusted bytes (files, storage), so every read is bounds-checked and names its field;
/// callers wrap [`Truncated`] in their own error.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Truncated> {
        if n > self.rest.len() {
            return Err(Truncated { what });
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    /// The next `N` bytes as an array.
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Truncated> {
        Ok(self.take(N, what)?.try_into().expect("took N bytes"))
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, Truncated> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, Truncated> {
        self.array(what).map(u64::from_le_bytes)
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

    #[test]
    fn reader_reads_in_order_and_refuses_to_overrun() {
        let mut bytes = vec![0xAB, 0xCD];
        bytes.extend_from_slice(&7u32.to_le_bytes());
        bytes.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        let mut r = Reader::new(&bytes);
        assert_eq!(r.take(2, "magic"), Ok(&[0xAB, 0xCD][..]));
        assert_eq!(r.u32("version"), Ok(7));
        assert_eq!(r.remaining(), 8);
        assert_eq!(r.u32("a"), Ok(0x0506_0708));
        // A failed read consumes nothing.
        let err = r.u64("length").unwrap_err();
        assert_eq!(err, Truncated { what: "length" });
        assert_eq!(err.to_string(), "truncated length");
        assert_eq!(r.remaining(), 4);
        assert_eq!(r.u32("b"), Ok(0x0102_0304));
        assert!(r.is_empty());
        assert!(r.take(1, "more").is_err());
        assert_eq!(r.take(0, "nothing"), Ok(&[][..]));
    }
}
