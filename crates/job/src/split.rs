//! A task's rows, typed: a row range of one data file or an offset range of one stream
//! partition. The master deals splits of its sources; a worker opens one through a single
//! seam. Nothing is told apart by parsing a name received from the wire.

use std::fmt;
use std::ops::Range;

use elastrec_data::RowShuffle;
use elastrec_proto::master as pb;
use elastrec_stream::PartitionId;

/// Why a source or split read back from the master's records or the wire is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// A recorded stream source that does not name a partition.
    #[error("{name:?} is listed among the stream's partitions but names none (expected kafka:TOPIC/PARTITION)")]
    NotAPartition {
        /// The recorded name.
        name: String,
    },
    /// A task without a split.
    #[error("the task names no file or partition")]
    Missing,
    /// A file split whose row order cannot be built.
    #[error("file {path}: {reason}")]
    BadShuffle {
        /// The file.
        path: String,
        /// What `RowShuffle::check` refused.
        reason: String,
    },
    /// A stream split without a topic or with a negative partition.
    #[error("stream split of topic {topic:?}, partition {partition}: not a partition")]
    BadPartition {
        /// The topic named.
        topic: String,
        /// The partition named.
        partition: i32,
    },
    /// A range whose end lies before its start.
    #[error("{split}: range {start}..{end} runs backwards")]
    Backwards {
        /// The source, as recorded and reported.
        split: String,
        /// First row or offset.
        start: u64,
        /// End row or offset.
        end: u64,
    },
}

/// One of a job's data sources, by the master's index: a file or a stream partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A data file, as the job lists it (or, in a following job, its absolute path).
    File(String),
    /// A partition of one of the job's topics.
    Partition(PartitionId),
}

impl Source {
    /// A source from the name the master records in its job directory: a partition's
    /// `kafka:topic/partition` where the job's list holds partitions (`stream`), else a
    /// file's path.
    pub fn from_recorded(name: &str, stream: bool) -> Result<Self, SplitError> {
        if !stream {
            return Ok(Self::File(name.to_string()));
        }
        PartitionId::parse(name)
            .map(Self::Partition)
            .ok_or_else(|| SplitError::NotAPartition { name: name.into() })
    }

    /// The partition, when this is one.
    pub fn partition(&self) -> Option<&PartitionId> {
        match self {
            Self::Partition(p) => Some(p),
            Self::File(_) => None,
        }
    }
}

/// The name a source is recorded and reported under: a file's path, or
/// `kafka:topic/partition`.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => f.write_str(path),
            Self::Partition(p) => p.fmt(f),
        }
    }
}

/// The rows of one task: `range` counts a file's rows (or, with `shuffle`, its slots) or a
/// partition's offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Where the rows are.
    pub source: Source,
    /// Rows, slots or offsets `[start, end)`.
    pub range: Range<u64>,
    /// A file's seeded row order (`train.shuffle_buffer`); `None`: file order. Never set
    /// for a partition.
    pub shuffle: Option<RowShuffle>,
}

impl Split {
    /// Units (rows or offsets) in the split.
    pub fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    /// True for a split without rows.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// True when the rows come from a stream partition.
    pub fn is_stream(&self) -> bool {
        matches!(self.source, Source::Partition(_))
    }

    /// The wire form of the split.
    pub fn to_proto(&self) -> pb::task::Split {
        let Range { start, end } = self.range;
        match &self.source {
            Source::File(path) => pb::task::Split::File(pb::FileSplit {
                path: path.clone(),
                start_row: start,
                end_row: end,
                shuffle: self.shuffle.map(|s| pb::RowShuffle {
                    block_rows: s.block_rows,
                    file_rows: s.file_rows,
                    seed: s.seed,
                }),
            }),
            Source::Partition(p) => pb::task::Split::Stream(pb::StreamSplit {
                topic: p.topic.clone(),
                partition: p.partition,
                start_offset: start,
                end_offset: end,
            }),
        }
    }

