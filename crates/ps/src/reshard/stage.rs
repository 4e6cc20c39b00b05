//! The receiving side of a re-sharding: `ImportShard` stages the rows and dense values of
//! the next layout, `CommitLayout` makes them live at once, `AbortLayout` drops them.
//!
//! Everything in an import comes from the network and is checked before anything is
//! written: the layout and indices against what this server expects, each row against
//! both routings (its sender held it, this server holds it next), every length and range.
//! A row or dense value received twice (a retried Reshard) is overwritten; the commit
//! checks that every row and dense value of the new shard arrived and that every sender
//! said it was done.

use std::collections::HashSet;
use std::mem;

use elastrec_embedding::{shard_of, EmbeddingError, RowUsage, TableSnapshot};
use elastrec_proto::ps::{
    AbortResponse, CommitResponse, ImportDone, ImportRequest, ImportResponse,
};
use elastrec_rpc::dense_slice;

use super::Inherited;
use crate::error::PsError;
use crate::layout::{Bitset, Phase};
use crate::shard::{PsShard, ShardConfig, ShardParts, State};

/// The shard of the next layout while it is being received.
pub(crate) struct Staged {
    parts: ShardParts,
    /// Servers of the previous layout (known from the first import).
    source_count: Option<u32>,
    /// Per table, the local rows received.
    received: Vec<Bitset>,
    /// Dense values received (offsets in the slice).
    dense_seen: Bitset,
    /// What each sender said when it finished, by its index in the previous layout.
    done: Vec<Option<ImportDone>>,
    /// Dynamic tables: the `(table, key)` rows received (their local rows are not known
    /// beforehand), and how many came from each sender, by its index.
    keys_seen: HashSet<(usize, u64)>,
    rows_from: Vec<u64>,
    /// The job's tables are dynamic.
    dynamic: bool,
}

impl Staged {
    /// Shard `index` of `count` of layout `version`, zeroed, nothing received.
    pub(crate) fn new(
        config: &ShardConfig,
        index: u32,
        count: u32,
        version: u64,
    ) -> Result<Self, EmbeddingError> {
        let parts = config.parts(index, count, version, None)?;
        let received = parts
            .store
            .tables()
            .iter()
            .map(|t| Bitset::new(t.local_rows()))
            .collect();
        let dense_seen = Bitset::new(parts.layout.range.len());
        Ok(Self {
            parts,
            source_count: None,
            received,
            dense_seen,
            done: Vec::new(),
            keys_seen: HashSet::new(),
            rows_from: Vec::new(),
            dynamic: config.embedding.dynamic.is_some(),
        })
    }

    fn version(&self) -> u64 {
        self.parts.layout.version
    }

    fn response(&self) -> ImportResponse {
        ImportResponse {
            rows_staged: self.received.iter().map(|b| b.ones() as u64).sum(),
            dense_staged: self.dense_seen.ones() as u64,
        }
    }

    /// What is still missing before the layout can be committed here (`None`: nothing).
    fn missing(&self) -> Option<String> {
        let Some(n) = self.source_count else {
            return Some("no server of the previous layout sent anything".into());
        };
        if let Some(s) = self.done.iter().position(Option::is_none) {
            return Some(format!(
                "PS {s} of the previous layout ({n} servers) has not finished sending"
            ));
        }
        // Dynamic tables: every sender's rows arrived (a retried message counts once).
        if self.dynamic {
            for (s, d) in self.done.iter().enumerate() {
                let (sent, got) = (d.as_ref().map_or(0, |d| d.rows_sent), self.rows_from[s]);
                if got != sent {
                    return Some(format!(
                        "PS {s} of the previous layout sent {sent} rows of dynamic tables, {got} arrived"
                    ));
                }
            }
        }
        for (t, got) in self.received.iter().enumerate() {
            if let Some(l) = got.first_missing() {
                let layout = &self.parts.layout;
                let row = elastrec_embedding::global_row(t, l as u64, layout.index, layout.count);
                return Some(format!(
                    "row {row} of table {t} did not arrive ({} of {} rows)",
                    got.ones(),
                    got.len()
                ));
            }
        }
        if let Some(i) = self.dense_seen.first_missing() {
            return Some(format!(
                "dense value {} did not arrive ({} of {} values)",
                self.parts.layout.range.start + i,
                self.dense_seen.ones(),
                self.dense_seen.len()
            ));
        }
        None
    }
}

