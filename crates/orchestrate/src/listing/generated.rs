//! A generated listing: every partition holds the same number of files, named
//! `part-NNNNN.tsv`, produced on demand. It stands in for a storage system with tens of
//! millions of keys in benchmarks of task generation (`elastrec bench tasks`), so that
//! what is measured is the planner, not a disk.

use super::{FileList, ListError, Lister, Listing, NameFilter};

/// `files` files of `file_bytes` bytes in every partition, all ready.
#[derive(Debug, Clone)]
pub struct GeneratedLister {
    files: u32,
    file_bytes: u64,
}

impl GeneratedLister {
    /// Every partition lists `files` files of `file_bytes` bytes.
    pub fn new(files: u32, file_bytes: u64) -> Self {
        Self { files, file_bytes }
    }
}

impl Lister for GeneratedLister {
    fn list(&self, _dir: &str, filter: &NameFilter, _marker: &str) -> Result<Listing, ListError> {
        const PREFIX: &[u8] = b"part-";
        const SUFFIX: &[u8] = b".tsv";
        let mut files = FileList::with_capacity(self.files as usize, 14);
        // Names are built in place (no formatting machinery): this loop runs tens of
        // millions of times in the benchmark.
        let mut name = [0u8; 32];
        name[..PREFIX.len()].copy_from_slice(PREFIX);
        for i in 0..self.files {
            let mut digits = [b'0'; 10];
            let mut v = i;
            let mut n = 0;
            while v > 0 || n < 5 {
                digits[9 - n] = b'0' + (v % 10) as u8;
                v /= 10;
                n += 1;
            }
            let mut len = PREFIX.len();
            name[len..len + n].copy_from_slice(&digits[10 - n..]);
            len += n;
            name[len..len + SUFFIX.len()].copy_from_slice(SUFFIX);
            len += SUFFIX.len();
            let s = std::str::from_utf8(&name[..len]).expect("ASCII");
            if filter.matches(s) {
                files.push(s, self.file_bytes);
            }
        }
        Ok(Listing {
            exists: true,
            ready: true,
            files,
        })
    }

    fn root(&self) -> String {
        "generated://".into()
    }

    fn is_local(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_sorted_zero_padded_names() {
        let l = GeneratedLister::new(12, 7)
            .list("x", &NameFilter::new("*.tsv").unwrap(), "")
            .unwrap();
        assert_eq!(l.files.len(), 12);
        assert_eq!(l.files.name(0), "part-00000.tsv");
        assert_eq!(l.files.name(11), "part-00011.tsv");
        let mut sorted = l.files.clone();
        sorted.sort();
        assert_eq!(sorted, l.files);
    }
}
