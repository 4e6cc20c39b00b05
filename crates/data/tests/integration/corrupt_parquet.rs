//! Corrupt Parquet files: bytes flipped all over a generated file, at a fixed stride. Each
//! mutant is read through the public readers (whole, by range, row count): it must either
//! read, or fail with an error that names the file, never panic (the Arrow and Parquet
//! decoders panic on some corrupt pages; those panics are ours to catch).

use elastrec_data::parquet_io::parquet_row_count;
use elastrec_data::{
    generate, open_reader_range, read_all, BadRowPolicy, BatchReader, GenSpec, OutputFormat,
};
use std::path::Path;

fn generated_parquet(dir: &Path) -> std::path::PathBuf {
    generate(&GenSpec {
        out: dir.to_path_buf(),
        rows: 3_000,
        format: OutputFormat::Parquet,
        seed: 7,
        days: 1,
        scale: 0.001,
        drift: 0.0,
        conversions: false,
    })
    .unwrap();
    dir.join("day_0.parquet")
}

/// Reads `path` every way a job does; returns the errors (none: it read).
fn read_every_way(path: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    if let Err(e) = read_all(path, BadRowPolicy::Skip) {
        errors.push(e.to_string());
    }
    if let Err(e) = parquet_row_count(path) {
        errors.push(e.to_string());
    }
    errors.extend(drain(open_reader_range(
        path,
        100,
        2_000,
        BadRowPolicy::Skip,
    )));
    errors
}

/// Reads everything an opened reader holds; the error that stopped it, if any.
fn drain(opened: elastrec_data::Result<Box<dyn BatchReader>>) -> Option<String> {
    let mut r = match opened {
        Ok(r) => r,
        Err(e) => return Some(e.to_string()),
    };
    let mut batch = elastrec_data::Batch::default();
    loop {
        match r.next_batch(&mut batch, 512) {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => return Some(e.to_string()),
        }
    }
}

/// Writes `good` with three bytes inverted every `stride` bytes (the footer included) to
/// `bad`, one mutant at a time, and reads each with `read`: it must not panic, and every
/// error must name the file. Returns how many mutants failed to read.
fn mutants(
    good: &[u8],
    bad: &Path,
    stride: usize,
    read: impl Fn(&Path) -> Vec<String> + std::panic::RefUnwindSafe,
) -> usize {
    let mut failed = 0;
    for at in (4..good.len() - 8).step_by(stride) {
        let mut bytes = good.to_vec();
        for b in &mut bytes[at..(at + 3).min(good.len() - 8)] {
            *b = !*b;
        }
        std::fs::write(bad, &bytes).unwrap();
        let errors = std::panic::catch_unwind(|| read(bad))
            .unwrap_or_else(|_| panic!("reading with bytes {at}.. flipped panicked"));
        let name = bad.file_name().unwrap().to_str().unwrap();
        for e in &errors {
            assert!(e.contains(name), "bytes {at}..: {e}");
        }
        failed += usize::from(!errors.is_empty());
    }
    failed
}

#[test]
fn flipped_bytes_give_errors_naming_the_file_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let path = generated_parquet(dir.path());
    let good = std::fs::read(&path).unwrap();
    assert!(read_every_way(&path).is_empty());
    let bad = dir.path().join("mutant.parquet");
    // Every 61st byte: three bytes inverted from there.
    let failed = mutants(&good, &bad, 61, read_every_way);
    assert!(failed > 0, "no mutant was detected at all");
}

/// The same for a file of many row groups, which several threads decode at once: an
/// error in one thread's group stops the read naming the file.
#[test]
fn flipped_bytes_in_a_file_of_many_row_groups_give_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("groups.parquet");
    let options = elastrec_data::ParquetOptions {
        row_group_rows: 300,
        snappy: true,
    };
    let mut w = elastrec_data::ParquetWriter::create(&path, options).unwrap();
    w.write(&crate::util::random_rows(2_100, 5)).unwrap();
    w.finish().unwrap();
    let good = std::fs::read(&path).unwrap();
    assert!(read_every_way(&path).is_empty());
    let bad = dir.path().join("mutant.parquet");
    let failed = mutants(&good, &bad, 389, read_every_way);
    assert!(failed > 0, "no mutant was detected at all");
}

/// The same for a file with named columns and lists, read through its inferred schema
/// (inference included): every mutant reads or fails naming the file.
#[test]
fn flipped_bytes_in_a_file_with_lists_give_errors_naming_the_file() {
    use elastrec_data::gen::named::{generate_named, NamedSpec};
    use elastrec_data::schema::infer;
    let dir = tempfile::tempdir().unwrap();
    let report = generate_named(&NamedSpec {
        out: dir.path().to_path_buf(),
        rows: 2_000,
        days: 1,
        seed: 3,
        csv: false,
    })
    .unwrap();
    let good = std::fs::read(&report.files[0]).unwrap();
    let schema = std::sync::Arc::new(
        infer(
            &report.files[0],
            &["click".into()],
            1 << 20,
            &Default::default(),
        )
        .unwrap()
        .schema,
    );
    let bad = dir.path().join("mutant.parquet");
    let read = |path: &Path| -> Vec<String> {
        let mut errors = Vec::new();
        if let Err(e) = infer(path, &["click".into()], 1 << 20, &Default::default()) {
            errors.push(e.to_string());
        }
        let range = Some((100, 1_500));
        errors.extend(drain(elastrec_data::open_source(
            path,
            range,
            BadRowPolicy::Skip,
            Some(&schema),
        )));
        errors
    };
    let failed = mutants(&good, &bad, 97, read);
    assert!(failed > 0, "no mutant was detected at all");
}
