//! Flash checkpoints of a parameter server through its own API, on a real local checkpoint
//! store: a full checkpoint followed by a CPR-MFU delta restores the hot rows to their
//! latest values and the cold ones to the full checkpoint; a restore onto another number
//! of servers gives every row back.

use std::path::Path;
use std::sync::Arc;

use elastrec_checkpoint::format::{CheckpointKind, Manifest, PartMeta};
use elastrec_checkpoint::store::CheckpointStore;
use elastrec_job::config::JobConfig;
use elastrec_proto::master::RestorePlan;
use elastrec_proto::ps::{CheckpointRequest, CheckpointResponse, PullRequest, PushRequest};
use elastrec_ps::PsShard;
use elastrec_rpc as rpc;

/// Table 0 has 1000 rows (the only "large" table at 50% coverage); 25 small ones.
fn job(priority: &str, ps: u32) -> JobConfig {
    let mut rows = vec![1000u64];
    rows.extend(std::iter::repeat_n(10, 25));
    JobConfig::from_toml(
        &format!(
            "[model]\nbottom_mlp = [8, 4]\ntop_mlp = [8, 1]\nembedding_dim = 4\ntable_rows = {rows:?}\n\
             [cluster]\nps = {ps}\n[checkpoint]\npriority = \"{priority}\"\nlarge_table_coverage = 0.5\n"
        ),
        Path::new("job.toml"),
    )
    .unwrap()
}

async fn push(ps: &PsShard, rows: &[u64], times: usize) {
    for _ in 0..times {
        ps.push(PushRequest {
            version: rpc::version(),
            worker_id: 1,
            tables: vec![0; rows.len()],
            rows: rows.to_vec(),
            grads: vec![0.5; rows.len() * 4],
            dense_grad: vec![],
            base_version: 0,
            step: 0,
            contributors: 1,
            batch: None,
            samples: 0,
            layout_version: 0,
            dense_spans: vec![],
            lr_scale: 0.0,
            loss_weight: None,
            grads_le: Vec::new(),
            dense_grad_le: Vec::new(),
        })
        .await
        .unwrap();
    }
}

fn pull(ps: &PsShard, rows: &[u64]) -> Vec<Vec<f32>> {
    let r = ps
        .pull(&PullRequest {
            version: rpc::version(),
            tables: vec![0; rows.len()],
            rows: rows.to_vec(),
            want_dense: false,
            layout_version: 0,
            packed: false,
        })
        .unwrap();
    r.values.chunks(4).map(|c| c.to_vec()).collect()
}

/// Restores `ps` from checkpoint chain `chain`, written by `num_ps` servers.
async fn restore(ps: &PsShard, store: &CheckpointStore, chain: Vec<u64>, num_ps: u32) {
    ps.restore(&RestorePlan {
        location: store.location(),
        chain,
        num_ps,
        shm_namespace: String::new(),
    })
    .await
    .unwrap();
}

