"""Serving loader: imports nothing else of ours, decodes bit-identically to
`sc.beam_search` (eagerly and under jit with a traced step), mask/advance
match the in-process pair, a plain process with only jax and numpy can run the
modules, and every damaged artifact or bad argument raises a typed error."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import serve

from static_compiler import artifact, beam_search, compile_constraints, errors, serving
from static_compiler.backend import decode
from static_compiler.errors import StaticCompilerError
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import Manifest

REPO = str(helpers.REPO)
FIXED = oracle.random_set(np.random.default_rng(0), 60, 3, 10)
RAGGED = [[1, 2, 3], [1, 2], [4, 5, 6, 2], [1, 2, 3, 7]]  # fewer sequences than beams
KNOBS = [dict(), dict(nan=40, neginf=40, dup=30), dict(zero_row=60, posinf_row=60, huge_row=60)]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    compiled = compile_constraints(FIXED, 10, export_beam_sizes=(4, 6), export_tokens_per_beam=3)
    path = artifact.save(compiled, tmp_path_factory.mktemp("serving") / "fixed.static")
    return compiled, path, serving.load(path)


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    compiled = compile_constraints(RAGGED, 9, end_token=8, export_beam_sizes=(5,))
    path = artifact.save(compiled, tmp_path_factory.mktemp("serving") / "ragged.static")
    return compiled, path, serving.load(path)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """FIXED with every sliced layer mixed (light_k=1, two wide slots)."""
    compiled = compile_constraints(FIXED, 10, pipeline=oracle.pipeline_for("mixed_near_unary"),
                                   export_beam_sizes=(6,), export_tokens_per_beam=3)
    assert any(step.light_k for step in compiled.plan.steps)
    path = artifact.save(compiled, tmp_path_factory.mktemp("serving") / "mixed.static")
    return compiled, path, serving.load(path)


def assert_bit_identical(got, want):
    for name, a, b in zip(("tokens", "scores", "valid", "lengths"), got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), name


# ----- decoding -----

@pytest.mark.parametrize("knobs", KNOBS, ids=["plain", "nan-inf-dup", "row-knobs"])
def test_beam_search_through_the_artifact_is_bit_identical(fixed, knobs):
    compiled, _, art = fixed
    model = oracle.HashModel(10, **knobs)
    seeds = [3, 12345]
    got = serve(art, model, seeds, 4, start_token=2)
    want = beam_search(compiled, model, batch_size=2, beam_size=4, tokens_per_beam=3,
                       start_token=2, carry_axes=model.carry_axes, carry=model.init_carry(seeds, 4))
    assert_bit_identical(got, want)
    expect = oracle.beam_search(oracle.ConstraintSet(FIXED, 10), model, seeds, 4, 3, 2)
    assert np.array_equal(np.asarray(got.tokens), expect.tokens)
    assert np.array_equal(np.asarray(got.valid), expect.valid)


@pytest.mark.parametrize("knobs", KNOBS[:2], ids=["plain", "nan-inf-dup"])
def test_ragged_beam_search_through_the_artifact_is_bit_identical(ragged, knobs):
    compiled, _, art = ragged
    model = oracle.HashModel(9, **knobs)
    seeds = [5, 6]
    got = serve(art, model, seeds, 5)
    want = beam_search(compiled, model, batch_size=2, beam_size=5,
                       carry_axes=model.carry_axes, carry=model.init_carry(seeds, 5))
    assert_bit_identical(got, want)
    assert not np.asarray(got.valid)[:, -1].any()  # 4 sequences, 5 beams
    assert np.array_equal(np.asarray(got.valid), oracle.beam_search(
        oracle.ConstraintSet(RAGGED, 9, 8), model, seeds, 5).valid)


def test_mixed_layout_through_the_artifact_is_bit_identical(mixed):
    compiled, path, art = mixed
    assert artifact.read_automaton(path) == compiled.ir  # light=/wide= survive the manifest
    model = oracle.HashModel(10, nan=40, neginf=40, dup=30)
    seeds = [7, 8, 9]
    got = serve(art, model, seeds, 6)
    want = beam_search(compiled, model, batch_size=3, beam_size=6, tokens_per_beam=3,
                       carry_axes=model.carry_axes, carry=model.init_carry(seeds, 6))
    assert_bit_identical(got, want)
    expect = oracle.beam_search(oracle.ConstraintSet(FIXED, 10), model, seeds, 6, 3)
    assert np.array_equal(np.asarray(got.tokens), expect.tokens)


def test_beam_step_is_jittable_with_a_traced_step(fixed):
    compiled, _, art = fixed
    model = oracle.HashModel(10, dup=50)
    seeds = [1, 2]

    @jax.jit
    def run(carry):
        def body(step, loop):
            state, carry = loop
            logits, carry = model(state.last_tokens, step, carry)
            state = art.beam_step(state, logits, step)
            h = jnp.take_along_axis(carry["h"], state.parent, axis=1)
            return decode.BeamState(*state), {"h": h, "knobs": carry["knobs"]}
        state = art.init_beams(2, 4, start_token=2)
        state, _ = jax.lax.fori_loop(0, art.max_length, body, (state, carry))
        return art.finalize(state)

    got = run(model.init_carry(seeds, 4))
    want = beam_search(compiled, model, batch_size=2, beam_size=4, tokens_per_beam=3,
                       start_token=2, carry_axes=model.carry_axes, carry=model.init_carry(seeds, 4))
    assert_bit_identical(got, want)


@pytest.mark.parametrize("which", ["fixed", "ragged"])
def test_a_traced_step_outside_the_range_appends_nothing(fixed, ragged, which):
    """Running the loop past max_length (or with a negative step) used to
    rerun the last step on finished beams: lengths above the sequence length
    and beams turned invalid. Now such a step returns the state unchanged,
    with parent the identity."""
    compiled, _, art = {"fixed": fixed, "ragged": ragged}[which]
    B, M, V = 2, art.beam_sizes[0], art.vocab_size
    step_fn = jax.jit(art.beam_step)
    rng = np.random.default_rng(0)
    state = art.init_beams(B, M)
    for step in range(art.max_length):
        state = step_fn(state, rng.standard_normal((B, M, V)).astype(np.float32), jnp.int32(step))
    done = art.finalize(state)
    for step in (art.max_length, art.max_length + 5, -1):
        after = step_fn(state, rng.standard_normal((B, M, V)).astype(np.float32), jnp.int32(step))
        for name in ("tokens", "scores", "node", "valid", "finished", "lengths", "last_tokens"):
            np.testing.assert_array_equal(np.asarray(getattr(after, name)),
                                          np.asarray(getattr(state, name)), err_msg=name)
        np.testing.assert_array_equal(np.asarray(after.parent), np.tile(np.arange(M), (B, 1)))
        assert_bit_identical(art.finalize(after), done)
    assert int(np.asarray(done.lengths).max()) <= art.max_length


def test_init_states_match_the_in_process_ones(fixed):
    compiled, _, art = fixed
    got = art.init_beams(3, 4, start_token=7)
    want = decode.init_beam_state(compiled.plan, 3, 4, start_tokens=7)
    assert serving.BeamState is decode.BeamState  # one definition (static_compiler.support.decode_state)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    per_row = art.init_beams(3, 4, start_token=[1, 2, 3])
    assert np.array_equal(per_row.last_tokens, np.repeat([[1], [2], [3]], 4, axis=1))
    for a, b in zip(art.init_processor(5), decode.init_processor_state(5)):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_mask_and_advance_match_the_oracle(ragged):
    _, _, art = ragged
    cset = oracle.ConstraintSet(RAGGED, 9, 8)
    rng = np.random.default_rng(4)
    B = 6
    state, rows = art.init_processor(B), [oracle.ProcessorRow() for _ in range(B)]
    seen_invalid = seen_finished = False
    for step in range(art.max_length):
        logits = rng.normal(size=(B, 9)).astype(np.float32)
        logits[rng.random((B, 9)) < 0.1] = np.nan
        masked = art.mask(logits, state, step)
        assert masked.dtype == jnp.float32
        assert np.array_equal(np.asarray(masked).view(np.uint32),
                              oracle.mask(cset, logits, rows).view(np.uint32))
        tokens = np.argmax(np.asarray(masked), axis=-1).astype(np.int32)
        tokens[0] = rng.integers(0, 9)  # row 0 picks anything, often a disallowed token
        state, rows = art.advance(state, tokens, step), oracle.advance(cset, rows, tokens)
        assert np.asarray(state.valid).tolist() == [r.valid for r in rows]
        assert np.asarray(state.finished).tolist() == [r.finished for r in rows]
        seen_invalid |= not all(r.valid for r in rows)
        seen_finished |= any(r.finished for r in rows)
    assert seen_invalid and seen_finished


# ----- processes with nothing else of ours -----

def run_python(code: str, *args, isolated=False) -> str:
    flags = ["-I"] if isolated else []
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, *flags, "-c", code, *map(str, args)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_serving_imports_nothing_else_of_ours_and_runs_a_step(fixed):
    _, path, art = fixed
    out = run_python(textwrap.dedent("""
        import sys, json
        import numpy as np
        from static_compiler import serving
        art = serving.load(sys.argv[1])
        state = art.init_beams(2, 4)
        logits = np.linspace(-1, 1, 2 * 4 * art.vocab_size, dtype=np.float32).reshape(2, 4, -1)
        state = art.beam_step(state, logits, 0)
        print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("static_compiler")),
                          "tokens": np.asarray(state.tokens).tolist()}))
    """), path)
    info = json.loads(out)
    # The serving binary (the serving/ folder) with the artifact's format (format/), the item
    # data, bits and rules, the verbs (decoding/), the plan and table format (lowered/), the IR
    # types, and the utilities (support/, jax_support/); not the artifact's writer, export or
    # update modules (and no compiler stage: no frontend module, pass, lowering or backend).
    assert info["modules"] == sorted(["static_compiler",
                                      "static_compiler.serving", "static_compiler.serving.engine",
                                      "static_compiler.serving.loader", "static_compiler.serving.runtime",
                                      "static_compiler.serving.warm",
                                      "static_compiler.format", "static_compiler.format.manifest",
                                      "static_compiler.format.manifest_records",
                                      "static_compiler.format.module_names",
                                      "static_compiler.format.names", "static_compiler.format.normalize",
                                      "static_compiler.format.snapshot",
                                      "static_compiler.format.snapshot_items", "static_compiler.format.spec",
                                      "static_compiler.decoding", "static_compiler.decoding.decoder",
                                      "static_compiler.decoding.warm_up",
                                      "static_compiler.errors",
                                      "static_compiler.ir", "static_compiler.ir.printer",
                                      "static_compiler.ir.row_checks", "static_compiler.ir.types",
                                      "static_compiler.ir.verify",
                                      "static_compiler.item_bits", "static_compiler.item_bits.item_masks",
                                      "static_compiler.item_bits.layer_walk",
                                      "static_compiler.item_bits.layers",
                                      "static_compiler.item_bits.liveness",
                                      "static_compiler.item_bits.padding",
                                      "static_compiler.item_bits.placements",
                                      "static_compiler.item_bits.state_order",
                                      "static_compiler.items", "static_compiler.items.attributes",
                                      "static_compiler.items.index", "static_compiler.items.names",
                                      "static_compiler.rules", "static_compiler.rules.priors",
                                      "static_compiler.rules.set_view",
                                      "static_compiler.support", "static_compiler.support.arguments",
                                      "static_compiler.support.arrays", "static_compiler.support.beam_loop",
                                      "static_compiler.support.decode_state",
                                      "static_compiler.support.decode_types",
                                      "static_compiler.support.dtypes", "static_compiler.support.lazy",
                                      "static_compiler.support.mapped", "static_compiler.support.threads",
                                      "static_compiler.jax_support", "static_compiler.jax_support.beam_result",
                                      "static_compiler.jax_support.compile_events",
                                      "static_compiler.jax_support.placement",
                                      "static_compiler.jax_support.warmth",
                                      "static_compiler.lowered", "static_compiler.lowered.plan",
                                      "static_compiler.lowered.tables"])
    # the serving process imports no frontend module (the item data it reads is in items/)
    assert not [m for m in info["modules"] if m.partition(".")[2].split(".")[0] == "frontend"]
    logits = np.linspace(-1, 1, 2 * 4 * 10, dtype=np.float32).reshape(2, 4, -1)
    assert info["tokens"] == np.asarray(art.beam_step(art.init_beams(2, 4), logits, 0).tokens).tolist()


PLAIN_PROCESS_SNIPPET = """
import json, numpy as np, jax

