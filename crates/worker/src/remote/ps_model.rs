//! A worker's copy of the model: the dense part in memory, the embedding rows pulled
//! from the parameter servers for each batch and the gradients pushed back, with the
//! layout changes and server replacements a call can run into.

use super::*;

/// Where each (sample, table) slot of a batch lives: PS index and position in that PS's
/// unique-row list, under the PS layout `layout`. With named features (`pool`), `slot`
/// has one entry per lookup of the plan, which says where each row adds to and how much.
pub(super) struct Routing {
    pub(super) per_ps: Vec<(Vec<u32>, Vec<u64>)>,
    pub(super) slot: Vec<(u32, u32)>,
    pub(super) layout: u64,
    pub(super) pool: Option<Arc<LookupPlan>>,
}

/// Why a round of calls to the parameter servers did not complete.
pub(super) enum Refusal {
    /// PS `i` is unreachable (died, or restarting): wait for its replacement.
    Unreachable(usize, tonic::Status),
    /// PS `i` does not serve the layout the call was routed by: wait for the new layout.
    Layout(usize, tonic::Status),
}

/// A pull's reply from one server.
pub(super) type PullReply = Result<tonic::Response<PullResponse>, tonic::Status>;

/// The next batch's pull, started before this batch's compute and push: its calls in
/// flight, and what they were made under.
pub(super) struct Prefetch {
    routing: Routing,
    layout: u64,
    addrs: Vec<String>,
    want_dense: bool,
    calls: Vec<tokio::task::JoinHandle<PullReply>>,
}

/// How long a worker waits for a replacement of a fenced server (see `elastrec_ps::lease`)
/// before it calls that server again.
pub(super) const FENCE_POLL: Duration = Duration::from_millis(200);
/// How often a worker says that a server still refuses it as fenced.
pub(super) const FENCE_LOG_EVERY: Duration = Duration::from_secs(5);

/// How long a worker waits for the master to publish a new layout after a server refused
/// its layout before it tries the servers again (they may be finishing their commit).
pub(super) const LAYOUT_POLL: Duration = Duration::from_millis(50);

/// How long servers may refuse a worker's layout before it gives up.
pub(super) const LAYOUT_WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Dense model copy plus the PS connections.
pub(super) struct RemoteModel {
    pub(super) dense: DenseDlrm,
    pub(super) ws: Workspace,
    pub(super) emb: Vec<f32>,
    /// What each table's ids hash over (`resolve_key_spaces`).
    pub(super) key_spaces: Vec<u64>,
    /// Shared tables and pooled lists of named features; `None`: slot `t` is table `t`'s
    /// single id.
    pub(super) slots: Option<SlotLayout>,
    /// The attention units' histories of the last pull (`[n, max_len, d]` each), their
    /// lengths, and their gradient after the last compute.
    pub(super) hist: Vec<f32>,
    pub(super) lens: Vec<u32>,
    pub(super) d_hist: Vec<f32>,
    pub(super) dim: usize,
    pub(super) ps: Vec<Ps>,
    /// Address of each PS connection (to notice a replaced PS).
    pub(super) addrs: Vec<String>,
    /// Version of the PS layout `ps`, `addrs` and `slices` belong to: every pull and push
    /// names it, and a server of another layout refuses them.
    pub(super) layout: u64,
    pub(super) token: String,
    pub(super) max_bytes: usize,
    pub(super) call_timeout: Duration,
    pub(super) shared: Arc<Shared>,
    pub(super) slices: Vec<std::ops::Range<usize>>,
    pub(super) versions: Vec<u64>,
    /// The newest dense version each server reported (pulls and pushes): what a push of
    /// ours will follow.
    pub(super) seen: Vec<u64>,
    pub(super) need_dense: bool,
    pub(super) staleness: u64,
    pub(super) mode: SyncMode,
    pub(super) worker_id: u32,
    /// `[optimizer.schedule]`'s multiplier for the next pushes, as the master last said
    /// (0: no schedule). Until its first reply, the schedule's start.
    pub(super) lr_scale: f32,
    /// The sum of the last batch's sample weights (none: the data has no weights).
    pub(super) loss_weight: Option<f64>,
    /// When a fenced server's refusal was last logged.
    pub(super) fence_logged: Option<Instant>,
}