fn bad(field: &'static str, detail: String) -> PsError {
    PsError::BadField {
        message: "ImportShard",
        field,
        detail,
    }
}

impl PsShard {
    /// Checks the fields of `req` that do not need the staged shard; the server is at
    /// `layout` (`joining` its layout or serving it).
    fn check_import_header(&self, req: &ImportRequest) -> Result<(), PsError> {
        let view = self.layout();
        let (mine, joining) = (&view.layout, view.phase == Phase::Joining);
        if joining && req.layout_version != mine.version {
            return Err(bad(
                "layout_version",
                format!(
                    "PS {} joins layout {}, not layout {}",
                    mine.index, mine.version, req.layout_version
                ),
            ));
        }
        if !joining && req.layout_version <= mine.version {
            return Err(bad(
                "layout_version",
                format!(
                    "PS {} serves layout {} already; layout {} is not a next one",
                    mine.index, mine.version, req.layout_version
                ),
            ));
        }
        if req.num_ps == 0 || req.target >= req.num_ps {
            return Err(bad(
                "num_ps",
                format!(
                    "server {} of a layout of {} servers does not exist",
                    req.target, req.num_ps
                ),
            ));
        }
        if req.target != mine.index {
            return Err(bad(
                "target",
                format!(
                    "this is PS {}, the message is for PS {}",
                    mine.index, req.target
                ),
            ));
        }
        if req.source_count == 0 || req.source >= req.source_count {
            return Err(bad(
                "source",
                format!(
                    "server {} of a layout of {} servers does not exist",
                    req.source, req.source_count
                ),
            ));
        }
        // A server moves from the layout it serves: the senders are its servers.
        if !joining && req.source_count != mine.count {
            return Err(bad(
                "source_count",
                format!(
                    "PS {} serves a layout of {} servers, the sender's has {}",
                    mine.index, mine.count, req.source_count
                ),
            ));
        }
        Ok(())
    }

    /// Checks the rows of `req` against both routings and the staged shard's layout.
    fn check_import_rows(&self, s: &Staged, req: &ImportRequest) -> Result<(), PsError> {
        if req.rows.is_empty() && req.values.is_empty() {
            return Ok(());
        }
        let t = req.table as usize;
        let table = s.parts.store.table(t).map_err(|_| {
            bad(
                "table",
                format!(
                    "table {t} does not exist (the job has {} tables)",
                    self.table_rows.len()
                ),
            )
        })?;
        let stride = table.stride();
        if req.rows.len().checked_mul(stride) != Some(req.values.len()) {
            return Err(bad(
                "values",
                format!(
                    "{} floats for {} rows of {stride} floats (weights and optimizer state)",
                    req.values.len(),
                    req.rows.len()
                ),
            ));
        }
        if !req.usage.is_empty() && (req.usage.len() != req.rows.len() || !table.is_dynamic()) {
            return Err(bad(
                "usage",
                format!(
                    "{} usage entries for {} rows of a {} table",
                    req.usage.len(),
                    req.rows.len(),
                    if table.is_dynamic() {
                        "dynamic"
                    } else {
                        "hashed"
                    }
                ),
            ));
        }
        let n = self.table_rows[t];
        for &row in &req.rows {
            if row >= n {
                return Err(bad(
                    "rows",
                    format!("row {row} of table {t} is out of range (the table has {n} rows)"),
                ));
            }
            let old = shard_of(t, row, req.source_count);
            if old != req.source {
                return Err(bad(
                    "rows",
                    format!(
                        "row {row} of table {t} was held by PS {old} of the previous layout \
                         ({} servers), not by the sender, PS {}",
                        req.source_count, req.source
                    ),
                ));
            }
            let new = shard_of(t, row, req.num_ps);
            if new != req.target {
                return Err(bad(
                    "rows",
                    format!(
                        "row {row} of table {t} belongs to PS {new} of layout {} ({} servers), \
                         not to PS {}",
                        req.layout_version, req.num_ps, req.target
                    ),
                ));
            }
        }
        if let Some(at) = req.values.iter().position(|v| !v.is_finite()) {
            return Err(bad("values", format!("non-finite value at position {at}")));
        }
        Ok(())
    }

