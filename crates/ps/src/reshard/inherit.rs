//! Batches applied by the servers of the previous layout, carried across a re-sharding.
//!
//! A server applies each batch once (`State::last_batch`): a batch pushed again (its
//! worker's reply was lost, or the worker died and the batch went to another one) is
//! skipped. After a re-sharding, a server's rows come from several old servers, and one of
//! them may have applied a batch that another refused (it was frozen already). So each new
//! server keeps every old server's last batches with that server's share of the routing:
//! in a push of such a batch, the rows and dense values that server held are skipped and
//! the rest is applied, so no row and no dense value gets a batch twice, and none loses it.

use std::collections::HashMap;

use elastrec_embedding::shard_of;
use elastrec_proto::ps::{BatchKey, PushRequest, WorkerBatch};
use elastrec_rpc::dense_slice;

use crate::shard::State;

/// The last batches one server of the previous layout applied.
#[derive(Debug, Clone)]
pub(crate) struct Inherited {
    /// Its index and the server count of its layout (what it held follows from them).
    source: u32,
    source_count: u32,
    /// Last batch applied, by worker.
    batches: HashMap<u32, BatchKey>,
}

impl Inherited {
    /// The batches old server `source` of `source_count` reported (none: nothing to keep).
    pub(crate) fn new(source: u32, source_count: u32, batches: &[WorkerBatch]) -> Option<Self> {
        let batches: HashMap<u32, BatchKey> = batches
            .iter()
            .filter_map(|b| Some((b.worker_id, b.batch?)))
            .collect();
        (!batches.is_empty()).then_some(Self {
            source,
            source_count,
            batches,
        })
    }
}

/// What is left of a push once the parts the old servers applied are taken out.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct PushRest {
    pub(crate) tables: Vec<u32>,
    pub(crate) rows: Vec<u64>,
    pub(crate) grads: Vec<f32>,
    /// `(start in the flat dense vector, gradient)` of each dense range left.
    pub(crate) dense: Vec<(usize, Vec<f32>)>,
}

/// The part of the validated push `req` that the servers of the previous layout have not
/// applied, or `None` when none of them applied any of it (apply it all). Also forgets the
/// inherited batch of a worker that pushes another one: it reported the inherited batch
/// before, so that batch cannot be handed out again.
pub(crate) fn inherited_part(
    st: &mut State,
    req: &PushRequest,
    dense_total: usize,
) -> Option<PushRest> {
    if st.inherited.is_empty() {
        return None;
    }
    let key = req.batch.as_ref()?;
    for inh in &mut st.inherited {
        if inh.batches.get(&req.worker_id).is_some_and(|k| k != key) {
            inh.batches.remove(&req.worker_id);
        }
    }
    st.inherited.retain(|i| !i.batches.is_empty());
    let applied: Vec<(u32, u32)> = st
        .inherited
        .iter()
        .filter(|i| i.batches.values().any(|k| k == key))
        .map(|i| (i.source, i.source_count))
        .collect();
    if applied.is_empty() {
        return None;
    }
    let held_by_applied = |t: u32, r: u64| {
        applied
            .iter()
            .any(|&(s, n)| shard_of(t as usize, r, n) == s)
    };
    let dim = st.store.dim();
    let mut rest = PushRest::default();
    let mut filtered = false;
    for (i, (&t, &r)) in req.tables.iter().zip(&req.rows).enumerate() {
        if held_by_applied(t, r) {
            filtered = true;
            continue;
        }
        rest.tables.push(t);
        rest.rows.push(r);
        rest.grads
            .extend_from_slice(&req.grads[i * dim..(i + 1) * dim]);
    }
    // The push's dense ranges, in the flat vector.
    let mut segments: Vec<(usize, &[f32])> = Vec::new();
    if req.dense_spans.is_empty() {
        if !req.dense_grad.is_empty() {
            segments.push((st.layout.range.start, &req.dense_grad));
        }
    } else {
        let mut at = 0;
        for s in &req.dense_spans {
            let len = s.len as usize;
            segments.push((s.start as usize, &req.dense_grad[at..at + len]));
            at += len;
        }
    }
    let mut skip: Vec<std::ops::Range<usize>> = applied
        .iter()
        .map(|&(s, n)| dense_slice(dense_total, n as usize, s as usize))
        .collect();
    skip.sort_by_key(|r| r.start);
    for (start, g) in segments {
        let mut at = start;
        let end = start + g.len();
        for k in &skip {
            if k.end <= at || k.start >= end {
                continue;
            }
            filtered = true;
            if k.start > at {
                rest.dense
                    .push((at, g[at - start..k.start - start].to_vec()));
            }
            at = at.max(k.end);
        }
        if at < end {
            rest.dense.push((at, g[at - start..].to_vec()));
        }
    }
    filtered.then_some(rest)
}
