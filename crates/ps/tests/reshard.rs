//! Online re-sharding of real parameter servers over gRPC on 127.0.0.1, driven as the
//! master drives it (`ps.proto`): 2 servers -> 4 -> 2, with pushes before and between.
//! After each change every row (with its optimizer state) and the whole dense vector (with
//! the dense optimizer's state) must be bit-identical to a single-process store and
//! optimizer that got the same updates; requests of a layout a server does not serve are
//! refused with the layout-changing status; malformed imports are refused by field.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use elastrec_embedding::{shard_of, EmbeddingConfig, EmbeddingStore, TableScratch};
use elastrec_job::config::JobConfig;
use elastrec_job::prepare::dense_model;
use elastrec_model::DenseOptimizer;
use elastrec_proto::ps::{
    AbortRequest, BatchKey, CommitRequest, ImportRequest, ImportResponse, InfoRequest, LayoutState,
    PullRequest, PushRequest, ReshardRequest, ReshardResponse,
};
use elastrec_ps::reshard::{GrpcPeers, Peers};
use elastrec_ps::{PsError, PsShard};
use elastrec_rpc::{self as rpc, dense_slice, is_layout_refusal, Ps};
use tokio::task::JoinHandle;

const TOKEN: &str = "reshardtoken";
const DIM: usize = 16;
/// The job's message limit, the smallest allowed: the big table and the dense slices
/// take several messages per target.
const MAX_BYTES: usize = 1 << 20;

fn table_rows() -> Vec<u64> {
    let mut rows = vec![120_000u64, 1, 2, 3, 7, 50, 999, 4096];
    rows.resize(26, 33);
    rows
}

/// Asynchronous, Adam on the dense side (two state buffers and a step count), row-wise
/// Adagrad on the rows; a top MLP of about 320k parameters.
fn job(mode: &str) -> JobConfig {
    JobConfig::from_toml(
        &format!(
            "[model]\nbottom_mlp = [64, {DIM}]\ntop_mlp = [512, 256, 1]\nembedding_dim = {DIM}\n\
             table_rows = {:?}\n[cluster]\nps = 2\nmode = \"{mode}\"\nmax_message_bytes = {MAX_BYTES}\n\
             [optimizer.dense]\ntype = \"adam\"\nlr = 0.01\n",
            table_rows()
        ),
        Path::new("job.toml"),
    )
    .unwrap()
}

/// A server in this process.
struct Server {
    shard: Arc<PsShard>,
    addr: String,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn start(shard: PsShard) -> Self {
        Self::start_with_limit(shard, MAX_BYTES).await
    }

    async fn start_with_limit(shard: PsShard, max_bytes: usize) -> Self {
        let shard = Arc::new(shard);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(elastrec_ps::service::serve(
            shard.clone(),
            listener,
            TOKEN.into(),
            max_bytes,
        ));
        Self { shard, addr, task }
    }

    fn client(&self) -> Ps {
        rpc::ps_client(&self.addr, TOKEN, MAX_BYTES, Duration::from_secs(60)).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The single-process model the servers must match: one store, one dense optimizer.
struct Reference {
    store: EmbeddingStore,
    scratch: TableScratch,
    dense: Vec<f32>,
    opt: Box<dyn DenseOptimizer>,
}

impl Reference {
    fn new(job: &JobConfig) -> Self {
        let dense = dense_model(job).unwrap().params().to_vec();
        Self {
            store: EmbeddingStore::new(EmbeddingConfig {
                dim: DIM,
                rows: table_rows(),
                optimizer: job.optimizer.sparse,
                seed: job.model.seed,
                dynamic: None,
            })
            .unwrap(),
            scratch: TableScratch::default(),
            opt: job.optimizer.dense.build(dense.len()),
            dense,
        }
    }

    /// Applies a batch as the servers do: per table, rows in batch order.
    fn apply(&mut self, b: &Batch) {
        for t in 0..table_rows().len() {
            let (mut rows, mut grads) = (Vec::new(), Vec::new());
            for (i, (&bt, &r)) in b.tables.iter().zip(&b.rows).enumerate() {
                if bt as usize == t {
                    rows.push(r);
                    grads.extend_from_slice(&b.grads[i * DIM..(i + 1) * DIM]);
                }
            }
            if !rows.is_empty() {
                let table = self.store.table_mut(t).unwrap();
                table.apply_rows(&rows, &grads, &mut self.scratch).unwrap();
            }
        }
        self.opt.step(&mut self.dense, &b.dense);
    }
}

/// A batch's gradients: rows of every table (repeats included) and the dense gradient.
struct Batch {
    key: BatchKey,
    tables: Vec<u32>,
    rows: Vec<u64>,
    grads: Vec<f32>,
    dense: Vec<f32>,
}

/// A deterministic batch of `n` rows.
fn batch(seed: u64, n: usize, dense_len: usize) -> Batch {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let rows_of = table_rows();
    let (mut tables, mut rows) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        // Half the rows in the big table.
        let t = if next() % 2 == 0 {
            0
        } else {
            (next() % 26) as usize
        };
        tables.push(t as u32);
        rows.push(next() % rows_of[t]);
    }
    let mut unit = move || (next() % 2001) as f32 / 1000.0 - 1.0;
    let grads = (0..n * DIM).map(|_| unit()).collect();
    let dense = (0..dense_len).map(|_| unit() * 0.1).collect();
    Batch {
        key: BatchKey {
            epoch: 1,
            file: 0,
            start_row: seed,
        },
        tables,
        rows,
        grads,
        dense,
    }
}

/// The servers of one layout, by index.
struct Layout<'a> {
    version: u64,
    servers: Vec<&'a Server>,
}

