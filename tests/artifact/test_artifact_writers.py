"""Every writer of an artifact path takes the same lock, and an update builds
only from the snapshot it read.

Before: `save(overwrite=True)` took no lock, and an update read the manifest
from a snapshot but hard-linked the files from the path, so a save landing
between the two left a manifest of one version over files of another (the
path no longer loaded). Now `save`, `update_removed` and `update_artifact`
all hold `artifact.update_lock` while they write (a second writer gets
ArtifactBusyError at once), and an update links or copies the very files its
snapshot opened (`Snapshot.link_into`).

The stress test runs writer and reader processes on one path until each
writer has written STATIC_COMPILER_STRESS_WRITES versions (default 6; the copy
marked slow, 60): it counts what it saw, it never asks for a rate."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import queue as queue_lib
import time
import traceback

import numpy as np
import pytest

import static_compiler as sc
from static_compiler import artifact, serving
from static_compiler.artifact import lock, writer
from static_compiler.errors import ArtifactBusyError
from static_compiler.format import snapshot
from static_compiler.format import spec as fmt
from static_compiler.lifecycle import update

V, L = 6, 3
BEAMS = 2


def sets() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, additions): two sets a writer saves in turn, and sequences an
    updater adds (well within the reserved capacity)."""
    rng = np.random.default_rng(5)
    a = np.unique(rng.integers(0, V, size=(16, L)), axis=0)
    b = np.unique(rng.integers(0, V, size=(16, L)), axis=0)
    extra = np.array([[5, 5, 5], [0, 5, 0], [4, 4, 1]], np.int32)
    return a, b, extra


def universe() -> set:
    """Every sequence any version of the stress test's path can hold."""
    return {tuple(map(int, row)) for rows in sets() for row in rows}


def compiled(rows) -> sc.CompiledConstraints:
    return sc.compile_constraints(rows, V, export_beam_sizes=(BEAMS,), export_subsets=True,
                                  capacity=2.0)


def version_id(files: dict) -> str:
    """One version of an artifact: the sha256 of every file its manifest
    lists ({relative path: sha256})."""
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()


def loaded_version(art) -> str:
    return version_id({rel: entry.sha256 for rel, entry in art.manifest.files.items()})


def decoded(art) -> set:
    """The valid beams of a beam search through `art` (all-zero logits)."""
    state = art.init_beams(1, BEAMS)
    for step in range(art.max_length):
        state = art.beam_step(state, np.zeros((1, BEAMS, V), np.float32), step)
    result = art.finalize(state)
    tokens, valid = np.asarray(result.tokens), np.asarray(result.valid)
    return {tuple(map(int, tokens[0, m, :L])) for m in range(BEAMS) if valid[0, m]}


def members(rows) -> set:
    return {tuple(map(int, row)) for row in rows}


@pytest.fixture(scope="module")
def built():
    """Compiled A and B with their artifact files, exported once."""
    a, b, _ = sets()
    ca, cb = compiled(a), compiled(b)
    return ca, cb, {id(ca): artifact.build_files(ca), id(cb): artifact.build_files(cb)}


@pytest.fixture
def two_sets(built, monkeypatch):
    """A and B, with `build_files` answered from the cache for them (these
    tests exercise writing and locking, not export)."""
    ca, cb, files = built
    real = writer.build_files
    monkeypatch.setattr(writer, "build_files", lambda c, reuse=None, modules=True:
                        files[id(c)] if reuse is None and id(c) in files else real(c, reuse))
    return ca, cb


def assert_loads_and_decodes(path, allowed: set, some: bool = True) -> serving.Artifact:
    """`path` loads with every checksum verified, its tables form the
    automaton its manifest describes, and decoding stays in `allowed` (and
    finds some sequence, unless `some` is False: updates may have removed
    every item)."""
    artifact.load_checked(path)
    art = serving.load(path, verify_checksums=True)
    beams = decoded(art)
    assert (beams or not some) and beams <= allowed, beams
    return art


# ----- the lock: every writer takes it ------------------------------------------------------

