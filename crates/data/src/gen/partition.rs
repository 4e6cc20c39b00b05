//! Hourly partitions of a generated data set, laid out as upstream pipelines write them:
//! `dt=YYYYMMDD/hour=HH/part-00000.{tsv,parquet}` with a `_SUCCESS` marker in each. A
//! day file's rows are spread over its 24 hours in order, so the partitions hold the same
//! rows (and the same drift over days) as the day files they come from.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};
use crate::parquet_io::{ParquetOptions, ParquetReader, ParquetWriter};
use crate::raw::{RawBatch, RawRow};
use crate::reader::{detect_format, BadRowPolicy, FileFormat};

/// Name of the readiness marker written into every complete partition.
pub const READY_MARKER: &str = "_SUCCESS";

/// One day file to split and the date (`YYYYMMDD`) its rows belong to.
#[derive(Debug, Clone)]
pub struct DaySplit {
    /// The day file (TSV or Parquet).
    pub file: PathBuf,
    /// Its rows.
    pub rows: u64,
    /// The partition date, `YYYYMMDD`.
    pub date: String,
}

/// Splits each day file into 24 hourly partitions under `out` and removes the day file.
/// Returns the partition directories written, oldest first.
pub fn split_hourly(out: &Path, days: &[DaySplit]) -> Result<Vec<PathBuf>> {
    let mut dirs = Vec::with_capacity(days.len() * 24);
    for day in days {
        let format = detect_format(&day.file)?;
        let hours: Vec<PathBuf> = (0..24)
            .map(|h| out.join(format!("dt={}/hour={h:02}", day.date)))
            .collect();
        for dir in &hours {
            std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, e))?;
        }
        // Hour h holds rows [h n / 24, (h + 1) n / 24).
        let bound = |h: u64| h * day.rows / 24;
        match format {
            FileFormat::Parquet => split_parquet(&day.file, &hours, bound)?,
            FileFormat::Tsv => split_tsv(&day.file, &hours, bound)?,
            FileFormat::TsvGzip => {
                return Err(DataError::io(
                    &day.file,
                    std::io::Error::other("splitting gzip files into partitions is not supported"),
                ))
            }
        }
        for dir in &hours {
            let marker = dir.join(READY_MARKER);
            File::create(&marker).map_err(|e| DataError::io(&marker, e))?;
        }
        std::fs::remove_file(&day.file).map_err(|e| DataError::io(&day.file, e))?;
        // A line index of the day file (built by a row count) describes a file now gone.
        let _ = std::fs::remove_file(crate::index::index_path(&day.file));
        dirs.extend(hours);
    }
    Ok(dirs)
}

fn split_tsv(file: &Path, hours: &[PathBuf], bound: impl Fn(u64) -> u64) -> Result<()> {
    let mut input = BufReader::with_capacity(
        1 << 20,
        File::open(file).map_err(|e| DataError::io(file, e))?,
    );
    let mut line = Vec::new();
    let mut row = 0u64;
    for (h, dir) in hours.iter().enumerate() {
        let path = dir.join("part-00000.tsv");
        let mut w = BufWriter::with_capacity(
            1 << 20,
            File::create(&path).map_err(|e| DataError::io(&path, e))?,
        );
        while row < bound(h as u64 + 1) {
            line.clear();
            let n = input
                .read_until(b'\n', &mut line)
                .map_err(|e| DataError::io(file, e))?;
            if n == 0 {
                break;
            }
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            w.write_all(&line).map_err(|e| DataError::io(&path, e))?;
            row += 1;
        }
        w.flush().map_err(|e| DataError::io(&path, e))?;
    }
    Ok(())
}

fn split_parquet(file: &Path, hours: &[PathBuf], bound: impl Fn(u64) -> u64) -> Result<()> {
    let mut reader = ParquetReader::open(file, BadRowPolicy::Fail)?;
    let mut raw = RawRow::default();
    let mut batch = RawBatch::with_capacity(8192);
    let mut row = 0u64;
    for (h, dir) in hours.iter().enumerate() {
        let path = dir.join("part-00000.parquet");
        let mut w = ParquetWriter::create(&path, ParquetOptions::default())?;
        while row < bound(h as u64 + 1) && reader.next_raw(&mut raw)? {
            batch.push(&raw);
            row += 1;
            if batch.len() == 8192 {
                w.write(&batch)?;
                batch.clear();
            }
        }
        if !batch.is_empty() {
            w.write(&batch)?;
            batch.clear();
        }
        w.finish()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{generate, GenSpec, OutputFormat};

    #[test]
    fn hourly_partitions_hold_every_row_of_the_day_in_order() {
        for format in [OutputFormat::Tsv, OutputFormat::Parquet] {
            let dir = tempfile::tempdir().unwrap();
            let mut spec = GenSpec::new(dir.path(), 1000);
            spec.days = 2;
            spec.format = format;
            let report = generate(&spec).unwrap();
            let days: Vec<DaySplit> = report
                .files
                .iter()
                .enumerate()
                .map(|(d, f)| DaySplit {
                    file: dir.path().join(&f.name),
                    rows: f.rows,
                    date: format!("2026110{}", d + 1),
                })
                .collect();
            let original: Vec<u64> = days.iter().map(|d| d.rows).collect();
            let dirs = split_hourly(dir.path(), &days).unwrap();
            assert_eq!(dirs.len(), 48);
            let mut per_day = [0u64; 2];
            for (i, d) in dirs.iter().enumerate() {
                assert!(d.join(READY_MARKER).exists());
                let part = std::fs::read_dir(d)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .find(|p| p.file_name().unwrap() != READY_MARKER)
                    .unwrap();
                per_day[i / 24] += crate::count_rows(&part).unwrap();
            }
            assert_eq!(per_day.to_vec(), original);
            assert!(
                !days[0].file.exists(),
                "the day file is replaced by its partitions"
            );
        }
    }
}