impl Layout<'_> {
    fn count(&self) -> u32 {
        self.servers.len() as u32
    }

    fn addrs(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.clone()).collect()
    }

    /// The push of `b` to server `j`, routed by this layout.
    fn push_for(&self, b: &Batch, j: u32, worker_id: u32) -> PushRequest {
        let n = self.count();
        let (mut tables, mut rows, mut grads) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (&t, &r)) in b.tables.iter().zip(&b.rows).enumerate() {
            if shard_of(t as usize, r, n) == j {
                tables.push(t);
                rows.push(r);
                grads.extend_from_slice(&b.grads[i * DIM..(i + 1) * DIM]);
            }
        }
        PushRequest {
            version: rpc::version(),
            worker_id,
            tables,
            rows,
            grads,
            dense_grad: b.dense[dense_slice(b.dense.len(), n as usize, j as usize)].to_vec(),
            base_version: 0,
            step: 0,
            contributors: 1,
            batch: Some(b.key),
            samples: 1,
            layout_version: self.version,
            dense_spans: vec![],
            lr_scale: 0.0,
            loss_weight: None,
            grads_le: Vec::new(),
            dense_grad_le: Vec::new(),
        }
    }

    /// Pushes `b` to every server of the layout (each must accept).
    async fn push(&self, b: &Batch) {
        for (j, s) in self.servers.iter().enumerate() {
            s.client()
                .push(self.push_for(b, j as u32, 1))
                .await
                .unwrap_or_else(|e| panic!("push to PS {j} of layout {}: {e}", self.version));
        }
    }

    /// Pulls every row of every table and the whole dense vector by this layout's routing
    /// and compares them with the reference's weights.
    async fn assert_pulls_match(&self, r: &Reference) {
        let n = self.count();
        let mut clients: Vec<Ps> = self.servers.iter().map(|s| s.client()).collect();
        for (t, &rows) in table_rows().iter().enumerate() {
            for (j, c) in clients.iter_mut().enumerate() {
                let mine: Vec<u64> = (0..rows)
                    .filter(|&row| shard_of(t, row, n) == j as u32)
                    .collect();
                for part in mine.chunks(8192) {
                    let got = c
                        .pull(PullRequest {
                            version: rpc::version(),
                            tables: vec![t as u32; part.len()],
                            rows: part.to_vec(),
                            want_dense: false,
                            layout_version: self.version,
                            packed: false,
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    for (k, &row) in part.iter().enumerate() {
                        let want = r.store.table(t).unwrap().weights(row).unwrap();
                        assert_eq!(
                            &got.values[k * DIM..(k + 1) * DIM],
                            want,
                            "table {t} row {row} at PS {j} of layout {}",
                            self.version
                        );
                    }
                }
            }
        }
        let mut dense = Vec::new();
        for c in clients.iter_mut() {
            let got = c
                .pull(PullRequest {
                    version: rpc::version(),
                    tables: vec![],
                    rows: vec![],
                    want_dense: true,
                    layout_version: self.version,
                    packed: false,
                })
                .await
                .unwrap()
                .into_inner();
            dense.extend(got.dense);
        }
        assert!(
            dense == r.dense,
            "dense parameters of layout {}",
            self.version
        );
    }

    /// Compares everything the servers hold, optimizer state included, with the reference.
    fn assert_state_matches(&self, r: &Reference) {
        let mut rows_seen = 0u64;
        let (mut dense, mut state) = (Vec::new(), vec![Vec::new(); r.opt.state().len()]);
        for (j, s) in self.servers.iter().enumerate() {
            let snap = s.shard.snapshot();
            assert_eq!(
                (snap.layout.version, snap.layout.index, snap.layout.count),
                (self.version, j as u32, self.count())
            );
            for table in &snap.tables {
                let want = r.store.table(table.table).unwrap();
                for (i, &row) in table.rows.iter().enumerate() {
                    assert_eq!(
                        table.row_values(i),
                        want.row(row).unwrap(),
                        "table {} row {row} (weights and optimizer state) at PS {j} of layout {}",
                        table.table,
                        self.version
                    );
                }
                rows_seen += table.rows.len() as u64;
            }
            assert_eq!(snap.layout.range.start, dense.len());
            dense.extend(snap.dense);
            for (all, part) in state.iter_mut().zip(snap.dense_state) {
                all.extend(part);
            }
            assert_eq!(snap.optimizer_steps, r.opt.steps(), "PS {j}");
        }
        assert_eq!(rows_seen, table_rows().iter().sum::<u64>());
        assert!(
            dense == r.dense,
            "dense parameters of layout {}",
            self.version
        );
        for (b, (got, want)) in state.iter().zip(r.opt.state()).enumerate() {
            assert!(got.as_slice() == want, "dense optimizer buffer {b}");
        }
    }
}

/// What re-sharding took, over every server of the old layout.
#[derive(Debug, Default)]
struct Stats {
    /// From the first server's freeze until every server committed: the time training
    /// is paused (less the workers' switch to the new layout).
    pause: Duration,
    /// From the first Reshard call until every server committed (pre-copy included).
    total: Duration,
    bytes: u64,
    rows: u64,
    messages: u64,
    max_freeze_us: u64,
    max_frozen_us: u64,
    precopy_bytes: u64,
}

/// One round of Reshard calls on every old server, concurrently: each reply with the
/// time it arrived.
async fn reshard_round(
    old: &Layout<'_>,
    new: &Layout<'_>,
    precopy: bool,
) -> Vec<(ReshardResponse, Instant)> {
    let calls: Vec<_> = old
        .servers
        .iter()
        .map(|s| {
            let mut c = s.client();
            let req = ReshardRequest {
                version: rpc::version(),
                layout_version: new.version,
                num_ps: new.count(),
                addrs: new.addrs(),
                precopy,
            };
            tokio::spawn(async move { (c.reshard(req).await, Instant::now()) })
        })
        .collect();
    let mut out = Vec::new();
    for h in calls {
        let (r, at) = h.await.unwrap();
        out.push((r.unwrap().into_inner(), at));
    }
    out
}

/// The master's part: (a pre-copy round, then) the freezing Reshard round on every old
/// server, then CommitLayout on every server of both layouts.
async fn reshard(old: &Layout<'_>, new: &Layout<'_>, precopy: bool) -> Stats {
    let t0 = Instant::now();
    let mut stats = Stats::default();
    if precopy {
        for (r, _) in reshard_round(old, new, true).await {
            stats.precopy_bytes += r.precopy_bytes;
            assert_eq!(r.bytes, 0, "a pre-copy sends nothing frozen");
        }
    }
    let mut first_freeze: Option<Instant> = None;
    for (r, at) in reshard_round(old, new, false).await {
        // The freeze happened `frozen_us` before the reply (less its way back).
        let froze = at - Duration::from_micros(r.frozen_us);
        first_freeze = Some(first_freeze.map_or(froze, |f| f.min(froze)));
        stats.bytes += r.bytes;
        stats.rows += r.rows;
        stats.messages += r.messages;
        stats.max_freeze_us = stats.max_freeze_us.max(r.freeze_us);
        stats.max_frozen_us = stats.max_frozen_us.max(r.frozen_us);
    }
    let mut both: Vec<&Server> = new.servers.clone();
    for s in &old.servers {
        if !both.iter().any(|b| b.addr == s.addr) {
            both.push(s);
        }
    }
    for s in both {
        let r = s
            .client()
            .commit_layout(CommitRequest {
                version: rpc::version(),
                layout_version: new.version,
                addrs: new.addrs(),
            })
            .await
            .unwrap()
            .into_inner();
        let stays = new.servers.iter().any(|n| n.addr == s.addr);
        assert_eq!(r.retired, !stays, "{}", s.addr);
    }
    stats.total = t0.elapsed();
    stats.pause = first_freeze.map_or(stats.total, |f| f.elapsed());
    stats
}

fn report(what: &str, s: &Stats) {
    let gb = s.bytes as f64 / 1e9;
    eprintln!(
        "re-sharding {what}: paused {:.1} ms (first freeze to last commit; {:.1} ms from the \
         first Reshard call); frozen at most {:.1} ms, lock held to freeze at most {} us; {} \
         rows, {:.2} MB in {} messages while frozen ({:.0} ms of pause per GB moved frozen), \
         {:.2} MB pre-copied",
        s.pause.as_secs_f64() * 1e3,
        s.total.as_secs_f64() * 1e3,
        s.max_frozen_us as f64 / 1e3,
        s.max_freeze_us,
        s.rows,
        s.bytes as f64 / 1e6,
        s.messages,
        s.pause.as_secs_f64() * 1e3 / gb.max(1e-9),
        s.precopy_bytes as f64 / 1e6,
    );
}

async fn push_of_layout(s: &Server, layout: &Layout<'_>, b: &Batch) -> tonic::Status {
    let j = layout
        .servers
        .iter()
        .position(|x| x.addr == s.addr)
        .unwrap() as u32;
    s.client()
        .push(layout.push_for(b, j, 1))
        .await
        .expect_err("a push of a layout the server does not serve")
}

async fn info_state(s: &Server) -> (u64, u32, LayoutState) {
    let i = s
        .client()
        .info(InfoRequest {
            version: rpc::version(),
        })
        .await
        .unwrap()
        .into_inner();
    (i.layout_version, i.num_servers, i.state())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_become_four_then_two_and_lose_nothing() {
    let job = job("async");
    let mut reference = Reference::new(&job);
    let dense_len = reference.dense.len();
    let a0 = Server::start(PsShard::new(&job, 0, 2).unwrap()).await;
    let a1 = Server::start(PsShard::new(&job, 1, 2).unwrap()).await;
    let v0 = Layout {
        version: 0,
        servers: vec![&a0, &a1],
    };
    for seed in 1..=4 {
        let b = batch(seed, 4000, dense_len);
        v0.push(&b).await;
        reference.apply(&b);
    }
    v0.assert_state_matches(&reference);

    // 2 -> 4: two servers join layout 1.
    let j2 = Server::start(PsShard::joining(&job, 2, 4, 1).unwrap()).await;
    let j3 = Server::start(PsShard::joining(&job, 3, 4, 1).unwrap()).await;
    assert_eq!(info_state(&j2).await, (1, 4, LayoutState::Joining));
    let v1 = Layout {
        version: 1,
        servers: vec![&a0, &a1, &j2, &j3],
    };
    // Nothing is served by a joining server.
    let refused = push_of_layout(&j2, &v1, &batch(99, 10, dense_len)).await;
    assert!(is_layout_refusal(&refused), "{refused:?}");
    let stats = reshard(&v0, &v1, false).await;
    report("2 -> 4", &stats);
    assert_eq!(stats.rows, table_rows().iter().sum::<u64>());
    assert!(stats.messages > 4 * 26, "{stats:?}");
    for s in &v1.servers {
        assert_eq!(info_state(s).await, (1, 4, LayoutState::Serving));
    }
    v1.assert_state_matches(&reference);
    v1.assert_pulls_match(&reference).await;
    // A request of the old layout is refused with the layout-changing status.
    let old = push_of_layout(&a0, &v0, &batch(98, 10, dense_len)).await;
    assert!(is_layout_refusal(&old), "{old:?}");
    assert!(old.message().contains("layout 0"), "{}", old.message());
    // It names the new layout, so a worker switches without waiting for the master.
    assert_eq!(rpc::refusal_layout(&old), Some((1, v1.addrs())));
    let pull = a1
        .client()
        .pull(PullRequest {
            version: rpc::version(),
            tables: vec![],
            rows: vec![],
            want_dense: true,
            layout_version: 0,
            packed: false,
        })
        .await
        .unwrap_err();
    assert!(is_layout_refusal(&pull), "{pull:?}");

    for seed in 5..=7 {
        let b = batch(seed, 4000, dense_len);
        v1.push(&b).await;
        reference.apply(&b);
    }
    v1.assert_state_matches(&reference);

    // 4 -> 2 with pre-copy: servers 2 and 3 retire.
    let v2 = Layout {
        version: 2,
        servers: vec![&a0, &a1],
    };
    let stats = reshard(&v1, &v2, true).await;
    report("4 -> 2 (pre-copy)", &stats);
    // Nothing changed during the pre-copy, so nothing is sent again while frozen.
    assert_eq!(stats.rows, 0, "{stats:?}");
    assert!(stats.precopy_bytes > 0);
    assert_eq!(info_state(&j3).await.2, LayoutState::Retired);
    let gone = push_of_layout(&j3, &v1, &batch(97, 10, dense_len)).await;
    assert!(is_layout_refusal(&gone), "{gone:?}");
    assert_eq!(rpc::refusal_layout(&gone), Some((2, v2.addrs())));
    v2.assert_state_matches(&reference);
    v2.assert_pulls_match(&reference).await;
    let b = batch(8, 4000, dense_len);
    v2.push(&b).await;
    reference.apply(&b);
    v2.assert_state_matches(&reference);
}

/// A `Peers` that runs `hook` (once) before delivering the first message of the pass in
/// which `source` is in `phase`, as training does meanwhile.
struct Hooked {
    inner: GrpcPeers,
    source: Arc<PsShard>,
    hooks: parking_lot::Mutex<Vec<(LayoutState, Hook)>>,
}

type Hook = Box<dyn FnOnce() -> Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

#[tonic::async_trait]
impl Peers for Hooked {
    async fn import(&self, target: u32, req: ImportRequest) -> Result<ImportResponse, PsError> {
        let phase = self.source.layout().phase.state();
        let hook = {
            let mut hooks = self.hooks.lock();
            let i = hooks.iter().position(|(p, _)| *p == phase);
            i.map(|i| hooks.remove(i).1)
        };
        if let Some(h) = hook {
            h().await;
        }
        self.inner.import(target, req).await
    }
}

/// Pre-copy while training goes on: a push that arrives during server 0's pre-copy is in
/// the new layout (its rows are marked and sent again once frozen, and only those), and a
/// push that arrives once it is frozen is refused. Then an aborted re-sharding leaves the
/// old servers serving exactly what they froze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_updated_during_the_precopy_are_sent_again_once_frozen() {
    let job = job("async");
    let mut reference = Reference::new(&job);
    let dense_len = reference.dense.len();
    let a0 = Server::start(PsShard::new(&job, 0, 2).unwrap()).await;
    let a1 = Server::start(PsShard::new(&job, 1, 2).unwrap()).await;
    let v0 = Layout {
        version: 0,
        servers: vec![&a0, &a1],
    };
    let b = batch(1, 3000, dense_len);
    v0.push(&b).await;
    reference.apply(&b);

    // An aborted re-sharding first: nothing changes, the old layout serves again.
    let j2 = Server::start(PsShard::joining(&job, 2, 3, 1).unwrap()).await;
    let v1 = Layout {
        version: 1,
        servers: vec![&a0, &a1, &j2],
    };
    for s in &v0.servers {
        s.client()
            .reshard(ReshardRequest {
                version: rpc::version(),
                layout_version: 1,
                num_ps: 3,
                addrs: v1.addrs(),
                precopy: false,
            })
            .await
            .unwrap();
    }
    let frozen = push_of_layout(&a0, &v0, &batch(90, 10, dense_len)).await;
    assert!(is_layout_refusal(&frozen), "{frozen:?}");
    for s in [&a0, &a1, &j2] {
        s.client()
            .abort_layout(AbortRequest {
                version: rpc::version(),
                layout_version: 1,
            })
            .await
            .unwrap();
    }
    assert_eq!(info_state(&a0).await, (0, 2, LayoutState::Serving));
    assert_eq!(info_state(&j2).await, (1, 3, LayoutState::Joining));
    let b = batch(2, 3000, dense_len);
    v0.push(&b).await;
    reference.apply(&b);
    v0.assert_state_matches(&reference);

    // Now for real, server by server; server 0 pre-copies while a push arrives.
    let during = batch(3, 3000, dense_len);
    let late = batch(4, 10, dense_len);
    let peers = Hooked {
        inner: GrpcPeers::new(&a0.shard, &v1.addrs()).unwrap(),
        source: a0.shard.clone(),
        hooks: parking_lot::Mutex::new(Vec::new()),
    };
    let layout_addrs = [a0.addr.clone(), a1.addr.clone()];
    // Pushes `b` to both servers of layout 0, as a worker that does not know better.
    let v0_push = move |b: Batch| {
        let addrs = layout_addrs.clone();
        async move {
            let mut results = Vec::new();
            for (j, addr) in addrs.iter().enumerate() {
                let mut c =
                    rpc::ps_client(addr, TOKEN, MAX_BYTES, Duration::from_secs(60)).unwrap();
                results.push(c.push(route_v0(&b, j as u32)).await);
            }
            results
        }
    };
    {
        let mut hooks = peers.hooks.lock();
        let push = v0_push.clone();
        let during = batch(3, 3000, dense_len);
        hooks.push((
            LayoutState::Serving,
            Box::new(move || {
                Box::pin(async move {
                    for r in push(during).await {
                        r.expect("a push during the pre-copy is applied");
                    }
                })
            }),
        ));
        let push = v0_push.clone();
        let late = batch(4, 10, dense_len);
        hooks.push((
            LayoutState::Frozen,
            Box::new(move || {
                Box::pin(async move {
                    let r = push(late).await;
                    let e = r[0].as_ref().expect_err("a push to a frozen server");
                    assert!(is_layout_refusal(e), "{e:?}");
                    r[1].as_ref().expect("server 1 still serves layout 0");
                })
            }),
        ));
    }
    let peers: Arc<Hooked> = Arc::new(peers);
    let call = |precopy| ReshardRequest {
        version: rpc::version(),
        layout_version: 1,
        num_ps: 3,
        addrs: v1.addrs(),
        precopy,
    };
    let pre = a0.shard.reshard(call(true), peers.clone()).await.unwrap();
    let r0 = a0.shard.reshard(call(false), peers.clone()).await.unwrap();
    assert!(peers.hooks.lock().is_empty(), "both hooks ran");
    // Server 1 accepted both pushes (it was serving); server 0 only the first.
    reference.apply(&during);
    assert_eq!(pre.precopy_rows, a0.shard.rows_held());
    assert_eq!((pre.rows, r0.precopy_rows), (0, 0));
    let touched: std::collections::HashSet<(u32, u64)> = during
        .tables
        .iter()
        .zip(&during.rows)
        .filter(|(&t, &r)| shard_of(t as usize, r, 2) == 0)
        .map(|(&t, &r)| (t, r))
        .collect();
    assert!(
        r0.rows as usize <= touched.len(),
        "{} rows sent again, {} touched",
        r0.rows,
        touched.len()
    );
    eprintln!(
        "pre-copy of PS 0: {} rows before the freeze, {} rows (of {} touched meanwhile) \
         after; frozen {:.1} ms",
        pre.precopy_rows,
        r0.rows,
        touched.len(),
        r0.frozen_us as f64 / 1e3
    );
    // Server 1's part of `late` was applied before it froze: the worker would re-split
    // only server 0's part to the new layout. Here it is sent to layout 1 as a partial push.
    let r1 = a1
        .client()
        .reshard(ReshardRequest {
            version: rpc::version(),
            layout_version: 1,
            num_ps: 3,
            addrs: v1.addrs(),
            precopy: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r1.precopy_rows, 0);
    for s in &v1.servers {
        s.client()
            .commit_layout(CommitRequest {
                version: rpc::version(),
                layout_version: 1,
                addrs: v1.addrs(),
            })
            .await
            .unwrap();
    }
    // The worker that pushed `late` died; the batch went to worker 5, which pushes it
    // whole by layout 1: every server skips what server 1 of layout 0 applied (its rows and
    // dense slice) and applies server 0's part.
    for (j, s) in v1.servers.iter().enumerate() {
        s.client()
            .push(v1.push_for(&late, j as u32, 5))
            .await
            .unwrap();
    }
    reference.apply(&late);
    v1.assert_state_matches(&reference);
    v1.assert_pulls_match(&reference).await;
    // Had the first worker lived, it would have re-split server 0's part by layout 1 (dense
    // as spans): applied already, so skipped.
    for (j, s) in v1.servers.iter().enumerate() {
        let req = rest_of(&late, 0, 2, &v1, j as u32);
        s.client().push(req).await.unwrap();
    }
    v1.assert_state_matches(&reference);
    assert!(v1.servers.iter().all(|s| s.shard.repeated_pushes() >= 1));
}

/// The push of `b` to server `j` of layout 0 (two servers).
fn route_v0(b: &Batch, j: u32) -> PushRequest {
    let (mut tables, mut rows, mut grads) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (&t, &r)) in b.tables.iter().zip(&b.rows).enumerate() {
        if shard_of(t as usize, r, 2) == j {
            tables.push(t);
            rows.push(r);
            grads.extend_from_slice(&b.grads[i * DIM..(i + 1) * DIM]);
        }
    }
    PushRequest {
        version: rpc::version(),
        worker_id: 1,
        tables,
        rows,
        grads,
        dense_grad: b.dense[dense_slice(b.dense.len(), 2, j as usize)].to_vec(),
        base_version: 0,
        step: 0,
        contributors: 1,
        batch: Some(b.key),
        samples: 1,
        layout_version: 0,
        dense_spans: vec![],
        lr_scale: 0.0,
        loss_weight: None,
        grads_le: Vec::new(),
        dense_grad_le: Vec::new(),
    }
}

/// The part of `b` that server `source` of the old layout (`old_count` servers) refused,
/// routed to server `j` of `new`: its rows, and its dense slice cut by `j`'s slice.
fn rest_of(b: &Batch, source: u32, old_count: u32, new: &Layout<'_>, j: u32) -> PushRequest {
    let n = new.count();
    let (mut tables, mut rows, mut grads) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (&t, &r)) in b.tables.iter().zip(&b.rows).enumerate() {
        if shard_of(t as usize, r, old_count) == source && shard_of(t as usize, r, n) == j {
            tables.push(t);
            rows.push(r);
            grads.extend_from_slice(&b.grads[i * DIM..(i + 1) * DIM]);
        }
    }
    let total = b.dense.len();
    let held = dense_slice(total, old_count as usize, source as usize);
    let mine = dense_slice(total, n as usize, j as usize);
    let (lo, hi) = (held.start.max(mine.start), held.end.min(mine.end));
    let (dense_grad, dense_spans) = if lo < hi {
        (
            b.dense[lo..hi].to_vec(),
            vec![elastrec_proto::ps::DenseSpan {
                start: lo as u64,
                len: (hi - lo) as u64,
            }],
        )
    } else {
        (vec![], vec![])
    };
    PushRequest {
        version: rpc::version(),
        worker_id: 1,
        tables,
        rows,
        grads,
        dense_grad,
        base_version: 0,
        step: 0,
        contributors: 1,
        batch: Some(b.key),
        samples: 1,
        layout_version: new.version,
        dense_spans,
        lr_scale: 0.0,
        loss_weight: None,
        grads_le: Vec::new(),
        dense_grad_le: Vec::new(),
    }
}