impl RemoteModel {
    pub(super) fn new(
        job: &JobConfig,
        layout: PsLayout,
        token: String,
        shared: Arc<Shared>,
        worker_id: u32,
    ) -> anyhow::Result<Self> {
        let dense = dense_model(job)?;
        let batch = job.train.batch_size;
        let mut ws = dense.workspace(batch);
        // Workers compute gradients side by side: each draws its own dropout masks. (A
        // restarted worker id repeats its masks from step 0: harmless, they are noise.)
        ws.set_dropout_stream(elastrec_common::splitmix::derive(
            job.model.seed,
            u64::from(worker_id) + 1,
        ));
        let mut me = Self {
            ws,
            emb: vec![0.0; batch * dense.config().num_tables * job.model.row_width()],
            key_spaces: resolve_key_spaces(job),
            slots: job.data.schema().as_ref().and_then(SlotLayout::of),
            hist: Vec::new(),
            lens: Vec::new(),
            d_hist: Vec::new(),
            dim: job.model.row_width(),
            slices: Vec::new(),
            versions: Vec::new(),
            seen: Vec::new(),
            need_dense: true,
            staleness: job.cluster.staleness as u64,
            mode: job.cluster.mode,
            dense,
            ps: Vec::new(),
            addrs: Vec::new(),
            layout: 0,
            token,
            max_bytes: job.cluster.max_message_bytes,
            call_timeout: job.cluster.rpc_timeout(),
            shared,
            worker_id,
            lr_scale: if job.optimizer.schedule.is_constant() {
                0.0
            } else {
                job.optimizer.schedule.scale(0, u64::MAX)
            },
            loss_weight: None,
            fence_logged: None,
        };
        me.connect(layout)?;
        Ok(me)
    }

    /// Routes by `layout` from now on: clients (connections to addresses that stay are
    /// kept), dense slices, and fresh dense parameters at the next pull.
    pub(super) fn connect(&mut self, layout: PsLayout) -> anyhow::Result<()> {
        let mut open: HashMap<String, Ps> = self.addrs.drain(..).zip(self.ps.drain(..)).collect();
        self.ps = layout
            .addrs
            .iter()
            .map(|a| match open.remove(a) {
                Some(c) => Ok(c),
                None => rpc::ps_client(a, &self.token, self.max_bytes, self.call_timeout),
            })
            .collect::<anyhow::Result<_>>()?;
        let (p, n) = (self.ps.len(), self.dense.num_params());
        self.addrs = layout.addrs;
        self.layout = layout.version;
        self.slices = (0..p).map(|i| dense_slice(n, p, i)).collect();
        self.versions = vec![0; p];
        self.seen = vec![0; p];
        self.need_dense = true;
        Ok(())
    }

    /// Switches to the layout the master published when it is newer than ours.
    pub(super) fn follow_layout(&mut self) -> anyhow::Result<bool> {
        let published = self.shared.ps_layout.lock().clone();
        if published.version <= self.layout || published.addrs.is_empty() {
            return Ok(false);
        }
        eprintln!(
            "worker {}: PS layout {} ({} servers) replaces layout {} ({} servers)",
            self.worker_id,
            published.version,
            published.addrs.len(),
            self.layout,
            self.ps.len()
        );
        self.connect(published)?;
        Ok(true)
    }

