//! The crate's single error type.

use std::fmt;
use std::path::{Path, PathBuf};

/// Everything that can go wrong in `elastrec-data`.
///
/// Variants say who is at fault: [`DataError::Malformed`], [`DataError::LineTooLong`] and
/// [`DataError::BadValue`] and [`DataError::BadField`] are problems in the input data, [`DataError::CorruptIndex`] in a
/// cached sidecar, [`DataError::Io`] and [`DataError::Parquet`] are the environment or the
/// container format, [`DataError::InvalidSpec`] and [`DataError::InvalidRange`] are the
/// caller's arguments.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An I/O error on `path`.
    #[error("{}: {source}", path.display())]
    Io {
        /// File being read or written.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A malformed TSV line, reported as `file:line: field N: reason`.
    ///
    /// Field numbering: 0 = label, 1..=13 integer features, 14..=39 categorical features.
    #[error("{}:{line}: field {field}: {reason}", path.display())]
    Malformed {
        /// File holding the line.
        path: PathBuf,
        /// 1-based line number in the file (also for range readers).
        line: u64,
        /// 0-based field index (0 = label).
        field: usize,
        /// What is wrong with the field.
        reason: FieldError,
    },
    /// A TSV line longer than [`crate::tsv::MAX_LINE_BYTES`]: `file:line: line longer than N
    /// bytes`. Only the first `N` bytes are ever buffered; the rest of the line is skipped.
    #[error(
        "{}:{line}: line longer than {limit} bytes (a Criteo line is under 1 KiB: corrupt file?)",
        path.display()
    )]
    LineTooLong {
        /// File holding the line.
        path: PathBuf,
        /// 1-based line number in the file (also for range readers).
        line: u64,
        /// The cap, [`crate::tsv::MAX_LINE_BYTES`].
        limit: usize,
    },
    /// A file whose rows carry another number of labels than the model has tasks.
    #[error(
        "{}: its rows carry {got} label(s) each, and the model predicts {expected} task(s); \
         a multi-task file's label field holds one 0/1 digit per task (`10`: task 0 yes, \
         task 1 no), and model.mmoe.tasks must match it",
        path.display()
    )]
    TaskCount {
        /// The file.
        path: PathBuf,
        /// Labels per row in the file.
        got: usize,
        /// The model's tasks.
        expected: usize,
    },
    /// A bad value in a columnar (Parquet) file: `file: row R: column C: reason`.
    #[error("{}: row {row}: column {column}: {reason}", path.display())]
    BadValue {
        /// File holding the row.
        path: PathBuf,
        /// 0-based row number in the file.
        row: u64,
        /// Column name (`label`, `I1`..`I13`, `C1`..`C26`).
        column: String,
        /// What is wrong with the value.
        reason: FieldError,
    },
    /// A bad value in a CSV or TSV file with a header: `file:line: column C: reason`.
    #[error("{}:{line}: column {column}: {reason}", path.display())]
    BadField {
        /// File holding the row.
        path: PathBuf,
        /// 1-based line number in the file (the header is line 1).
        line: u64,
        /// Column name from the header.
        column: String,
        /// What is wrong with the value.
        reason: FieldError,
    },
    /// A file that does not hold what the job's schema names (a missing or mistyped
    /// column, no header line).
    #[error("{}: {message}", path.display())]
    Schema {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the column.
        message: String,
    },
    /// The Parquet/Arrow layer failed (corrupt file, unsupported schema...).
    #[error("{}: parquet: {message}", path.display())]
    Parquet {
        /// File being read or written.
        path: PathBuf,
        /// Error text from the parquet/arrow crates.
        message: String,
    },
    /// A TSV row index sidecar (`<file>.idx`, see [`crate::index`]) that matches its data
    /// file's size and modification time but whose contents are inconsistent.
    #[error("{}: corrupt row index: {reason}; delete it to rebuild it", path.display())]
    CorruptIndex {
        /// The sidecar file (not the data file).
        path: PathBuf,
        /// What is inconsistent.
        reason: String,
    },
    /// A requested row range does not fit the file.
    #[error("{}: invalid row range {start}..{end} (file has {rows} rows)", path.display())]
    InvalidRange {
        /// File the range refers to.
        path: PathBuf,
        /// First row (inclusive).
        start: u64,
        /// Last row (exclusive).
        end: u64,
        /// Rows in the file.
        rows: u64,
    },
    /// Invalid arguments (generator spec, options).
    #[error("invalid specification: {0}")]
    InvalidSpec(String),
    /// A malformed stream message: `kafka:topic/partition@offset: field N: reason`.
    ///
    /// `sample` is the 0-based sample inside a message of the binary batch format (0 for
    /// one-sample messages). `field` follows [`DataError::Malformed`]'s numbering; the
    /// batch format's framing errors use field `usize::MAX` and are shown as `frame`.
    #[error("{partition}@{offset}: sample {sample}: {}: {reason}", field_name(*field))]
    BadMessage {
        /// The partition, `kafka:topic/partition`.
        partition: String,
        /// Offset of the message in its partition.
        offset: u64,
        /// 0-based sample in the message.
        sample: u32,
        /// 0-based field index, or `usize::MAX` for the message's framing.
        field: usize,
        /// What is wrong.
        reason: FieldError,
    },
    /// The stream could not be read (broker unreachable, topic deleted, data expired).
    #[error("{partition}: {message}")]
    Stream {
        /// The partition, `kafka:topic/partition`.
        partition: String,
        /// What went wrong and what to do about it.
        message: String,
    },
}