/// A server of the old layout that was declared dead and replaced may still send its
/// part of a re-sharding: the receiver knows the index's newer node (from the master) and
/// refuses it, staging nothing, while the current node's part is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_from_a_replaced_server_is_refused_and_stages_nothing() {
    let job = job("async");
    let j2 = Server::start(PsShard::joining(&job, 2, 4, 1).unwrap()).await;
    // The master says index 0 of the old layout now runs node 7 (node 6 was replaced).
    j2.shard.fence_peers(&[7, 8]);
    // Rows 2 and 6 of table 0: held by PS 0 of 2, bound for PS 2 of 4.
    assert_eq!((shard_of(0, 6, 2), shard_of(0, 6, 4)), (0, 2));
    let import = |source_node, row| ImportRequest {
        version: rpc::version(),
        layout_version: 1,
        num_ps: 4,
        target: 2,
        source: 0,
        source_count: 2,
        source_node,
        table: 0,
        rows: vec![row],
        values: vec![0.5; DIM + 1],
        ..Default::default()
    };
    let mut c = j2.client();
    let e = c.import_shard(import(6, 2)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("node 6"), "{}", e.message());
    let ok = c.import_shard(import(7, 6)).await.unwrap().into_inner();
    assert_eq!(
        ok.rows_staged, 1,
        "the refusal staged nothing: one row in all"
    );
}

