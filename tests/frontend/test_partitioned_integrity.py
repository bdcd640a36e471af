"""The partitioned build's files passed between tasks: a flipped
byte in a spill file or a partition's piece, or a truncated or deleted
piece, fails the build with BuildError naming the file (never compiles into
another set); work directories of builds that died (SIGKILL) are removed by
the next build in the same directory; a broken process pool's BuildError
says how a script must guard its build."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import socket
import subprocess
import sys
import zlib
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest
from helpers import REPO

import static_compiler as sc
from static_compiler.errors import BuildError
from static_compiler.frontend import array_files, build_dirs, partitioned
from static_compiler.frontend.partitioned import Shards, build_trie_partitioned
from static_compiler.support import processes

V = 16
ROWS = np.random.default_rng(3).integers(0, V, size=(400, 4))


def flip(path: pathlib.Path) -> None:
    """Flips one bit of the file's last byte (data, not an .npy header)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: pathlib.Path) -> None:
    os.truncate(path, path.stat().st_size - 1)


def delete(path: pathlib.Path) -> None:
    path.unlink()


def damage_between(monkeypatch, tmp_path, hook: str, name: str, damage) -> None:
    """Damages file `name` of the build's work directory under tmp_path
    when `partitioned.<hook>` is called: build_partition (partition 1's
    task, after the spill wrote its files) or merged_summary (after every
    partition's task wrote its pieces, before the merge reads them). Both
    are looked up in `partitioned` (by `partitions_built`), so they are
    patched there."""
    real = getattr(partitioned, hook)

    def hooked(*args):
        if hook != "build_partition" or args[1] == 1:
            (work,) = tmp_path.glob(f"{build_dirs.WORK_PREFIX}*")
            damage(work / name)
        return real(*args)

    monkeypatch.setattr(partitioned, hook, hooked)


CASES = [  # (hook, file, damage, message)
    ("build_partition", "s0.p1.codes", flip, r"CRC-32 \w{8}, expected \w{8} as its task wrote"),
    ("build_partition", "s0.p1.lengths", truncate, r"\d+ bytes, expected the \d+ its task"),
    ("merged_summary", "s0.p1.rows", flip, r"CRC-32 \w{8}, expected \w{8}"),
    ("merged_summary", "p1.tokens1.npy", flip, r"CRC-32 \w{8}, expected \w{8}"),
    ("merged_summary", "p1.tokens1.npy", truncate, r"\d+ bytes, expected the \d+ its task"),
    ("merged_summary", "p1.tokens1.npy", delete, r"missing: a task of this build wrote \d+"),
    ("merged_summary", "p2.branch1.npy", flip, r"CRC-32"),
    ("merged_summary", "p0.inverse.npy", flip, r"CRC-32"),
]


@pytest.mark.parametrize("hook, name, damage, message", CASES,
                         ids=[f"{name}-{damage.__name__}" for _, name, damage, _ in CASES])
def test_a_damaged_file_fails_the_build_naming_it(tmp_path, monkeypatch, hook, name, damage,
                                                  message):
    """Spill files are read by the partition tasks (the error names the
    partition too), pieces and row ids by the merge: the trie merge here,
    the lowering straight into tables in the next test."""
    damage_between(monkeypatch, tmp_path, hook, name, damage)
    with pytest.raises(BuildError, match=re.escape(name) + ": " + message) as info:
        build_trie_partitioned(Shards([ROWS], partitions=3, workdir=tmp_path), V)
    assert str(tmp_path / build_dirs.WORK_PREFIX) in str(info.value)  # the full path
    if hook == "build_partition":
        assert "partition 1 of 3 failed" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # the work directory is removed either way


@pytest.mark.parametrize("name, damage", [("p1.tokens2.npy", flip), ("p0.tokens0.npy", delete),
                                          ("s0.p2.rows", truncate)])
def test_compiling_shards_checks_the_pieces_it_lowers(tmp_path, monkeypatch, name, damage):
    """compile_constraints lowers the pieces into tables unmerged
    (`lower_pieces`): a thread pool runs the partition tasks."""
    damage_between(monkeypatch, tmp_path, "merged_summary", name, damage)
    with ThreadPoolExecutor(2) as pool, pytest.raises(BuildError, match=re.escape(name)):
        sc.compile_constraints(Shards([ROWS], partitions=3, executor=pool, workdir=tmp_path), V)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype, shape", [(np.uint16, (5,)), (bool, (3,)), (np.int32, (4, 3)),
                                          (np.int64, (0,))])
def test_checked_files_round_trip_in_chunks(tmp_path, monkeypatch, dtype, shape):
    monkeypatch.setattr(array_files, "CHECK_CHUNK_BYTES", 7)  # many chunks, a short last one
    arr = (np.arange(int(np.prod(shape))) * 7919 % 251).astype(dtype).reshape(shape)
    size, crc = record = array_files.save_checked(tmp_path / "a.npy", arr)
    assert size == (tmp_path / "a.npy").stat().st_size
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), arr)  # a plain .npy file
    got = array_files.npy_array(array_files.read_checked(tmp_path / "a.npy", record))
    assert got.dtype == arr.dtype and got.shape == arr.shape and np.array_equal(got, arr)
    assert array_files.read_checked(tmp_path / "a.npy", record, keep=False) is None
    with pytest.raises(BuildError, match=rf"a.npy: CRC-32 \w{{8}}, expected {crc ^ 1:08x}"):
        array_files.read_checked(tmp_path / "a.npy", (size, crc ^ 1), keep=False)
    writer = array_files.CheckedWriter(tmp_path / "raw")
    writer.write(arr)
    writer.write(b"xy")
    assert writer.close() == (arr.nbytes + 2, zlib.crc32(arr.tobytes() + b"xy"))


