"""`Shards`: the input of a partitioned build (`frontend.partitioned`), a
catalogue larger than memory given as its sources and how to build it. Its
own module, below the build's steps (`spill`, `build_tasks`,
`partition_layers`) that read it and `partitioned` that runs them."""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import Executor
from typing import Callable, Optional, Union

import numpy as np

from static_compiler.errors import ConstraintSetError

DEFAULT_CHUNK_ROWS = 1 << 20


@dataclasses.dataclass(frozen=True)
class Shards:
    """A catalogue larger than memory, built in partitions.

    The input of `build_trie_partitioned` and of `compile_constraints` for
    sets that do not fit one array (see the module doc).

    Parameters
    ----------
    sources : str, os.PathLike or numpy.ndarray, or a list, tuple or other iterable of them
        .npy file paths (memory-mapped, read in chunks) and/or int arrays,
        each 2-D (N_i, L) of any integer dtype, all of one L; rows are
        numbered across them in order. Tokens lie in [0, V); a
        variable-length row holds -1 past its end (and the build needs
        ``end_token``). One path or array is one source. A list or tuple
        is opened up front (its files' spill tasks run on the executor);
        any other iterable (a generator of arrays) is consumed once, one
        source at a time in this process, so only the current one is ever
        in memory.
    partitions : int, default 16
        P, ranges of the first token (of about equal rows) built
        separately; at least 1.
    executor : concurrent.futures.Executor, optional
        Runs the partition tasks (and the spill task of each .npy path of
        a list or tuple); default: one after another in this process.
    workdir : str or os.PathLike, optional
        Where spill files go (default: the system's temp directory);
        removed afterwards.
    chunk_rows : int, default DEFAULT_CHUNK_ROWS (1 << 20)
        Rows of a source read, checked and spilled at a time; at least 1.
    progress : callable, optional
        Called with one line (str) per stage.

    Raises
    ------
    ConstraintSetError
        When `sources` is not paths or arrays (or is empty), or
        `partitions` or `chunk_rows` is not an int >= 1.

    Examples
    --------
    >>> import numpy as np
    >>> from static_compiler.frontend.partitioned import build_trie_partitioned
    >>> rows = np.array([[1, 2], [1, 3], [0, 2], [1, 2]], np.int32)
    >>> ir, items = build_trie_partitioned(Shards([rows], partitions=2), vocab_size=4)
    >>> ir.num_sequences, items.row_item.tolist()
    (3, [1, 2, 0, 1])
    """

    sources: tuple
    partitions: int = 16
    executor: Optional[Executor] = None
    workdir: Optional[Union[str, os.PathLike]] = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    progress: Optional[Callable[[str], None]] = None

    def __post_init__(self):
        if isinstance(self.sources, (str, os.PathLike, np.ndarray)):
            object.__setattr__(self, "sources", (self.sources,))
        elif isinstance(self.sources, (list, tuple)):
            object.__setattr__(self, "sources", tuple(self.sources))
        else:
            try:
                object.__setattr__(self, "sources", iter(self.sources))
            except TypeError:
                raise ConstraintSetError(f"Shards: sources is a {type(self.sources).__name__}: "
                                         "expected .npy paths or int arrays (a list, or an "
                                         "iterable consumed once)") from None
        for name in ("partitions", "chunk_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ConstraintSetError(f"Shards: {name}={value!r}: expected an int >= 1")
        if isinstance(self.sources, tuple) and not self.sources:
            raise ConstraintSetError("Shards: no sources: expected .npy paths or int arrays")