art = sys.argv[1]                                  # an artifact directory
manifest = json.load(open(f"{art}/manifest.json"))

def module(name):                                  # -> jax.export.Exported
    with open(f"{art}/{manifest['modules'][name]['file']}", "rb") as f:
        return jax.export.deserialize(bytearray(f.read()))

tables = [jax.device_put(np.load(f"{art}/{t['file']}", mmap_mode="r"))
          for t in manifest["tables"]]              # argument order of every module
init, step = module("init_m4"), module("beam_step_m4")
fields = [r["name"] for r in manifest["modules"]["beam_step_m4"]["results"]]

state = init.call(np.zeros(2, np.int32))           # start token per batch row
for t in range(manifest["max_length"]):
    s = dict(zip(fields, state))
    logits = model(s["state.last_tokens"], t)      # float32 (2, 4, V)
    state = step.call(*tables, *state, logits, np.int32(t))
s = dict(zip(fields, state))
tokens, scores, valid = s["state.tokens"], s["state.scores"], s["state.valid"]
"""


def _demo_model(last_tokens, t):
    V = 10
    x = (np.asarray(last_tokens)[..., None] * 7 + np.arange(V) * 3 + t * 5) % 11
    return (x.astype(np.float32) - 5.0) / 2.0


def test_a_plain_process_runs_the_modules_with_jax_and_numpy_only(fixed):
    _, path, art = fixed
    model_src = ("import sys, numpy as np\n"
                 "def model(last_tokens, t):\n"
                 "    V = 10\n"
                 "    x = (np.asarray(last_tokens)[..., None] * 7 + np.arange(V) * 3 + t * 5) % 11\n"
                 "    return (x.astype(np.float32) - 5.0) / 2.0\n")
    tail = ("print(json.dumps({'modules': sorted(m for m in sys.modules if m == 'static_compiler'"
            " or m.startswith('static_compiler.')),"
            " 'tokens': np.asarray(tokens).tolist(), 'scores': np.asarray(scores).tolist(),"
            " 'valid': np.asarray(valid).tolist()}))\n")
    out = json.loads(run_python(model_src + PLAIN_PROCESS_SNIPPET + tail, path, isolated=True))
    assert out["modules"] == []
    state = art.init_beams(2, 4)
    for t in range(art.max_length):
        state = art.beam_step(state, _demo_model(state.last_tokens, t), t)
    assert out["tokens"] == np.asarray(state.tokens).tolist()
    assert out["scores"] == np.asarray(state.scores).tolist()
    assert out["valid"] == np.asarray(state.valid).tolist()
    assert all(out["valid"][0])


# ----- damaged artifacts -----

@pytest.fixture
def copy(fixed, tmp_path):
    """A fresh copy of the fixed artifact to damage."""
    dst = tmp_path / "copy.static"
    shutil.copytree(fixed[1], dst)
    return dst


def flip_byte(file, offset=None):
    data = bytearray(file.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


def test_a_flipped_byte_in_any_file_is_caught(fixed, tmp_path):
    path = fixed[1]
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*")
                   if p.is_file() and p.name != fmt.MANIFEST_FILE)
    assert len(files) >= 8
    for i, rel in enumerate(files):
        dst = tmp_path / f"flip{i}"
        shutil.copytree(path, dst)
        flip_byte(dst / rel)
        with pytest.raises(errors.ArtifactChecksumError, match=rf"{rel}.*sha256") as e:
            serving.load(dst)
        assert "expected" in str(e.value)


def test_a_flipped_byte_in_the_manifest_is_caught(fixed, tmp_path):
    path = fixed[1]
    size = (path / fmt.MANIFEST_FILE).stat().st_size
    offsets = np.random.default_rng(0).choice(size, size=25, replace=False)
    for offset in offsets:
        dst = tmp_path / f"m{offset}"
        shutil.copytree(path, dst)
        flip_byte(dst / fmt.MANIFEST_FILE, int(offset))
        with pytest.raises((errors.ArtifactFormatError, errors.ArtifactChecksumError,
                            errors.ArtifactVersionError)):
            serving.load(dst)


def test_missing_and_extra_files(copy):
    (copy / "tables" / "layer0.next.npy").rename(copy / "stray.npy")
    with pytest.raises(errors.ArtifactFormatError, match=r"missing file.*tables/layer0.next.npy"):
        serving.load(copy)
    (copy / "stray.npy").rename(copy / "tables" / "layer0.next.npy")
    (copy / "modules" / "notes.txt").write_text("hello")
    with pytest.raises(errors.ArtifactFormatError, match=r"extra file.*modules/notes.txt"):
        serving.load(copy)
    (copy / "modules" / "notes.txt").unlink()
    (copy / fmt.MANIFEST_FILE).unlink()
    with pytest.raises(errors.ArtifactFormatError, match="missing file 'manifest.json'"):
        serving.load(copy)


def test_not_an_artifact_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(errors.ArtifactFormatError, match="expected a directory.*found a file"):
        serving.load(tmp_path / "file")
    with pytest.raises(errors.ArtifactFormatError, match="found nothing"):
        serving.load(tmp_path / "absent")


def test_truncated_module(copy):
    module = copy / "modules" / "beam_step_m4.jaxexport"
    data = module.read_bytes()
    module.write_bytes(data[:len(data) // 3])
    with pytest.raises(errors.ArtifactChecksumError,
                       match=rf"beam_step_m4.jaxexport' is truncated: {len(data) // 3} bytes, "
                             rf"expected {len(data)}"):
        serving.load(copy)

    def fix(m):  # a manifest that agrees with the truncated file
        m["files"]["modules/beam_step_m4.jaxexport"] = {
            "size": len(data) // 3, "sha256": fmt.sha256_file(module)}
    helpers.edit_manifest(copy, fix)
    with pytest.raises(errors.ArtifactFormatError, match="cannot be deserialized"):
        serving.load(copy)


@pytest.mark.parametrize("version", [0, fmt.MAX_FORMAT_VERSION + 1, 99])
def test_format_version_outside_the_supported_range(copy, version):
    helpers.edit_manifest(copy, lambda m: m.update(format_version=version))
    lo, hi = fmt.MIN_FORMAT_VERSION, fmt.MAX_FORMAT_VERSION
    with pytest.raises(errors.ArtifactVersionError,
                       match=rf"format version {version} is outside .*\[{lo}, {hi}\]"):
        serving.load(copy)


def test_a_calling_convention_this_jax_cannot_run(copy):
    hi = jax.export.maximum_supported_calling_convention_version
    for version in (hi + 1, jax.export.minimum_supported_calling_convention_version - 1):
        helpers.edit_manifest(copy, lambda m: m.update(calling_convention_version=version))
        with pytest.raises(errors.ArtifactVersionError,
                           match=rf"calling-convention version {version} cannot run on jax "
                                 rf".*supports \[\d+, {hi}\]"):
            serving.load(copy)


def test_the_manifest_schema_round_trips(fixed):
    _, path, art = fixed
    manifest = art.manifest
    assert Manifest.from_json(manifest.to_json(), path) == manifest
    assert manifest.seal() == (path / fmt.MANIFEST_FILE).read_bytes()
    assert manifest.beam_sizes() == art.beam_sizes and manifest.missing_modules() == []


@pytest.mark.parametrize("key, value, match", [
    ("vocab_size", "10", r"manifest.json\['vocab_size'\] is '10' \(str\), expected int"),
    ("end_token", 1.5, r"\['end_token'\] is 1.5 \(float\), expected int or NoneType"),
    ("max_length", True, r"\['max_length'\] is True \(bool\), expected int"),
    ("pipeline", None, r"manifest.json has no key 'pipeline'"),
    ("tables", {}, r"\['tables'\] is \{\} \(dict\), expected list"),
    ("names_file", None, r"manifest.json has no key 'names_file'"),
    ("names_file", 3, r"\['names_file'\] is 3 \(int\), expected str or NoneType"),
])
def test_a_manifest_key_of_the_wrong_type_is_named(copy, key, value, match):
    helpers.edit_manifest(copy, lambda m: m.pop(key) if value is None else m.update({key: value}))
    with pytest.raises(errors.ArtifactFormatError, match=match):
        serving.load(copy)


def test_a_version_1_artifact_still_loads_and_has_no_names(copy, fixed):
    """Version 1 had no names_file key (and no names.jsonl), nor item_files
    nor mesh."""
    helpers.edit_manifest(copy, lambda m: (m.update(format_version=1), m.pop("names_file"),
                                   m.pop("item_files"), m.pop("mesh"), m.pop("subset_bits"),
                                       m.pop("exported_at"), m.pop("attributes"),
                                       m.pop("beam_schedules"), m.pop("export_plan"),
                                       m.pop("rows_in_item_order")))
    art = serving.load(copy)
    assert art.manifest.format_version == 1 and art.manifest.names_file is None
    assert art.names is None and artifact.read_names(copy) is None
    assert art.manifest.seal() == (copy / fmt.MANIFEST_FILE).read_bytes()
    model = oracle.HashModel(10)
    assert_bit_identical(serve(art, model, [3], 4), serve(fixed[2], model, [3], 4))
    with pytest.raises(errors.DecodeInputError, match=r"has no names \(compiled from token ids, "
                                                      r"or written before format version 2\)"):
        art.texts(art.finalize(art.init_beams(1, 4)))


def test_a_version_3_artifact_loads_as_one_for_one_device(copy, fixed):
    """Version 3 had no mesh key: its modules run on one device."""
    helpers.edit_manifest(copy, lambda m: (m.update(format_version=3), m.pop("mesh"), m.pop("subset_bits"),
                                   m.pop("exported_at"), m.pop("attributes"),
                                       m.pop("beam_schedules")))
    art = serving.load(copy)
    assert art.manifest.mesh is None and art.placement is None
    model = oracle.HashModel(10)
    assert_bit_identical(serve(art, model, [3], 4), serve(fixed[2], model, [3], 4))


@pytest.mark.parametrize("mesh, message", [
    ({"axes": [], "table_axis": "d", "split_tables": [], "min_bytes": 0}, r"\['axes'\] is \[\]"),
    ({"axes": [["d", 0]], "table_axis": "d", "split_tables": [], "min_bytes": 0},
     r"expected \[\[name, size >= 1\]"),
    ({"axes": [["d", 2]], "table_axis": "x", "split_tables": [], "min_bytes": 0},
     r"'table_axis'\] 'x' is not one of the axes \['d'\]"),
    ({"axes": [["d", 2]], "table_axis": "d", "split_tables": ["layer99.tokens"], "min_bytes": 0},
     r"splits \['layer99.tokens'\], which are not among the tables"),
    ({"axes": [["d", 2]], "table_axis": "d", "split_tables": [7], "min_bytes": 0},
     r"'split_tables'\] is \[7\]"),
    ({"axes": [["d", 2]], "table_axis": "d", "split_tables": []}, r"has no key 'min_bytes'"),
    ([2], r"\['mesh'\] is \[2\] \(list\), expected dict"),
])
def test_a_bad_mesh_record_is_named(copy, mesh, message):
    helpers.edit_manifest(copy, lambda m: m.update(mesh=mesh))
    with pytest.raises(errors.ArtifactFormatError, match=message):
        serving.load(copy)


def test_a_one_device_artifact_refuses_a_mesh(fixed):
    import jax
    from jax.sharding import Mesh
    mesh = Mesh(np.array(jax.devices()[:1]), ("d",))
    with pytest.raises(errors.DecodeInputError, match=r"was exported for one device; got "
                                                      r"mesh=.*load it without mesh="):
        serving.load(fixed[1], mesh=mesh)


def test_a_mesh_record_on_modules_for_one_device_is_refused(tmp_path):
    """A mesh record whose split row pointers the modules do not take padded
    (an edited manifest, resealed)."""
    from static_compiler.frontend import datasets
    path = artifact.save(compile_constraints(datasets.synthetic_sids(3000, 4, 64, seed=2), 64,
                                             pipeline="choose-layout{force=csr},pack-dtypes",
                                             export_beam_sizes=(4,)), tmp_path / "csr.static")

    def split(m):
        ptrs = [t for t in m["tables"] if t["name"] == "indptr" and t["shape"][0] % 7919]
        m["mesh"] = {"axes": [["d", 7919]], "table_axis": "d", "min_bytes": 0,
                     "split_tables": [f"layer{ptrs[0]['layer']}.indptr"]}
    helpers.edit_manifest(path, split)
    with pytest.raises(errors.ArtifactFormatError, match=r"takes tables .* placed"):
        serving.load(path)


def test_a_table_entry_of_the_wrong_type_is_named(copy):
    helpers.edit_manifest(copy, lambda m: m["tables"][0].update(layer="0"))
    with pytest.raises(errors.ArtifactFormatError, match=r"tables\[0\]\['layer'\] is '0'"):
        serving.load(copy)


def test_manifest_not_json_or_not_ours(copy):
    (copy / fmt.MANIFEST_FILE).write_text("{not json")
    with pytest.raises(errors.ArtifactFormatError, match="not valid UTF-8 JSON"):
        serving.load(copy)
    (copy / fmt.MANIFEST_FILE).write_text("[1, 2]")
    with pytest.raises(errors.ArtifactFormatError, match="holds a list, expected a JSON object"):
        serving.load(copy)
    (copy / fmt.MANIFEST_FILE).write_text('{"format": "something-else"}')
    with pytest.raises(errors.ArtifactFormatError, match="format is 'something-else'"):
        serving.load(copy)


def test_an_edited_manifest_without_a_new_seal(copy):
    helpers.edit_manifest(copy, lambda m: m.update(num_sequences=1), reseal=False)
    with pytest.raises(errors.ArtifactChecksumError, match="manifest is corrupted"):
        serving.load(copy)


def test_module_that_disagrees_with_its_calling_convention(copy):
    def swap(m):
        m["modules"]["mask"]["args"][-1]["dtype"] = "float32"
    helpers.edit_manifest(copy, swap)
    with pytest.raises(errors.ArtifactFormatError, match="mask.jaxexport' takes"):
        serving.load(copy)


def test_table_that_disagrees_with_the_manifest(copy):
    entry_file = "tables/layer0.next.npy"
    arr = np.load(copy / entry_file)
    np.save(copy / entry_file, arr.astype(np.int64))

    def fix(m):
        m["files"][entry_file] = {"size": (copy / entry_file).stat().st_size,
                                  "sha256": fmt.sha256_file(copy / entry_file)}
    helpers.edit_manifest(copy, fix)
    with pytest.raises(errors.ArtifactFormatError, match=r"layer0.next.npy' holds int64"):
        serving.load(copy)


def reseal_table(copy, entry_file, edit):
    """Edits a table in place and records its new size and sha256: what
    checksums cannot catch."""
    arr = np.load(copy / entry_file)
    edit(arr)
    np.save(copy / entry_file, arr)

    def fix(m):
        m["files"][entry_file] = {"size": (copy / entry_file).stat().st_size,
                                  "sha256": fmt.sha256_file(copy / entry_file)}
    helpers.edit_manifest(copy, fix)


TABLE_EDITS = {
    "next state out of range": ("tables/layer1.next.npy", lambda a: a.__setitem__((0, 0), 900)),
    "dense child ids out of order": ("tables/layer1.next.npy",
                                     lambda a: a.__setitem__((0, slice(0, 2)), a[0, 1::-1])),
    "token out of range": ("tables/layer2.tokens.npy", lambda a: a.__setitem__(0, 11)),
    "row not increasing": ("tables/layer2.tokens.npy",
                           lambda a: a.__setitem__(slice(0, 2), a[1::-1])),
    "exception state out of range": ("tables/layer2.ex_states.npy",
                                     lambda a: a.__setitem__(-1, 1000)),
    "exception start moved": ("tables/layer2.ex_starts.npy",
                              lambda a: a.__setitem__(0, a[0] + 1)),
    "exception branch changed": ("tables/layer2.ex_branch.npy",
                                 lambda a: a.__setitem__(0, a[0] + 3)),
}


@pytest.mark.parametrize("edit", sorted(TABLE_EDITS))
def test_load_checked_refuses_tables_edited_under_recomputed_checksums(fixed, copy, edit):
    """serving.load trusts checksums (documented); artifact.load_checked
    (and `decode --check-tables`) run the structural check on the files
    it loads, and refuse every edit here."""
    entry_file, change = TABLE_EDITS[edit]
    reseal_table(copy, entry_file, change)
    with pytest.raises((errors.IRVerificationError, errors.ArtifactFormatError)):
        artifact.load_checked(copy)
    from static_compiler.cli import main
    assert main(["decode", str(copy), "--check-tables"]) == 2


def test_load_checked_loads_an_intact_artifact_like_load(fixed):
    compiled, path, art = fixed
    checked = artifact.load_checked(path)
    assert checked.manifest == art.manifest
    logits = np.linspace(-1, 1, 2 * 4 * 10, dtype=np.float32).reshape(2, 4, -1)
    assert np.array_equal(np.asarray(checked.beam_step(checked.init_beams(2, 4), logits, 0).tokens),
                          np.asarray(art.beam_step(art.init_beams(2, 4), logits, 0).tokens))


def test_artifact_errors_are_static_compiler_errors(copy):
    (copy / fmt.MANIFEST_FILE).write_text("nope")
    with pytest.raises(StaticCompilerError):
        serving.load(copy)


# ----- bad arguments -----

def test_bad_logits_are_rejected_before_xla(fixed):
    _, _, art = fixed
    state = art.init_beams(2, 4)
    with pytest.raises(errors.DecodeInputError, match=r"logits have shape \(2, 4, 9\), expected "
                                                       r"\(2, 4, 10\)"):
        art.beam_step(state, np.zeros((2, 4, 9), np.float32), 0)
    with pytest.raises(errors.DecodeInputError, match=r"shape \(2, 10\), expected \(2, 4, 10\)"):
        art.beam_step(state, np.zeros((2, 10), np.float32), 0)
    with pytest.raises(errors.DecodeInputError, match="dtype int32, expected a float dtype"):
        art.beam_step(state, np.zeros((2, 4, 10), np.int32), 0)
    with pytest.raises(errors.DecodeInputError, match="logits have shape"):
        jax.jit(lambda lg: art.beam_step(state, lg, 0))(jnp.zeros((3, 4, 10)))
    bf16 = art.beam_step(state, jnp.ones((2, 4, 10), jnp.bfloat16), 0)  # floats are upcast
    f32 = art.beam_step(state, jnp.ones((2, 4, 10), jnp.float32), 0)
    assert np.array_equal(bf16.tokens, f32.tokens)


def test_bad_step_state_and_sizes(fixed):
    _, _, art = fixed
    state = art.init_beams(2, 4)
    logits = np.zeros((2, 4, 10), np.float32)
    for step in (-1, art.max_length, True):
        with pytest.raises(errors.DecodeInputError, match="step"):
            art.beam_step(state, logits, step)
    with pytest.raises(errors.DecodeInputError, match=r"step=.*float32\[\].* must be an int"):
        art.beam_step(state, logits, np.float32(1))
    with pytest.raises(errors.DecodeInputError, match=r"beam_size=5: this artifact exports beam "
                                                       r"sizes \[4, 6\]"):
        art.init_beams(2, 5)
    with pytest.raises(errors.DecodeInputError, match="state is a list"):
        art.beam_step(list(state), logits, 0)
    bad = state._replace(scores=state.scores.astype(jnp.int32))
    with pytest.raises(errors.DecodeInputError, match=r"state.scores is int32\[2, 4\], expected "
                                                       r"float"):
        art.beam_step(bad, logits, 0)
    for kwargs in (dict(batch_size=0, beam_size=4), dict(batch_size=2, beam_size=4,
                                                         start_token=[1, 2, 3]),
                   dict(batch_size=2, beam_size=4, start_token=1.5)):
        with pytest.raises(errors.DecodeInputError):
            art.init_beams(**kwargs)


def test_bad_mask_and_advance_arguments(fixed):
    _, _, art = fixed
    st = art.init_processor(3)
    with pytest.raises(errors.DecodeInputError, match=r"mask: logits have shape \(3, 4, 10\), "
                                                       r"expected \(3, 10\)"):
        art.mask(np.zeros((3, 4, 10), np.float32), st, 0)
    with pytest.raises(errors.DecodeInputError, match=r"tokens have shape \(3,\) dtype float32"):
        art.advance(st, np.zeros(3, np.float32), 0)
    with pytest.raises(errors.DecodeInputError, match=r"tokens have shape \(2,\) dtype int32, "
                                                       r"expected int of shape \(3,\)"):
        art.advance(st, np.zeros(2, np.int32), 0)


def test_manifest_entries_that_name_unlisted_files_or_wrong_kinds(copy):
    helpers.edit_manifest(copy, lambda m: m["modules"]["mask"].update(file="../outside.jaxexport"))
    with pytest.raises(errors.ArtifactFormatError, match=r"modules\['mask'\] names file "
                                                          r"'../outside.jaxexport'"):
        serving.load(copy)
    helpers.edit_manifest(copy, lambda m: (m["modules"]["mask"].update(file="modules/mask.jaxexport"),
                                   m["modules"]["init_m4"].update(beam_size=6)))
    with pytest.raises(errors.ArtifactFormatError, match=r"'init_m4' records kind 'init' and "
                                                          r"beam size 6"):
        serving.load(copy)
    helpers.edit_manifest(copy, lambda m: (m["modules"]["init_m4"].update(beam_size=4),
                                   m["modules"].pop("init_m6")))
    with pytest.raises(errors.ArtifactFormatError, match=r"no module\(s\) \['init_m6'\]"):
        serving.load(copy)


@pytest.mark.parametrize("items, end", [([(0, 1, 2), (1, 1, 1), (2, 0, 1)], None),
                                        ([(1, 2), (1,), (2, 2, 2)], 0)])
def test_finalize_before_the_last_step_flags_no_prefix_valid(items, end, tmp_path):
    """finalize used to return the beams' valid flags as they were mid-way:
    unfinished prefixes came back valid, sequences not in the set."""
    import static_compiler as sc
    compiled = sc.compile_constraints(items, 3, end_token=end, export_beam_sizes=(2,))
    compiled.save(tmp_path / "a")
    art = serving.load(tmp_path / "a")
    state = art.init_beams(1, 2)
    wanted = {tuple(s) for s in items}
    for t in range(art.max_length):
        state = art.beam_step(state, np.zeros((1, 2, 3), np.float32), t)
        result = art.finalize(state)
        tokens, valid, lengths = (np.asarray(x) for x in (result.tokens, result.valid,
                                                          result.lengths))
        for j in np.flatnonzero(valid[0]):
            assert tuple(tokens[0, j, :lengths[0, j]].tolist()) in wanted, (t, j)
        assert (np.asarray(result.scores)[~valid] == sc.SENTINEL_SCORE).all()
    assert valid.all()  # after the last step every beam is a sequence of the set


@pytest.mark.parametrize("field, value, match", [
    ("max_length", 7, "max_length 7 with depth"),
    ("end_token", 99, "end_token 99 is not a token"),
    ("num_sequences", 5, "num_sequences 5, but the tables end"),
    ("depth", 2, "depth 2"),
    ("num_final_states", 10 ** 6, "num_final_states"),
])
def test_a_manifest_whose_metadata_disagrees_with_the_tables_does_not_load(tmp_path, field,
                                                                           value, match):
    """Such manifests (resealed after the edit) used to load without complaint."""
    import json

    import static_compiler as sc
    from static_compiler.errors import ArtifactFormatError
    compiled = sc.compile_constraints([(1, 2), (1,), (2, 2, 2)], 3, end_token=0,
                                      export_beam_sizes=(2,))
    compiled.save(tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    manifest[field] = value
    manifest.pop("manifest_sha256", None)
    (tmp_path / "a" / "manifest.json").write_bytes(fmt.seal_manifest(manifest))
    with pytest.raises(ArtifactFormatError, match=match):
        serving.load(tmp_path / "a")
