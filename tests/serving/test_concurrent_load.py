"""Loading an artifact while another process overwrites it:
a load reads one version, all old or all new, or fails with a typed error;
never tables of one version under the manifest of another.

Sets A and B have the same shapes (B is A with its tokens permuted), so the
same modules serve both and a mixed load would run without complaint and
decode sequences of neither set."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from static_compiler import artifact, compile_constraints, serving
from static_compiler.artifact import history
from static_compiler.errors import ArtifactError
from static_compiler.format import snapshot
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import Manifest

V, L, N = 12, 3, 40
PERMUTATION = np.random.default_rng(7).permutation(V)


def sets():
    rng = np.random.default_rng(3)
    a = np.unique(rng.integers(0, V, size=(N, L)), axis=0)
    return a, PERMUTATION[a]


def member_sets():
    a, b = sets()
    return {tuple(map(int, row)) for row in a}, {tuple(map(int, row)) for row in b}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(path, {fingerprint: the set's sequences}, compiled A, compiled B):
    A saved at path."""
    root = tmp_path_factory.mktemp("concurrent")
    a, b = sets()
    ca = compile_constraints(a, V, export_beam_sizes=(4,))
    cb = compile_constraints(b, V, export_beam_sizes=(4,))
    assert [t.shape for t in ca.lowered.tables[-1].values()] == \
        [t.shape for t in cb.lowered.tables[-1].values()]
    prints = {}
    for name, c, seqs in (("a", ca, a), ("b", cb, b)):
        prints[serving.load(artifact.save(c, root / name)).fingerprint] = \
            {tuple(map(int, row)) for row in seqs}
    path = artifact.save(ca, root / "served")
    return path, prints, ca, cb


def decoded(art, seed: int) -> list[tuple]:
    """The valid beams of a beam search through `art` with random logits."""
    rng = np.random.default_rng(seed)
    state = art.init_beams(2, 4)
    for step in range(art.max_length):
        logits = rng.standard_normal((2, 4, V)).astype(np.float32)
        state = art.beam_step(state, logits, step)
    result = art.finalize(state)
    tokens, valid = np.asarray(result.tokens), np.asarray(result.valid)
    return [tuple(map(int, tokens[b, m, :L])) for b in range(2) for m in range(4)
            if valid[b, m]]


def assert_one_version(art, prints):
    assert art.fingerprint in prints, "the loaded manifest is of neither set"
    members = prints[art.fingerprint]
    for seed in range(3):
        beams = decoded(art, seed)
        assert beams and set(beams) <= members, (art.fingerprint, beams)


def overwrite_on_call(monkeypatch, owner, name, when, action):
    """Runs action() once, right after the `when`-th call of owner.name;
    returns the list of calls so far."""
    original = getattr(owner, name)
    calls = []

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(1)
        if len(calls) == when:
            action()
        return out

    monkeypatch.setattr(owner, name, wrapped)
    return calls


def test_an_overwrite_after_the_manifest_is_read_leaves_the_load_on_the_old_version(
        saved, monkeypatch):
    """Before: the manifest and checksums were of A, then the tables were
    read again by path, after B replaced A: A's manifest over B's tables."""
    path, prints, ca, cb = saved
    artifact.save(ca, path, overwrite=True)
    original = Manifest.from_json.__func__
    fired = []

    def from_json(cls, obj, where):
        manifest = original(cls, obj, where)
        if not fired:
            fired.append(1)
            artifact.save(cb, path, overwrite=True)  # lands between verify and read
        return manifest

    monkeypatch.setattr(Manifest, "from_json", classmethod(from_json))
    art = serving.load(path)
    assert fired
    assert_one_version(art, prints)
    monkeypatch.undo()
    assert prints[serving.load(path).fingerprint] == member_sets()[1]  # B is there now


def test_an_overwrite_while_the_files_are_opened_restarts_on_the_new_version(
        saved, monkeypatch):
    """Without kept versions (K = 0) the replaced directory is deleted under
    the load, which starts again on the new version."""
    path, prints, ca, cb = saved
    monkeypatch.setenv(history.KEEP_ENV, "0")
    artifact.save(ca, path, overwrite=True)
    a_print = serving.load(path).fingerprint
    calls = overwrite_on_call(monkeypatch, snapshot, "_open_at", 4,
                              lambda: artifact.save(cb, path, overwrite=True))
    art = serving.load(path)
    assert len(calls) > 4
    assert art.fingerprint != a_print
    assert_one_version(art, prints)