def test_a_save_while_another_writer_holds_the_lock_fails_at_once(tmp_path, two_sets):
    ca, cb = two_sets
    path = artifact.save(ca, tmp_path / "set.static")
    before = (path / "manifest.json").read_bytes()
    new = tmp_path / "new.static"
    with artifact.update_lock(path), artifact.update_lock(new):
        for target, overwrite in ((path, True), (new, False)):
            with pytest.raises(ArtifactBusyError, match=f"{target.name}.*being updated by "
                                                        "another process.*nothing was written"):
                artifact.save(cb, target, overwrite=overwrite)
        with pytest.raises(ArtifactBusyError):
            sc.update_artifact(path, add=sets()[2][:1])
        with pytest.raises(ArtifactBusyError):
            sc.update_artifact(path, remove=sets()[0][:1])
        with pytest.raises(ArtifactBusyError):
            update.update_removed(path, sets()[0][:1])
    assert (path / "manifest.json").read_bytes() == before
    # The lock file goes with its holder: nothing is left beside the artifact.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".set.static.versions", "set.static"]
    artifact.save(cb, path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".set.static.versions", "set.static"]
    assert_loads_and_decodes(path, members(sets()[1]))


def test_a_lock_file_left_by_a_killed_writer_is_taken_over(tmp_path, two_sets):
    ca, _ = two_sets
    path = tmp_path / "set.static"
    artifact.lock_file(path).write_bytes(b"")  # its holder died: the kernel dropped the flock
    artifact.save(ca, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".set.static.versions", "set.static"]


def test_a_writer_that_locked_a_removed_lock_file_does_not_hold_the_lock(tmp_path):
    """The holder removes the lock file as it lets go; a writer that had
    opened it just before then locks a file no other writer can see. The
    next writer must not treat that as the lock: it locks the path's new
    file, and a writer that finds its locked file removed starts over."""
    import fcntl
    path = tmp_path / "set.static"
    with artifact.update_lock(path):
        late = os.open(artifact.lock_file(path), os.O_RDWR)  # opened before the release
    try:
        fcntl.flock(late, fcntl.LOCK_EX | fcntl.LOCK_NB)  # succeeds: on the removed file
        with artifact.update_lock(path):
            with pytest.raises(ArtifactBusyError):
                with artifact.update_lock(path):
                    pass
    finally:
        os.close(late)
    assert not artifact.lock_file(path).exists()


def test_update_lock_starts_over_when_the_file_it_locked_was_removed(tmp_path, monkeypatch):
    path = tmp_path / "set.static"
    checks = []
    real = lock.names_open_file

    def removed_once(lock, fd):
        checks.append(lock)
        return len(checks) > 1 and real(lock, fd)

    monkeypatch.setattr(lock, "names_open_file", removed_once)
    with artifact.update_lock(path):
        assert len(checks) == 2
    assert not artifact.lock_file(path).exists()


def test_locking_a_path_whose_directory_is_missing_is_a_typed_error(tmp_path):
    from static_compiler.errors import ArtifactFormatError
    with pytest.raises(ArtifactFormatError, match="missing.*found nothing"):
        with artifact.update_lock(tmp_path / "missing" / "set.static"):
            pass


# ----- the update builds only from its snapshot ---------------------------------------------

def test_link_into_takes_the_opened_file_even_after_the_path_was_replaced(tmp_path, two_sets):
    ca, cb = two_sets
    path = artifact.save(ca, tmp_path / "set.static")
    with snapshot.open_snapshot(path) as snap:
        rel = snap.manifest.tables[0].file
        snap.link_into(rel, tmp_path / "linked" / rel)
        if os.link in os.supports_dir_fd:  # a hard link to the very file, not a copy
            assert os.stat(tmp_path / "linked" / rel).st_ino == os.stat(path / rel).st_ino
        artifact.save(cb, path, overwrite=True)  # swaps B in and deletes A's directory
        assert not snap.is_current()
        for rel, entry in snap.manifest.files.items():
            snap.link_into(rel, tmp_path / "copy" / rel)
            assert fmt.sha256_file(tmp_path / "copy" / rel) == entry.sha256, rel


def _in_the_window(monkeypatch, kind: str, action):
    """Runs action() once inside an update of kind "remove" or "add", after
    it read its snapshot and before it writes anything."""
    done = []

    def once():
        if not done:
            done.append(action())

    if kind == "remove":  # before the first file is linked from the snapshot
        real = snapshot.Snapshot.link_into

        def link_into(self, rel, dest):
            once()
            return real(self, rel, dest)

        monkeypatch.setattr(snapshot.Snapshot, "link_into", link_into)
    else:  # after the old set is read, before the new version is built
        real_read = update.compiled_from_snapshot

        def read(*args, **kwargs):
            out = real_read(*args, **kwargs)
            once()
            return out

        monkeypatch.setattr(update, "compiled_from_snapshot", read)
    return done