# Work directories of builds that died.

def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def test_a_build_removes_the_work_directories_of_builds_that_died(tmp_path):
    host = socket.gethostname()
    me = build_dirs.current_owner()
    owners = {
        "dead": f"{host} {dead_pid()} 12345",
        "dead-no-start": f"{host} {dead_pid()} -",
        "reused-pid": f"{host} {os.getpid()} 1",  # our pid, another process's start time
        "alive": me,
        "alive-no-start": f"{host} {os.getpid()} -",
        "other-host": f"{host}-elsewhere {dead_pid()} 12345",  # a shared file system
        "garbled": "x",
    }
    for key, owner in owners.items():
        (tmp_path / f"{build_dirs.WORK_PREFIX}{key}").mkdir()
        (tmp_path / f"{build_dirs.WORK_PREFIX}{key}" / build_dirs.OWNER_FILE).write_text(owner)
    (tmp_path / f"{build_dirs.WORK_PREFIX}no-owner").mkdir()  # an older build, or one starting
    (tmp_path / "not-a-build").mkdir()
    (tmp_path / "not-a-build" / build_dirs.OWNER_FILE).write_text(owners["dead"])
    lines = []
    build_trie_partitioned(Shards([ROWS], partitions=2, workdir=tmp_path,
                                  progress=lines.append), V)
    gone = {"dead", "dead-no-start"}
    if processes.start_time(os.getpid()) is not None:  # (Linux: /proc)
        gone.add("reused-pid")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["not-a-build", f"{build_dirs.WORK_PREFIX}no-owner"]
                          + [f"{build_dirs.WORK_PREFIX}{key}" for key in owners
                             if key not in gone])
    removed = [line for line in lines if "removed" in line]
    assert len(removed) == len(gone) and all("the work directory of a build that died" in line
                                             for line in removed)


KILLED_BUILD = """
import os, signal, sys
import numpy as np
from static_compiler.frontend.partitioned import Shards, build_trie_partitioned

def progress(line):
    if "built partition 2/" in line:
        os.kill(os.getpid(), signal.SIGKILL)  # mid-build: no finally runs

rows = np.random.default_rng(0).integers(0, 16, size=(400, 4))
build_trie_partitioned(Shards([rows], partitions=3, workdir=sys.argv[1], progress=progress), 16)
"""


def test_a_sigkilled_build_leaves_a_directory_the_next_build_removes(tmp_path):
    done = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    (stale,) = tmp_path.iterdir()
    assert stale.name.startswith(build_dirs.WORK_PREFIX) and (stale / "p0.tokens0.npy").exists()
    assert build_dirs.remove_stale_builds(tmp_path) == [stale.name]
    assert list(tmp_path.iterdir()) == []


# A broken process pool.

class BrokenPool(Executor):
    """A pool whose workers died: at submit (it already broke) or in the
    futures (a worker died while they ran)."""

    def __init__(self, at_submit: bool):
        self.at_submit = at_submit

    def submit(self, fn, *args, **kwargs):
        if self.at_submit:
            raise BrokenProcessPool("A child process terminated abruptly, the process pool is "
                                    "not usable anymore")
        future = Future()
        future.set_exception(BrokenProcessPool("A process in the process pool was terminated "
                                               "abruptly while the future was running or "
                                               "pending."))
        return future


@pytest.mark.parametrize("at_submit", [False, True])
def test_a_broken_process_pool_says_to_guard_the_main_module(tmp_path, at_submit):
    with pytest.raises(BuildError, match=r"partition 0 of 3 failed \(BrokenProcessPool: .*\): "
                                         r"a worker process died .*'spawn' or 'forkserver' pool "
                                         r"re-imports the main module in every worker, so a "
                                         r"script's build code must sit under `if __name__ == "
                                         r"\"__main__\":`"):
        build_trie_partitioned(Shards([ROWS], partitions=3, executor=BrokenPool(at_submit),
                                      workdir=tmp_path), V)
    assert list(tmp_path.iterdir()) == []


def test_other_task_failures_give_no_main_module_hint(tmp_path, monkeypatch):
    def failing(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(partitioned, "build_partition", failing)
    with pytest.raises(BuildError, match=r"partition 0 of 3 failed \(RuntimeError: disk full\)$"):
        build_trie_partitioned(Shards([ROWS], partitions=3, workdir=tmp_path), V)


def test_the_docs_snippet_builds_under_the_main_guard():
    """docs/billion-scale.md's partitioned-build snippet, pasted into a
    script, keeps every statement but imports and constants under
    `if __name__ == "__main__":`."""
    page = (REPO / "docs" / "billion-scale.md").read_text()
    (snippet,) = [block for block in re.findall(r"```python[^\n]*\n(.*?)```", page, re.S)
                  if "ProcessPoolExecutor" in block]
    body = ast.parse(snippet).body
    assert all(isinstance(node, (ast.Import, ast.ImportFrom))
               or (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant))
               for node in body[:-1])
    guard = body[-1]
    assert isinstance(guard, ast.If) and ast.unparse(guard.test) == "__name__ == '__main__'"
    assert "sc.Shards(" in ast.unparse(guard) and "compile_constraints" in ast.unparse(guard)
