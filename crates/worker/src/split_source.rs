//! The one seam between a task and its data: a worker (or data executor) opens a task's
//! typed split here, whether it names a row range of a training file or an offset range
//! of a stream partition, and checks that the file or topic is the job's own.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use elastrec_data::BatchReader;
use elastrec_job::split::{Source, Split};
use elastrec_job::JobConfig;

/// The data files a worker may open: the job's list or, in a following job (whose master
/// appends files as partitions land), any file under its datasets' roots.
pub(crate) struct TaskFiles {
    listed: Vec<PathBuf>,
    roots: Vec<PathBuf>,
}

impl TaskFiles {
    /// [`TaskFiles::of`] off the runtime's async threads: an object-store dataset's
    /// lister owns a runtime of its own, which may not be dropped inside async code.
    pub(crate) async fn of_blocking(job: &JobConfig) -> anyhow::Result<Self> {
        let job = job.clone();
        tokio::task::spawn_blocking(move || Self::of(&job)).await?
    }

    pub(crate) fn of(job: &JobConfig) -> anyhow::Result<Self> {
        Ok(Self {
            listed: job.train_files(),
            roots: if job.data.follow {
                elastrec_job::datasets::follow_roots(job)?
            } else {
                Vec::new()
            },
        })
    }

    /// The file a split names as source `index` of the job, and its index: a listed
    /// file's own position. A name from the wire is trusted only inside the job's data:
    /// listed, or (following) an absolute path under a dataset root without `..`, past
    /// the listed files' indices.
    pub(crate) fn resolve(&self, file: &str, index: u32) -> anyhow::Result<(PathBuf, u32)> {
        // A listed file's index is its position: checked directly, not by a search of a
        // list that may hold 100,000 files.
        if let Some(f) = self
            .listed
            .get(index as usize)
            .filter(|f| f.as_os_str() == file)
        {
            return Ok((f.clone(), index));
        }
        if let Some(i) = self.listed.iter().position(|f| f.as_os_str() == file) {
            return Ok((self.listed[i].clone(), i as u32));
        }
        let path = PathBuf::from(file);
        let inside = path.is_absolute()
            && !path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
            && self.roots.iter().any(|r| path.starts_with(r));
        anyhow::ensure!(
            inside && index as usize >= self.listed.len(),
            "unknown file {file}: not one of the job's files"
        );
        Ok((path, index))
    }
}

/// The split a task from the master carries, checked: a well-formed range, and an offset
/// (the master's copy of how far the task was reported) inside it.
pub(crate) fn task_split(task: &elastrec_proto::master::Task) -> anyhow::Result<Split> {
    let split = Split::from_proto(task.split.as_ref())
        .map_err(|e| anyhow::anyhow!("task {}: {e}", task.task_id))?;
    anyhow::ensure!(
        task.offset <= split.len(),
        "task {}: offset {} is past its {} rows",
        task.task_id,
        task.offset,
        split.len()
    );
    Ok(split)
}

/// Opens the rows of `split` (source `index` of the job's sources) from row or offset
/// `from`: the one seam between a task and its data. A file split reads one of the job's
/// training files; a stream split, an offset range of a partition of one of the job's
/// topics. What the wire names is checked: only the job's own files and topics. The rows
/// go through the job's `[[preprocess]]` plan, when it has one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_split(
    job: &JobConfig,
    files: &TaskFiles,
    plan: Option<&Arc<elastrec_preprocess::Plan>>,
    executors: &crate::executor_reader::Executors,
    stream: &mut Option<elastrec_stream::StreamInput>,
    split: &Split,
    index: u32,
    from: u64,
    worker: u32,
) -> anyhow::Result<(u32, Box<dyn BatchReader>)> {
    let policy = job.data.on_bad_row;
    let path = match &split.source {
        Source::Partition(partition) => {
            let cfg = job
                .stream
                .as_ref()
                .filter(|cfg| cfg.topics.contains(&partition.topic))
                .with_context(|| format!("{partition} is not a partition of the job's topics"))?;
            if stream.is_none() {
                let group = format!("{}-worker", cfg.group_for("job"));
                *stream = Some(
                    elastrec_stream::StreamInput::new(&cfg.connection(), &group, cfg.format)?
                        .with_tasks(job.model.tasks())
                        .with_schema(elastrec_job::prepare::job_schema(job)),
                );
            }
            let input = stream.as_ref().expect("made above");
            let reader = input.range(partition, from, split.range.end, policy)?;
            let reader = elastrec_job::prepare::preprocessed(Box::new(reader), plan);
            return Ok((index, reader));
        }
        Source::File(path) => path,
    };
    // A stream job trains files only as the history of a mixture.
    anyhow::ensure!(
        job.stream.is_none() || job.is_mixture(),
        "file {path}: the job reads a stream and has no history files"
    );
    let (path, index) = files.resolve(path, index)?;
    let mut open_range: elastrec_data::shuffled::RangeOpener = if executors.any() {
        // The job's data executors read and parse it (`cluster.executors`).
        let format = crate::executor_reader::RowFormat {
            plan: plan.cloned(),
            schema: elastrec_job::prepare::job_schema(job),
        };
        let (executors, name) = (executors.clone(), split.source.to_string());
        let path = path.clone();
        Box::new(move |start, end| {
            Ok(Box::new(crate::executor_reader::ExecutorReader::new(
                executors.clone(),
                name.clone(),
                index,
                path.clone(),
                start,
                end,
                policy,
                format.clone(),
                worker,
            )) as Box<dyn BatchReader>)
        })
    } else {
        let plan = plan.cloned();
        let schema = elastrec_job::prepare::job_schema(job);
        let path = path.clone();
        Box::new(move |start, end| {
            elastrec_job::prepare::open_job_reader(
                plan.as_ref(),
                schema.as_ref(),
                &path,
                start,
                end,
                policy,
            )
        })
    };
    let reader = match split.shuffle {
        None => open_range(from, split.range.end)?,
        Some(shuffle) => {
            // The split's rows count slots of a seeded order (`train.shuffle_buffer`).
            let reader =
                elastrec_data::ShuffledReader::new(open_range, shuffle, from, split.range.end)
                    .with_context(|| format!("file {}", path.display()))?;
            Box::new(reader)
        }
    };
    Ok((index, reader))
}

