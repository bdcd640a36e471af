"""Running a partitioned build's tasks (`frontend.partitioned`): each on
`Shards.executor` where it may run there (a process pool, or a Dask / Ray
cluster's `Executor` over a shared file system), else in this process, in
order, with a progress line (`Shards.progress`) per task. A task's bad
input (ConstraintSetError) is raised as it is; any other failure (a worker
that died, a broken pool) as BuildError naming the task, with the main
module guard a "spawn" pool needs when a worker died.
"""

from __future__ import annotations

import contextlib
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterator, Optional

from static_compiler.errors import BuildError, ConstraintSetError
from static_compiler.frontend.shards import Shards


def say(shards: Shards, line: str) -> None:
    """A progress line, when `shards.progress` is given."""
    if shards.progress is not None:
        shards.progress(line)


def run_tasks(shards: Shards, task: Callable, tasks: list[tuple], on_executor: list[bool],
              what: str, check: Optional[Callable[[int, object], None]] = None) -> list:
    """`task(*args)` for each of `tasks`, on the executor where on_executor
    says so (and one is given), else in this process; in order. A task's
    ConstraintSetError (bad input) is raised as it is; any other failure
    (a worker that died, a broken pool) as BuildError naming the task.
    `check(number, result)`, when given, sees each result in order and may
    raise to stop the build (its error passes as it is, the tasks not yet
    started are cancelled); the first task then runs alone, checked before
    the others are handed to the executor."""
    results: list = []
    with contextlib.closing(_results(shards, task, tasks, on_executor, what,
                                     check is not None)) as running:
        for number, result in enumerate(running):
            results.append(result)
            if check is not None:
                check(number, result)
    return results


def _results(shards: Shards, task: Callable, tasks: list[tuple], on_executor: list[bool],
             what: str, first_alone: bool) -> Iterator:
    """The results of `run_tasks`, in order (a generator: with first_alone,
    the rest are submitted once the first result has been taken)."""
    futures: list = [None] * len(tasks)

    def submit(numbers) -> None:
        for n in numbers:
            if shards.executor is not None and on_executor[n]:
                futures[n] = shards.executor.submit(task, *tasks[n])

    held = 1 if first_alone else len(tasks)
    number = 0
    try:
        submit(range(min(held, len(tasks))))
        for number, args in enumerate(tasks):
            if number == held:
                submit(range(held, len(tasks)))
            result = task(*args) if futures[number] is None else futures[number].result()
            say(shards, f"[partitioned build] {what} {number + 1}/{len(tasks)}")
            yield result
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
