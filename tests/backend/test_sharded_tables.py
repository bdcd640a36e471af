"""Tables split across devices, the serving side:
`compiled.shard(mesh, axis)` places large tables in contiguous row ranges,
one per device; decoding is bit-identical to one device for D in {1, 2, 4,
8}, fixed and variable length, with and without a cap per beam (CI decodes
a split with a cap and the widest split without, per set; the slow test
every D and cap), and each device holds about 1/D of the tables
(padded to split evenly, no reserved capacity needed; checked for every D);
an artifact saved from it is exported for the mesh and served from it by
`serving.load(path, mesh=...)`. Run on 8 host CPU devices in a subprocess,
so the rest of the suite keeps one device."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from helpers import FAST_COMPILE_FLAG, one_error_line, run_cli

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh
    import static_compiler as sc
    from static_compiler.frontend import datasets

    assert len(jax.devices()) == 8
    # the (D, caps) each set decodes at: every one with "full" (the slow test), else one
    # per distinct path: a split with a cap per beam, the widest split without
    DECODED = ((2, 3), (8, None))
    full = sys.argv[1:] == ["full"]
    V = 64
    rng = np.random.default_rng(0)
    fixed = datasets.synthetic_sids(120_000, 5, V, seed=1)
    ragged = [row[:n].tolist() for row, n in zip(rng.integers(1, V, size=(200_000, 6)),
                                                 rng.integers(3, 7, size=200_000))]
    # no reserved capacity: split tables are padded to a multiple of D
    sets = {"fixed": sc.compile_constraints(fixed, V),
            "ragged": sc.compile_constraints(ragged, V, end_token=0)}
    model = lambda t, s, c: (jnp.sin(jnp.arange(V, dtype=jnp.float32) * (s + 1)
                                     + t[..., None] * 0.37), c)
    out = {}
    for name, compiled in sets.items():
        whole = compiled.lowered.bytes_per_device()
        decoded = DECODED if not full else [(D, caps) for D in (1, 2, 4, 8)
                                                  for caps in (None, 3)]
        runs = {caps: sc.beam_search(compiled, model, batch_size=2, beam_size=6,
                                     tokens_per_beam=caps) for caps in {c for _, c in decoded}}
        for D in (1, 2, 4, 8):
            mesh = Mesh(np.array(jax.devices()[:D]), ("d",))
            split = compiled.shard(mesh, "d", min_bytes=1024)
            for caps, want in runs.items():
                if (D, caps) not in decoded:
                    continue
                got = sc.beam_search(split, model, batch_size=2, beam_size=6,
                                     tokens_per_beam=caps)
                same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want))
                out[f"{name} D={D} caps={caps}"] = same
            out[f"{name} D={D} bytes"] = split.lowered.bytes_per_device() / whole
            out[f"{name} D={D} rule"] = sum(st["bytes_per_device"]
                                            for st in split.layer_stats()) / whole
    # every layout: each forced where it can serve a layer (csr, near_unary,
    # unary, dense_rows), and mixed (split-heavy) slices, at D = 8 against the
    # default layouts' decode on one device (every layout decodes the same)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    want = sc.beam_search(sets["fixed"], model, batch_size=2, beam_size=6, tokens_per_beam=3)
    for spec in ("choose-layout{force=csr}", "choose-layout{force=near_unary}",
                 "choose-layout{force=unary}", "choose-layout{force=dense_rows}",
                 "choose-layout{force=csr},split-heavy{light-k=2,wide-slots=2}",
                 "choose-layout{force=near_unary},reserve-capacity{growth=1.3}"):
        compiled = sc.compile_constraints(fixed, V, pipeline=spec + ",pack-dtypes")
        split = compiled.shard(mesh, "d", min_bytes=1024)
        got = sc.beam_search(split, model, batch_size=2, beam_size=6, tokens_per_beam=3)
        kinds = sorted({str(st.kind) + ("+mixed" if st.light_k else "")
                        for st in compiled.plan.steps})
        out[f"layouts {kinds} caps=3"] = all(np.array_equal(np.asarray(a), np.asarray(b))
                                              for a, b in zip(got, want))
        out[f"layouts {kinds} split"] = len(split.lowered.placement.split)
    print(json.dumps(out))
""")


