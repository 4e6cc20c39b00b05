//! Reading Parquet with named columns and lists (`gen-data --named`: 2 string ids, 2
//! integer ids, a float, a genre list and a history of up to 30 items per row) into
//! jagged batches, beside the Criteo-layout Parquet reader on the same machine; and the
//! bytes the named reader allocates per row once its buffers have grown. The same log as
//! CSV with a header, read through the same schema. The generated file has 13 row
//! groups, which the reader decodes on up to 4 threads; the same rows rewritten as one
//! row group are decoded on the reading thread alone, the serial peer. And the same file
//! through the schema with three features of their own chains added (`data.feature.ops`:
//! the price bucketized, the user hashed, the history's 2-grams).
//!
//! `cargo bench -p elastrec-data --bench named`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use elastrec_data::gen::named::{generate_named, NamedSpec};
use elastrec_data::schema::infer;
use elastrec_data::{
    generate, open_source, BadRowPolicy, Batch, BatchReader, GenSpec, OutputFormat, Schema,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts the bytes every allocation asks for.
struct Counting;

static ALLOCATED: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ROWS: u64 = 200_000;
const BATCH: usize = 4096;

/// `src` rewritten to `dst` as a single row group.
fn one_row_group(src: &Path, dst: &Path) {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(src).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(ROWS as usize))
        .build();
    let out = std::fs::File::create(dst).unwrap();
    let schema = arrow_array::RecordBatchReader::schema(&reader);
    let mut w = ArrowWriter::try_new(out, schema, Some(props)).unwrap();
    for b in reader {
        w.write(&b.unwrap()).unwrap();
    }
    w.close().unwrap();
}

/// Reads `path` whole; returns its rows and list items.
fn drain(path: &Path, schema: Option<&Arc<Schema>>, batch: &mut Batch) -> (usize, usize) {
    let mut r = open_source(path, None, BadRowPolicy::Fail, schema).unwrap();
    let (mut rows, mut items) = (0, 0);
    loop {
        let k = r.next_batch(batch, BATCH).unwrap();
        if k == 0 {
            return (rows, items);
        }
        rows += k;
        items += batch.bags.iter().map(|b| b.ids.len()).sum::<usize>();
    }
}

/// `schema` with three more features, each with a chain of its own (`chains`), or the
/// same columns read again as plain features (the peer: what reading them costs without
/// a chain).
fn with_chains(schema: &Schema, chains: bool) -> Schema {
    use elastrec_data::{FeatureKind, FeatureSpec};
    let mut s = schema.clone();
    let mut add = |name: &str, column: &str, kind, ops: &[&str]| {
        let plain = if kind == FeatureKind::Categorical && column == "price" {
            FeatureKind::Dense
        } else {
            kind
        };
        let mut f = FeatureSpec::new(name, if chains { kind } else { plain });
        f.column = Some(column.into());
        if chains {
            f.ops = ops.iter().map(|o| o.to_string()).collect();
        }
        if kind == FeatureKind::Sequence {
            f.max_len = Some(30);
        }
        s.features.push(f);
    };
    add(
        "price_band",
        "price",
        FeatureKind::Categorical,
        &["bucketize([5, 10, 20, 50, 100])"],
    );
    add(
        "user_hashed",
        "user_id",
        FeatureKind::Categorical,
        &["sigrid_hash(3, 4000)"],
    );
    add(
        "hist_pairs",
        "hist_items",
        FeatureKind::Sequence,
        &["ngram(2)"],
    );
    s.validate().unwrap();
    s
}

fn named(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let report = generate_named(&NamedSpec {
        out: dir.path().join("named"),
        rows: ROWS,
        days: 1,
        seed: 1,
        csv: false,
    })
    .unwrap();
    let file = report.files[0].clone();
    let csv = generate_named(&NamedSpec {
        out: dir.path().join("named-csv"),
        rows: ROWS,
        days: 1,
        seed: 1,
        csv: true,
    })
    .unwrap()
    .files[0]
        .clone();
    let schema = Arc::new(
        infer(&file, &["click".into()], 1 << 20, &Default::default())
            .unwrap()
            .schema,
    );
    let chained = Arc::new(with_chains(&schema, true));
    let copies = Arc::new(with_chains(&schema, false));
    let serial = dir.path().join("one-row-group.parquet");
    one_row_group(&file, &serial);
    let criteo_dir = dir.path().join("criteo");
    generate(&GenSpec {
        out: criteo_dir.clone(),
        rows: ROWS,
        format: OutputFormat::Parquet,
        seed: 1,
        days: 1,
        scale: 0.01,
        drift: 0.0,
        conversions: false,
    })
    .unwrap();
    let criteo = criteo_dir.join("day_0.parquet");

    // Allocation per row in the steady state: a second pass with warm batch buffers.
    let mut batch = Batch::default();
    drain(&file, Some(&schema), &mut batch);
    let before = ALLOCATED.load(Ordering::Relaxed);
    let (n, items) = drain(&file, Some(&schema), &mut batch);
    let bytes = ALLOCATED.load(Ordering::Relaxed) - before;
    println!(
        "named reader: {n} rows, {items} list items, {:.1} bytes allocated per row (Arrow \
         decoding included)",
        bytes as f64 / n as f64
    );
    let mut chained_batch = Batch::default();
    drain(&file, Some(&chained), &mut chained_batch);
    let before = ALLOCATED.load(Ordering::Relaxed);
    let (n, items) = drain(&file, Some(&chained), &mut chained_batch);
    let bytes = ALLOCATED.load(Ordering::Relaxed) - before;
    println!(
        "named reader with chains: {n} rows, {items} list items, {:.1} bytes allocated per \
         row",
        bytes as f64 / n as f64
    );
    drain(&csv, Some(&schema), &mut batch);
    let before = ALLOCATED.load(Ordering::Relaxed);
    let (n, _) = drain(&csv, Some(&schema), &mut batch);
    let bytes = ALLOCATED.load(Ordering::Relaxed) - before;
    println!(
        "named CSV reader: {n} rows, {:.1} bytes allocated per row (opening the file \
         included)",
        bytes as f64 / n as f64
    );

    let mut g = c.benchmark_group("read_rows");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ROWS));
    g.bench_function("named_with_lists", |b| {
        b.iter(|| assert_eq!(drain(&file, Some(&schema), &mut batch).0 as u64, ROWS))
    });
    g.bench_function("named_with_lists_and_chains", |b| {
        b.iter(|| {
            let read = drain(&file, Some(&chained), &mut chained_batch).0;
            assert_eq!(read as u64, ROWS)
        })
    });
    g.bench_function("named_with_lists_and_plain_copies", |b| {
        b.iter(|| {
            let read = drain(&file, Some(&copies), &mut chained_batch).0;
            assert_eq!(read as u64, ROWS)
        })
    });
    g.bench_function("named_with_lists_one_row_group", |b| {
        b.iter(|| assert_eq!(drain(&serial, Some(&schema), &mut batch).0 as u64, ROWS))
    });
    g.bench_function("named_with_lists_csv", |b| {
        b.iter(|| assert_eq!(drain(&csv, Some(&schema), &mut batch).0 as u64, ROWS))
    });
    g.bench_function("criteo_parquet", |b| {
        b.iter(|| assert_eq!(drain(&criteo, None, &mut batch).0 as u64, ROWS))
    });
    g.finish();
}

criterion_group!(benches, named);
criterion_main!(benches);