fn field_name(field: usize) -> String {
    match field {
        usize::MAX => "frame".into(),
        JSON_FIELD => "json".into(),
        _ => format!("field {field}"),
    }
}

/// The field of [`DataError::BadMessage`] for a JSON sample, whose reason names the
/// column.
pub const JSON_FIELD: usize = usize::MAX - 1;

/// Result alias for this crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

impl DataError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Wraps a parquet/arrow error with the path it happened on.
    pub fn parquet(path: &Path, err: impl fmt::Display) -> Self {
        DataError::Parquet {
            path: path.to_path_buf(),
            message: err.to_string(),
        }
    }

    /// True for errors caused by one bad row (the ones [`crate::BadRowPolicy::Skip`] skips).
    pub fn is_bad_row(&self) -> bool {
        matches!(
            self,
            DataError::Malformed { .. }
                | DataError::LineTooLong { .. }
                | DataError::BadValue { .. }
                | DataError::BadField { .. }
                | DataError::BadMessage { .. }
        )
    }
}

/// Why one field (or value) is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldError {
    /// The line ended before all 40 fields were seen (`found` fields present).
    MissingField {
        /// Number of fields present on the line.
        found: usize,
    },
    /// The line has more than 40 fields.
    ExtraField,
    /// The label is empty (or null in Parquet).
    EmptyLabel,
    /// The label is not `0` or `1` (or, in a multi-task file, 2 to 8 such digits).
    BadLabel(String),
    /// A row carries another number of labels than the file's first row.
    LabelCount {
        /// The first row's labels.
        expected: usize,
        /// This row's.
        got: usize,
    },
    /// A stream sample carries another number of labels than the job's model has tasks.
    TaskCount {
        /// The model's tasks.
        expected: usize,
        /// The sample's labels.
        got: usize,
    },
    /// An integer feature is not a valid 64-bit integer.
    BadInteger(String),
    /// A categorical feature is not exactly 8 hex digits (or out of 32-bit range).
    BadCategory(String),
    /// The field holds non-ASCII bytes (invalid UTF-8 or binary garbage).
    NonAscii(String),
    /// A binary stream message whose framing is wrong (bad magic, truncated, a count
    /// larger than the message can hold).
    BadFrame(String),
    /// A dense value that is NaN or infinite.
    NotFinite(String),
    /// A bag's weight list is not as long as its id list.
    WeightCount {
        /// Weights in the row.
        weights: usize,
        /// Ids in the row.
        ids: usize,
    },
    /// A number field (dense value, weight) that is not a number.
    BadNumber(String),
    /// A sample weight (`data.weight`) that is missing, negative or not finite.
    BadWeight(String),
    /// A JSON sample of named features that does not fit the schema (the message names
    /// the column).
    Json(String),
    /// A CSV row with another number of fields than its header.
    FieldCount {
        /// Columns in the header.
        expected: usize,
        /// Fields in the row.
        found: usize,
    },
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldError::MissingField { found } => write!(
                f,
                "missing field: line has {found} fields, expected {}",
                crate::tsv::NUM_FIELDS
            ),
            FieldError::ExtraField => write!(
                f,
                "unexpected extra field: expected {} fields",
                crate::tsv::NUM_FIELDS
            ),
            FieldError::EmptyLabel => write!(f, "empty label"),
            FieldError::BadFrame(why) => write!(f, "malformed batch message: {why}"),
            FieldError::BadLabel(got) => write!(f, "label must be 0 or 1, got {got:?}"),
            FieldError::LabelCount { expected, got } => write!(
                f,
                "the label field holds {got} label(s) and the file's first row {expected}: every row of a file needs one 0/1 digit per task"
            ),
            FieldError::TaskCount { expected, got } => write!(
                f,
                "the sample carries {got} label(s) and the job's model has {expected} task(s): \
                 every message needs one 0/1 label per task (docs/models.md)"
            ),
            FieldError::BadInteger(got) => write!(f, "expected an integer, got {got:?}"),
            FieldError::BadCategory(got) => write!(f, "expected 8 hex digits, got {got:?}"),
            FieldError::NotFinite(v) => write!(f, "a dense value must be finite, got {v}"),
            FieldError::BadNumber(got) => write!(f, "expected a number, got {got:?}"),
            FieldError::BadWeight(got) => write!(
                f,
                "a sample weight must be a finite number >= 0, got {got}"
            ),
            FieldError::Json(why) => write!(f, "{why}"),
            FieldError::FieldCount { expected, found } => write!(
                f,
                "the row has {found} field(s) and the header {expected} column(s)"
            ),
            FieldError::WeightCount { weights, ids } => write!(
                f,
                "{weights} weight(s) for {ids} id(s): a bag's weights need one per id"
            ),
            FieldError::NonAscii(got) => {
                write!(
                    f,
                    "non-ASCII bytes (invalid UTF-8 or binary garbage): {got}"
                )
            }
        }
    }
}

/// Renders raw field bytes for an error message: lossy UTF-8, at most 40 characters.
pub(crate) fn show_bytes(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut out: String = s.chars().take(40).collect();
    if s.chars().count() > 40 {
        out.push('…');
    }
    out
}

/// Renders non-ASCII field bytes as an escaped byte string, e.g. `"ab\xff"`.
pub(crate) fn show_escaped(bytes: &[u8]) -> String {
    let mut out = String::from("\"");
    for &b in bytes.iter().take(40) {
        out.extend(std::ascii::escape_default(b).map(char::from));
    }
    if bytes.len() > 40 {
        out.push('…');
    }
    out.push('"');
    out
}