def _update(path, kind: str):
    a, _, extra = sets()
    if kind == "remove":
        return sc.update_artifact(path, remove=a[:2])
    return sc.update_artifact(path, add=extra)


@pytest.mark.parametrize("kind", ["remove", "add"])
def test_a_save_in_the_update_window_is_refused_and_the_update_completes(tmp_path, two_sets,
                                                                        monkeypatch, kind):
    """The forced window of the issue: a save(overwrite=True) between the
    update reading its snapshot and writing. It used to swap B in there,
    and the update then linked B's files under A's manifest."""
    ca, cb = two_sets
    path = artifact.save(ca, tmp_path / "set.static")

    def save_b():
        try:
            artifact.save(cb, path, overwrite=True)
        except ArtifactBusyError as e:
            return e
        return None

    done = _in_the_window(monkeypatch, kind, save_b)
    report = _update(path, kind)
    assert done and isinstance(done[0], ArtifactBusyError), done
    monkeypatch.undo()
    a, _, extra = sets()
    want = members(a[2:]) if kind == "remove" else members(a) | members(extra)
    assert report[{"remove": "removed", "add": "added"}[kind]] == (2 if kind == "remove" else 3)
    art = assert_loads_and_decodes(path, want)
    assert art.num_sequences == (len(a) if kind == "remove" else len(a) + len(extra))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".set.static.versions", "set.static"]
    # And the save goes through once the update is done.
    artifact.save(cb, path, overwrite=True)
    assert_loads_and_decodes(path, members(sets()[1]))


@pytest.mark.parametrize("kind", ["remove", "add"])
def test_a_writer_that_skips_the_lock_cannot_mix_versions_into_an_update(tmp_path, two_sets,
                                                                          monkeypatch, kind):
    """A writer that does not take the lock (an older release) swaps B in
    inside the window: the update has built only from A's snapshot, sees
    the path replaced before its own swap, and writes nothing."""
    ca, cb = two_sets
    path = artifact.save(ca, tmp_path / "set.static")
    b_files = artifact.build_files(cb)
    done = _in_the_window(monkeypatch, kind,
                          lambda: writer._write_files(path, b_files, overwrite=True))
    with pytest.raises(ArtifactBusyError, match="was replaced while the update was reading it"):
        _update(path, kind)
    assert done
    monkeypatch.undo()
    assert (path / "manifest.json").read_bytes() == b_files["manifest.json"]
    assert_loads_and_decodes(path, members(sets()[1]))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".set.static.versions", "set.static"]


# ----- stress: writer and reader processes on one path --------------------------------------
# The process functions are module level: the spawn context imports this
# module in each child and calls them by name.


def _record_swaps(out: list) -> None:
    """Makes every version this process swaps in recorded in `out` (by
    `version_id`, read from the manifest it is about to swap in, under the
    writers' lock) before the swap."""
    real = writer._swap_in

    def swap_in(tmp, path, parent, *rest):  # (overwrite, made)
        files = json.loads((tmp / fmt.MANIFEST_FILE).read_bytes())["files"]
        out.append(version_id({rel: e["sha256"] for rel, e in files.items()}))
        return real(tmp, path, parent, *rest)

    writer._swap_in = swap_in


def _writer(role: str, path: str, seed: int, writes: int, start, stop, results) -> None:
    """One writer: "save" (A and B in turn, overwrite=True), "remove" or "add"
    (`update_artifact` with a few sequences), until it has written `writes`
    versions (or `stop` is set: a child failed). Busy errors are counted and
    retried; any other error is reported."""
    out = {"role": role, "ok": 0, "busy": 0, "errors": [], "written": []}
    try:
        rng = np.random.default_rng(seed)
        a, b, extra = sets()
        _record_swaps(out["written"])
        if role == "save":
            versions = [compiled(a), compiled(b)]
            files = {id(c): writer.build_files(c) for c in versions}  # export once
            real = writer.build_files  # where `save` looks it up
            writer.build_files = lambda c, reuse=None, modules=True: (
                files[id(c)] if reuse is None and id(c) in files else real(c, reuse))
        pool = np.concatenate([a, b, extra])
        results.put(("ready", role))
        start.wait()
        i = 0
        while out["ok"] < writes and not stop.is_set():
            try:
                if role == "save":
                    artifact.save(versions[i % 2], path, overwrite=True)
                elif role == "remove":
                    sc.update_artifact(path, remove=pool[rng.choice(len(pool), 2)])
                else:
                    sc.update_artifact(path, add=pool[rng.choice(len(pool), 2)])
                out["ok"] += 1
            except ArtifactBusyError:
                out["busy"] += 1
            i += 1
            time.sleep(rng.uniform(0, 0.03))  # so that each writer gets its turns
    except BaseException:
        out["errors"].append(traceback.format_exc())
    results.put(("done", out))


