"""Item priors in a saved artifact: the prior variants of the step modules
(compile_constraints(export_priors=True)), the served search equal to the
library's (with subsets and beam schedules), the warm-up, the CLI, and
what an artifact without them says."""

from __future__ import annotations

import numpy as np
import oracle
import pytest
from helpers import run_cli

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import DecodeInputError

V = 8
ROWS = np.unique(np.asarray(oracle.random_set(np.random.default_rng(31), 90, 4, V), np.int32),
                 axis=0)
POP = (np.random.default_rng(32).standard_normal(len(ROWS)) * 2).astype(np.float32)
SCHEDULE = (2, 4, 6, 5)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    compiled = sc.compile_constraints(ROWS, V, export_subsets=True, export_priors=True,
                                      export_beam_sizes=(4, SCHEDULE), attributes={"pop": POP})
    path = tmp_path_factory.mktemp("priors") / "a.static"
    compiled.save(path)
    return compiled, path


def jax_model(last, step, carry):
    import jax.numpy as jnp
    last = jnp.asarray(last)
    return jnp.cos((last[..., None] + 1.0) * (jnp.arange(V) + 2) * (step + 0.3)), carry


def host_model(last, step, carry):  # (numpy: no jax op of the model's own compiles)
    last = np.asarray(last)
    return np.cos((last[..., None] + 1.0) * (np.arange(V) + 2) * (step + 0.3)), carry


def test_the_served_search_with_a_prior_is_the_librarys(saved):
    compiled, path = saved
    art = serving.load(path)
    assert art.manifest.exports_priors and sc.load(path).export_options.priors
    keep = np.arange(len(ROWS)) % 3 != 0
    for beam_size in (4, SCHEDULE):
        for picked in (None, keep):
            lib_kw = {} if picked is None else {"subset": compiled.subset(picked)}
            art_kw = {} if picked is None else {"subset": art.subset(picked)}
            want = compiled.beam_search(jax_model, batch_size=2, beam_size=beam_size,
                                        prior=compiled.prior("pop", -0.7, picked), **lib_kw)
            got = art.beam_search(jax_model, batch_size=2, beam_size=beam_size,
                                  prior=art.prior("pop", -0.7, picked), **art_kw)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_warming_compiles_the_prior_modules(saved):
    _, path = saved
    art = serving.load(path)
    art.warm([2], max_subsets=1)
    before = art.compilations()
    art.beam_search(host_model, batch_size=2, beam_size=4, prior=art.prior("pop", 2.0))
    art.beam_search(host_model, batch_size=2, beam_size=SCHEDULE, prior=art.prior("pop", 0.1),
                    subset=art.subset(np.arange(len(ROWS)) < 30))
    assert art.compilations() == before


def test_an_artifact_without_prior_modules_says_how_to_get_them(tmp_path):
    compiled = sc.compile_constraints(ROWS, V, export_subsets=True, export_beam_sizes=(4,),
                                      attributes={"pop": POP})
    art = serving.load(compiled.save(tmp_path / "plain.static"))
    with pytest.raises(DecodeInputError, match=r"exports no item-prior modules \(compile with "
                                               r"export_priors=True\)"):
        art.beam_search(host_model, batch_size=1, beam_size=4, prior=art.prior("pop"))
    with pytest.raises(DecodeInputError, match="export_priors=True needs export_subsets=True"):
        sc.compile_constraints(ROWS, V, export_priors=True).save(tmp_path / "never.static")
    assert not (tmp_path / "never.static").exists()


def test_a_set_with_priors_saved_tables_only_gets_its_prior_modules_back(saved, tmp_path):
    """Saved tables-only (modules=False), the set's export plan records its
    priors: re-export exports the prior modules (as the save with modules
    did), with or without explicit beam sizes, and the served search with a
    prior is the library's."""
    compiled, path = saved
    tables_only = compiled.save(tmp_path / "t.static", modules=False)
    assert sc.load(tables_only).export_options.priors
    sc.reexport_artifact(tables_only)
    art = serving.load(tables_only)
    assert sorted(art.manifest.modules) == sorted(serving.load(path).manifest.modules)
    assert art.manifest.exports_priors and not art.manifest.missing_modules()
    want = compiled.beam_search(jax_model, batch_size=2, beam_size=SCHEDULE,
                                prior=compiled.prior("pop", -0.7))
    got = art.beam_search(jax_model, batch_size=2, beam_size=SCHEDULE,
                          prior=art.prior("pop", -0.7))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    again = compiled.save(tmp_path / "sizes.static", modules=False)
    sc.reexport_artifact(again, beam_sizes=(2,))
    assert serving.load(again).manifest.modules.keys() >= {"beam_step_prior_m2",
                                                           "beam_step_prior_subset_m2"}


def test_a_prior_of_another_set_is_refused(saved, tmp_path):
    compiled, path = saved
    art = serving.load(path)
    other = sc.compile_constraints(ROWS[:50], V, export_subsets=True,
                                   attributes={"pop": POP[:50]})
    with pytest.raises(DecodeInputError, match="the prior is of another set"):
        art.beam_step(art.init_beams(1, 4), np.zeros((1, 4, V), np.float32), 0,
                      prior=other.prior("pop"))


def test_the_cli_decodes_with_a_prior(saved, tmp_path, capsys):
    src, attrs = tmp_path / "rows.npy", tmp_path / "attrs.npz"
    np.save(src, ROWS)
    np.savez(attrs, pop=POP)
    art = tmp_path / "cli.static"
    code, out, err = run_cli(capsys, "compile", src, "--vocab-size", V, "-o", art,
                             "--beam-sizes", "4", "--export-subsets", "--export-priors",
                             "--attributes", attrs)
    assert code == 0, err
    code, plain, err = run_cli(capsys, "decode", art, "--top", 4)
    assert code == 0, err
    code, boosted, err = run_cli(capsys, "decode", art, "--prior", "pop", "--prior-weight", 50,
                                 "--top", 4)
    assert code == 0, err
    assert boosted != plain
    top = ROWS[int(np.argmax(POP))].tolist()
    assert f"tokens {top}" in boosted.split("batch row 1")[0]  # weight 50: the top item wins
    code, out, err = run_cli(capsys, "decode", art, "--prior", "nope")
    assert code == 2 and "no attribute 'nope'" in err


def test_a_set_with_an_end_token_serves_priors_too(tmp_path):
    """Names of several lengths: the served search with a prior (the end
    token's candidates read their item's own prior) is the library's."""
    items = oracle.random_ragged_set(np.random.default_rng(33), 40, 3, 6, end_token=0)
    pop = (np.random.default_rng(34).standard_normal(len(items)) * 2).astype(np.float32)
    compiled = sc.compile_constraints(items, 6, end_token=0, export_subsets=True,
                                      export_priors=True, export_beam_sizes=(5, (2, 4, 3, 6)),
                                      attributes={"pop": pop})
    art = serving.load(compiled.save(tmp_path / "ragged.static"))

    def model(last, step, carry):
        import jax.numpy as jnp
        last = jnp.asarray(last)
        return jnp.cos((last[..., None] + 1.0) * (jnp.arange(6) + 2) * (step + 0.3)), carry

    for beam_size in (5, (2, 4, 3, 6)):
        want = compiled.beam_search(model, batch_size=2, beam_size=beam_size,
                                    prior=compiled.prior("pop", 1.5))
        got = art.beam_search(model, batch_size=2, beam_size=beam_size,
                              prior=art.prior("pop", 1.5))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
