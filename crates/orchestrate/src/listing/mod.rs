//! Listings of partition directories: which files a partition holds and whether it is ready.
//!
//! A [`Lister`] lists one directory (a local path, an S3 prefix, or a generated listing for
//! benchmarks) into a [`FileList`]: names in one arena, sizes beside them, so that tens of
//! millions of files cost about their names' bytes and no allocation each.

mod generated;
mod local;
mod object;

pub use generated::GeneratedLister;
pub use local::LocalLister;
pub use object::ObjectStoreLister;

/// The files of one partition, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileList {
    names: String,
    ends: Vec<u32>,
    sizes: Vec<u64>,
}

impl FileList {
    /// An empty list with room for `files` names of about `name_len` bytes.
    pub fn with_capacity(files: usize, name_len: usize) -> Self {
        Self {
            names: String::with_capacity(files * name_len),
            ends: Vec::with_capacity(files),
            sizes: Vec::with_capacity(files),
        }
    }

    /// Appends a file. Names are kept in the order pushed.
    pub fn push(&mut self, name: &str, size: u64) {
        self.names.push_str(name);
        self.ends
            .push(u32::try_from(self.names.len()).expect("a partition's names fit in 4 GiB"));
        self.sizes.push(size);
    }

    /// Number of files.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when the partition has no file.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Name of file `i` (relative to the partition directory).
    pub fn name(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.names[start..self.ends[i] as usize]
    }

    /// Size of file `i` in bytes.
    pub fn size(&self, i: usize) -> u64 {
        self.sizes[i]
    }

    /// Sorts by name (listings of local directories come in no particular order).
    pub fn sort(&mut self) {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_unstable_by(|&a, &b| self.name(a).cmp(self.name(b)));
        let mut sorted = FileList::with_capacity(self.len(), 0);
        sorted.names.reserve(self.names.len());
        for i in order {
            sorted.push(self.name(i), self.size(i));
        }
        *self = sorted;
    }

    /// Bytes held by this list (for memory reports).
    pub fn heap_bytes(&self) -> usize {
        self.names.capacity() + self.ends.capacity() * 4 + self.sizes.capacity() * 8
    }
}

/// What listing a partition directory found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The directory (or prefix) exists.
    pub exists: bool,
    /// The partition's ready marker is present (always true without a marker).
    pub ready: bool,
    /// The data files matching the dataset's name filter.
    pub files: FileList,
}

/// A file-name pattern with `*` (any run of characters) and `?` (one character).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameFilter {
    pattern: String,
}

impl NameFilter {
    /// `pattern` as written in the job file (`*.tsv`, `part-*.parquet`, `*`).
    pub fn new(pattern: &str) -> Result<Self, String> {
        if pattern.is_empty() {
            return Err("an empty file pattern matches nothing (use \"*\" for every file)".into());
        }
        if pattern.contains('/') {
            return Err(format!(
                "`{pattern}` contains `/`: the file pattern matches names inside a partition; put directories in `path`"
            ));
        }
        Ok(Self {
            pattern: pattern.to_string(),
        })
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// True for a data file name matching the pattern. Hidden files (`.x`), markers
    /// (`_SUCCESS`, `_x`) and the line-index sidecars elastrec writes beside TSV files
    /// (`x.idx`) never match: they are bookkeeping, not samples.
    pub fn matches(&self, name: &str) -> bool {
        !name.starts_with(['.', '_'])
            && !name.ends_with(".idx")
            && wildcard(self.pattern.as_bytes(), name.as_bytes())
    }
}

/// Iterative wildcard matching with one backtrack point: linear for patterns like `*.tsv`.
fn wildcard(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Why a listing failed.
#[derive(Debug, thiserror::Error)]
#[error("listing {dir}: {reason}")]
pub struct ListError {
    /// The directory or prefix (credentials never appear here).
    pub dir: String,
    /// What went wrong.
    pub reason: String,
}

/// Lists partition directories under one root. Called from several threads at once.
pub trait Lister: Send + Sync {
    /// Lists `dir` (relative to the root): the files matching `filter`, and whether the
    /// file named `marker` is present (`marker` empty: ready whenever the directory exists
    /// and holds a matching file).
    fn list(&self, dir: &str, filter: &NameFilter, marker: &str) -> Result<Listing, ListError>;

    /// The root, for messages (without credentials).
    fn root(&self) -> String;

    /// The path of `file` in partition `dir` as a reader opens it.
    fn file_path(&self, dir: &str, file: &str) -> String {
        format!("{}/{dir}/{file}", self.root().trim_end_matches('/'))
    }

    /// True when readers open [`Lister::file_path`] directly; false when a file must be
    /// fetched first ([`Lister::fetch`]).
    fn is_local(&self) -> bool {
        true
    }

    /// Copies `file` of partition `dir` to `dest` (written to a temporary name, then
    /// renamed, so `dest` is either whole or absent) and returns its size.
    fn fetch(&self, dir: &str, file: &str, dest: &std::path::Path) -> Result<u64, ListError> {
        let _ = dest;
        Err(ListError {
            dir: format!("{}/{dir}", self.root()),
            reason: format!("{file}: this storage is read in place, not fetched"),
        })
    }
}

/// Applies the readiness rule of [`Lister::list`] once a listing is known.
pub(crate) fn readiness(exists: bool, marker_seen: bool, marker: &str, files: &FileList) -> bool {
    exists
        && if marker.is_empty() {
            !files.is_empty()
        } else {
            marker_seen
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_like_a_shell() {
        let f = NameFilter::new("part-*.tsv").unwrap();
        assert!(f.matches("part-00001.tsv"));
        assert!(!f.matches("part-00001.tsv.crc"));
        assert!(!f.matches("xpart-1.tsv"));
        let any = NameFilter::new("*").unwrap();
        assert!(any.matches("a"));
        assert!(!any.matches("_SUCCESS"));
        assert!(!any.matches(".part-1.tsv.crc"));
        assert!(!any.matches("part-1.tsv.idx"));
        let q = NameFilter::new("d?y_*_*.gz").unwrap();
        assert!(q.matches("day_1_2.gz"));
        assert!(!q.matches("day_1.gz"));
        assert!(NameFilter::new("a/*").unwrap_err().contains("contains `/`"));
    }

    #[test]
    fn a_file_list_keeps_names_in_one_arena_and_sorts() {
        let mut l = FileList::with_capacity(3, 8);
        l.push("b.tsv", 2);
        l.push("a.tsv", 1);
        l.push("c.tsv", 3);
        l.sort();
        let names: Vec<_> = (0..l.len()).map(|i| (l.name(i), l.size(i))).collect();
        assert_eq!(names, vec![("a.tsv", 1), ("b.tsv", 2), ("c.tsv", 3)]);
    }
}
