"""`TorchConstraints.reload()`: the served `Artifact.reload` contract on the
torch side. The artifact at the loaded path is re-read as one snapshot and
returned as a new object (double buffering: the old one keeps decoding its
version); nothing changed gives self; a version that keeps the tables
(removals, a rollback of them) shares the device tensors; a damaged or
missing version raises the loader's typed error and changes nothing.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import static_compiler as sc
from static_compiler.errors import ArtifactChecksumError, ArtifactFormatError, DecodeInputError
from static_compiler.torch_backend import TorchConstraints

ROWS = np.array([[1, 2, 3], [1, 2, 4], [2, 3, 1], [3, 1, 1]])
V = 6
PIPELINE = "verify,choose-layout{force=near_unary},reserve-capacity{growth=2.0},pack-dtypes"


@pytest.fixture
def saved(tmp_path):
    compiled = sc.compile_constraints(ROWS, V, pipeline=PIPELINE, export_subsets=True)
    path = tmp_path / "set.sc"
    compiled.save(path, modules=False)
    return path


def _allows(tc, prefix) -> list:
    """The tokens `tc` allows after one prefix."""
    return torch.nonzero(tc.allowed(torch.tensor([prefix]))[0]).flatten().tolist()


def test_unchanged_is_self_and_removals_share_the_tensors(saved):
    tc = TorchConstraints.load(saved)
    assert tc.path == saved and tc.reload() is tc
    tc.allowed(torch.tensor([[2]]), subset=tc.ranked_subset(np.ones(4, bool)))  # (order, ranges)
    sc.update_artifact(saved, remove=np.array([[1, 2, 4]]))
    new = tc.reload()
    assert new is not tc and new.reload() is new
    assert _allows(tc, [1, 2]) == [3, 4]  # the old object keeps its version
    assert _allows(new, [1, 2]) == [3]
    assert new._tables is tc._tables  # removals: only the items changed
    assert new.fingerprint != tc.fingerprint
    sub = new.subset(np.array([True, True, False, True]))
    assert _allows(new, [2]) == [3] and _allows(new.__class__.load(saved), [2]) == [3]
    with pytest.raises(DecodeInputError):  # a subset belongs to its version
        tc.allowed(torch.tensor([[2]]), subset=sub)
    assert torch.nonzero(new.allowed(torch.tensor([[2]]), subset=sub)[0]).numel() == 0
    # ranked subsets: per version too; the trie order and range tensors are shared
    ranked = new.ranked_subset(np.array([True, True, False, True]))
    assert torch.equal(new.allowed(torch.tensor([[1], [2]]), subset=ranked),
                       new.allowed(torch.tensor([[1], [2]]), subset=sub))
    with pytest.raises(DecodeInputError, match="the ranked subset was made from another set"):
        tc.allowed(torch.tensor([[2]]), subset=ranked)
    assert new._set_view.trie_order() is tc._set_view.trie_order()
    old, now = tc._engine.range_table, new._engine.range_table
    assert now.rows is old.rows and now.fingerprint == new.fingerprint != old.fingerprint


def test_additions_and_rollback(saved):
    tc = TorchConstraints.load(saved)
    sc.update_artifact(saved, add=np.array([[4, 4, 4]]))
    added = tc.reload()
    assert _allows(tc, [4]) == [] and _allows(added, [4]) == [4]
    result = added.beam_search(lambda last, step, carry: (torch.zeros(1, 2, V), None),
                               batch_size=1, beam_size=2)
    assert result.valid.all()
    sc.rollback_artifact(saved)
    back = added.reload()
    assert _allows(back, [4]) == [] and _allows(added, [4]) == [4]


def test_a_new_set_at_the_path_is_read_whole(saved):
    tc = TorchConstraints.load(saved)
    sc.compile_constraints([[5, 5], [0, 1]], 7).save(saved, overwrite=True, modules=False)
    new = tc.reload()
    assert (new.vocab_size, new.max_length) == (7, 2) and _allows(new, [5]) == [5]
    assert (tc.vocab_size, tc.max_length) == (V, 3) and _allows(tc, [1, 2]) == [3, 4]


@pytest.mark.parametrize("damage", ["checksum", "manifest", "deleted"])
def test_a_damaged_version_is_a_typed_error_and_the_old_one_serves(saved, damage):
    tc = TorchConstraints.load(saved)
    sc.update_artifact(saved, remove=np.array([[1, 2, 4]]))
    if damage == "checksum":
        table = next(p for p in sorted((saved / "tables").iterdir()) if p.stat().st_size)
        data = bytearray(table.read_bytes())
        data[-1] ^= 0xFF
        table.write_bytes(bytes(data))
        error = ArtifactChecksumError
    elif damage == "manifest":
        manifest = saved / "manifest.json"
        manifest.write_text(json.dumps({"format_version": "x"}))
        error = ArtifactFormatError
    else:
        shutil.rmtree(saved)
        error = ArtifactFormatError
    with pytest.raises(error, match=str(saved.name)):
        tc.reload()
    assert _allows(tc, [1, 2]) == [3, 4]  # unchanged, still decoding


def test_a_set_made_from_compiled_has_no_path():
    tc = TorchConstraints.from_compiled(sc.compile_constraints(ROWS, V))
    assert tc.path is None
    with pytest.raises(DecodeInputError, match=r"reload: .*from_compiled.*TorchConstraints.load"):
        tc.reload()
