//! Float arrays packed as little-endian bytes (`*_le` fields): what a pull and a push
//! carry by the megabyte every step, copied in one pass instead of encoded value by value.

use crate::ps::{PullResponse, PushRequest};

/// `values` as little-endian bytes, 4 per value.
pub fn pack(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 4);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// The floats of a packed field `what`; a length that is not a multiple of 4 is refused
/// (never trusted from the wire).
pub fn unpack(bytes: &[u8], what: &str) -> Result<Vec<f32>, String> {
    if !bytes.len().is_multiple_of(4) {
        return Err(format!(
            "{what}: {} bytes is not a whole number of 4-byte floats",
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Moves a packed field into its float array, refusing a message that sets both.
fn take(floats: &mut Vec<f32>, bytes: &mut Vec<u8>, what: &str) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    if !floats.is_empty() {
        return Err(format!("{what} is sent both packed and unpacked"));
    }
    *floats = unpack(bytes, what)?;
    *bytes = Vec::new();
    Ok(())
}

impl PullResponse {
    /// Packs `values` and `dense` into `values_le` and `dense_le`.
    pub fn pack(&mut self) {
        self.values_le = pack(&std::mem::take(&mut self.values));
        self.dense_le = pack(&std::mem::take(&mut self.dense));
    }

    /// Unpacks `values_le` and `dense_le` into `values` and `dense`.
    pub fn unpack(&mut self) -> Result<(), String> {
        take(&mut self.values, &mut self.values_le, "values_le")?;
        take(&mut self.dense, &mut self.dense_le, "dense_le")
    }
}

impl PushRequest {
    /// Packs `grads` and `dense_grad` into `grads_le` and `dense_grad_le`.
    pub fn pack(&mut self) {
        self.grads_le = pack(&std::mem::take(&mut self.grads));
        self.dense_grad_le = pack(&std::mem::take(&mut self.dense_grad));
    }

    /// Unpacks `grads_le` and `dense_grad_le` into `grads` and `dense_grad`.
    pub fn unpack(&mut self) -> Result<(), String> {
        take(&mut self.grads, &mut self.grads_le, "grads_le")?;
        take(
            &mut self.dense_grad,
            &mut self.dense_grad_le,
            "dense_grad_le",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_and_a_push_read_back_what_was_packed_and_bad_lengths_are_refused() {
        let mut r = PullResponse {
            values: vec![1.5, -0.0, f32::MIN_POSITIVE],
            dense: vec![3.25; 5],
            dense_version: 7,
            ..PullResponse::default()
        };
        let want = r.clone();
        r.pack();
        assert!(r.values.is_empty() && r.values_le.len() == 12);
        r.unpack().unwrap();
        assert_eq!(r, want);

        let mut p = PushRequest {
            grads: vec![0.5; 3],
            dense_grad: vec![-2.0],
            ..PushRequest::default()
        };
        let want = p.clone();
        p.pack();
        p.unpack().unwrap();
        assert_eq!(p, want);

        let mut bad = PushRequest {
            grads_le: vec![0; 6],
            ..PushRequest::default()
        };
        assert!(bad.unpack().unwrap_err().contains("grads_le: 6 bytes"));
        let mut both = PushRequest {
            grads: vec![1.0],
            grads_le: pack(&[1.0]),
            ..PushRequest::default()
        };
        assert!(both
            .unpack()
            .unwrap_err()
            .contains("both packed and unpacked"));
    }
}
