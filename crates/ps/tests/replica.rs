//! Dense replicas between real parameter servers over gRPC on 127.0.0.1: every server keeps
//! its predecessor's dense slice with the optimizer state, bit for bit, by the time a push
//! is answered; a server started in a failed one's place takes the slice back instead of
//! the checkpoint's; a dead successor slows nothing down and is seeded again once it is
//! back.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use elastrec_job::config::JobConfig;
use elastrec_proto::ps::{BatchKey, PushRequest, TakeReplicaRequest};
use elastrec_ps::shard::ShardSnapshot;
use elastrec_ps::PsShard;
use elastrec_rpc::{self as rpc, dense_slice, Ps};
use tokio::task::JoinHandle;

const TOKEN: &str = "replicatoken";
const MAX_BYTES: usize = 8 << 20;

/// Adam on the dense side (two state buffers and a step count, so the replica must follow
/// the owner's step count too), partial recovery.
fn job(mode: &str) -> JobConfig {
    JobConfig::from_toml(
        &format!(
            "[model]\nbottom_mlp = [16, 8]\ntop_mlp = [64, 1]\nembedding_dim = 8\n\
             table_rows = 50\n[cluster]\nps = 2\nmode = \"{mode}\"\n\
             [checkpoint]\nrecovery = \"partial\"\n\
             [optimizer.dense]\ntype = \"adam\"\nlr = 0.01\n"
        ),
        Path::new("job.toml"),
    )
    .unwrap()
}

struct Server {
    shard: Arc<PsShard>,
    addr: String,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn start(shard: PsShard) -> Self {
        let shard = Arc::new(shard);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(elastrec_ps::service::serve(
            shard.clone(),
            listener,
            TOKEN.into(),
            MAX_BYTES,
        ));
        Self { shard, addr, task }
    }

    fn client(&self) -> Ps {
        rpc::ps_client(&self.addr, TOKEN, MAX_BYTES, Duration::from_secs(30)).unwrap()
    }

    fn kill(self) {
        self.task.abort();
    }
}

/// Tells every server where the others are, as the master's heartbeat replies do.
fn publish(servers: &[&Server]) {
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    for s in servers {
        s.shard.set_peers(0, addrs.clone());
    }
}

