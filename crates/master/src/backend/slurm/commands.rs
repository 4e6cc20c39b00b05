//! Slurm's command-line tools as the backend uses them: every call has a time limit (a
//! controller that does not answer makes them retry for minutes) and its output parsed
//! into plain values. Nothing here keeps state.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one query (`squeue`, `scontrol`, `sacct`, `scancel`) may take.
pub const QUERY_LIMIT: Duration = Duration::from_secs(20);

/// Where Slurm's commands are.
#[derive(Debug, Clone, Default)]
pub struct SlurmTools {
    /// Directory of the commands; `None`: `PATH`.
    bin_dir: Option<PathBuf>,
}

/// Why a Slurm command gave no answer.
#[derive(Debug)]
pub enum ToolError {
    /// The program is not there.
    NotFound(String),
    /// It ran longer than its limit and was killed.
    TimedOut(String),
    /// It could not be started or read for another reason.
    Io(String, std::io::Error),
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFound(p) => write!(f, "`{p}` was not found"),
            Self::TimedOut(p) => write!(f, "`{p}` gave no answer in {QUERY_LIMIT:?}"),
            Self::Io(p, e) => write!(f, "running `{p}`: {e}"),
        }
    }
}

impl std::error::Error for ToolError {}

impl SlurmTools {
    /// The commands in `bin_dir` (empty: on `PATH`).
    pub fn new(bin_dir: &str) -> Self {
        Self {
            bin_dir: (!bin_dir.is_empty()).then(|| PathBuf::from(bin_dir)),
        }
    }

    /// The path (or bare name) of the command `name`.
    pub fn program(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(d) => d.join(name),
            None => PathBuf::from(name),
        }
    }

    /// A `Command` for `name` with no input.
    pub fn command(&self, name: &str) -> Command {
        let mut c = Command::new(self.program(name));
        c.stdin(Stdio::null());
        c
    }

    /// Runs `name args` to its end (at most `limit`), capturing its output.
    pub fn run(&self, name: &str, args: &[&str], limit: Duration) -> Result<Output, ToolError> {
        let shown = self.program(name).display().to_string();
        let mut child = self
            .command(name)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ToolError::NotFound(shown.clone()),
                _ => ToolError::Io(shown.clone(), e),
            })?;
        // Pipes are drained on their own threads so a long answer cannot block the child.
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_end(&mut buf);
                }
                buf
            })
        };
        let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
        let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
        let t0 = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if t0.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ToolError::TimedOut(shown));
                }
                Err(e) => return Err(ToolError::Io(shown, e)),
            }
        };
        Ok(Output {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        })
    }

    /// `squeue` rows (`|`-separated fields of `format`) of the calling user's jobs or,
    /// with `steps_of`, of that allocation's steps.
    pub fn squeue(&self, format: &str, extra: &[&str]) -> Result<Vec<Vec<String>>, String> {
        let mut args = vec!["-h", "--me", "-o", format];
        args.extend_from_slice(extra);
        let out = self
            .run("squeue", &args, QUERY_LIMIT)
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("squeue: {}", text(&out.stderr)));
        }
        Ok(rows(&text(&out.stdout)))
    }

    /// The fields of `scontrol show job -o ID` (`JobState`, `Reason`, `ExitCode`, ...), or
    /// `None` when Slurm no longer knows the job.
    pub fn job_fields(&self, job_id: &str) -> Option<Vec<(String, String)>> {
        let out = self
            .run("scontrol", &["show", "job", "-o", job_id], QUERY_LIMIT)
            .ok()?;
        out.status.success().then(|| key_values(&text(&out.stdout)))
    }

    /// `(JobID, JobName, State, ExitCode)` rows of `sacct` for `job` (with its steps), or
    /// `None` where accounting is off.
    pub fn sacct(&self, job: &str) -> Option<Vec<Vec<String>>> {
        let args = ["-n", "-P", "-j", job, "-o", "JobID,JobName,State,ExitCode"];
        let out = self.run("sacct", &args, QUERY_LIMIT).ok()?;
        out.status.success().then(|| rows(&text(&out.stdout)))
    }

    /// Cancels `targets` (job ids or `job.step` ids); errors are reported, not raised:
    /// the target may have ended meanwhile.
    pub fn scancel(&self, targets: &[String]) {
        if targets.is_empty() {
            return;
        }
        let args: Vec<&str> = targets.iter().map(String::as_str).collect();
        match self.run("scancel", &args, QUERY_LIMIT) {
            Ok(o) if o.status.success() => {}
            Ok(o) => tracing::warn!(?targets, err = %text(&o.stderr), "scancel failed"),
            Err(e) => tracing::warn!(?targets, %e, "scancel failed"),
        }
    }
}

/// Output as trimmed text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_string()
}

/// Lines of `|`-separated fields.
pub fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split('|').map(|f| f.trim().to_string()).collect())
        .collect()
}

/// `Key=Value` pairs of a one-line `scontrol show` record.
pub fn key_values(line: &str) -> Vec<(String, String)> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A job's (or step's) state while it may still change: not yet the final word.
pub fn is_transient(state: &str) -> bool {
    matches!(
        state.split_whitespace().next().unwrap_or(""),
        "PENDING"
            | "CONFIGURING"
            | "RUNNING"
            | "COMPLETING"
            | "SUSPENDED"
            | "RESIZING"
            | "REQUEUED"
            | "STAGE_OUT"
            | "SIGNALING"
    )
}

/// The job (or step) still holds or waits for resources.
pub fn is_live(state: &str) -> bool {
    is_transient(state) && !state.starts_with("COMPLETING")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_scontrol_and_squeue_output() {
        let kv = key_values("JobId=8 JobName=t4 JobState=CANCELLED Reason=None ExitCode=0:15");
        assert!(kv.contains(&("JobState".into(), "CANCELLED".into())));
        assert!(kv.contains(&("ExitCode".into(), "0:15".into())));
        assert_eq!(
            rows("12|elastrec-a-ps-1|RUNNING\n\n13|b|PENDING\n"),
            [
                vec!["12", "elastrec-a-ps-1", "RUNNING"],
                vec!["13", "b", "PENDING"]
            ]
        );
        assert!(is_transient("COMPLETING") && !is_live("COMPLETING"));
        assert!(is_live("RUNNING") && !is_transient("CANCELLED by 0"));
    }

    #[test]
    fn a_missing_command_is_named() {
        let tools = SlurmTools::new("/nonexistent/slurm/bin");
        let err = tools.run("squeue", &[], QUERY_LIMIT).unwrap_err();
        assert!(matches!(err, ToolError::NotFound(_)), "{err}");
        assert!(
            err.to_string().contains("/nonexistent/slurm/bin/squeue"),
            "{err}"
        );
    }
}
