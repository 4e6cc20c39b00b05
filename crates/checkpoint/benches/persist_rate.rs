//! Background persistence rate of checkpoint parts: `put_part` of one 256 MiB part (the
//! size of a large PS shard), checksum included, to a local directory (fsynced) and to a
//! real S3-compatible server (moto_server on loopback), as the default concurrent multipart
//! upload and as one PUT. Throughput is reported in bytes/s.
//!
//! `cargo bench -p elastrec-checkpoint --bench persist_rate`. Fails when moto_server is not
//! installed (`pip install 'moto[server]'`).

use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use elastrec_checkpoint::store::CheckpointStore;

#[allow(dead_code)]
#[path = "../tests/integration/moto.rs"]
mod moto;

const PART_BYTES: usize = 256 << 20;

fn part() -> Bytes {
    (0..PART_BYTES)
        .map(|i| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes()[7])
        .collect::<Vec<_>>()
        .into()
}

fn bench_store(c: &mut Criterion, name: &str, store: &CheckpointStore, bytes: &Bytes) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("persist_rate");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(30))
        .throughput(Throughput::Bytes(PART_BYTES as u64));
    group.bench_function(name, |b| {
        b.iter(|| {
            rt.block_on(store.put_part(1, "ps-0", bytes.clone()))
                .expect("put_part")
        })
    });
    group.finish();
}

fn persist_rate(c: &mut Criterion) {
    let bytes = part();
    let dir = tempfile::tempdir().expect("temp dir");
    let local =
        CheckpointStore::open(dir.path().to_str().expect("utf-8 temp dir")).expect("local store");
    bench_store(c, "local_dir_256MiB", &local, &bytes);

    moto::set_credentials_env();
    let moto = moto::Moto::start();
    moto.create_bucket("bench");
    let s3 = CheckpointStore::open(&moto.url("bench", "persist")).expect("s3 store");
    bench_store(c, "moto_s3_256MiB_multipart", &s3, &bytes);
    let single = s3.with_multipart(usize::MAX, 16 << 20);
    bench_store(c, "moto_s3_256MiB_single_put", &single, &bytes);
}

criterion_group!(benches, persist_rate);
criterion_main!(benches);