def _reader(path: str, start, stop, results) -> None:
    """Loads `path` with every checksum verified until `stop` is set (and at
    least once), recording the version of each load; every third load also
    decodes."""
    out = {"role": "read", "ok": 0, "errors": [], "read": []}
    try:
        allowed = universe()
        results.put(("ready", "read"))
        start.wait()
        while not stop.is_set() or not (out["ok"] or out["errors"]):
            try:
                art = serving.load(path, verify_checksums=True)
                out["read"].append(loaded_version(art))
                if out["ok"] % 3 == 0:
                    beams = decoded(art)
                    if not beams <= allowed:
                        out["errors"].append(f"decoded {sorted(beams)}, outside every version")
                out["ok"] += 1
            except Exception:
                out["errors"].append(traceback.format_exc())
    except BaseException:
        out["errors"].append(traceback.format_exc())
    results.put(("done", out))


def _stress(tmp_path, writes: int) -> None:
    path = tmp_path / "set.static"
    a, _, _ = sets()
    artifact.save(compiled(a), path)
    initial = version_id({rel: e.sha256 for rel, e in
                          snapshot.read_manifest(path).files.items()})
    ctx = multiprocessing.get_context("spawn")
    start, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    roles = ["save", "remove", "add"]
    procs = [ctx.Process(target=_writer,
                         args=(role, str(path), seed, writes, start, stop, results))
             for seed, role in enumerate(roles)]
    procs += [ctx.Process(target=_reader, args=(str(path), start, stop, results))
              for _ in range(2)]
    outs = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 300  # start-up: each child imports jax
        ready = 0
        while ready < len(procs):
            kind, what = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if kind == "ready":
                ready += 1
            else:  # failed before it was ready
                outs.append(what)
                break
        if ready == len(procs):
            start.set()
            while len(outs) < len(roles):  # the writers stop after `writes` versions each
                kind, what = results.get(timeout=600)
                if kind == "done":
                    outs.append(what)
        stop.set()
        start.set()
        while len(outs) < len(procs):
            kind, what = results.get(timeout=120)
            if kind == "done":
                outs.append(what)
        for p in procs:
            p.join(timeout=60)
    except queue_lib.Empty:
        pytest.fail(f"stress: children stopped answering; results so far: {outs}")
    finally:
        stop.set()
        start.set()
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
    errors = [e for out in outs for e in out["errors"]]
    assert not errors, "\n".join(errors)
    written = {initial} | {v for out in outs for v in out.get("written", [])}
    read = [v for out in outs for v in out.get("read", [])]
    by_role = {out["role"]: out for out in outs if out["role"] != "read"}
    summary = {role: (out["ok"], out["busy"]) for role, out in by_role.items()}
    assert all(out["ok"] == writes for out in by_role.values()), summary
    assert all(out["ok"] for out in outs if out["role"] == "read")  # every reader read
    print(f"stress, {writes} writes each: writers (ok, busy) {summary}; {len(read)} loads of "
          f"{len(set(read))} versions ({len(written)} written)")
    unknown = [v for v in read if v not in written]
    assert not unknown, f"{len(unknown)} of {len(read)} loads read a version no writer wrote"
    # Afterwards the path holds a whole version, and nothing else is left.
    assert_loads_and_decodes(path, universe(), some=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".set.static.versions", "set.static"]


def test_writers_and_readers_on_one_path_never_see_a_corrupt_version(tmp_path):
    """A process saving A and B in turn, one removing and one adding with
    `update_artifact`, and two loading with checksums verified, all on one
    path: every load succeeds and is a version some writer wrote; busy
    writers are expected, counted and retried."""
    _stress(tmp_path, int(os.environ.get("STATIC_COMPILER_STRESS_WRITES", "6")))


@pytest.mark.slow
def test_writers_and_readers_on_one_path_for_60_writes_each(tmp_path):
    _stress(tmp_path, 60)
