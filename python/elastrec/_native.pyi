"""Types of the native module (``crates/python``)."""

from os import PathLike
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

_Path = Union[str, PathLike]

class Model:
    """A model file opened for inspection and prediction."""

    def __init__(self, path: _Path) -> None: ...
    @property
    def tasks(self) -> int:
        """Tasks (labels) the model predicts."""
    @property
    def signature(self) -> Dict[str, Any]:
        """What the model reads: dense columns, single ids, lists, tables."""
    @property
    def config(self) -> Dict[str, Any]:
        """The model's settings as its file records them."""
    def tables(self) -> Dict[str, npt.NDArray[np.float32]]:
        """Every embedding table, ``[rows, width]`` (copies). A dynamic table's rows are
        the ones it stores, then one of zeros."""
    def keys(self) -> Dict[str, npt.NDArray[np.uint64]]:
        """The key of each stored row of every dynamic table, ``[stored]``, in the order
        of ``tables()``' rows; empty for a model of hashed tables."""
    def weights(self) -> Dict[str, npt.NDArray[np.float32]]:
        """Every dense parameter, named and shaped as PyTorch's modules."""
    def predict(self, rows: Sequence[Dict[str, Any]]) -> npt.NDArray[np.float32]:
        """Probabilities ``[rows, tasks]`` of raw rows (dicts, as ``elastrec serve``
        takes them)."""

class Batches(Iterator[Dict[str, npt.NDArray[Any]]]):
    """A job's files as batches of numpy arrays."""

    def __iter__(self) -> "Batches": ...
    def __next__(self) -> Dict[str, npt.NDArray[Any]]: ...
    @property
    def columns(self) -> List[str]:
        """The keys of every batch."""
    @property
    def rows_skipped(self) -> int:
        """Rows skipped so far by the job's bad-row policy."""

def read_batches(
    job: _Path, files: Optional[Sequence[_Path]] = None, batch_size: Optional[int] = None
) -> Batches:
    """Reads ``files`` (default: the job's training files) of the job file ``job``."""