    /// PS `i` failed a call: waits until the master publishes a replacement (a new
    /// address), reconnects, and asks for fresh dense parameters. A PS that stays away
    /// for two minutes ends the worker (the master stops the job or recovers it fully).
    /// A new layout published meanwhile is taken instead. A fenced PS (alive, past its
    /// lease) is called again after `FENCE_POLL` unless replaced by then.
    pub(super) async fn await_replacement(
        &mut self,
        i: usize,
        why: &tonic::Status,
    ) -> anyhow::Result<()> {
        // A fenced server is alive but lost the master's lease: it serves again once the
        // master answers it, or the master replaces it. Either way the master settles it
        // (a fenced server's heartbeats are no sign of life), so the call is retried
        // every `FENCE_POLL` until then, with no deadline of its own.
        let fenced = rpc::is_fence_refusal(why);
        if !fenced
            || self
                .fence_logged
                .is_none_or(|t| t.elapsed() > FENCE_LOG_EVERY)
        {
            eprintln!(
                "worker {}: PS {i} at {} failed ({}); waiting for it or its replacement",
                self.worker_id,
                self.addrs[i],
                why.message()
            );
            if fenced {
                self.fence_logged = Some(Instant::now());
            }
        }
        let started = Instant::now();
        let deadline = started + Duration::from_secs(120);
        loop {
            if self.follow_layout()? {
                return Ok(());
            }
            let published = self.shared.ps_layout.lock().clone();
            let addrs = published.addrs;
            if published.version == self.layout
                && addrs.len() == self.addrs.len()
                && addrs[i] != self.addrs[i]
            {
                for (k, a) in addrs.iter().enumerate() {
                    if *a != self.addrs[k] {
                        self.ps[k] =
                            rpc::ps_client(a, &self.token, self.max_bytes, self.call_timeout)?;
                    }
                }
                self.addrs = addrs;
                self.need_dense = true;
                eprintln!(
                    "worker {}: PS {i} is back at {}",
                    self.worker_id, self.addrs[i]
                );
                return Ok(());
            }
            if fenced && started.elapsed() >= FENCE_POLL {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("PS {i} did not come back within 120 s ({why})");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// PS `i` refused our layout (the servers are being re-sharded, or were): waits for
    /// the master to publish a newer layout and switches to it; without one within
    /// [`LAYOUT_POLL`], returns to retry the same layout (the servers of a layout we
    /// already have may be finishing their commit). Servers that refuse every layout we
    /// get for [`LAYOUT_WAIT_LIMIT`] since `since` end the worker.
    pub(super) async fn await_layout(
        &mut self,
        i: usize,
        why: &tonic::Status,
        since: Instant,
    ) -> anyhow::Result<()> {
        if since.elapsed() < LAYOUT_POLL {
            eprintln!(
                "worker {}: PS {i} refused layout {} ({}); waiting for the new layout",
                self.worker_id,
                self.layout,
                why.message()
            );
        }
        // A server that committed the new layout names it: no need to wait for the
        // master's next heartbeat reply.
        if let Some((version, addrs)) = rpc::refusal_layout(why) {
            self.shared.ps_layout.lock().take_newer(version, &addrs);
        }
        let poll = Instant::now();
        loop {
            if self.follow_layout()? {
                return Ok(());
            }
            if since.elapsed() > LAYOUT_WAIT_LIMIT {
                bail!(
                    "the parameter servers refused layout {} for {} s ({why})",
                    self.layout,
                    LAYOUT_WAIT_LIMIT.as_secs()
                );
            }
            if poll.elapsed() >= LAYOUT_POLL {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(super) fn route(&self, batch: &Batch) -> anyhow::Result<Routing> {
        let tables = self.dense.config().num_tables;
        let Some(slots) = &self.slots else {
            let keys = batch
                .sparse
                .iter()
                .enumerate()
                .map(|(i, &id)| (i % tables, id));
            return Ok(self.route_keys(keys, None));
        };
        let mut plan = LookupPlan::default();
        plan.plan(slots, batch)?;
        let keys: Vec<(usize, u64)> = plan
            .tables
            .iter()
            .zip(&plan.ids)
            .map(|(&t, &id)| (t as usize, id))
            .collect();
        Ok(self.route_keys(keys.into_iter(), Some(Arc::new(plan))))
    }

    /// Routes each `(table, id)` to its server, once per distinct row.
    pub(super) fn route_keys(
        &self,
        keys: impl Iterator<Item = (usize, u64)>,
        pool: Option<Arc<LookupPlan>>,
    ) -> Routing {
        let p = self.ps.len();
        let mut per_ps: Vec<(Vec<u32>, Vec<u64>)> = vec![(Vec::new(), Vec::new()); p];
        let lookups = keys.size_hint().0;
        // Tens of thousands of keys a batch: foldhash (seeded per process), several times
        // faster than the standard library's SipHash on these small keys.
        let mut index: Vec<hashbrown::HashMap<(u32, u64), u32>> = (0..p)
            .map(|_| hashbrown::HashMap::with_capacity(lookups / p))
            .collect();
        let mut slot = Vec::with_capacity(lookups);
        for (t, id) in keys {
            let row = row_of(t, id, self.key_spaces[t]);
            let s = shard_of(t, row, p as u32) as usize;
            let k = *index[s].entry((t as u32, row)).or_insert_with(|| {
                per_ps[s].0.push(t as u32);
                per_ps[s].1.push(row);
                (per_ps[s].1.len() - 1) as u32
            });
            slot.push((s as u32, k));
        }
        Routing {
            per_ps,
            slot,
            layout: self.layout,
            pool,
        }
    }

    /// `r` routed by the current layout instead of the one it was made for (the same
    /// unique rows, each at its new owner; the slots follow them).
    pub(super) fn reroute(&self, r: &Routing) -> Routing {
        let p = self.ps.len();
        let mut per_ps: Vec<(Vec<u32>, Vec<u64>)> = vec![(Vec::new(), Vec::new()); p];
        // Each (table, row) appears once in `r`, under one server.
        let moved: Vec<Vec<(u32, u32)>> = r
            .per_ps
            .iter()
            .map(|(tables, rows)| {
                tables
                    .iter()
                    .zip(rows)
                    .map(|(&t, &row)| {
                        let s = shard_of(t as usize, row, p as u32) as usize;
                        per_ps[s].0.push(t);
                        per_ps[s].1.push(row);
                        (s as u32, (per_ps[s].1.len() - 1) as u32)
                    })
                    .collect()
            })
            .collect();
        let slot = r
            .slot
            .iter()
            .map(|&(s, k)| moved[s as usize][k as usize])
            .collect();
        Routing {
            per_ps,
            slot,
            layout: self.layout,
            pool: r.pool.clone(),
        }
    }

    /// Pulls the batch's rows (and the dense parameters when stale) into place, waiting
    /// out the replacement of a failed PS and changes of the PS layout (the pull is done
    /// again by the new layout's routing).
    pub(super) async fn pull(&mut self, routing: &Routing) -> anyhow::Result<()> {
        self.follow_layout()?;
        let mut refused_since = None;
        loop {
            let rerouted;
            let r = if routing.layout == self.layout {
                routing
            } else {
                rerouted = self.reroute(routing);
                &rerouted
            };
            match self.try_pull(r).await? {
                None => return Ok(()),
                Some(Refusal::Unreachable(i, status)) => self.await_replacement(i, &status).await?,
                Some(Refusal::Layout(i, status)) => {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    self.await_layout(i, &status, since).await?
                }
            }
        }
    }

    /// One pull attempt (`routing` is of the current layout); `Some` when a PS was
    /// unreachable or refused the layout.
    pub(super) async fn try_pull(&mut self, routing: &Routing) -> anyhow::Result<Option<Refusal>> {
        let want_dense = self.need_dense || self.mode == SyncMode::Sync;
        let replies = rpc::join_all(self.pull_calls(routing, want_dense).into_iter()).await;
        self.place(routing, want_dense, replies)
    }

    /// The calls of a pull of `routing`'s rows (and the dense slices when `want_dense`),
    /// one per server of the current layout.
    fn pull_calls(
        &self,
        routing: &Routing,
        want_dense: bool,
    ) -> Vec<impl Future<Output = PullReply> + Send + 'static> {
        let layout_version = self.layout;
        self.ps
            .iter()
            .zip(&routing.per_ps)
            .map(move |(c, (tables, rows))| {
                let mut c = c.clone();
                let req = PullRequest {
                    version: rpc::version(),
                    tables: tables.clone(),
                    rows: rows.clone(),
                    want_dense,
                    layout_version,
                    packed: true,
                };
                async move { c.pull(req).await }
            })
            .collect()
    }

    /// True when the next batch's pull may start before this batch is pushed: async mode
    /// with a staleness bound of at least one update, which a pull made before this
    /// worker's own push lags by (its rows and dense parameters miss that push).
    pub(super) fn can_prefetch(&self) -> bool {
        self.mode == SyncMode::Async && self.staleness >= 1
    }

    /// Starts the pull of the next batch (`routing`) while this one is computed and
    /// pushed (see [`Self::can_prefetch`]). It asks for the dense slices when they are
    /// due, or will be once this worker's push of the current batch lands.
    pub(super) fn prefetch(&self, routing: Routing) -> Prefetch {
        let due_after_push = self
            .seen
            .iter()
            .zip(&self.versions)
            .any(|(&seen, &held)| (seen + 1).saturating_sub(held) > self.staleness);
        let want_dense = self.need_dense || due_after_push;
        let calls = self
            .pull_calls(&routing, want_dense)
            .into_iter()
            .map(tokio::spawn)
            .collect();
        Prefetch {
            routing,
            layout: self.layout,
            addrs: self.addrs.clone(),
            want_dense,
            calls,
        }
    }

    /// Places a prefetched pull; returns its routing and whether it served. When dense
    /// parameters fell due that it did not ask for (other workers' pushes), they are
    /// pulled alone first (attention units pool the rows with the dense weights). It does
    /// not serve (and the caller pulls again) when the layout or a server changed since it
    /// started, or a server refused it.
    pub(super) async fn take_prefetch(&mut self, p: Prefetch) -> anyhow::Result<(Routing, bool)> {
        let mut replies = Vec::with_capacity(p.calls.len());
        for call in p.calls {
            replies.push(call.await.context("a prefetched pull")?);
        }
        self.follow_layout()?;
        let current = |m: &Self| p.layout == m.layout && p.addrs == m.addrs;
        if current(self) && self.need_dense && !p.want_dense {
            let dense_only = Routing {
                per_ps: vec![(Vec::new(), Vec::new()); self.ps.len()],
                slot: Vec::new(),
                layout: self.layout,
                pool: None,
            };
            self.pull(&dense_only).await?;
        }
        if !current(self) {
            return Ok((p.routing, false));
        }
        let placed = self.place(&p.routing, p.want_dense, replies)?.is_none();
        Ok((p.routing, placed))
    }

    /// Puts a pull's replies in place: each row where the batch reads it (pooled and
    /// attended for named features), the dense slices when asked for. `Some` (and nothing
    /// placed) when a server was unreachable or refused the layout.
    fn place(
        &mut self,
        routing: &Routing,
        want_dense: bool,
        replies: Vec<PullReply>,
    ) -> anyhow::Result<Option<Refusal>> {
        let d = self.dim;
        let mut values = Vec::with_capacity(replies.len());
        let mut replies_ok = Vec::with_capacity(replies.len());
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(r) => {
                    let mut r = r.into_inner();
                    r.unpack()
                        .map_err(|e| anyhow::anyhow!("pull from PS {i}: {e}"))?;
                    replies_ok.push(r)
                }
                Err(s) if rpc::is_layout_refusal(&s) => return Ok(Some(Refusal::Layout(i, s))),
                Err(s) if is_transient(&s) => return Ok(Some(Refusal::Unreachable(i, s))),
                Err(s) => return Err(s).with_context(|| format!("pull from PS {i}")),
            }
        }
        for (i, r) in replies_ok.into_iter().enumerate() {
            anyhow::ensure!(
                r.values.len() == routing.per_ps[i].1.len() * d,
                "PS {i} returned {} values for {} rows",
                r.values.len(),
                routing.per_ps[i].1.len()
            );
            if want_dense {
                let range = self.slices[i].clone();
                anyhow::ensure!(
                    r.dense.len() == range.len(),
                    "PS {i} returned a wrong dense slice"
                );
                self.dense.params_mut()[range].copy_from_slice(&r.dense);
                self.versions[i] = r.dense_version;
                self.seen[i] = self.seen[i].max(r.dense_version);
            }
            values.push(r.values);
        }
        self.need_dense = false;
        match &routing.pool {
            None => {
                for (j, &(s, k)) in routing.slot.iter().enumerate() {
                    let src = &values[s as usize][k as usize * d..(k as usize + 1) * d];
                    self.emb[j * d..(j + 1) * d].copy_from_slice(src);
                }
            }
            Some(plan) => {
                // Each lookup's row, scaled, added to its bag's (or single id's) slot, or
                // laid out as a history for an attention unit, which pools it here.
                let slots = self.dense.config().num_tables;
                let emb = &mut self.emb[..plan.rows * slots * d];
                let layout = self.slots.as_ref().expect("a pooled routing has a layout");
                self.hist.resize(plan.history_len(layout, d), 0.0);
                plan.pool(d, emb, &mut self.hist, |j| {
                    let (s, k) = routing.slot[j];
                    &values[s as usize][k as usize * d..(k as usize + 1) * d]
                });
                self.lens.clone_from(&plan.lens);
                if !self.dense.attention().is_empty() {
                    self.dense
                        .attend(&self.hist, &self.lens, emb, &mut self.ws)?;
                }
            }
        }
        Ok(None)
    }

    /// Forward/backward on the pulled parameters; returns the loss.
    /// Forward and backward of one batch; `stream` says it came from a stream partition
    /// (an MTRM trains its adapt tower on those, its memory tower on history files).
    pub(super) fn compute(&mut self, batch: &Batch, stream: bool) -> anyhow::Result<f32> {
        let n = batch.len();
        let emb = &self.emb[..n * self.dense.config().num_tables * self.dim];
        let tower = self.dense.tower_for(stream);
        let labels = elastrec_model::Labels {
            labels: &batch.labels,
            task_labels: &batch.task_labels,
            weights: &batch.weights,
        };
        self.loss_weight =
            (!batch.weights.is_empty()).then(|| batch.weights.iter().map(|&w| f64::from(w)).sum());
        let loss =
            self.dense
                .forward_backward_weighted(&batch.dense, emb, labels, tower, &mut self.ws)?;
        if !self.dense.attention().is_empty() {
            self.d_hist.resize(self.hist.len(), 0.0);
            self.dense.attend_backward(
                &self.hist,
                &self.lens,
                emb,
                &mut self.d_hist,
                &mut self.ws,
            )?;
        }
        Ok(loss)
    }

    /// The probabilities of the last [`Self::compute`], made with the parameters pulled
    /// before its update: what the model predicted for `batch` before training on it.
    /// A multi-task model's are every task's, row-major, task 0 first.
    pub(super) fn predictions(&self, batch: &Batch) -> Predictions {
        let (n, tasks) = (batch.len(), self.dense.tasks());
        let mut probs = Vec::with_capacity(n * tasks);
        let mut labels = Vec::with_capacity(n * tasks);
        for r in 0..n {
            probs.extend((0..tasks).map(|t| sigmoid(self.ws.task_logits(t)[r])));
            let row = std::iter::once(&batch.labels[r]).chain(batch.task_labels_row(r));
            labels.extend(row.map(|&y| u8::from(y > 0.5)));
        }
        Predictions {
            probs,
            labels,
            tasks: tasks as u32,
            weights: batch.weights.clone(),
        }
    }

    /// The push of `part` to PS `j` of the current layout: the whole dense slice in the
    /// plain form (one optimizer step), other ranges as spans. A part re-split after a
    /// re-sharding (`resplit`) is always sent as spans: the rest of a step the new server
    /// counted already (its step count is the largest of the old servers').
    #[allow(clippy::too_many_arguments)]
    pub(super) fn push_request(
        &self,
        j: usize,
        part: &PushPart,
        resplit: bool,
        dense_grad: &[f32],
        contributors: u32,
        batch: BatchKey,
        samples: u32,
    ) -> PushRequest {
        let whole = !resplit && part.dense.len() == 1 && part.dense[0] == self.slices[j];
        let (dense_grad, dense_spans) = if whole || part.dense.is_empty() {
            let slice = part.dense.first().cloned().unwrap_or_default();
            (dense_grad[slice].to_vec(), Vec::new())
        } else {
            let values = part.dense.iter().flat_map(|r| &dense_grad[r.clone()]);
            let spans = part.dense.iter().map(|r| DenseSpan {
                start: r.start as u64,
                len: r.len() as u64,
            });
            (values.copied().collect(), spans.collect())
        };
        PushRequest {
            version: rpc::version(),
            worker_id: self.worker_id,
            tables: part.tables.clone(),
            rows: part.rows.clone(),
            grads: part.grads.clone(),
            dense_grad,
            base_version: self.versions[j],
            step: self.versions[j],
            contributors,
            batch: Some(batch),
            samples,
            layout_version: self.layout,
            dense_spans,
            lr_scale: self.lr_scale,
            loss_weight: self.loss_weight,
            grads_le: Vec::new(),
            dense_grad_le: Vec::new(),
        }
    }

    /// Pushes the gradients of `batch` to every PS; returns once all accepted them. A PS
    /// that failed is retried alone once replaced (the others applied their part). When
    /// servers refuse the layout (re-sharding), only the parts they refused are split by
    /// the new layout and sent to the new owners: the accepted parts moved with the state.
    pub(super) async fn push(
        &mut self,
        routing: &Routing,
        contributors: u32,
        batch: BatchKey,
        samples: u32,
    ) -> anyhow::Result<()> {
        self.follow_layout()?;
        let rerouted;
        let routing = if routing.layout == self.layout {
            routing
        } else {
            rerouted = self.reroute(routing);
            &rerouted
        };
        let d = self.dim;
        let d_emb = self.ws.d_emb();
        let mut grads: Vec<Vec<f32>> = routing
            .per_ps
            .iter()
            .map(|(_, rows)| vec![0.0; rows.len() * d])
            .collect();
        for (j, &(s, k)) in routing.slot.iter().enumerate() {
            let dst = &mut grads[s as usize][k as usize * d..(k as usize + 1) * d];
            match &routing.pool {
                None => {
                    for (a, g) in dst.iter_mut().zip(&d_emb[j * d..(j + 1) * d]) {
                        *a += g;
                    }
                }
                Some(plan) => plan.add_grad(j, d, d_emb, &self.d_hist, dst),
            }
        }
        // What each server of the current layout has not accepted yet (`None`: accepted).
        let mut parts: Vec<Option<PushPart>> = routing
            .per_ps
            .iter()
            .zip(grads)
            .zip(&self.slices)
            .map(|(((tables, rows), grads), slice)| {
                Some(PushPart {
                    tables: tables.clone(),
                    rows: rows.clone(),
                    grads,
                    dense: vec![slice.clone()],
                })
            })
            .collect();
        let (first_layout, mut parts_layout) = (self.layout, self.layout);
        let mut refused_since = None;
        loop {
            let dense_grad = self.ws.grads();
            let pending: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].is_some()).collect();
            let calls = pending.iter().map(|&i| {
                let mut c = self.ps[i].clone();
                let part = parts[i].as_ref().expect("pending");
                let resplit = parts_layout != first_layout;
                let mut req =
                    self.push_request(i, part, resplit, dense_grad, contributors, batch, samples);
                req.pack();
                async move { c.push(req).await }
            });
            let replies = rpc::join_all(calls).await;
            let mut refusal = None;
            for (&i, r) in pending.iter().zip(replies) {
                match r {
                    Ok(r) => {
                        parts[i] = None;
                        let v = r.into_inner().dense_version;
                        self.seen[i] = self.seen[i].max(v);
                        if v.saturating_sub(self.versions[i]) > self.staleness {
                            self.need_dense = true;
                        }
                    }
                    Err(s) if rpc::is_layout_refusal(&s) => {
                        if !matches!(refusal, Some(Refusal::Layout(..))) {
                            refusal = Some(Refusal::Layout(i, s));
                        }
                    }
                    Err(s) if is_transient(&s) => {
                        refusal.get_or_insert(Refusal::Unreachable(i, s));
                    }
                    Err(s) => return Err(s).with_context(|| format!("push to PS {i}")),
                }
            }
            match refusal {
                None => return Ok(()),
                Some(Refusal::Layout(i, s)) => {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    self.await_layout(i, &s, since).await?;
                }
                Some(Refusal::Unreachable(i, s)) => self.await_replacement(i, &s).await?,
            }
            if self.layout != parts_layout {
                let left = parts.into_iter().flatten();
                parts = split_parts(left, &self.slices, d)
                    .into_iter()
                    .map(|p| (!p.is_empty()).then_some(p))
                    .collect();
                parts_layout = self.layout;
            }
        }
    }

    /// Forward-only evaluation over in-memory batches: one accumulator per task, task 0
    /// first.
    pub(super) async fn evaluate(
        &mut self,
        batches: &[Batch],
        user: Option<usize>,
    ) -> anyhow::Result<Vec<EvalAccumulator>> {
        self.need_dense = true;
        let tasks = self.dense.tasks();
        let mut accs: Vec<EvalAccumulator> = (0..tasks).map(|_| EvalAccumulator::new()).collect();
        let mut probs = Vec::new();
        for b in batches {
            self.follow_layout()?;
            let routing = self.route(b)?;
            self.pull(&routing).await?;
            let n = b.len();
            probs.resize(n * tasks, 0.0);
            let emb = &self.emb[..n * self.dense.config().num_tables * self.dim];
            self.dense
                .predict_tasks(&b.dense, emb, &mut self.ws, &mut probs)?;
            crate::step::push_task_figures(&mut accs, &probs, b, user);
        }
        Ok(accs)
    }
}

/// What the model predicted for a batch before training on it (progressive validation of
/// online jobs; empty for other jobs).
#[derive(Default)]
pub(super) struct Predictions {
    /// `samples × tasks`, row-major.
    pub(super) probs: Vec<f32>,
    pub(super) labels: Vec<u8>,
    pub(super) tasks: u32,
    /// Each sample's weight; empty: 1 each.
    pub(super) weights: Vec<f32>,
}