    /// Checks the dense range of `req`: inside what the sender held and what this server
    /// holds next, with the optimizer state of every value.
    fn check_import_dense(&self, s: &Staged, req: &ImportRequest) -> Result<(), PsError> {
        if req.dense.is_empty() && req.dense_state.is_empty() {
            return Ok(());
        }
        let total = self.config.dense_total;
        let held = dense_slice(total, req.source_count as usize, req.source as usize);
        let mine = &s.parts.layout.range;
        let start = req.dense_start;
        let end = start.saturating_add(req.dense.len() as u64);
        let (lo, hi) = (held.start.max(mine.start), held.end.min(mine.end));
        if start < lo as u64 || end > hi as u64 || req.dense.is_empty() {
            return Err(bad(
                "dense_start",
                format!(
                    "dense range [{start}, {end}) is not inside [{lo}, {hi}), what the sender \
                     held ([{}, {})) and this server holds next ([{}, {}))",
                    held.start, held.end, mine.start, mine.end
                ),
            ));
        }
        let buffers = s.parts.opt.state().len();
        if req.dense_state.len() != buffers * req.dense.len() {
            return Err(bad(
                "dense_state",
                format!(
                    "{} floats for {buffers} optimizer buffers of {} values",
                    req.dense_state.len(),
                    req.dense.len()
                ),
            ));
        }
        for (field, v) in [("dense", &req.dense), ("dense_state", &req.dense_state)] {
            if let Some(at) = v.iter().position(|v| !v.is_finite()) {
                return Err(bad(field, format!("non-finite value at position {at}")));
            }
        }
        Ok(())
    }