async fn checkpoint(
    ps: &[&Arc<PsShard>],
    store: &CheckpointStore,
    id: u64,
    delta: bool,
    ratio: f64,
) -> Vec<CheckpointResponse> {
    let mut out = Vec::new();
    for p in ps {
        out.push(
            p.checkpoint(CheckpointRequest {
                version: rpc::version(),
                id,
                location: store.location(),
                delta,
                ratio,
                shm_namespace: String::new(),
            })
            .await
            .unwrap(),
        );
    }
    let parts = out
        .iter()
        .map(|r| PartMeta {
            name: r.part.clone(),
            bytes: r.bytes,
            checksum: r.checksum,
        })
        .collect();
    store
        .commit(&Manifest {
            id,
            created_ms: 0,
            fingerprint: "test".into(),
            kind: if delta {
                CheckpointKind::Delta { base: id - 1 }
            } else {
                CheckpointKind::Full
            },
            num_ps: ps.len() as u32,
            step: 0,
            samples: 0,
            parts,
            info: Default::default(),
        })
        .await
        .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mfu_delta_saves_hot_rows_and_restores_on_top_of_the_full_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path().to_str().unwrap()).unwrap();
    let ps = Arc::new(PsShard::new(&job("mfu", 1), 0, 1).unwrap());
    let hot: Vec<u64> = (100..105).collect();
    let cold: Vec<u64> = (500..520).collect();
    push(&ps, &hot, 3).await;
    push(&ps, &cold, 1).await;
    let full = checkpoint(&[&ps], &store, 1, false, 1.0).await;
    assert_eq!(full[0].rows, 1000 + 25 * 10);
    assert!(full[0].stall_us > 0 && full[0].bytes > 0);
    let cold_at_full = pull(&ps, &cold);
    // After the full checkpoint: hot rows 10 times, cold rows once.
    push(&ps, &hot, 10).await;
    push(&ps, &cold, 1).await;
    // k = ceil(0.01 × 1000) = 10: the 5 hot rows and the 5 lowest-index cold rows.
    let delta = checkpoint(&[&ps], &store, 2, true, 0.01).await;
    assert_eq!(
        delta[0].rows,
        10 + 25 * 10,
        "delta: 10 MFU rows + the small tables"
    );
    assert!(delta[0].bytes < full[0].bytes);
    let now_hot = pull(&ps, &hot);
    let now_cold = pull(&ps, &cold);

    let fresh = PsShard::new(&job("mfu", 1), 0, 1).unwrap();
    restore(&fresh, &store, vec![1, 2], 1).await;
    assert_eq!(pull(&fresh, &hot), now_hot, "hot rows come from the delta");
    let restored_cold = pull(&fresh, &cold);
    assert_eq!(restored_cold[..5], now_cold[..5], "selected cold rows too");
    assert_eq!(
        restored_cold[5..],
        cold_at_full[5..],
        "unselected rows keep the full checkpoint's values"
    );
    assert_ne!(restored_cold[5..], now_cold[5..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssu_delta_saves_at_most_ratio_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path().to_str().unwrap()).unwrap();
    let ps = Arc::new(PsShard::new(&job("ssu", 1), 0, 1).unwrap());
    checkpoint(&[&ps], &store, 1, false, 1.0).await;
    let touched: Vec<u64> = (0..400).collect();
    push(&ps, &touched, 4).await;
    let delta = checkpoint(&[&ps], &store, 2, true, 0.125).await;
    let large_rows = delta[0].rows - 25 * 10;
    assert!(
        large_rows > 0 && large_rows <= 125,
        "SSU saved {large_rows} rows of table 0 (cap 125)"
    );
}

/// A checkpoint of two servers restored onto three: every row of every table is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_checkpoint_restores_onto_three() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path().to_str().unwrap()).unwrap();
    let job2 = job("none", 2);
    let a = Arc::new(PsShard::new(&job2, 0, 2).unwrap());
    let b = Arc::new(PsShard::new(&job2, 1, 2).unwrap());
    let rows: Vec<u64> = (0..1000).collect();
    let owner = |r: u64, n: u32| elastrec_embedding::shard_of(0, r, n) as usize;
    for (i, s) in [&a, &b].iter().enumerate() {
        let mine: Vec<u64> = rows.iter().copied().filter(|&r| owner(r, 2) == i).collect();
        push(s, &mine, 2).await;
    }
    checkpoint(&[&a, &b], &store, 1, false, 1.0).await;
    let job3 = job("none", 3);
    let three: Vec<PsShard> = (0..3).map(|i| PsShard::new(&job3, i, 3).unwrap()).collect();
    for s in &three {
        restore(s, &store, vec![1], 2).await;
    }
    for r in (0..1000).step_by(37) {
        let before = pull([&a, &b][owner(r, 2)], &[r]);
        let after = pull(&three[owner(r, 3)], &[r]);
        assert_eq!(before, after, "row {r}");
    }
}

