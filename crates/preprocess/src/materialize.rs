//! Preprocessed features written to Parquet (`elastrec preprocess`), for users who want
//! them offline: one row per sample, `label` then every feature column.
//!
//! Column names: a feature of width 1 keeps its name (`I5`, `C3_C7`); a wider one gets
//! `name.0`, `name.1`, ... Dense columns are `Float32`, sparse ones `UInt64` (an empty
//! id is the shared "missing" id, `2^32`, as the model sees it).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array, RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use elastrec_data::{Batch, BatchReader};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::plan::{FeatureKind, Plan};

/// Rows per batch read and written.
const CHUNK_ROWS: usize = 65_536;

/// The Parquet schema of a plan's output.
pub fn schema(plan: &Plan) -> SchemaRef {
    let mut fields = vec![Field::new("label", DataType::Float32, false)];
    for kind in [FeatureKind::Dense, FeatureKind::Sparse] {
        for f in plan.features().iter().filter(|f| f.kind == kind) {
            let ty = match kind {
                FeatureKind::Dense => DataType::Float32,
                FeatureKind::Sparse => DataType::UInt64,
            };
            if f.width == 1 {
                fields.push(Field::new(&f.name, ty, false));
            } else {
                fields.extend(
                    (0..f.width).map(|k| Field::new(format!("{}.{k}", f.name), ty.clone(), false)),
                );
            }
        }
    }
    Arc::new(Schema::new(fields))
}

/// Reads every row of `reader` (already through the plan) into `out` as Parquet;
/// `progress` is told the rows done after each chunk. Returns the rows written.
pub fn write_parquet(
    reader: &mut dyn BatchReader,
    plan: &Plan,
    out: &Path,
    mut progress: impl FnMut(u64),
) -> Result<u64, String> {
    let schema = schema(plan);
    let file = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let mut batch = Batch::default();
    let mut rows = 0u64;
    loop {
        let n = reader
            .next_batch(&mut batch, CHUNK_ROWS)
            .map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        let record = to_record(&batch, &schema).map_err(|e| format!("{}: {e}", out.display()))?;
        writer
            .write(&record)
            .map_err(|e| format!("{}: {e}", out.display()))?;
        rows += n as u64;
        progress(rows);
    }
    writer
        .close()
        .map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(rows)
}

fn to_record(b: &Batch, schema: &SchemaRef) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let n = b.len();
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Float32Array::from(b.labels.clone()))];
    for c in 0..b.dense_width {
        let col: Vec<f32> = (0..n).map(|r| b.dense[r * b.dense_width + c]).collect();
        columns.push(Arc::new(Float32Array::from(col)));
    }
    for c in 0..b.sparse_width {
        let col: Vec<u64> = (0..n).map(|r| b.sparse[r * b.sparse_width + c]).collect();
        columns.push(Arc::new(UInt64Array::from(col)));
    }
    RecordBatch::try_new(schema.clone(), columns)
}