    /// Stages part of the next layout's shard (see the module docs). Validates everything
    /// first: a refused message changes nothing.
    pub fn import(&self, req: ImportRequest) -> Result<ImportResponse, PsError> {
        self.check_import_header(&req)?;
        // Rows from a replaced server of the old layout would overwrite its successor's.
        self.replication.admit(req.source, req.source_node)?;
        let mut staged = self.staged.lock();
        let joining = self.layout().phase == Phase::Joining;
        match staged.as_ref() {
            Some(s) if s.version() == req.layout_version => {}
            Some(s) if joining || s.version() > req.layout_version => {
                return Err(bad(
                    "layout_version",
                    format!(
                        "PS {} is receiving layout {}, not layout {}",
                        req.target,
                        s.version(),
                        req.layout_version
                    ),
                ))
            }
            // Nothing staged yet, or a re-sharding to an older layout that was abandoned.
            _ => {
                *staged = Some(Staged::new(
                    &self.config,
                    req.target,
                    req.num_ps,
                    req.layout_version,
                )?)
            }
        }
        let s = staged.as_mut().expect("staged above");
        if s.parts.layout.count != req.num_ps {
            return Err(bad(
                "num_ps",
                format!(
                    "layout {} has {} servers, not {}",
                    req.layout_version, s.parts.layout.count, req.num_ps
                ),
            ));
        }
        if s.source_count.is_some_and(|n| n != req.source_count) {
            return Err(bad(
                "source_count",
                format!(
                    "other senders' layout has {} servers, this one's {}",
                    s.source_count.unwrap_or_default(),
                    req.source_count
                ),
            ));
        }
        self.check_import_rows(s, &req)?;
        self.check_import_dense(s, &req)?;
        if s.source_count.is_none() {
            s.source_count = Some(req.source_count);
            s.done = vec![None; req.source_count as usize];
            s.rows_from = vec![0; req.source_count as usize];
        }
        let ImportRequest {
            table,
            rows,
            values,
            dense_start,
            dense,
            dense_state,
            done,
            num_ps,
            source,
            usage,
            ..
        } = req;
        if !rows.is_empty() {
            let t = table as usize;
            let tbl = s.parts.store.table_mut(t)?;
            if tbl.is_dynamic() {
                let new = rows.iter().filter(|&&r| s.keys_seen.insert((t, r))).count();
                s.rows_from[source as usize] += new as u64;
            } else {
                for &r in &rows {
                    s.received[t].insert((r / u64::from(num_ps)) as usize);
                }
            }
            let snap = TableSnapshot {
                table: t,
                table_rows: tbl.snapshot_rows(),
                dim: tbl.dim(),
                state_len: tbl.state_len(),
                rows,
                values,
                usage: usage.into_iter().map(RowUsage::unpacked).collect(),
                // A moved row keeps its usage; the receiver keeps its own clock and filter.
                dynamic: None,
            };
            tbl.import(&snap)?;
        }
        if !dense.is_empty() {
            let at = dense_start as usize - s.parts.layout.range.start;
            let n = dense.len();
            s.parts.dense[at..at + n].copy_from_slice(&dense);
            for (b, buf) in s.parts.opt.state_mut().into_iter().enumerate() {
                buf[at..at + n].copy_from_slice(&dense_state[b * n..(b + 1) * n]);
            }
            for i in at..at + n {
                s.dense_seen.insert(i);
            }
        }
        if let Some(d) = done {
            s.done[source as usize] = Some(d);
        }
        Ok(s.response())
    }

    /// The reply to a commit, from the state now live.
    fn commit_response(&self, st: &State) -> CommitResponse {
        CommitResponse {
            index: st.layout.index,
            num_ps: st.layout.count,
            retired: matches!(st.phase, Phase::Retired { .. }),
            rows_held: st.layout.rows_held,
            dense_version: self.version_locked(st),
        }
    }

