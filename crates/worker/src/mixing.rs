//! The read order of `elastrec train` over several `[[data.source]]`s: each source's rows
//! are cut into chunks the size of a `run` task, and the chunks are dealt by the same
//! serving policy that the master's queue applies (`elastrec_control::serving`), so
//! one job mixes its sources alike in one process and on a cluster.

use std::path::PathBuf;

use elastrec_control::serving::{Buffers, Served, Serving};

/// Rows `start..end` of one file (`end = u64::MAX`: to the file's end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The data file.
    pub path: PathBuf,
    /// First row read.
    pub start: u64,
    /// Row after the last one read, or `u64::MAX` for the whole rest of the file.
    pub end: u64,
}

impl Segment {
    /// The whole of `path`.
    pub fn whole(path: PathBuf) -> Self {
        Self {
            path,
            start: 0,
            end: u64::MAX,
        }
    }
}

/// A training file as the mix sees it: the rows read from it and its source.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// The data file.
    pub path: PathBuf,
    /// Rows read from its start (the validation slice may cut a file short).
    pub rows: u64,
    /// Its `[[data.source]]`, by position.
    pub source: u32,
}

/// The segments to read, in the order `serving` deals `chunk_rows`-row chunks of
/// `sources` buffers, and the rows each buffer handed out. Within a source, rows keep
/// their file order; a chunk never spans two files.
pub fn interleave(
    files: &[SourceFile],
    sources: usize,
    serving: Serving,
    chunk_rows: u64,
) -> (Vec<Segment>, Vec<Served>) {
    let chunk_rows = chunk_rows.max(1);
    let mut chunks: Vec<Segment> = Vec::new();
    let mut buffers = Buffers::new(sources.max(1));
    buffers.set_serving(serving);
    for f in files {
        let mut start = 0;
        while start < f.rows {
            let end = (start + chunk_rows).min(f.rows);
            buffers.push_back(
                (f.source as usize).min(buffers.count() - 1),
                chunks.len() as u64,
            );
            chunks.push(Segment {
                path: f.path.clone(),
                start,
                end,
            });
            start = end;
        }
    }
    let mut order = Vec::with_capacity(chunks.len());
    while let Some(b) = buffers.pick() {
        let id = buffers.remove(b, 0).expect("picked buffer has a task");
        let segment = chunks[id as usize].clone();
        buffers.record_served(b, segment.end - segment.start);
        order.push(segment);
    }
    (order, buffers.served().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, rows: u64, source: u32) -> SourceFile {
        SourceFile {
            path: PathBuf::from(name),
            rows,
            source,
        }
    }

    /// Two sources at 3 : 1: the chunks go one of `old` per three of `recent` (a tie goes
    /// to the later buffer), every row is read once, and each source keeps its file order.
    #[test]
    fn chunks_of_two_sources_are_dealt_by_weight() {
        let files = [
            file("old_0", 250, 1),
            file("recent_0", 400, 0),
            file("old_1", 100, 1),
            file("recent_1", 200, 0),
        ];
        let serving = Serving::Weighted {
            weights: vec![3.0, 1.0],
        };
        let (order, served) = interleave(&files, 2, serving, 100);
        let names: Vec<&str> = order.iter().map(|s| s.path.to_str().unwrap()).collect();
        assert_eq!(
            &names[..8],
            [
                "old_0", "recent_0", "recent_0", "recent_0", "old_0", "recent_0", "recent_1",
                "recent_1"
            ],
            "{names:?}"
        );
        assert_eq!(
            served.iter().map(|s| s.rows).collect::<Vec<_>>(),
            [600, 350]
        );
        // Each file is covered once, in order, in chunks of at most 100 rows.
        for f in &files {
            let mine: Vec<(u64, u64)> = order
                .iter()
                .filter(|s| s.path == f.path)
                .map(|s| (s.start, s.end))
                .collect();
            let mut at = 0;
            for (s, e) in mine {
                assert_eq!(s, at);
                assert!(e - s <= 100);
                at = e;
            }
            assert_eq!(at, f.rows);
        }
    }

    #[test]
    fn sequential_serving_reads_source_by_source() {
        let files = [file("b", 150, 1), file("a", 120, 0)];
        let (order, _) = interleave(&files, 2, Serving::Sequential, 100);
        let got: Vec<(&str, u64, u64)> = order
            .iter()
            .map(|s| (s.path.to_str().unwrap(), s.start, s.end))
            .collect();
        assert_eq!(
            got,
            [
                ("a", 0, 100),
                ("a", 100, 120),
                ("b", 0, 100),
                ("b", 100, 150)
            ]
        );
    }
}
