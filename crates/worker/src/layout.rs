//! The worker's side of parameter-server layouts (see the `ParameterServer` service in
//! `ps.proto`): which layout the master published, and how the part of a push that the
//! servers of one layout did not accept is routed to the servers of the next.
//!
//! A push goes to every server of a layout; during a re-sharding some may accept their part
//! (they froze after it, so it moved with their state) while others refuse theirs (they
//! froze before). Only the refused parts are sent again, split by the new layout: rows by
//! their new owner, and the dense ranges of the refused slices cut by the new slices (a
//! server of the new layout may get only part of its slice: `PushRequest::dense_spans`).

use std::ops::Range;

use elastrec_embedding::shard_of;

/// The PS layout the master published: its version and the servers' addresses by index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PsLayout {
    /// Version (0: the job's first layout).
    pub version: u64,
    /// Address of each server, by index.
    pub addrs: Vec<String>,
}

impl PsLayout {
    /// Takes a publication from the master: a newer layout, or new addresses for the same
    /// one (a server replaced after it died). An older one (a reply overtaken by a newer
    /// one) or an empty one is ignored.
    pub fn update(&mut self, version: u64, addrs: &[String]) {
        if version >= self.version && !addrs.is_empty() {
            self.version = version;
            self.addrs = addrs.to_vec();
        }
    }
}

impl PsLayout {
    /// Takes a layout a server named when it refused a request (see
    /// `rpc::refusal_layout`): only a newer version. The master's publication stays the
    /// authority for the current layout's addresses (a server's list may predate the
    /// replacement of one of them).
    pub fn take_newer(&mut self, version: u64, addrs: &[String]) {
        if version > self.version && !addrs.is_empty() {
            self.version = version;
            self.addrs = addrs.to_vec();
        }
    }
}

/// Gradients of a batch that one server has not accepted yet: rows with their summed
/// gradients (`dim` floats each) and ranges of the flat dense gradient.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PushPart {
    /// Table of each row.
    pub tables: Vec<u32>,
    /// Global rows, each once.
    pub rows: Vec<u64>,
    /// `rows.len() * dim` gradient values.
    pub grads: Vec<f32>,
    /// Ranges of the flat dense vector, ascending and disjoint.
    pub dense: Vec<Range<usize>>,
}

impl PushPart {
    /// True when there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.dense.is_empty()
    }
}

/// Splits `parts` (what servers of some layout did not accept) by a layout whose servers
/// hold the dense `slices` (one per server): part `j` of the result holds the rows server
/// `j` owns and the dense ranges inside its slice. Nothing is lost or duplicated: rows
/// keep their gradients, dense ranges are merged and cut.
pub fn split_parts(
    parts: impl IntoIterator<Item = PushPart>,
    slices: &[Range<usize>],
    dim: usize,
) -> Vec<PushPart> {
    let n = slices.len() as u32;
    let mut out = vec![PushPart::default(); slices.len()];
    let mut dense = Vec::new();
    for part in parts {
        for (i, (&t, &r)) in part.tables.iter().zip(&part.rows).enumerate() {
            let o = &mut out[shard_of(t as usize, r, n) as usize];
            o.tables.push(t);
            o.rows.push(r);
            o.grads
                .extend_from_slice(&part.grads[i * dim..(i + 1) * dim]);
        }
        dense.extend(part.dense);
    }
    let dense = merge(dense);
    for (o, slice) in out.iter_mut().zip(slices) {
        for r in &dense {
            let (lo, hi) = (r.start.max(slice.start), r.end.min(slice.end));
            if lo < hi {
                o.dense.push(lo..hi);
            }
        }
    }
    out
}