    /// Makes layout `version` live (see `ps.proto`): the staged shard replaces the state at
    /// once, or, for a server that is not part of the layout, the server retires. A
    /// repeated commit answers the same.
    /// `addrs` (optional, by index) are the new layout's servers: a server refusing a
    /// request of an older layout names them.
    pub fn commit_layout(
        &self,
        version: u64,
        addrs: Vec<String>,
    ) -> Result<CommitResponse, PsError> {
        let mut staged = self.staged.lock();
        let mut st = self.state.lock();
        let (index, served) = (st.layout.index, st.layout.version);
        let known = (!addrs.is_empty()).then(|| (version, std::sync::Arc::new(addrs)));
        match st.phase {
            Phase::Serving { .. } if served == version => {
                return Ok(self.commit_response(&st));
            }
            Phase::Retired { layout } if layout == version => {
                return Ok(self.commit_response(&st));
            }
            Phase::Frozen(t) if t.version == version && index >= t.count => {
                // Not part of the new layout: its rows went to the other servers.
                st.phase = Phase::Retired { layout: version };
                st.known = known;
                self.publish(&st);
                *staged = None;
                eprintln!("PS {index}: retired by layout {version}");
                return Ok(self.commit_response(&st));
            }
            Phase::Frozen(t) if t.version == version => {}
            Phase::Joining if served == version => {}
            phase => {
                return Err(PsError::Reshard(format!(
                    "PS {index} has no re-sharding to layout {version} to commit (layout \
                     {served}, {:?})",
                    phase.state()
                )))
            }
        }
        let Some(s) = staged.take_if(|s| s.version() == version) else {
            return Err(PsError::Reshard(format!(
                "PS {index} received nothing for layout {version}"
            )));
        };
        if let Some(missing) = s.missing() {
            let e = format!("layout {version} cannot be committed on PS {index}: {missing}");
            *staged = Some(s);
            return Err(PsError::Reshard(e));
        }
        let count = s.parts.layout.count as usize;
        if known.as_ref().is_some_and(|(_, a)| a.len() != count) {
            let n = known.as_ref().map_or(0, |(_, a)| a.len());
            *staged = Some(s);
            return Err(PsError::BadField {
                message: "CommitLayout",
                field: "addrs",
                detail: format!("{n} addresses for a layout of {count} servers"),
            });
        }
        let Staged {
            parts,
            source_count,
            done,
            ..
        } = s;
        let n = source_count.unwrap_or_default();
        let done: Vec<ImportDone> = done.into_iter().flatten().collect();
        let dense_version = done.iter().map(|d| d.dense_version).max().unwrap_or(0);
        let steps = done.iter().map(|d| d.optimizer_steps).max().unwrap_or(0);
        let old = (
            mem::replace(&mut st.store, parts.store),
            mem::replace(&mut st.dense, parts.dense),
            mem::replace(&mut st.opt, parts.opt),
        );
        st.ssu = parts.ssu;
        st.opt.set_steps(steps);
        st.accum = Default::default();
        // The rows moved: the batches this server applied are the old servers' business.
        st.last_batch.clear();
        st.inherited = done
            .iter()
            .enumerate()
            .filter_map(|(src, d)| Inherited::new(src as u32, n, &d.last_batches))
            .collect();
        st.layout = parts.layout;
        st.phase = Phase::Serving { precopy: None };
        st.known = known;
        st.dirty = None;
        self.set_version(&mut st, dense_version);
        // The successor and the slice changed: the replica is seeded again.
        self.replication.invalidate();
        self.publish(&st);
        let reply = self.commit_response(&st);
        drop(st);
        drop(staged);
        self.version_tx.send_replace(dense_version);
        drop(old);
        eprintln!(
            "PS {index}: serving layout {version} as server {index} of {} ({} rows, dense \
             version {dense_version})",
            reply.num_ps, reply.rows_held
        );
        Ok(reply)
    }

    /// Abandons a re-sharding to layout `version` (see `ps.proto`): a frozen server serves
    /// its layout again with the state it froze, the staged shard is dropped (a joining
    /// server starts receiving over). Nothing to abandon is not an error; a committed
    /// layout cannot be abandoned.
    pub fn abort_layout(&self, version: u64) -> Result<AbortResponse, PsError> {
        let mut staged = self.staged.lock();
        let mut st = self.state.lock();
        let index = st.layout.index;
        match st.phase {
            Phase::Frozen(t) | Phase::Serving { precopy: Some(t) } if t.version == version => {
                st.phase = Phase::Serving { precopy: None };
                st.dirty = None;
                eprintln!(
                    "PS {index}: re-sharding to layout {version} abandoned; serving layout {} \
                     again",
                    st.layout.version
                );
            }
            Phase::Serving { .. } if st.layout.version >= version && version > 0 => {
                return Err(PsError::Reshard(format!(
                    "PS {index} serves layout {} already; layout {version} cannot be abandoned",
                    st.layout.version
                )));
            }
            Phase::Retired { layout } if layout >= version => {
                return Err(PsError::Reshard(format!(
                    "PS {index} retired by layout {layout}; layout {version} cannot be abandoned"
                )));
            }
            _ => {}
        }
        if staged.as_ref().is_some_and(|s| s.version() == version) {
            *staged = if st.phase == Phase::Joining {
                Some(Staged::new(&self.config, index, st.layout.count, version)?)
            } else {
                None
            };
        }
        self.publish(&st);
        Ok(AbortResponse {
            layout_version: st.layout.version,
            state: st.phase.state() as i32,
        })
    }
}
