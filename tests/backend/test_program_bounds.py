"""Compiled programs per process are bounded: a process that
decodes many distinct sets used to keep every set's executables (~90 memory
maps and ~4.5 MB each on CPU) until the kernel's map limit aborted it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import static_compiler as sc
from static_compiler.backend.decode import programs, search
from static_compiler.errors import DecodeInputError

MANY_SETS = textwrap.dedent("""
    import json, sys
    import jax.numpy as jnp, numpy as np
    import static_compiler as sc
    from static_compiler.backend.decode import search

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    sc.set_max_programs(int(sys.argv[1]))
    V = 16
    zeros = lambda t, s, c: (jnp.zeros(t.shape + (V,), jnp.float32), c)
    rng = np.random.default_rng(0)
    counts, held = [], []
    for i in range(int(sys.argv[2])):  # distinct shapes: a plan, so programs, each
        items = np.unique(rng.integers(0, V, size=(20 + 3 * i, 3)), axis=0)
        compiled = sc.compile_constraints(items, V)
        sc.beam_search(compiled, zeros, batch_size=1, beam_size=4).tokens.block_until_ready()
        counts.append(maps())
        held.append(search._beam_search.num_configurations())
    print(json.dumps({"maps": counts, "held": held}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/maps")
@pytest.mark.parametrize("num_sets", [10, pytest.param(16, marks=pytest.mark.slow)])
def test_decoding_many_sets_keeps_the_programs_and_memory_maps_bounded(num_sets):
    """4 programs kept; the maps of the sets decoded after the 6th (4 in
    CI: ~360 more without the bound) stay within 150 of each other."""
    out = subprocess.run([sys.executable, "-c", MANY_SETS, "4", str(num_sets)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert max(info["held"]) == 4
    late = info["maps"][6:]
    assert len(late) == num_sets - 6
    # Before the bound: ~90 more maps for every set decoded (10 late sets: ~900).
    assert max(late) - min(late) < 150, info["maps"]


def test_an_evicted_configuration_compiles_again_and_decodes_the_same(monkeypatch):
    V = 8
    sets = [sc.compile_constraints(np.unique(np.random.default_rng(s).integers(0, V, (12 + s, 3)),
                                             axis=0), V) for s in range(3)]
    zeros = lambda t, s, c: (jnp.zeros(t.shape + (V,), jnp.float32), c)
    first = sc.beam_search(sets[0], zeros, batch_size=1, beam_size=3)
    before = search._beam_search.compilations()
    monkeypatch.setattr(programs, "_max_programs", 1)
    for compiled in sets[1:]:  # each evicts the one before
        sc.beam_search(compiled, zeros, batch_size=1, beam_size=3)
    assert search._beam_search.num_configurations() == 1
    again = sc.beam_search(sets[0], zeros, batch_size=1, beam_size=3)
    assert search._beam_search.compilations() == before + 3  # the first one compiled again
    for a, b in zip(first, again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("n", [0, -3, 2.5, True, "8"])
def test_set_max_programs_needs_a_positive_int(n):
    with pytest.raises(DecodeInputError, match=r"set_max_programs: n=.*: expected an int >= 1"):
        sc.set_max_programs(n)
    assert sc.max_programs() >= 1


def test_step_processors_share_counted_bounded_programs(monkeypatch):
    """A step processor's programs are `BoundedJit` configurations (plan,
    kind, step): counted by `compilations()`, shared by processors of an
    equal plan, and trimmed by `set_max_programs` like the searches'."""
    from static_compiler.backend.decode import processor
    V = 8
    items = np.unique(np.random.default_rng(4).integers(0, V, (20, 3)), axis=0)
    compiled = sc.compile_constraints(items, V)
    before = processor._step_program.compilations()
    first = compiled.processor(2)
    state = first.init_processor()
    masked = first.mask(np.zeros((2, V), np.float32), state, 0)
    assert processor._step_program.compilations() == before + 1
    again = sc.compile_constraints(items, V).processor(2)  # an equal plan: compiles nothing
    np.testing.assert_array_equal(again.mask(np.zeros((2, V), np.float32), state, 0), masked)
    assert processor._step_program.compilations() == before + 1
    first.advance(state, np.full(2, items[0, 0], np.int32), 0)
    monkeypatch.setattr(programs, "_max_programs", 1)  # one plan: all its steps' programs
    processor._step_program.trim()
    assert processor._step_program.num_configurations() == 2
    other = sc.compile_constraints(items[:-1], V).processor(2)  # another plan evicts them
    other.mask(np.zeros((2, V), np.float32), other.init_processor(), 0)
    assert processor._step_program.num_configurations() == 1