def test_an_overwrite_while_the_files_are_opened_keeps_the_load_on_its_kept_version(
        saved, monkeypatch):
    """With kept versions the replaced directory is renamed, not deleted:
    the load finishes on the version it opened, whole (`artifact.history`)."""
    path, prints, ca, cb = saved
    artifact.save(ca, path, overwrite=True)
    a_print = serving.load(path).fingerprint
    overwrite_on_call(monkeypatch, snapshot, "_open_at", 4,
                      lambda: artifact.save(cb, path, overwrite=True))
    art = serving.load(path)
    assert art.fingerprint == a_print
    assert_one_version(art, prints)
    monkeypatch.undo()
    assert serving.load(path).fingerprint != a_print  # B is there now


def test_a_directory_replaced_on_every_attempt_is_a_typed_error(saved, monkeypatch):
    path, _, ca, cb = saved
    monkeypatch.setenv(history.KEEP_ENV, "0")  # (kept versions would leave each attempt whole)
    versions_ = iter([cb, ca] * snapshot.SNAPSHOT_ATTEMPTS)
    original, saving = snapshot._open_at, []

    def open_at(path_, dir_fd, rel):
        f = original(path_, dir_fd, rel)
        # Every attempt opens the manifest first (so does save's own check).
        if rel == fmt.MANIFEST_FILE and not saving:
            saving.append(1)
            artifact.save(next(versions_), path, overwrite=True)
            saving.clear()
        return f

    monkeypatch.setattr(snapshot, "_open_at", open_at)
    with pytest.raises(ArtifactError, match="replaced 5 times while it was being opened"):
        serving.load(path)


def test_a_symbolic_link_inside_an_artifact_is_refused(saved, tmp_path):
    path, _, ca, _ = saved
    copy = artifact.save(ca, tmp_path / "copy")
    target = copy / "tables"
    moved = tmp_path / "elsewhere"
    target.rename(moved)
    os.symlink(moved, target)
    with pytest.raises(ArtifactError, match="'tables' is a symbolic link"):
        serving.load(copy)


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[4])
    import test_concurrent_load as t
    from static_compiler import artifact, compile_constraints
    a, b = t.sets()
    sets = [compile_constraints(s, t.V, export_beam_sizes=(4,)) for s in (a, b)]
    open(sys.argv[3], "w").close()  # ready
    for i in range(int(sys.argv[2])):  # B, A, B, ...: overwrite i saves sets[(i + 1) % 2]
        artifact.save(sets[(i + 1) % 2], sys.argv[1], overwrite=True)
    print(int(sys.argv[2]))
""")


def test_loads_during_a_stream_of_overwrites_each_decode_one_version(saved, tmp_path):
    """A writer process overwrites the path with B and A in turn while this
    process loads and decodes it: every load is one of the two versions (or
    a typed error), and every valid beam is in the set the load reports.
    Driven by a count, not a clock: the writer makes
    STATIC_COMPILER_STRESS_OVERWRITES (default 6) overwrites, this process
    loads until the writer exits, then once more (the last version written)."""
    path, prints, ca, _ = saved
    artifact.save(ca, path, overwrite=True)
    overwrites = int(os.environ.get("STATIC_COMPILER_STRESS_OVERWRITES", "6"))
    ready = tmp_path / "ready"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(overwrites),
                               str(ready), os.path.dirname(__file__)], stdout=subprocess.PIPE,
                              text=True)
    try:
        while not ready.exists() and writer.poll() is None:
            time.sleep(0.05)
        loads, errors, seen = 0, 0, set()
        while writer.poll() is None:
            try:
                art = serving.load(path)
            except ArtifactError:
                errors += 1
                continue
            loads += 1
            seen.add(art.fingerprint)
            assert_one_version(art, prints)
        out, _ = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == 0 and int(out) == overwrites, out
    print(f"{overwrites} overwrites: {loads} loads during them ({len(seen)} versions seen), "
          f"{errors} typed errors")
    last = serving.load(path)  # the writer is done: the version it wrote last
    assert_one_version(last, prints)
    assert prints[last.fingerprint] == member_sets()[overwrites % 2]
