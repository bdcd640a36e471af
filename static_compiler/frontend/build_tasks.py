"""Running a partitioned build's tasks (`frontend.partitioned`): each on
`Shards.executor` where it may run there (a process pool, or a Dask / Ray
cluster's `Executor` over a shared file system), else in this process, in
order, with a progress line (`Shards.progress`) per task. A task's bad
input (ConstraintSetError) is raised as it is; any other failure (a worker
that died, a broken pool) as BuildError naming the task, with the main
module guard a "spawn" pool needs when a worker died.
"""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Callable

from static_compiler.errors import BuildError, ConstraintSetError

if TYPE_CHECKING:
    from static_compiler.frontend.partitioned import Shards


def say(shards: Shards, line: str) -> None:
    """A progress line, when `shards.progress` is given."""
    if shards.progress is not None:
        shards.progress(line)


def run_tasks(shards: Shards, task: Callable, tasks: list[tuple], on_executor: list[bool],
              what: str) -> list:
    """`task(*args)` for each of `tasks`, on the executor where on_executor
    says so (and one is given), else in this process; in order. A task's
    ConstraintSetError (bad input) is raised as it is; any other failure
    (a worker that died, a broken pool) as BuildError naming the task."""
    futures, results = [], []
    number = 0
    try:
        for number, (args, remote) in enumerate(zip(tasks, on_executor)):
            futures.append(shards.executor.submit(task, *args)
                           if shards.executor is not None and remote else None)
        for number, (args, future) in enumerate(zip(tasks, futures)):
            results.append(task(*args) if future is None else future.result())
            say(shards, f"[partitioned build] {what} {number + 1}/{len(tasks)}")
    except ConstraintSetError:
        raise
    except Exception as e:  # a worker died, or the task raised
        why = ""
        if isinstance(e, BrokenProcessPool):
            why = (": a worker process died (killed, out of memory) or could not start; a "
                   "'spawn' or 'forkserver' pool re-imports the main module in every worker, "
                   "so a script's build code must sit under `if __name__ == \"__main__\":`")
        raise BuildError(f"partitioned build: {what.split()[-1]} {number} of {len(tasks)} "
                         f"failed ({type(e).__name__}: {e}){why}") from e
    finally:
        for future in futures:
            if future is not None:
                future.cancel()
    return results
