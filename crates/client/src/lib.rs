//! A running job seen from outside: the files of its job directory, a client of its
//! master, its status as JSON and as the tables `elastrec status` prints, and the history
//! of progress points the master appends and the dashboard charts. What `cli` and `viz`
//! need of a job without linking the master that runs it.

pub mod connect;
pub mod history;
pub mod job_dir;
pub mod status;

pub use job_dir::JobDir;
