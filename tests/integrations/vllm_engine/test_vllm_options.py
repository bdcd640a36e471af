"""The ``sc_`` request keys of the vLLM processor (`integrations.vllm.options`):
pure Python, runs without vLLM."""

from __future__ import annotations

import pytest

from static_compiler.errors import DecodeInputError
from static_compiler.integrations.vllm.options import KEYS, Options, parse_options


@pytest.mark.parametrize("extra_args", [None, {}, {"other": 1, "session_id": "x"}])
def test_a_request_without_sc_keys_opts_out(extra_args):
    assert parse_options(extra_args) is None


def test_every_key_parses():
    got = parse_options({"sc_set": "tz", "sc_where": "idx < 3", "sc_prefix": [5, 7], "x": 1})
    assert got == Options("tz", "idx < 3", None, (5, 7))
    assert parse_options({"sc_set": "tz", "sc_subset": "america"}) == \
        Options("tz", None, "america", ())
    assert KEYS == ("sc_set", "sc_where", "sc_subset", "sc_prefix")


@pytest.mark.parametrize("extra_args, names", [
    ({"sc_sett": "tz"}, ["sc_sett", "'tz'", "expected one of"]),
    ({"sc_where": "idx < 3"}, ["sc_where='idx < 3'", "without sc_set"]),
    ({"sc_prefix": [1]}, ["sc_prefix=[1]", "without sc_set"]),
    ({"sc_set": ""}, ["sc_set=''", "artifact path or a registered set name"]),
    ({"sc_set": 3}, ["sc_set=3", "non-empty str"]),
    ({"sc_set": "tz", "sc_where": 5}, ["sc_where=5", "filter expression"]),
    ({"sc_set": "tz", "sc_subset": ["a"]}, ["sc_subset=['a']", "bool attribute column"]),
    ({"sc_set": "tz", "sc_where": "a", "sc_subset": "b"}, ["sc_where='a'", "sc_subset='b'",
                                                           "at most one"]),
    ({"sc_set": "tz", "sc_prefix": "1,2"}, ["sc_prefix='1,2'", "list of token ids"]),
    ({"sc_set": "tz", "sc_prefix": [1, -2]}, ["sc_prefix=[1, -2]", "ints >= 0"]),
    ({"sc_set": "tz", "sc_prefix": [1.0]}, ["sc_prefix=[1.0]", "list of token ids"]),
    ({"sc_set": "tz", "sc_prefix": [True]}, ["sc_prefix=[True]", "list of token ids"]),
])
def test_a_bad_key_is_named_with_its_value_and_what_was_expected(extra_args, names):
    with pytest.raises(DecodeInputError) as err:
        parse_options(extra_args)
    assert isinstance(err.value, ValueError)  # (vLLM answers a ValueError with HTTP 400)
    for name in names:
        assert name in str(err.value)


def test_importing_the_package_and_its_pure_modules_imports_no_engine():
    """The package and its options / slots modules import neither torch,
    vLLM nor jax (the processor is imported when first named); the sets
    and beam_search modules import torch, never jax (nor vLLM before a
    search)."""
    import subprocess
    import sys
    code = ("import sys; import static_compiler.integrations.vllm as m, "
            "static_compiler.integrations.vllm.options, static_compiler.integrations.vllm.slots; "
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'torch', 'vllm', 'jax'})); "
            "import static_compiler.integrations.vllm.sets, "
            "static_compiler.integrations.vllm.beam_search; "
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'vllm', 'jax'}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["[]", "[]"], run.stdout