    /// The split a task received from the wire carries, checked for shape only (a worker
    /// still checks that the file or topic is the job's own): a range that does not run
    /// backwards, a named partition, a shuffle that `RowShuffle::check` accepts.
    pub fn from_proto(split: Option<&pb::task::Split>) -> Result<Self, SplitError> {
        match split {
            None => Err(SplitError::Missing),
            Some(pb::task::Split::File(f)) => {
                let shuffle = f.shuffle.as_ref().map(|s| RowShuffle {
                    block_rows: s.block_rows,
                    file_rows: s.file_rows,
                    seed: s.seed,
                });
                if let Some(s) = shuffle {
                    s.check(f.start_row, f.end_row)
                        .map_err(|e| SplitError::BadShuffle {
                            path: f.path.clone(),
                            reason: e.to_string(),
                        })?;
                }
                Self::checked(
                    Source::File(f.path.clone()),
                    f.start_row,
                    f.end_row,
                    shuffle,
                )
            }
            Some(pb::task::Split::Stream(s)) => {
                if s.topic.is_empty() || s.partition < 0 {
                    return Err(SplitError::BadPartition {
                        topic: s.topic.clone(),
                        partition: s.partition,
                    });
                }
                let p = PartitionId {
                    topic: s.topic.clone(),
                    partition: s.partition,
                };
                Self::checked(Source::Partition(p), s.start_offset, s.end_offset, None)
            }
        }
    }

    fn checked(
        source: Source,
        start: u64,
        end: u64,
        shuffle: Option<RowShuffle>,
    ) -> Result<Self, SplitError> {
        if start > end {
            return Err(SplitError::Backwards {
                split: source.to_string(),
                start,
                end,
            });
        }
        Ok(Self {
            source,
            range: start..end,
            shuffle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(topic: &str, partition: i32) -> Source {
        Source::Partition(PartitionId {
            topic: topic.into(),
            partition,
        })
    }

    #[test]
    fn a_split_survives_the_wire_whatever_its_source() {
        let shuffle = RowShuffle {
            block_rows: 64,
            file_rows: 1000,
            seed: 7,
        };
        for split in [
            Split {
                source: Source::File("/data/day_0.parquet".into()),
                range: 10..200,
                shuffle: Some(shuffle),
            },
            Split {
                source: Source::File("kafka:looks/0".into()),
                range: 0..5,
                shuffle: None,
            },
            Split {
                source: partition("clicks.v2", 3),
                range: 1 << 40..(1 << 40) + 9,
                shuffle: None,
            },
        ] {
            let wire = split.to_proto();
            assert_eq!(Split::from_proto(Some(&wire)), Ok(split));
        }
    }

    #[test]
    fn a_file_named_like_a_partition_stays_a_file() {
        let s = Source::from_recorded("kafka:t/0", false).unwrap();
        assert_eq!(s, Source::File("kafka:t/0".into()));
        assert_eq!(
            Source::from_recorded("kafka:t/0", true),
            Ok(partition("t", 0))
        );
        let e = Source::from_recorded("/data/a.tsv", true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"/data/a.tsv\"") && e.contains("kafka:TOPIC/PARTITION"),
            "{e}"
        );
    }

    #[test]
    fn malformed_splits_from_the_wire_are_refused_by_name() {
        let backwards = pb::task::Split::File(pb::FileSplit {
            path: "a.tsv".into(),
            start_row: 9,
            end_row: 3,
            shuffle: None,
        });
        let e = Split::from_proto(Some(&backwards)).unwrap_err();
        assert_eq!(
            e,
            SplitError::Backwards {
                split: "a.tsv".into(),
                start: 9,
                end: 3
            }
        );
        assert_eq!(e.to_string(), "a.tsv: range 9..3 runs backwards");
        let no_block = pb::task::Split::File(pb::FileSplit {
            path: "a.tsv".into(),
            start_row: 0,
            end_row: 3,
            shuffle: Some(pb::RowShuffle::default()),
        });
        let e = Split::from_proto(Some(&no_block)).unwrap_err().to_string();
        assert!(
            e.contains("a.tsv") && e.contains("shuffle block of 0 rows"),
            "{e}"
        );
        let nameless = pb::task::Split::Stream(pb::StreamSplit {
            topic: String::new(),
            partition: 0,
            start_offset: 0,
            end_offset: 1,
        });
        assert!(matches!(
            Split::from_proto(Some(&nameless)),
            Err(SplitError::BadPartition { .. })
        ));
        let negative = pb::task::Split::Stream(pb::StreamSplit {
            topic: "t".into(),
            partition: -1,
            start_offset: 0,
            end_offset: 1,
        });
        assert!(matches!(
            Split::from_proto(Some(&negative)),
            Err(SplitError::BadPartition { partition: -1, .. })
        ));
        assert_eq!(Split::from_proto(None), Err(SplitError::Missing));
    }
}