#[cfg(test)]
mod tests {
    use elastrec_data::{criteo, Batch};
    use elastrec_job::stream::StreamConfig;
    use elastrec_stream::PartitionId;

    use super::*;
    use crate::executor_reader::Executors;

    /// A job training one Criteo file of `rows` rows in `dir`.
    fn job(dir: &std::path::Path, rows: usize) -> JobConfig {
        let mut text = String::new();
        for r in 0..rows {
            text += &format!("{}", r % 2);
            for i in 0..criteo::DENSE {
                text += &format!("\t{}", (r + i) % 9);
            }
            for i in 0..criteo::CATEGORICAL {
                text += &format!("\t{:08x}", r * 31 + i);
            }
            text += "\n";
        }
        std::fs::write(dir.join("day_0.tsv"), text).unwrap();
        let mut job = JobConfig::default();
        job.data.dir = dir.to_path_buf();
        job.data.train = vec!["day_0.tsv".into()];
        job
    }

    fn file_split(path: &str, range: std::ops::Range<u64>) -> Split {
        Split {
            source: Source::File(path.into()),
            range,
            shuffle: None,
        }
    }

    fn partition_split(topic: &str) -> Split {
        Split {
            source: Source::Partition(PartitionId {
                topic: topic.into(),
                partition: 0,
            }),
            range: 0..10,
            shuffle: None,
        }
    }

    fn open(
        job: &JobConfig,
        split: &Split,
        index: u32,
    ) -> anyhow::Result<(u32, Box<dyn BatchReader>)> {
        let files = TaskFiles::of(job)?;
        open_split(
            job,
            &files,
            None,
            &Executors::default(),
            &mut None,
            split,
            index,
            split.range.start,
            1,
        )
    }

    fn error(job: &JobConfig, split: &Split) -> String {
        match open(job, split, 0) {
            Ok(_) => panic!("{split:?} opened"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_listed_file_opens_at_its_own_index_and_reads_the_splits_rows() {
        let tmp = tempfile::tempdir().unwrap();
        let job = job(tmp.path(), 20);
        let listed = job.train_files()[0].to_string_lossy().into_owned();
        // The wire's index does not move a listed file: its batch keys name its position.
        let (index, mut reader) = open(&job, &file_split(&listed, 5..12), 7).unwrap();
        assert_eq!(index, 0);
        let mut batch = Batch::default();
        assert_eq!(reader.next_batch(&mut batch, 100).unwrap(), 7);
        assert_eq!(batch.labels[0], 1.0, "row 5 is the first read");
    }

    #[test]
    fn splits_outside_the_jobs_data_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let batch_job = job(tmp.path(), 4);
        let e = error(&batch_job, &file_split("/etc/passwd", 0..1));
        assert!(e.contains("unknown file /etc/passwd"), "{e}");
        let e = error(&batch_job, &partition_split("clicks"));
        assert!(
            e.contains("kafka:clicks/0 is not a partition of the job's topics"),
            "{e}"
        );

        let mut online = batch_job.clone();
        online.data.train.clear();
        online.stream = Some(StreamConfig {
            topics: vec!["clicks".into()],
            ..StreamConfig::default()
        });
        let e = error(&online, &partition_split("views"));
        assert!(e.contains("kafka:views/0 is not a partition"), "{e}");
        let listed = batch_job.train_files()[0].to_string_lossy().into_owned();
        let e = error(&online, &file_split(&listed, 0..1));
        assert!(
            e.contains("the job reads a stream and has no history files"),
            "{e}"
        );
    }

    #[test]
    fn a_tasks_offset_past_its_split_is_refused() {
        let task = elastrec_proto::master::Task {
            task_id: 4,
            offset: 11,
            split: Some(file_split("a.tsv", 0..10).to_proto()),
            ..Default::default()
        };
        let e = task_split(&task).unwrap_err().to_string();
        assert!(e.contains("task 4: offset 11 is past its 10 rows"), "{e}");
        let empty = elastrec_proto::master::Task {
            task_id: 5,
            ..Default::default()
        };
        let e = task_split(&empty).unwrap_err().to_string();
        assert!(
            e.contains("task 5: the task names no file or partition"),
            "{e}"
        );
    }
}
