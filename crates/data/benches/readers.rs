//! Reader and generator throughput.
//!
//! `cargo bench -p elastrec-data --bench readers`. Data is generated once into a temp dir
//! (scale 0.01, like a small benchmark data set).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use elastrec_data::{
    generate, open_reader_range, BadRowPolicy, BatchReader, GenSpec, OutputFormat, ParquetReader,
    RowShuffle, ShuffledReader, TsvReader,
};
use std::io::Write;
use std::path::Path;

const ROWS: u64 = 200_000;
const BATCH: usize = 4096;

fn drain(mut r: impl BatchReader) -> usize {
    let mut b = elastrec_data::criteo::batch(BATCH);
    let mut n = 0;
    loop {
        let k = r.next_batch(&mut b, BATCH).unwrap();
        if k == 0 {
            return n;
        }
        n += k;
    }
}

fn spec(out: &Path, format: OutputFormat) -> GenSpec {
    GenSpec {
        out: out.to_path_buf(),
        rows: ROWS,
        format,
        seed: 1,
        days: 1,
        scale: 0.01,
        drift: 0.0,
        conversions: false,
    }
}

fn readers(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    generate(&spec(dir.path(), OutputFormat::Tsv)).unwrap();
    let tsv = dir.path().join("day_0.tsv");
    let pq_dir = dir.path().join("pq");
    generate(&spec(&pq_dir, OutputFormat::Parquet)).unwrap();
    let pq = pq_dir.join("day_0.parquet");
    let gz = dir.path().join("day_0.tsv.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(&std::fs::read(&tsv).unwrap()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let bytes = std::fs::metadata(&tsv).unwrap().len();

    let mut g = c.benchmark_group("read_rows");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ROWS));
    g.bench_function("tsv_plain", |b| {
        b.iter(|| {
            assert_eq!(
                drain(TsvReader::open(&tsv, BadRowPolicy::Fail).unwrap()),
                ROWS as usize
            )
        })
    });
    g.bench_function("tsv_gzip", |b| {
        b.iter(|| {
            assert_eq!(
                drain(TsvReader::open(&gz, BadRowPolicy::Fail).unwrap()),
                ROWS as usize
            )
        })
    });
    g.bench_function("parquet", |b| {
        b.iter(|| {
            assert_eq!(
                drain(ParquetReader::open(&pq, BadRowPolicy::Fail).unwrap()),
                ROWS as usize
            )
        })
    });
    g.finish();

    let mut g = c.benchmark_group("read_bytes");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("tsv_plain", |b| {
        b.iter(|| drain(TsvReader::open(&tsv, BadRowPolicy::Fail).unwrap()))
    });
    g.finish();

    // Opening a small shard near the end of the file: indexed seek vs scan.
    let mut g = c.benchmark_group("open_range_tail_1000_rows");
    g.sample_size(20);
    let unindexed = dir.path().join("copy.tsv");
    std::fs::copy(&tsv, &unindexed).unwrap();
    elastrec_data::count_rows(&tsv).unwrap(); // builds day_0.tsv.idx
    for (name, path) in [("indexed", &tsv), ("scan", &unindexed)] {
        g.bench_with_input(BenchmarkId::from_parameter(name), path, |b, p| {
            b.iter(|| drain(open_reader_range(p, ROWS - 1000, ROWS, BadRowPolicy::Fail).unwrap()))
        });
    }
    g.finish();

    // What `train.shuffle_buffer` costs a worker of `elastrec run`: the file's shards of
    // 8,192 rows read in file order, or each read whole and delivered in a seeded order.
    let mut g = c.benchmark_group("shards_of_8192_rows");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ROWS));
    const SHARD: u64 = 8192;
    let shards = || {
        (0..ROWS)
            .step_by(SHARD as usize)
            .map(|s| (s, (s + SHARD).min(ROWS)))
    };
    g.bench_function("file_order", |b| {
        b.iter(|| {
            shards()
                .map(|(s, e)| drain(open_reader_range(&tsv, s, e, BadRowPolicy::Fail).unwrap()))
                .sum::<usize>()
        })
    });
    g.bench_function("shuffled", |b| {
        b.iter(|| {
            shards()
                .map(|(s, e)| {
                    let path = tsv.clone();
                    let open: elastrec_data::shuffled::RangeOpener =
                        Box::new(move |s, e| open_reader_range(&path, s, e, BadRowPolicy::Fail));
                    let shuffle = RowShuffle {
                        block_rows: SHARD,
                        file_rows: ROWS,
                        seed: 3,
                    };
                    drain(ShuffledReader::new(open, shuffle, s, e).unwrap())
                })
                .sum::<usize>()
        })
    });
    g.finish();
}

fn generator(c: &mut Criterion) {
    let mut g = c.benchmark_group("generate");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ROWS));
    for format in [OutputFormat::Tsv, OutputFormat::Parquet] {
        g.bench_function(format.extension(), |b| {
            b.iter(|| {
                let dir = tempfile::tempdir().unwrap();
                generate(&spec(dir.path(), format)).unwrap().rows
            })
        });
    }
    g.finish();
}

criterion_group!(benches, readers, generator);
criterion_main!(benches);