/// Pushes `n` steps of deterministic dense gradients from worker 1 to both servers, each
/// step with its own learning-rate multiplier (a schedule): the replica must replay the
/// rates too.
async fn train(servers: &[&Server], first_step: u64, n: u64) {
    let total = servers[0].shard.range().len() + servers[1].shard.range().len();
    for step in first_step..first_step + n {
        for (j, s) in servers.iter().enumerate() {
            let range = dense_slice(total, 2, j);
            let grad: Vec<f32> = range
                .clone()
                .map(|i| ((i as u64 * 31 + step * 17) % 23) as f32 / 23.0 - 0.5)
                .collect();
            s.client()
                .push(PushRequest {
                    version: rpc::version(),
                    worker_id: 1,
                    dense_grad: grad,
                    contributors: 1,
                    batch: Some(BatchKey {
                        epoch: 1,
                        file: 0,
                        start_row: step,
                    }),
                    samples: 1,
                    lr_scale: 1.0 / (1.0 + step as f32),
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|e| panic!("push of step {step} to PS {j}: {e}"));
        }
    }
}

/// The replica `holder` keeps of `owner`'s slice, as (dense, state buffers, steps, version).
async fn replica_on(holder: &Server, owner: u32) -> (Vec<f32>, Vec<f32>, u64, u64) {
    let s = holder
        .client()
        .take_replica(TakeReplicaRequest {
            version: rpc::version(),
            owner,
            layout_version: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .state
        .unwrap_or_else(|| panic!("no replica of PS {owner}"));
    (s.dense, s.state, s.optimizer_steps, s.dense_version)
}

fn owned(s: &ShardSnapshot) -> (Vec<f32>, Vec<f32>, u64, u64) {
    (
        s.dense.clone(),
        s.dense_state.concat(),
        s.optimizer_steps,
        s.dense_version,
    )
}

fn assert_same(
    what: &str,
    got: (Vec<f32>, Vec<f32>, u64, u64),
    want: (Vec<f32>, Vec<f32>, u64, u64),
) {
    assert_eq!(
        (got.2, got.3),
        (want.2, want.3),
        "{what}: steps and version"
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.0), bits(&want.0), "{what}: dense values");
    assert_eq!(bits(&got.1), bits(&want.1), "{what}: optimizer state");
}

async fn replicas_match_after_every_push(mode: &str) {
    let job = job(mode);
    let a = Server::start(PsShard::new(&job, 0, 2).unwrap()).await;
    let b = Server::start(PsShard::new(&job, 1, 2).unwrap()).await;
    publish(&[&a, &b]);
    train(&[&a, &b], 0, 12).await;
    let (sa, sb) = (a.shard.snapshot(), b.shard.snapshot());
    assert!(sa.dense_version >= 12, "{}", sa.dense_version);
    // Answered pushes are replicated: no waiting here.
    assert_same("PS 0 on PS 1", replica_on(&b, 0).await, owned(&sa));
    assert_same("PS 1 on PS 0", replica_on(&a, 1).await, owned(&sb));

    // PS 0 dies; its replacement starts from the initial model (no checkpoint) and takes
    // its slice back from PS 1: nothing of the dense model is rewound.
    a.kill();
    let a2 = Server::start(PsShard::new(&job, 0, 2).unwrap()).await;
    let version = a2
        .shard
        .take_dense_replica(&[String::new(), b.addr.clone()], TOKEN)
        .await
        .unwrap();
    assert_eq!(version, sa.dense_version);
    assert_same("relaunched PS 0", owned(&a2.shard.snapshot()), owned(&sa));

    // Training goes on from there, and PS 1 holds the new server's updates again.
    publish(&[&a2, &b]);
    train(&[&a2, &b], 12, 5).await;
    assert_same(
        "PS 0 on PS 1 after the relaunch",
        replica_on(&b, 0).await,
        owned(&a2.shard.snapshot()),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_servers_replicate_every_dense_update() {
    replicas_match_after_every_push("async").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_servers_replicate_every_step() {
    replicas_match_after_every_push("sync").await;
}

/// A successor that is gone holds nothing up: pushes are answered (without a replica);
/// once a server runs in its place, the owner seeds it with the whole slice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_successor_is_seeded_again_once_replaced() {
    let job = job("async");
    let a = Server::start(PsShard::new(&job, 0, 2).unwrap()).await;
    let b = Server::start(PsShard::new(&job, 1, 2).unwrap()).await;
    publish(&[&a, &b]);
    train(&[&a, &b], 0, 3).await;
    b.kill();
    // PS 0 knows PS 1 only at an address where nothing listens any more, while a new PS 1
    // already takes pushes: every push is answered.
    let b2 = Server::start(PsShard::new(&job, 1, 2).unwrap()).await;
    let addr_of_dead = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    };
    a.shard.set_peers(0, vec![a.addr.clone(), addr_of_dead]);
    train(&[&a, &b2], 3, 4).await;
    publish(&[&a, &b2]);
    // The next update finds the replica gone and seeds it.
    train(&[&a, &b2], 7, 2).await;
    assert_same(
        "PS 0 on the new PS 1",
        replica_on(&b2, 0).await,
        owned(&a.shard.snapshot()),
    );
    assert!(replica_failures(&a) >= 1.0);
}

/// `server`'s count of times its replica stopped being live (`/metrics`).
fn replica_failures(server: &Server) -> f64 {
    let metrics = server.shard.metrics.render(server.shard.version());
    let index = server.shard.index();
    let name = format!("elastrec_ps_dense_replica_failures_total{{ps=\"{index}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name.as_str()))
        .unwrap_or_else(|| panic!("no {name}in {metrics}"))
        .parse()
        .unwrap()
}

/// One push of a deterministic dense gradient straight to `server` (as a worker that still
/// routes by an old address would send it); the call's outcome.
async fn push_to(
    server: &Server,
    total: usize,
    index: usize,
    step: u64,
) -> Result<(), tonic::Status> {
    let grad: Vec<f32> = dense_slice(total, 2, index)
        .map(|i| ((i as u64 * 7 + step) % 11) as f32 / 11.0 - 0.5)
        .collect();
    server
        .client()
        .push(PushRequest {
            version: rpc::version(),
            worker_id: 2,
            dense_grad: grad,
            contributors: 1,
            batch: Some(BatchKey {
                epoch: 1,
                file: 1,
                start_row: step,
            }),
            samples: 1,
            ..Default::default()
        })
        .await
        .map(|_| ())
}

/// PS 0 (node 3) is replaced by node 5 while node 3 still runs (cut off, its kill lost).
/// Whatever node 3 applies afterwards never reaches the replica its successor keeps of
/// index 0: the replacement's seed fenced it (`fenced_by_publication`: the master's
/// publication that no node runs index 0 fenced it before the replacement spoke).
async fn an_old_node_cannot_overwrite_its_replacements_replica(fenced_by_publication: bool) {
    let job = job("async");
    let a = Server::start(PsShard::new(&job, 0, 2).unwrap()).await;
    let b = Server::start(PsShard::new(&job, 1, 2).unwrap()).await;
    a.shard.set_node(3);
    b.shard.set_node(4);
    publish(&[&a, &b]);
    train(&[&a, &b], 0, 4).await;
    let total = a.shard.range().len() + b.shard.range().len();
    if fenced_by_publication {
        b.shard.fence_peers(&[0, 4]);
        push_to(&a, total, 0, 100).await.unwrap();
        assert_ne!(
            a.shard.snapshot().dense_version,
            replica_on(&b, 0).await.3,
            "node 3's update after the master stopped counting it reached the replica"
        );
    }
    let a2 = Server::start(PsShard::new(&job, 0, 2).unwrap()).await;
    a2.shard.set_node(5);
    a2.shard
        .take_dense_replica(&[String::new(), b.addr.clone()], TOKEN)
        .await
        .unwrap();
    let addrs = vec![a2.addr.clone(), b.addr.clone()];
    a2.shard.set_peers(0, addrs.clone());
    b.shard.set_peers(0, addrs);
    train(&[&a2, &b], 4, 3).await;
    let before = a.shard.snapshot().dense_version;
    // Node 3 takes more pushes and replicates them under index 0: refused by the successor.
    for step in 200..203 {
        push_to(&a, total, 0, step).await.unwrap();
    }
    assert_eq!(a.shard.snapshot().dense_version, before + 3);
    assert_same(
        "PS 0's replica on PS 1 after node 3 pushed",
        replica_on(&b, 0).await,
        owned(&a2.shard.snapshot()),
    );
    assert!(
        replica_failures(&a) >= 1.0,
        "the refused node counts its replica as failed"
    );
    // The replacement goes on replicating as before.
    train(&[&a2, &b], 7, 2).await;
    assert_same(
        "PS 0's replica on PS 1 after the replacement pushed again",
        replica_on(&b, 0).await,
        owned(&a2.shard.snapshot()),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_nodes_updates_are_refused_once_its_replacement_seeded_the_replica() {
    an_old_node_cannot_overwrite_its_replacements_replica(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_master_no_longer_counts_is_refused_before_its_replacement_speaks() {
    an_old_node_cannot_overwrite_its_replacements_replica(true).await;
}

/// A server whose lease from the master ran out (cut off from it for longer than the
/// lease) refuses pulls, pushes and checkpoints with a refusal the worker retries, and
/// changes nothing; an acknowledged heartbeat lets it serve again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_past_its_lease_serves_nothing_until_renewed() {
    let job = job("async");
    let a = Server::start(PsShard::new(&job, 0, 2).unwrap()).await;
    let b = Server::start(PsShard::new(&job, 1, 2).unwrap()).await;
    publish(&[&a, &b]);
    train(&[&a, &b], 0, 2).await;
    let total = a.shard.range().len() + b.shard.range().len();
    let before = owned(&a.shard.snapshot());
    let long_ago = std::time::Instant::now() - Duration::from_secs(10);
    a.shard.lease.arm(Duration::from_secs(3), long_ago);
    let refused = push_to(&a, total, 0, 50).await.unwrap_err();
    assert!(rpc::is_fence_refusal(&refused), "{refused:?}");
    assert!(
        rpc::is_transient(&refused),
        "a worker retries it: {refused:?}"
    );
    assert!(refused.message().contains("ms"), "{refused:?}");
    let pull = a
        .client()
        .pull(elastrec_proto::ps::PullRequest {
            version: rpc::version(),
            tables: vec![0],
            rows: vec![0],
            want_dense: true,
            layout_version: 0,
            packed: false,
        })
        .await
        .unwrap_err();
    assert!(rpc::is_fence_refusal(&pull), "{pull:?}");
    let dir = tempfile::tempdir().unwrap();
    let ckpt = a
        .client()
        .checkpoint(elastrec_proto::ps::CheckpointRequest {
            version: rpc::version(),
            id: 1,
            location: dir.path().display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(rpc::is_fence_refusal(&ckpt), "{ckpt:?}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a fenced server wrote checkpoint data"
    );
    let version = before.3;
    assert_same("PS 0 while fenced", owned(&a.shard.snapshot()), before);
    // The master answers again: the lease is renewed and the push goes through.
    a.shard.lease.renew(std::time::Instant::now());
    push_to(&a, total, 0, 51).await.unwrap();
    assert_eq!(a.shard.snapshot().dense_version, version + 1);
}