/// Sorted, disjoint ranges covering exactly the non-empty ranges given.
fn merge(mut ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
    ranges.retain(|r| !r.is_empty());
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_rpc::dense_slice;

    const DIM: usize = 2;

    fn slices(total: usize, n: usize) -> Vec<Range<usize>> {
        (0..n).map(|i| dense_slice(total, n, i)).collect()
    }

    /// The parts of a push routed to `n` servers (rows of tables 0..3, each with a
    /// gradient naming it).
    fn routed(n: usize, total: usize) -> Vec<PushPart> {
        let mut one = PushPart::default();
        for t in 0..3u32 {
            for r in 0..20u64 {
                one.tables.push(t);
                one.rows.push(r);
                one.grads.extend([t as f32, r as f32]);
            }
        }
        one.dense.push(0..total);
        split_parts([one], &slices(total, n), DIM)
    }

    fn rows_of(parts: &[PushPart]) -> Vec<(u32, u64, Vec<f32>)> {
        let mut v: Vec<_> = parts
            .iter()
            .flat_map(|p| {
                p.tables
                    .iter()
                    .zip(&p.rows)
                    .enumerate()
                    .map(|(i, (&t, &r))| (t, r, p.grads[i * DIM..(i + 1) * DIM].to_vec()))
            })
            .collect();
        v.sort_by_key(|a| (a.0, a.1));
        v
    }

    /// Servers 0 and 2 of 3 refused (they froze first), server 1 accepted: what they
    /// refused, and only that, reaches the 4 servers of the next layout, each row at its
    /// owner with its gradient, and the dense ranges of servers 0 and 2 cut by the new
    /// slices (the new server spanning the gap gets two spans).
    #[test]
    fn the_refused_parts_are_re_split_by_the_new_layout() {
        let total = 101;
        let old = routed(3, total);
        assert_eq!(old[1].dense, vec![33..67]);
        let refused = vec![old[0].clone(), old[2].clone()];
        let new = split_parts(refused.clone(), &slices(total, 4), DIM);
        assert_eq!(new.len(), 4);
        assert_eq!(rows_of(&new), rows_of(&refused), "rows lost or duplicated");
        for (j, p) in new.iter().enumerate() {
            for (&t, &r) in p.tables.iter().zip(&p.rows) {
                assert_eq!(shard_of(t as usize, r, 4), j as u32);
                assert_ne!(
                    shard_of(t as usize, r, 3),
                    1,
                    "an accepted row was sent again"
                );
            }
        }
        // New slices: [0, 25), [25, 50), [50, 75), [75, 101); refused: [0, 33), [67, 101).
        assert_eq!(new[0].dense, vec![0..25]);
        assert_eq!(new[1].dense, vec![25..33]);
        assert_eq!(new[2].dense, vec![67..75]);
        assert_eq!(new[3].dense, vec![75..101]);
        // Down to one server, the accepted range is a gap inside its slice: two spans.
        let one = split_parts(new, &slices(total, 1), DIM);
        assert_eq!(one[0].dense, vec![0..33, 67..101]);
        assert_eq!(rows_of(&one), rows_of(&refused));
    }

    /// Split by the same layout, nothing moves: every part is what it was.
    #[test]
    fn splitting_by_the_same_layout_changes_nothing() {
        let total = 50;
        let parts = routed(3, total);
        assert_eq!(split_parts(parts.clone(), &slices(total, 3), DIM), parts);
        assert!(PushPart::default().is_empty());
        assert_eq!(
            merge(vec![5..9, 0..2, 2..3, 8..12, 20..20]),
            vec![0..3, 5..12]
        );
    }

    #[test]
    fn a_published_layout_is_taken_when_newer_or_the_same() {
        let mut l = PsLayout::default();
        let addrs = |a: &str| vec![a.to_string()];
        l.update(0, &addrs("a"));
        l.update(2, &addrs("b"));
        assert_eq!(
            l,
            PsLayout {
                version: 2,
                addrs: addrs("b")
            }
        );
        l.update(1, &addrs("c"));
        l.update(2, &[]);
        assert_eq!(
            l.addrs,
            addrs("b"),
            "older or empty publications are ignored"
        );
        l.update(2, &addrs("d"));
        assert_eq!(l.addrs, addrs("d"), "a replaced server of the same layout");
        l.take_newer(2, &addrs("e"));
        assert_eq!(
            l.addrs,
            addrs("d"),
            "a server's list does not replace the master's"
        );
        l.take_newer(3, &addrs("f"));
        assert_eq!(
            l,
            PsLayout {
                version: 3,
                addrs: addrs("f")
            }
        );
    }
}
