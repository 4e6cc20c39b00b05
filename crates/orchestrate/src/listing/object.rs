//! Partitions under an object-store prefix (`s3://bucket/prefix?endpoint=...`), with the
//! location syntax and credential rules of checkpoints: keys come from the environment
//! (`AWS_ACCESS_KEY_ID`, ...), never from the location, which is logged.

use std::sync::Arc;

use elastrec_checkpoint::store::{redact_location, CheckpointStore};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::{readiness, FileList, ListError, Lister, Listing, NameFilter};

/// Lists partition prefixes of an object store.
pub struct ObjectStoreLister {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    location: String,
    // The store's client is async; listings are called from planner threads, which block
    // on this runtime (never call them from inside another runtime's worker).
    runtime: tokio::runtime::Runtime,
}

impl ObjectStoreLister {
    /// Opens `location` (`s3://bucket/prefix?endpoint=...&region=...`, `file://dir` or a path).
    pub fn open(location: &str) -> Result<Self, ListError> {
        let store = CheckpointStore::open(location).map_err(|e| ListError {
            dir: redact_location(location),
            reason: e.to_string(),
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("elastrec-listing")
            .enable_all()
            .build()
            .map_err(|e| ListError {
                dir: store.location(),
                reason: format!("cannot start the listing runtime: {e}"),
            })?;
        Ok(Self {
            store: store.object_store().clone(),
            prefix: store.prefix().clone(),
            location: store.location(),
            runtime,
        })
    }
}

impl Lister for ObjectStoreLister {
    fn list(&self, dir: &str, filter: &NameFilter, marker: &str) -> Result<Listing, ListError> {
        let prefix: Path = self.prefix.parts().chain(Path::from(dir).parts()).collect();
        let listed = self
            .runtime
            .handle()
            .block_on(self.store.list_with_delimiter(Some(&prefix)))
            .map_err(|e| ListError {
                dir: format!("{}/{dir}", self.location),
                reason: e.to_string(),
            })?;
        let exists = !listed.objects.is_empty() || !listed.common_prefixes.is_empty();
        let mut files = FileList::with_capacity(listed.objects.len(), 16);
        let mut marker_seen = false;
        for meta in &listed.objects {
            let Some(name) = meta.location.filename() else {
                continue;
            };
            if !marker.is_empty() && name == marker {
                marker_seen = true;
            } else if filter.matches(name) {
                files.push(name, meta.size);
            }
        }
        // Object stores list in key order already; sorting keeps the contract explicit.
        files.sort();
        Ok(Listing {
            exists,
            ready: readiness(exists, marker_seen, marker, &files),
            files,
        })
    }

    fn root(&self) -> String {
        self.location.clone()
    }

    fn is_local(&self) -> bool {
        false
    }

    fn fetch(&self, dir: &str, file: &str, dest: &std::path::Path) -> Result<u64, ListError> {
        use futures::StreamExt;
        use std::io::Write;
        let fail = |reason: String| ListError {
            dir: format!("{}/{dir}", self.location),
            reason: format!("{file}: {reason}"),
        };
        let path: Path = self
            .prefix
            .parts()
            .chain(Path::from(dir).parts())
            .chain(Path::from(file).parts())
            .collect();
        let parent = dest.parent().unwrap_or(std::path::Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| fail(format!("{}: {e}", parent.display())))?;
        let tmp = dest.with_extension("part-download");
        let mut out =
            std::fs::File::create(&tmp).map_err(|e| fail(format!("{}: {e}", tmp.display())))?;
        let bytes = self.runtime.handle().block_on(async {
            let mut stream = self
                .store
                .get(&path)
                .await
                .map_err(|e| fail(e.to_string()))?
                .into_stream();
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| fail(e.to_string()))?;
                out.write_all(&chunk)
                    .map_err(|e| fail(format!("{}: {e}", tmp.display())))?;
                n += chunk.len() as u64;
            }
            Ok::<u64, ListError>(n)
        })?;
        out.sync_all()
            .map_err(|e| fail(format!("{}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, dest).map_err(|e| fail(format!("{}: {e}", dest.display())))?;
        Ok(bytes)
    }
}