/// Dynamic tables (`[model.dynamic_embeddings]`): a full checkpoint holds the stored keys
/// with their rows, an MFU delta the hottest keys, and the chain restored onto three
/// servers gives the hot keys their latest values, the cold ones the full checkpoint's,
/// and a key never trained the same initial value as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_tables_checkpoint_their_keys_and_restore_onto_three() {
    let with_dynamic = |ps: u32| {
        let mut j = job("mfu", ps);
        j.model.dynamic_embeddings = Some(Default::default());
        j
    };
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path().to_str().unwrap()).unwrap();
    let ps = Arc::new(PsShard::new(&with_dynamic(1), 0, 1).unwrap());
    // The keys of ids 0, 1, ...: anywhere in the 64-bit space.
    let key = |id: u64| elastrec_embedding::row_of(0, id, elastrec_embedding::DYNAMIC_KEY_SPACE);
    let hot: Vec<u64> = (0..5).map(key).collect();
    let cold: Vec<u64> = (5..25).map(key).collect();
    let never = key(99);
    let untrained = pull(&ps, &[never]);
    push(&ps, &hot, 3).await;
    push(&ps, &cold, 1).await;
    let full = checkpoint(&[&ps], &store, 1, false, 1.0).await;
    assert_eq!(full[0].rows, 25, "the stored keys, nothing else");
    let cold_at_full = pull(&ps, &cold);
    push(&ps, &hot, 10).await;
    push(&ps, &cold, 1).await;
    // k = ceil(0.2 × 25 stored rows) = 5: the hot keys.
    let delta = checkpoint(&[&ps], &store, 2, true, 0.2).await;
    assert_eq!(delta[0].rows, 5);
    let (now_hot, now_cold) = (pull(&ps, &hot), pull(&ps, &cold));
    assert_ne!(now_cold, cold_at_full);

    let job3 = with_dynamic(3);
    let three: Vec<PsShard> = (0..3).map(|i| PsShard::new(&job3, i, 3).unwrap()).collect();
    for s in &three {
        restore(s, &store, vec![1, 2], 1).await;
    }
    let at = |k: u64| &three[elastrec_embedding::shard_of(0, k, 3) as usize];
    for (i, &k) in hot.iter().enumerate() {
        assert_eq!(pull(at(k), &[k])[0], now_hot[i], "hot key {i}");
    }
    for (i, &k) in cold.iter().enumerate() {
        assert_eq!(pull(at(k), &[k])[0], cold_at_full[i], "cold key {i}");
    }
    assert_eq!(pull(at(never), &[never]), untrained);
    // Each row's eviction statistics came back with it, from the checkpoint its values
    // came from: a hot key's 13 updates (the delta), a cold key's one (the full one).
    let usage = |k: u64| {
        let snap = at(k).snapshot();
        let t = &snap.tables[0];
        let i = t.rows.iter().position(|&r| r == k).expect("restored");
        t.usage[i]
    };
    assert_eq!((usage(hot[0]).hits, usage(cold[0]).hits), (13, 1));
}

/// A parameter server that fails and reloads its checkpoint (same layout) keeps counting
/// the ids it had seen but not admitted: with `admit_count = 2`, a key pushed once before
/// the checkpoint gets its row at its next push after the restore, as on the server that
/// never failed.
#[tokio::test]
async fn a_restored_server_keeps_its_admission_counts() {
    let mut j = job("mfu", 1);
    j.model.dynamic_embeddings = Some(elastrec_embedding::DynamicConfig {
        admit_count: 2,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path().to_str().unwrap()).unwrap();
    let live = Arc::new(PsShard::new(&j, 0, 1).unwrap());
    let key = |id: u64| elastrec_embedding::row_of(0, id, elastrec_embedding::DYNAMIC_KEY_SPACE);
    let seen: Vec<u64> = (0..20).map(key).collect();
    push(&live, &seen, 1).await;
    let stored = |ps: &PsShard| ps.snapshot().tables[0].rows.len();
    assert_eq!(stored(&live), 0, "one push of admit_count 2 admits nothing");
    checkpoint(&[&live], &store, 1, false, 1.0).await;
    let restored = PsShard::new(&j, 0, 1).unwrap();
    restore(&restored, &store, vec![1], 1).await;
    push(&live, &seen, 1).await;
    push(&restored, &seen, 1).await;
    assert_eq!(stored(&live), 20);
    assert_eq!(
        stored(&restored),
        20,
        "the restored server forgot its counts"
    );
    assert_eq!(pull(&restored, &seen), pull(&live, &seen));
}
