//! Partitions in a local (or mounted) directory tree.

use std::io::ErrorKind;
use std::path::PathBuf;

use super::{readiness, FileList, ListError, Lister, Listing, NameFilter};

/// Lists partition directories under a local root.
#[derive(Debug, Clone)]
pub struct LocalLister {
    root: PathBuf,
}

impl LocalLister {
    /// Partitions under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

impl Lister for LocalLister {
    fn list(&self, dir: &str, filter: &NameFilter, marker: &str) -> Result<Listing, ListError> {
        let path = self.root.join(dir);
        let fail = |reason: String| ListError {
            dir: path.display().to_string(),
            reason,
        };
        let entries = match std::fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Listing::default()),
            Err(e) => return Err(fail(e.to_string())),
        };
        let mut files = FileList::default();
        let mut marker_seen = false;
        for entry in entries {
            let entry = entry.map_err(|e| fail(e.to_string()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue; // not UTF-8: no pattern can name it
            };
            if !marker.is_empty() && name == marker {
                marker_seen = true;
                continue;
            }
            if !filter.matches(name) {
                continue;
            }
            // `metadata` follows a symbolic link, as a reader opening the file would.
            let meta = std::fs::metadata(entry.path()).map_err(|e| fail(format!("{name}: {e}")))?;
            if meta.is_file() {
                files.push(name, meta.len());
            }
        }
        files.sort();
        Ok(Listing {
            exists: true,
            ready: readiness(true, marker_seen, marker, &files),
            files,
        })
    }

    fn root(&self) -> String {
        self.root.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_matching_files_in_order_and_sees_the_marker() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dt=20261101");
        std::fs::create_dir_all(p.join("sub.tsv")).unwrap();
        for (name, bytes) in [("b.tsv", 3), ("a.tsv", 1), ("c.txt", 2), (".a.tsv.crc", 1)] {
            std::fs::write(p.join(name), vec![b'x'; bytes]).unwrap();
        }
        let lister = LocalLister::new(dir.path());
        let filter = NameFilter::new("*.tsv").unwrap();
        let l = lister.list("dt=20261101", &filter, "_SUCCESS").unwrap();
        assert!(l.exists && !l.ready);
        assert_eq!(
            (l.files.len(), l.files.name(0), l.files.size(1)),
            (2, "a.tsv", 3)
        );
        std::fs::write(p.join("_SUCCESS"), b"").unwrap();
        assert!(
            lister
                .list("dt=20261101", &filter, "_SUCCESS")
                .unwrap()
                .ready
        );
        // Without a marker a partition is ready once it holds a matching file.
        assert!(lister.list("dt=20261101", &filter, "").unwrap().ready);
        let missing = lister.list("dt=20261102", &filter, "").unwrap();
        assert!(!missing.exists && !missing.ready);
    }
}
