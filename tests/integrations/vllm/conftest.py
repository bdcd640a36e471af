"""Fixtures of the vLLM tests: the tiny Llama (tools/tiny_llama.py; the
folder named by STATIC_COMPILER_TINY_LLAMA when set, as scripts/test-vllm.sh
sets it, else built here) and small sets compiled with its tokenizer, in
this process (the compiler needs numpy alone: no jax in the vLLM venv).
The engine tests skip without vLLM (pytest.importorskip in their modules);
the fixtures import what they need when used."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys

import numpy as np
import pytest
from helpers import REPO

if str(REPO) not in sys.path:  # (tools.tiny_llama)
    sys.path.insert(0, str(REPO))

EOS = 1  # tools.tiny_llama.EOS


@dataclasses.dataclass
class Catalogue:
    """A compiled set's names, their token ids and the saved artifact."""

    path: pathlib.Path
    names: list
    ids: list

    def items(self, keep=None) -> set:
        """The token tuples of the items `keep` (bool per name) picks."""
        return {tuple(ids) for i, ids in enumerate(self.ids) if keep is None or keep[i]}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> pathlib.Path:
    given = os.environ.get("STATIC_COMPILER_TINY_LLAMA")
    if given and (pathlib.Path(given) / "model.safetensors").exists():
        return pathlib.Path(given)
    pytest.importorskip("transformers")
    from tools import tiny_llama
    return tiny_llama.build(tmp_path_factory.mktemp("tiny") / "model")


def compile_names(tiny_model, names, path, **options) -> Catalogue:
    """`names` compiled with the tiny model's tokenizer (attributes: america,
    bool; idx, int), saved to `path` (tables only)."""
    from tokenizers import Tokenizer

    import static_compiler as sc
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    attributes = {"america": np.array([n.startswith("America/") for n in names]),
                  "idx": np.arange(len(names))}
    compiled = sc.compile_constraints(names, tokenizer=tokenizer, export_subsets=True,
                                      attributes=attributes, **options)
    compiled.save(path, modules=False)
    return Catalogue(path, list(names), [tokenizer.encode(n).ids for n in names])


@pytest.fixture(scope="session")
def catalogues(tiny_model, tmp_path_factory) -> dict:
    """"tz": 200 IANA time-zone names; "synth": 300 made-up names (a second,
    disjoint set); "fixed": 50 random 3-token sequences, no end token;
    "other_end": the time-zone names ending with token 2, not the model's
    end of sequence."""
    import static_compiler as sc
    from tools.tiny_llama import synthetic_names, timezone_names
    out = tmp_path_factory.mktemp("sets")
    tz = timezone_names()[:200]
    found = {"tz": compile_names(tiny_model, tz, out / "tz"),
             "synth": compile_names(tiny_model, synthetic_names(300, seed=7), out / "synth"),
             "other_end": compile_names(tiny_model, tz[:20], out / "other_end", end_token=2)}
    rows = np.unique(np.random.default_rng(0).integers(3, 512, (60, 3)), axis=0)[:50]
    sc.compile_constraints(rows, vocab_size=512, export_subsets=True).save(out / "fixed",
                                                                         modules=False)
    found["fixed"] = Catalogue(out / "fixed", [], rows.tolist())
    return found
