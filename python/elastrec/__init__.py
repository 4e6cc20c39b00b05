"""elastrec from Python.

* :class:`Model` opens a model file (``model.bin`` of ``train``, ``run`` or
  ``export``): its tables and dense weights as numpy arrays, what it reads, and
  predictions of raw rows.
* :func:`read_batches` reads a job's files through elastrec's readers and
  preprocessing as batches of numpy arrays (:class:`Batches` is an iterator; wrap it
  in a ``torch.utils.data.IterableDataset`` to train a PyTorch model on them).
* :func:`run`, :func:`status`, :func:`scale`, :func:`stop` start and steer a job;
  :func:`result`, :func:`events` and :func:`metrics` read what it wrote, the last two
  as pandas data frames. They drive the ``elastrec`` binary (``ELASTREC_BIN``, or
  ``elastrec`` on ``PATH``).

See ``docs/python.md``.
"""

from ._native import Batches, Model, read_batches
from .jobs import Job, cli, events, metrics, result, run, scale, status, stop

__all__ = [
    "Batches",
    "Job",
    "Model",
    "cli",
    "events",
    "metrics",
    "read_batches",
    "result",
    "run",
    "scale",
    "status",
    "stop",
]