/// Every field of an import is checked against the routing and the sizes; a refused
/// import names the field and stages nothing; a commit before everything arrived is
/// refused; a synchronous job refuses re-sharding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_imports_are_refused_by_field() {
    let job = job("async");
    let j2 = Server::start(PsShard::joining(&job, 2, 4, 1).unwrap()).await;
    let stride = DIM + 1; // row-wise Adagrad: one accumulator per row
                          // Row 0 of table 0 was held by PS 0 of 2 and belongs to PS 0 of 4; row 2 to PS 2 of 4.
    assert_eq!((shard_of(0, 2, 2), shard_of(0, 2, 4)), (0, 2));
    assert_eq!(shard_of(0, 4, 4), 0);
    let base = ImportRequest {
        version: rpc::version(),
        layout_version: 1,
        num_ps: 4,
        target: 2,
        source: 0,
        source_count: 2,
        table: 0,
        rows: vec![2],
        values: vec![0.5; stride],
        ..Default::default()
    };
    let mut c = j2.client();
    let cases = [
        (
            ImportRequest {
                rows: vec![4],
                ..base.clone()
            },
            "rows",
            "belongs to PS 0 of layout 1",
        ),
        (
            ImportRequest {
                rows: vec![3],
                ..base.clone()
            },
            "rows",
            "was held by PS 1",
        ),
        (
            ImportRequest {
                rows: vec![120_000],
                ..base.clone()
            },
            "rows",
            "out of range",
        ),
        (
            ImportRequest {
                values: vec![0.5; stride - 1],
                ..base.clone()
            },
            "values",
            "16 floats for 1 rows of 17",
        ),
        (
            ImportRequest {
                values: vec![f32::NAN; stride],
                ..base.clone()
            },
            "values",
            "non-finite",
        ),
        (
            ImportRequest {
                table: 26,
                ..base.clone()
            },
            "table",
            "does not exist",
        ),
        (
            ImportRequest {
                target: 3,
                ..base.clone()
            },
            "target",
            "this is PS 2",
        ),
        (
            ImportRequest {
                layout_version: 2,
                ..base.clone()
            },
            "layout_version",
            "joins layout 1",
        ),
        (
            ImportRequest {
                source: 2,
                ..base.clone()
            },
            "source",
            "does not exist",
        ),
        (
            ImportRequest {
                rows: vec![],
                values: vec![],
                dense_start: 0,
                dense: vec![1.0; 3],
                dense_state: vec![0.0; 6],
                ..base.clone()
            },
            "dense_start",
            "is not inside",
        ),
    ];
    for (req, field, says) in cases {
        let e = c.import_shard(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{field}: {e:?}");
        assert!(
            e.message()
                .starts_with(&format!("ImportShard field `{field}`: ")),
            "{field}: {}",
            e.message()
        );
        assert!(e.message().contains(says), "{field}: {}", e.message());
    }
    // Dense of the right range but without its optimizer state (Adam: two buffers).
    let total = dense_model(&job).unwrap().num_params();
    let start = dense_slice(total, 4, 2).start;
    let e = c
        .import_shard(ImportRequest {
            source: 1,
            rows: vec![],
            values: vec![],
            dense_start: start as u64,
            dense: vec![1.0; 3],
            dense_state: vec![0.0; 3],
            ..base.clone()
        })
        .await
        .unwrap_err();
    assert!(
        e.message().starts_with("ImportShard field `dense_state`"),
        "{}",
        e.message()
    );
    // Nothing was staged by the refusals; a valid message is.
    let ok = c.import_shard(base.clone()).await.unwrap().into_inner();
    assert_eq!((ok.rows_staged, ok.dense_staged), (1, 0));
    let e = c
        .commit_layout(CommitRequest {
            version: rpc::version(),
            layout_version: 1,
            addrs: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("has not finished sending"), "{e:?}");

    // Synchronous mode refuses re-sharding, with the reason.
    let sync = Server::start(PsShard::new(&job_sync(), 0, 2).unwrap()).await;
    let e = sync
        .client()
        .reshard(ReshardRequest {
            version: rpc::version(),
            layout_version: 1,
            num_ps: 1,
            addrs: vec![sync.addr.clone()],
            precopy: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("synchronous mode"), "{e:?}");
}

/// Every stored row of every server of `layout`: `(table, key)` → weights and optimizer
/// state, checking that each is held by the server the layout routes it to.
fn held_rows(layout: &Layout<'_>) -> std::collections::BTreeMap<(usize, u64), Vec<f32>> {
    let mut out = std::collections::BTreeMap::new();
    for (j, s) in layout.servers.iter().enumerate() {
        for table in &s.shard.snapshot().tables {
            for (i, &key) in table.rows.iter().enumerate() {
                assert_eq!(shard_of(table.table, key, layout.count()), j as u32);
                let values = table.row_values(i).to_vec();
                assert!(out.insert((table.table, key), values).is_none());
            }
        }
    }
    out
}

/// The usage (eviction statistics) of every dynamic row the layout holds.
fn held_usage(
    layout: &Layout<'_>,
) -> std::collections::BTreeMap<(usize, u64), elastrec_embedding::RowUsage> {
    let mut out = std::collections::BTreeMap::new();
    for s in &layout.servers {
        for table in &s.shard.snapshot().tables {
            assert_eq!(table.usage.len(), table.rows.len());
            for (&key, &u) in table.rows.iter().zip(&table.usage) {
                out.insert((table.table, key), u);
            }
        }
    }
    out
}

/// Dynamic tables (`[model.dynamic_embeddings]`) move too. Their slots move while they
/// serve, so a pre-copy request sends nothing; once frozen, each server plans from the keys
/// it holds and sends them, and each new server checks that every sender's rows arrived
/// (`ImportDone.rows_sent`). 2 -> 3: every row held before is held after, by its new owner,
/// weights and optimizer state bit for bit, with its eviction statistics, and training
/// goes on in the new layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_tables_move_to_a_new_layout_by_key() {
    let job = job_dynamic();
    let dense_len = dense_model(&job).unwrap().params().len();
    let a0 = Server::start(PsShard::new(&job, 0, 2).unwrap()).await;
    let a1 = Server::start(PsShard::new(&job, 1, 2).unwrap()).await;
    let v0 = Layout {
        version: 0,
        servers: vec![&a0, &a1],
    };
    for seed in 1..=3 {
        v0.push(&batch(seed, 4000, dense_len)).await;
    }
    let before = held_rows(&v0);
    assert!(before.len() > 3000, "{} rows", before.len());
    let usage = held_usage(&v0);
    assert!(usage.values().any(|u| u.hits > 1) && usage.values().any(|u| u.idle > 0));
    let j2 = Server::start(PsShard::joining(&job, 2, 3, 1).unwrap()).await;
    let v1 = Layout {
        version: 1,
        servers: vec![&a0, &a1, &j2],
    };
    let stats = reshard(&v0, &v1, true).await;
    report("2 -> 3 (dynamic tables)", &stats);
    assert_eq!(stats.precopy_bytes, 0, "{stats:?}");
    assert_eq!(stats.rows, before.len() as u64, "{stats:?}");
    for s in &v1.servers {
        assert_eq!(info_state(s).await, (1, 3, LayoutState::Serving));
    }
    assert!(held_rows(&v1) == before, "the rows moved unchanged");
    assert!(held_usage(&v1) == usage, "the rows' usage moved with them");
    let b = batch(4, 4000, dense_len);
    v1.push(&b).await;
    assert!(held_rows(&v1) != before, "the new layout trains");
}

fn job_dynamic() -> JobConfig {
    let mut j = job("async");
    j.model.dynamic_embeddings = Some(Default::default());
    j
}

fn job_sync() -> JobConfig {
    job("sync")
}

/// The pause per gigabyte moved, on a larger shard (`ELASTREC_RESHARD_MB`, default 256 MB
/// of rows with their optimizer state) with the default 64 MiB message limit, compared
/// with a plain memory copy of the same bytes. A measurement, not a check: run with
/// `cargo test -p elastrec-ps --test reshard -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn pause_per_gigabyte() {
    let mb: u64 = std::env::var("ELASTREC_RESHARD_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let dim = 64;
    // Row-wise Adagrad: dim + 1 floats a row.
    let big = mb * 1_000_000 / ((dim as u64 + 1) * 4);
    let mut rows = vec![big];
    rows.resize(26, 1000);
    let job = JobConfig::from_toml(
        &format!(
            "[model]\nbottom_mlp = [64, {dim}]\ntop_mlp = [64, 1]\nembedding_dim = {dim}\n\
             table_rows = {rows:?}\n[cluster]\nps = 2\n"
        ),
        Path::new("job.toml"),
    )
    .unwrap();
    let limit = job.cluster.max_message_bytes;
    let start = |s| Server::start_with_limit(s, limit);
    let a0 = start(PsShard::new(&job, 0, 2).unwrap()).await;
    let a1 = start(PsShard::new(&job, 1, 2).unwrap()).await;
    let j2 = start(PsShard::joining(&job, 2, 4, 1).unwrap()).await;
    let j3 = start(PsShard::joining(&job, 3, 4, 1).unwrap()).await;
    let v0 = Layout {
        version: 0,
        servers: vec![&a0, &a1],
    };
    let v1 = Layout {
        version: 1,
        servers: vec![&a0, &a1, &j2, &j3],
    };
    let v2 = Layout {
        version: 2,
        servers: vec![&a0, &a1],
    };
    let stats = reshard(&v0, &v1, false).await;
    report(&format!("2 -> 4, {mb} MB"), &stats);
    let copy = vec![1.0f32; (stats.bytes / 4) as usize];
    let t0 = Instant::now();
    let copied = std::hint::black_box(copy.clone());
    let memcpy = t0.elapsed();
    drop(copied);
    eprintln!(
        "a memory copy of the {:.0} MB moved takes {:.1} ms ({:.0} ms per GB); the pause is \
         {:.1}x that",
        stats.bytes as f64 / 1e6,
        memcpy.as_secs_f64() * 1e3,
        memcpy.as_secs_f64() * 1e3 / (stats.bytes as f64 / 1e9),
        stats.pause.as_secs_f64() / memcpy.as_secs_f64()
    );
    let stats = reshard(&v1, &v2, true).await;
    report(
        &format!("4 -> 2 with pre-copy, {mb} MB, no training meanwhile"),
        &stats,
    );
}
