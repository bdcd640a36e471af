"""Fixtures of the vLLM tests: the tiny Llama (tools/tiny_llama.py; the
folder named by STATIC_COMPILER_TINY_LLAMA when set, as scripts/test-vllm.sh
sets it, else built here) and small sets compiled with its tokenizer, in
this process (the compiler needs numpy alone: no jax in the vLLM venv).
The engine tests skip without vLLM (pytest.importorskip in their modules);
the fixtures import what they need when used."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO
from vllm_cases import Catalogue, compile_names, made_up_names, timezone_names


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> pathlib.Path:
    given = os.environ.get("STATIC_COMPILER_TINY_LLAMA")
    if given and (pathlib.Path(given) / "model.safetensors").exists():
        return pathlib.Path(given)
    pytest.importorskip("transformers")
    model = tmp_path_factory.mktemp("tiny") / "model"
    subprocess.run([sys.executable, "-m", "tools.tiny_llama", str(model)], cwd=REPO, check=True,
                   timeout=600, capture_output=True)
    return model


@pytest.fixture(scope="session")
def catalogues(tiny_model, tmp_path_factory) -> dict:
    """"tz": 200 IANA time-zone names; "synth": 300 made-up names (a second,
    disjoint set); "fixed": 50 random 3-token sequences, no end token;
    "other_end": the time-zone names ending with token 2, not the model's
    end of sequence."""
    import static_compiler as sc
    out = tmp_path_factory.mktemp("sets")
    tz = timezone_names()[:200]
    found = {"tz": compile_names(tiny_model, tz, out / "tz"),
             "synth": compile_names(tiny_model, made_up_names(300, seed=7), out / "synth"),
             "other_end": compile_names(tiny_model, tz[:20], out / "other_end", end_token=2)}
    rows = np.unique(np.random.default_rng(0).integers(3, 512, (60, 3)), axis=0)[:50]
    sc.compile_constraints(rows, vocab_size=512, export_subsets=True).save(out / "fixed",
                                                                         modules=False)
    found["fixed"] = Catalogue(out / "fixed", [], rows.tolist())
    return found
