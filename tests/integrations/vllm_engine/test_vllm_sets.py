"""The sets of the vLLM processor (`integrations.vllm.sets`): names registered
at start-up, one load per artifact version (a new version on disk is picked
up, the old object keeps its own), a request's subset and prefix checked at
admission. torch and the compiler, no vLLM."""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import static_compiler as sc  # noqa: E402
from static_compiler.errors import DecodeInputError  # noqa: E402
from static_compiler.integrations.vllm import sets  # noqa: E402
from static_compiler.integrations.vllm.options import Options  # noqa: E402

END = 1
ITEMS = [[5, 6, 7], [5, 6, 8], [5, 9], [10, 11, 12], [10, 13]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    compiled = sc.compile_constraints(ITEMS, vocab_size=16, end_token=END, export_subsets=True,
                                      attributes={"even": np.arange(5) % 2 == 0,
                                                  "idx": np.arange(5)})
    path = tmp_path_factory.mktemp("sets") / "set.sc"
    compiled.save(path, modules=False)
    return path


@pytest.fixture
def artifact(saved, tmp_path):
    """A copy of the saved set, for one test (which may update it)."""
    return pathlib.Path(shutil.copytree(saved, tmp_path / "set.sc"))


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.delenv(sets.ENV, raising=False)
    monkeypatch.setattr(sets, "_REGISTERED", {})


def walk(resolved, tokens):
    """The items the resolved request may still end with, by the door's
    verbs from its state (each token tried)."""
    tc, found = resolved.constraints, []

    def go(state, step, path):
        allowed = tc.allowed_tokens(state, step, subset=resolved.subset)[0]
        for token in torch.nonzero(allowed).flatten().tolist():
            if token == END:
                found.append(path)
            else:
                go(tc.advance(state, torch.tensor([token]), step, subset=resolved.subset),
                   step + 1, path + [token])
    go(resolved.state, resolved.step, list(tokens))
    return sorted(found)


def test_registered_names_come_from_the_environment_then_register_set(monkeypatch,
                                                                       clean_registry):
    monkeypatch.setenv(sets.ENV, " a=/x/a , b=/x/b,")
    assert sets.registered_sets() == {"a": "/x/a", "b": "/x/b"}
    sets.register_set("b", "/y/b")
    assert sets.registered_sets() == {"a": "/x/a", "b": "/y/b"}
    monkeypatch.setenv(sets.ENV, "a")
    with pytest.raises(DecodeInputError, match=f"{sets.ENV}: 'a': expected name=path"):
        sets.registered_sets()
    with pytest.raises(DecodeInputError, match="name='x=y'"):
        sets.register_set("x=y", "/p")


def test_sc_set_is_a_registered_name_or_a_directory(artifact, clean_registry):
    sets.register_set("mine", artifact)
    assert sets.set_path("mine") == artifact and sets.set_path(str(artifact)) == artifact
    with pytest.raises(DecodeInputError, match=r"sc_set='nope'.*registered: \['mine'\]"):
        sets.set_path("nope")


def test_a_version_is_loaded_once_and_a_new_one_for_new_requests(artifact, clean_registry):
    cache = sets.SetCache()
    first = cache.current(artifact)
    assert cache.current(artifact) is first
    old = cache.resolve(Options(str(artifact)))
    sc.update_artifact(artifact, remove=[[5, 9]])
    second = cache.current(artifact)
    assert second is not first and cache.current(artifact) is second
    assert walk(cache.resolve(Options(str(artifact))), []) == \
        sorted(i for i in ITEMS if i != [5, 9])
    assert walk(old, []) == sorted(ITEMS)  # a running request keeps its version


def test_an_unchanged_artifact_is_not_read_again(artifact, clean_registry, monkeypatch):
    cache = sets.SetCache()
    first = cache.current(artifact)
    opened = []
    real = sets.snapshot.open_snapshot
    monkeypatch.setattr(sets.snapshot, "open_snapshot",
                        lambda *a, **k: opened.append(a) or real(*a, **k))
    for _ in range(3):
        assert cache.current(artifact) is first
    assert opened == []  # (stats only)
    (artifact / "manifest.json").touch()  # a new stat, the same manifest: read, kept
    assert cache.current(artifact) is first and len(opened) == 1
    assert cache.current(artifact) is first and len(opened) == 1


def test_a_request_like_an_earlier_one_reuses_its_resolution(artifact, clean_registry):
    cache = sets.SetCache()
    plain, prefixed = Options(str(artifact)), Options(str(artifact), prefix=(5,))
    first = cache.resolve(plain)
    assert cache.resolve(Options(str(artifact))) is first
    assert cache.resolve(prefixed) is not first and cache.resolve(prefixed).step == 1
    assert walk(cache.resolve(prefixed), [5]) == [[5, 6, 7], [5, 6, 8], [5, 9]]
    sc.update_artifact(artifact, remove=[[5, 9]])
    again = cache.resolve(plain)  # a new version: resolved anew
    assert again is not first and again.constraints is not first.constraints
    assert walk(cache.resolve(prefixed), [5]) == [[5, 6, 7], [5, 6, 8]]


def test_a_name_registered_again_or_a_link_moved_reaches_new_requests(saved, tmp_path,
                                                                     clean_registry,
                                                                     monkeypatch):
    """The resolution kept for a request's options is reused only while the
    name still names the same directory, unchanged."""
    one = pathlib.Path(shutil.copytree(saved, tmp_path / "one.sc"))
    two = pathlib.Path(shutil.copytree(saved, tmp_path / "two.sc"))
    sc.update_artifact(two, remove=[[5, 9]])
    cache = sets.SetCache()
    sets.register_set("mine", one)
    assert walk(cache.resolve(Options("mine")), []) == sorted(ITEMS)
    sets.register_set("mine", two)
    assert walk(cache.resolve(Options("mine")), []) == sorted(i for i in ITEMS if i != [5, 9])
    monkeypatch.setenv(sets.ENV, f"env={one}")
    assert walk(cache.resolve(Options("env")), []) == sorted(ITEMS)
    monkeypatch.setenv(sets.ENV, f"env={two}")
    assert walk(cache.resolve(Options("env")), []) == sorted(i for i in ITEMS if i != [5, 9])
    link = tmp_path / "current.sc"
    link.symlink_to(one)
    assert walk(cache.resolve(Options(str(link))), []) == sorted(ITEMS)
    swap = tmp_path / "swap"
    swap.symlink_to(two)
    swap.replace(link)  # (a deployment's atomic switch)
    assert walk(cache.resolve(Options(str(link))), []) == sorted(i for i in ITEMS if i != [5, 9])


def test_versions_saved_in_quick_succession_each_reach_new_requests(artifact, clean_registry):
    cache = sets.SetCache()
    seen = [cache.current(artifact)]
    left = list(ITEMS)
    for item in ([5, 9], [10, 13], [5, 6, 8]):  # each update straight after the last look
        sc.update_artifact(artifact, remove=[item])
        left.remove(item)
        seen.append(cache.current(artifact))
        assert walk(cache.resolve(Options(str(artifact))), []) == sorted(left)
    assert len({id(tc) for tc in seen}) == len(seen)


def test_subsets_by_filter_and_by_name(artifact, clean_registry):
    cache = sets.SetCache()
    where = cache.resolve(Options(str(artifact), where="idx >= 3"))
    assert walk(where, []) == [[10, 11, 12], [10, 13]]
    named = cache.resolve(Options(str(artifact), subset="even"))
    assert walk(named, []) == [[5, 6, 7], [5, 9], [10, 13]]
    assert cache.resolve(Options(str(artifact), subset="even")).subset is named.subset  # cached


@pytest.mark.parametrize("ranked_from", [None, "0"])
def test_a_filter_is_ranked_on_a_large_set_and_a_named_subset_never(artifact, clean_registry,
                                                                     monkeypatch, ranked_from):
    """sc_where is a ranked subset on a set of `ranked_from_rows()` rows or
    more (the environment lowers it to every set here): the same items as
    the `Subset`, resolved and refused alike; sc_subset stays a `Subset`."""
    from static_compiler.item_bits.liveness import Subset
    from static_compiler.item_bits.rank import RankedSubset
    if ranked_from is None:
        monkeypatch.delenv(sets.RANKED_ENV, raising=False)
    else:
        monkeypatch.setenv(sets.RANKED_ENV, ranked_from)
    cache = sets.SetCache()
    where = cache.resolve(Options(str(artifact), where="idx >= 3"))
    assert isinstance(where.subset, Subset if ranked_from is None else RankedSubset)
    assert walk(where, []) == [[10, 11, 12], [10, 13]]
    prefixed = cache.resolve(Options(str(artifact), where="idx != 3", prefix=(10,)))
    assert walk(prefixed, [10]) == [[10, 13]]
    assert isinstance(cache.resolve(Options(str(artifact), subset="even")).subset, Subset)
    with pytest.raises(DecodeInputError, match="sc_where='idx > 9': selects no item"):
        cache.resolve(Options(str(artifact), where="idx > 9"))
    with pytest.raises(DecodeInputError, match=r"sc_prefix=\[5, 9\].*in the request's subset"):
        cache.resolve(Options(str(artifact), where="idx != 2", prefix=(5, 9)))


@pytest.mark.parametrize("value", ["-1", "many", "1.5"])
def test_a_bad_ranked_threshold_is_refused_naming_the_variable(artifact, clean_registry,
                                                                monkeypatch, value):
    monkeypatch.setenv(sets.RANKED_ENV, value)
    with pytest.raises(DecodeInputError, match=f"{sets.RANKED_ENV}='{value}': expected an int"):
        sets.SetCache().resolve(Options(str(artifact), where="idx >= 3"))


@pytest.mark.parametrize("options, names", [
    (dict(where="idx > 9"), ["sc_where='idx > 9'", "selects no item"]),
    (dict(where="colour == 1"), ["sc_where='colour == 1'", "unknown attribute 'colour'"]),
    (dict(subset="idx"), ["sc_subset='idx'", "no named subset 'idx'", "['even']"]),
    (dict(subset="none"), ["sc_subset='none'", "bool attribute columns ['even']"]),
    (dict(prefix=(5, 6, 7, 1, 2)), ["sc_prefix=[5, 6, 7, 1, 2]", "at most the set's max_length"]),
    (dict(prefix=(16,)), ["sc_prefix=[16]", "below the set's vocab_size 16"]),
    (dict(prefix=(5, 7)), ["sc_prefix=[5, 7]", "not a prefix of an item"]),
    (dict(prefix=(5, 9), where="idx != 2"), ["sc_prefix=[5, 9]", "in the request's subset"]),
])
def test_a_bad_request_is_refused_naming_its_key(artifact, clean_registry, options, names):
    with pytest.raises(DecodeInputError) as err:
        sets.SetCache().resolve(Options(str(artifact), **options))
    for name in names:
        assert name in str(err.value)


def test_a_missing_artifact_is_refused_naming_it(tmp_path, clean_registry):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DecodeInputError, match="sc_set: the artifact .*empty.* cannot be loaded"):
        sets.SetCache().resolve(Options(str(tmp_path / "empty")))


def test_a_prefix_starts_the_request_inside_the_set(artifact, clean_registry):
    resolved = sets.SetCache().resolve(Options(str(artifact), prefix=(5, 6)))
    assert resolved.step == 2 and walk(resolved, [5, 6]) == [[5, 6, 7], [5, 6, 8]]


def test_end_token_and_vocabulary_problems_are_explained(artifact):
    tc = sets.SetCache().current(artifact)
    assert sets.end_token_problem(tc, END, 16) is None
    assert "ends its items with token 1, the model's end of sequence is 2" in \
        sets.end_token_problem(tc, 2, 16)
    assert "vocab_size 16, wider than the model's logits (8)" in sets.end_token_problem(tc, END, 8)