def on_8_devices(script: str, *argv: str) -> dict:
    """The JSON object `script` (with arguments `argv`) prints last, run on
    8 host CPU devices."""
    env = {**os.environ, "XLA_FLAGS": f"{FAST_COMPILE_FLAG} --xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                         env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def check_split_decoding(out: dict, decodes: dict):
    """SCRIPT's answers: every decode bit-identical (`decodes[name]` of set
    `name`, one per layout), every layout split something, and each device's
    bytes are what the split rule says."""
    for name, count in decodes.items():
        assert sum(k.startswith(f"{name} D=") and "caps" in k for k in out) == count, out
    assert all(v > 0 for k, v in out.items() if k.endswith(" split")), out  # something split
    assert all(v for k, v in out.items() if "caps" in k), out
    for name in ("fixed", "ragged"):
        assert out[f"{name} D=1 bytes"] == 1.0
        for D in (2, 4, 8):  # what the rule says: 1/D of split tables, small ones whole
            assert abs(out[f"{name} D={D} bytes"] - out[f"{name} D={D} rule"]) < 1e-3, out
    for D in (2, 4, 8):  # only small tables (<= 65536 entries) stay whole on every device
        assert out[f"fixed D={D} bytes"] < 1.0 / D + 0.12, out


def test_decoding_with_tables_split_across_devices_is_bit_identical():
    check_split_decoding(on_8_devices(SCRIPT), {"fixed": 2, "ragged": 2})


@pytest.mark.slow
def test_every_device_count_and_cap_decodes_bit_identically():
    """The CI test's full matrix: both sets at D in {1, 2, 4, 8}, with and
    without a cap per beam."""
    check_split_decoding(on_8_devices(SCRIPT, "full"), {"fixed": 8, "ragged": 8})


EXPORT_SCRIPT = textwrap.dedent("""
    import json, sys, tempfile, pathlib
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh
    import static_compiler as sc
    from static_compiler import artifact, errors
    from static_compiler import serving
    from static_compiler.frontend import datasets

    assert len(jax.devices()) == 8
    full = sys.argv[1:] == ["full"]  # the fixed set also exported for 8 devices (slow test)
    V, M, B = 64, 6, 2
    work = pathlib.Path(tempfile.mkdtemp())
    rng = np.random.default_rng(0)
    fixed = datasets.synthetic_sids(120_000, 5, V, seed=1)
    ragged = [row[:n].tolist() for row, n in zip(rng.integers(1, V, size=(200_000, 6)),
                                                 rng.integers(3, 7, size=200_000))]
    sets = {"fixed": sc.compile_constraints(fixed, V, capacity=1.5, export_beam_sizes=(M,),
                                            export_subsets=True),
            "ragged": sc.compile_constraints(ragged, V, end_token=0, capacity=1.5,
                                             export_beam_sizes=(M,), export_subsets=True)}
    mesh_of = lambda D: Mesh(np.array(jax.devices()[:D]), ("d",))

    model = lambda t, s, c: (jnp.sin(jnp.arange(V, dtype=jnp.float32) * (s + 1)
                                     + t[..., None] * 0.37), c)
    logits_at = lambda tokens, step: np.asarray(model(jnp.asarray(tokens), step, None)[0])

    def serve(art, subset=None, index=None):
        state = art.init_beams(B, M)
        for step in range(art.max_length):
            state = art.beam_step(state, logits_at(state.last_tokens, step), step,
                                  subset=subset, subset_index=index)
        return art.finalize(state)

    same = lambda a, b: all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
    out = {}
    for name, compiled in sets.items():
        n = compiled.items.num_items
        pick = np.arange(n) % 3 == 0
        want = sc.beam_search(compiled, model, batch_size=B, beam_size=M)
        want_sub = sc.beam_search(compiled, model, batch_size=B, beam_size=M,
                                  subset=compiled.subset(pick))
        for D in (((2, 8) if full else (2,)) if name == "fixed" else (4,)):
            split = compiled.shard(mesh_of(D), "d", min_bytes=1024)
            path = artifact.save(split, work / f"{name}{D}.static")
            art = serving.load(path, mesh=mesh_of(D))
            key = f"{name} D={D}"
            out[key + " decode"] = same(serve(art), want)
            out[key + " subset"] = same(serve(art, art.subset(pick)), want_sub)
            out[key + " ranked"] = same(serve(art, art.ranked_subset(pick)), want_sub)
            # mask/advance: one step of the processor pair against the in-process one
            ps = art.init_processor(B)
            logits = logits_at(np.zeros(B, np.int32), 0)[:, :]
            got = art.mask(logits, ps, 0)
            ref = compiled.mask(jnp.asarray(logits), compiled.init_processor(B), 0)
            out[key + " mask"] = bool(np.array_equal(np.asarray(got), np.asarray(ref)))
            out[key + " bytes"] = (sum(max(s.data.nbytes for s in a.addressable_shards)
                                       for a in art._tables) / split.lowered.bytes_per_device())
            out[key + " on mesh"] = all(len(a.sharding.device_set) == D for a in art._tables)
            # XLA partitions the module's gathers: all-reduces, no table gathered whole
            module = art._modules[f"beam_step_m{M}"]
            args = jax.device_put(list(art.init_beams(B, M)) + [logits_at(
                np.zeros((B, M), np.int32), 0), np.int32(0)], module._replicated)
            hlo = module._call.lower(*art._tables, *args).compile().as_text()
            out[key + " collectives"] = "all-reduce(" in hlo and "all-gather(" not in hlo
        # the wrong mesh, no mesh, and a one-device mesh are refused
        D = 2 if name == "fixed" else 4
        path = work / f"{name}{D}.static"
        for label, kwargs in (("wrong mesh", {"mesh": mesh_of(6 - D)}), ("no mesh", {}),
                              ("device", {"device": jax.devices()[0]})):
            try:
                serving.load(path, **kwargs)
                out[f"{name} {label} refused"] = False
            except errors.DecodeInputError as e:
                out[f"{name} {label} refused"] = f"exported for a mesh {{d: {D}}}" in str(e)
    # a 2-D mesh: tables split along "d" (4), replicated along "data" (2)
    grid = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "d"))
    compiled = sets["fixed"]
    path = artifact.save(compiled.shard(grid, "d", min_bytes=1024), work / "grid.static")
    art = serving.load(path, mesh=grid)
    out["2-D mesh decode"] = same(serve(art), sc.beam_search(compiled, model, batch_size=B,
                                                             beam_size=M))
    out["2-D mesh record"] = art.manifest.mesh["axes"] == [["data", 2], ["d", 4]]
    try:
        serving.load(path, mesh=Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "d")))
        out["2-D mesh of other sizes refused"] = False
    except errors.DecodeInputError as e:
        out["2-D mesh of other sizes refused"] = "got a mesh {data: 4, d: 2}" in str(e)
    # an update within capacity keeps the modules and the mesh; reload serves it
    path = work / "fixed2.static"
    art = serving.load(path, mesh=mesh_of(2))
    add = datasets.synthetic_sids(500, 5, V, seed=9)
    report = sc.update_artifact(path, add=add)
    new = art.reload()
    ref = sets["fixed"].update(add=add)
    out["update reused"] = report["modules"] == "reused" and new._modules is art._modules
    out["update decode"] = same(serve(new), sc.beam_search(ref, model, batch_size=B, beam_size=M))
    out["update on mesh"] = new.placement is not None and new.manifest.mesh == art.manifest.mesh
    # an update past the capacity exports anew: it needs the mesh, then serves on it
    more = datasets.synthetic_sids(100_000, 5, V, seed=11)
    try:
        sc.update_artifact(path, add=more)
        out["outgrown without mesh refused"] = False
    except errors.DecodeInputError as e:
        out["outgrown without mesh refused"] = "exported for a mesh {d: 2}" in str(e)
    report = sc.update_artifact(path, add=more, mesh=mesh_of(2))
    grown = serving.load(path, mesh=mesh_of(2))
    want = sc.beam_search(ref.update(add=more), model, batch_size=B, beam_size=M)
    out["outgrown exported"] = report["modules"] == "exported" and bool(report["grew"])
    out["outgrown decode"] = same(serve(grown), want)
    out["outgrown on mesh"] = grown.manifest.mesh is not None and grown.placement.devices == 2
    print(json.dumps(out))
""")


def test_an_artifact_exported_for_a_mesh_loads_on_it_and_decodes_bit_identically():
    """`save` of `compiled.shard(mesh, axis)` exports modules for that mesh;
    `serving.load(path, mesh=...)` splits the tables as saved and decodes
    (beam_step, subsets, ranked subsets, mask) bit-identically to the in-process decode on
    one device; a mesh of another size, no mesh, or a device are refused;
    an update within capacity reloads onto the mesh with the same modules."""
    check_exported(on_8_devices(EXPORT_SCRIPT), {"fixed D=2", "ragged D=4"})


@pytest.mark.slow
def test_an_artifact_exported_for_every_mesh_size_decodes_bit_identically():
    """The CI test with the fixed set also exported for 8 devices."""
    check_exported(on_8_devices(EXPORT_SCRIPT, "full"), {"fixed D=2", "fixed D=8", "ragged D=4"})


def check_exported(out: dict, meshes: set):
    """EXPORT_SCRIPT's answers: the artifacts of `meshes` were served, and
    every check holds (each device's bytes as the split says, the rest True)."""
    assert {key.removesuffix(" decode") for key in out
            if key.endswith(" decode") and " D=" in key} == meshes, out
    for key, value in out.items():
        if key.endswith(" bytes"):
            assert value == 1.0, (key, out)
        else:
            assert value is True, (key, out)


def test_the_cli_compiles_for_a_mesh_and_decodes_on_one(tmp_path, capsys):
    """`compile --mesh d=4` exports for 4 devices; `decode` loads it on a
    mesh of the process's devices and prints what the one-device artifact
    prints; a process with too few devices (this one) gets one line, no
    traceback."""
    import numpy as np

    from static_compiler.frontend import datasets

    np.save(tmp_path / "s.npy", datasets.synthetic_sids(150_000, 4, 64, seed=4))
    cli = [sys.executable, "-m", "static_compiler.cli"]
    many = {**os.environ, "XLA_FLAGS": f"{FAST_COMPILE_FLAG} --xla_force_host_platform_device_count=8",
            "JAX_PLATFORMS": "cpu"}
    run = lambda argv, env: subprocess.run(cli + argv, capture_output=True, text=True, env=env,
                                           cwd=tmp_path, timeout=600)
    logged = {}
    for name, extra in (("mesh", ["--mesh", "d=4"]), ("one", [])):
        done = run(["compile", "s.npy", "--vocab-size", "64", "--capacity", "1.0",
                    "--beam-sizes", "8", "-o", f"{name}.static", *extra], many)
        assert done.returncode == 0, done.stderr
        logged[name] = done.stderr
    per_device = re.search(r"tables split across 'd': (\d+) bytes per device of (\d+)",
                           logged["mesh"])
    code, shown, err = run_cli(capsys, "show-ir", tmp_path / "mesh.static", "--stats")
    assert code == 0, err  # one device: modules not loaded
    assert "mesh {d: 4}: modules exported for it" in shown
    assert f"{per_device.group(1)} table bytes per device of {per_device.group(2)}" in shown
    beams = lambda out: [line for line in out.splitlines() if "score" in line]
    on_mesh, alone = (run(["decode", f"{name}.static", "--check-tables"], many)
                      for name in ("mesh", "one"))
    assert on_mesh.returncode == 0 and alone.returncode == 0, on_mesh.stderr + alone.stderr
    assert beams(on_mesh.stdout) == beams(alone.stdout) and len(beams(alone.stdout)) == 10
    code, _, err = run_cli(capsys, "decode", tmp_path / "mesh.static")
    assert code == 2 and "a mesh {d: 4} needs 4 devices, this process has 1" in one_error_line(err)
