"""Starting, steering and reading jobs through the ``elastrec`` binary."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


def _binary() -> str:
    """The ``elastrec`` binary: ``ELASTREC_BIN``, else ``elastrec`` on ``PATH``."""
    path = os.environ.get("ELASTREC_BIN") or shutil.which("elastrec")
    if not path:
        raise FileNotFoundError(
            "no elastrec binary: set ELASTREC_BIN, or put elastrec on PATH "
            "(cargo install --path crates/cli)"
        )
    return path


def cli(*args: Any, check: bool = True) -> subprocess.CompletedProcess:
    """Runs ``elastrec ARGS...`` and returns the finished process (its output as
    text). With ``check``, a failure raises :class:`RuntimeError` with its error
    output."""
    done = subprocess.run(
        [_binary(), *map(str, args)], capture_output=True, text=True
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f"elastrec {' '.join(map(str, args))} failed ({done.returncode}):\n"
            f"{done.stderr.strip()}"
        )
    return done


class Job:
    """A job started by :func:`run`: its process and its directory."""

    def __init__(self, process: subprocess.Popen, job_dir: Path, log: Path):
        self.process = process
        self.dir = job_dir
        self.log = log

    def wait(self, timeout: Optional[float] = None) -> dict:
        """Waits for the job to end; returns its ``result.json``. A failed job raises
        :class:`RuntimeError` with the end of its log."""
        code = self.process.wait(timeout=timeout)
        if code != 0:
            tail = self.log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"the job failed ({code}); its log ends:\n{tail}")
        return result(self.dir)

    def status(self) -> dict:
        """:func:`status` of this job."""
        return status(self.dir)

    def wait_held(self, timeout: float = 300.0) -> dict:
        """Waits until the job stands at its pause point (``run(...,
        "--pause-at-samples", N)`` or ``elastrec pause``); returns its status. A paused
        job cannot pass the point, so no fast job skips this state. Raises
        :class:`RuntimeError` if the job ends first, :class:`TimeoutError` after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"the job ended before its pause point; its log ends:\n{tail}")
            done = cli("status", "--json", self.dir, check=False)
            if done.returncode == 0:
                s = json.loads(done.stdout)
                if (s.get("pause") or {}).get("held"):
                    return s
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.dir}: not at its pause point after {timeout} s")
            # Polling the master's status: it answers once the job stands still.
            time.sleep(0.2)

    def unpause(self) -> None:
        """Lets the held job go on (``elastrec unpause``)."""
        cli("unpause", self.dir)

    def scale(self, workers: Optional[int] = None, ps: Optional[int] = None) -> None:
        """:func:`scale` of this job."""
        scale(self.dir, workers=workers, ps=ps)

    def stop(self) -> None:
        """:func:`stop` of this job."""
        stop(self.dir)

    def __repr__(self) -> str:
        return f"elastrec.Job({str(self.dir)!r}, pid={self.process.pid})"


def _output_dir(job_file: Path) -> Path:
    """The job's ``output.dir`` as ``elastrec`` resolves it."""
    printed = cli("train", "--print-config", job_file).stdout
    section = None
    for line in printed.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
        elif section == "[output]" and stripped.startswith("dir = "):
            return (job_file.parent / json.loads(stripped[len("dir = "):])).resolve()
    raise RuntimeError(f"{job_file}: no [output] dir in its configuration")


def run(job_file: PathLike, *args: str, log: Optional[PathLike] = None) -> Job:
    """Starts ``elastrec run JOB_FILE ARGS...`` in the background; returns its
    :class:`Job`. Its output goes to ``log`` (default: ``<output.dir>.log``)."""
    job_file = Path(job_file)
    job_dir = _output_dir(job_file)
    log_path = Path(log) if log else job_dir.with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            [_binary(), "run", str(job_file), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Job(process, job_dir, log_path)


def status(job_dir: PathLike) -> dict:
    """``elastrec status --json JOB_DIR``: the running job's nodes, rates and plans
    (or the finished job's result)."""
    return json.loads(cli("status", "--json", job_dir).stdout)


def scale(
    job_dir: PathLike, workers: Optional[int] = None, ps: Optional[int] = None
) -> None:
    """``elastrec scale``: asks the running job for ``workers`` workers and/or ``ps``
    parameter servers."""
    if workers is None and ps is None:
        raise ValueError("give workers, ps or both")
    args: list = ["scale", job_dir]
    if workers is not None:
        args += ["--workers", workers]
    if ps is not None:
        args += ["--ps", ps]
    cli(*args)


def stop(job_dir: PathLike) -> None:
    """``elastrec stop``: the job checkpoints (when it takes checkpoints) and ends."""
    cli("stop", job_dir)


def result(job_dir: PathLike) -> dict:
    """The finished job's ``result.json`` (``run``) or ``summary.json`` (``train``)."""
    job_dir = Path(job_dir)
    for name in ("result.json", "summary.json"):
        path = job_dir / name
        if path.exists():
            return json.loads(path.read_text())
    raise FileNotFoundError(f"{job_dir}: no result.json or summary.json (has the job ended?)")


def _frame(path: Path, what: str):
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError(f"{what} as a data frame needs pandas (pip install pandas)") from e
    if not path.exists():
        raise FileNotFoundError(f"{path}: no {what} yet")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return pd.json_normalize(rows)


def events(job_dir: PathLike):
    """The job's events (``events.jsonl``: scaling decisions, failures, checkpoints) as
    a pandas data frame, one row per event."""
    return _frame(Path(job_dir) / "events.jsonl", "events")


def metrics(job_dir: PathLike):
    """A ``train`` run's evaluations (``metrics.jsonl``) as a pandas data frame."""
    return _frame(Path(job_dir) / "metrics.jsonl", "metrics")
