"""`artifact.table_check`: an artifact's tables checked a chunk at a time
(`static-compiler verify` without --input; bounded memory at 1e9) refuse
exactly what rebuilding and verifying the automaton refuses
(`read.read_automaton`), on intact artifacts of every layout and on random
single-entry edits under recomputed checksums."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from helpers import examples
from oracle import pipeline_for

import static_compiler as sc
from static_compiler.artifact import table_check
from static_compiler.artifact.read import read_automaton
from static_compiler.cli import main
from static_compiler.errors import ArtifactFormatError, IRVerificationError
from static_compiler.format import snapshot
from static_compiler.format import spec as fmt
from static_compiler.frontend import datasets

REFUSED = (IRVerificationError, ArtifactFormatError)


def _rows(ragged: bool):
    rng = np.random.default_rng(3)
    if not ragged:
        return datasets.synthetic_sids(400, 4, 12, seed=3), None
    return [list(rng.integers(1, 12, size=int(n))) for n in rng.integers(1, 5, size=300)], 0


SETS = {
    "default": dict(),
    "ragged": dict(ragged=True),
    "csr": dict(pipeline=pipeline_for("csr")),
    "dense": dict(pipeline=pipeline_for("dense_rows")),
    "near_unary": dict(pipeline=pipeline_for("near_unary")),
    "mixed": dict(pipeline=pipeline_for("mixed_near_unary")),
    "capacity": dict(capacity=1.5),
    "near_unary room": dict(pipeline="verify,choose-layout{force=near_unary},"
                                     "reserve-capacity{growth=1.5},pack-dtypes"),
    "ragged capacity": dict(ragged=True, capacity=1.5),
}


@pytest.fixture(scope="module", params=sorted(SETS))
def saved(request, tmp_path_factory):
    spec = dict(SETS[request.param])
    rows, end = _rows(spec.pop("ragged", False))
    compiled = sc.compile_constraints(rows, 12, end_token=end, export_subsets=True, **spec)
    path = tmp_path_factory.mktemp("check") / "set.static"
    compiled.save(path)
    return request.param, compiled, path


def _verdict(path, checker) -> str:
    """"ok", "refused", "summary" (the manifest's branch histogram, counts or
    accepting states are not the tables') or "miscounted" for one way of
    checking."""
    try:
        with snapshot.open_snapshot(path) as snap:
            if checker == "chunks":
                counted = table_check.check_tables(snap)
                return "ok" if counted["num_sequences"] == counted["recorded"] else "miscounted"
        read_automaton(path)
        return "ok"
    except REFUSED as e:
        return "summary" if "summary disagrees" in str(e) else "refused"


@pytest.mark.parametrize("chunk", [1 << 22, 1, 5])
def test_intact_artifacts_pass_and_count_their_sequences(saved, chunk, monkeypatch):
    name, compiled, path = saved
    monkeypatch.setattr(table_check, "CHECK_CHUNK", chunk)
    with snapshot.open_snapshot(path) as snap:
        counted = table_check.check_tables(snap)
    assert counted == {"num_sequences": compiled.outline.num_sequences,
                       "recorded": compiled.outline.num_sequences}, name


def _reseal(path, rel, arr, histograms: bool = True) -> None:
    """Saves `arr` as table `rel` with its new size and checksum; without
    `histograms`, the manifest drops its branch histograms (as versions
    before 7 wrote it), so the row checks, not the summary, meet the edit."""
    np.save(path / rel, arr)
    manifest = json.loads((path / fmt.MANIFEST_FILE).read_text())
    if not histograms:
        for layer in manifest["layers"]:
            layer.pop("branch_counts", None)
    manifest["files"][rel] = {"size": (path / rel).stat().st_size,
                              "sha256": fmt.sha256_file(path / rel)}
    (path / fmt.MANIFEST_FILE).write_bytes(fmt.seal_manifest(manifest))


# Random single-entry edits per set (10x under the slow profile).
EDIT_TRIALS = examples(10)


def test_random_edits_are_refused_exactly_when_the_rebuilt_automaton_refuses_them(
        saved, tmp_path, monkeypatch):
    """One entry of one table set to a random value (or a neighbour's),
    checksums recomputed: the chunked check and the rebuild agree on every
    edit (most are refused; an edit that keeps the set valid passes both,
    unless it disagrees with the manifest's summary, which only the chunked
    check reads)."""
    name, compiled, path = saved
    monkeypatch.setattr(table_check, "CHECK_CHUNK", 3)
    rng = np.random.default_rng(sum(map(ord, name)))
    tables = sorted(p.relative_to(path).as_posix() for p in (path / "tables").glob("*.npy"))
    refused = 0
    for trial in range(EDIT_TRIALS):
        copy = tmp_path / f"edit{trial}"
        shutil.copytree(path, copy)
        rel = tables[rng.integers(len(tables))]
        arr = np.load(copy / rel)
        if arr.size == 0:
            continue
        flat = arr.reshape(-1)
        i = int(rng.integers(flat.size))
        if arr.dtype == bool:
            flat[i] = not flat[i]
        elif rng.random() < 0.5 and flat.size > 1:
            flat[i] = flat[(i + 1) % flat.size]
        else:
            info = np.iinfo(arr.dtype)
            flat[i] = rng.integers(max(info.min, -3), min(info.max, 2 * int(flat.max()) + 3) + 1)
        _reseal(copy, rel, arr, histograms=trial % 2 == 0)
        want, got = _verdict(copy, "rebuild"), _verdict(copy, "chunks")
        # the rebuild never reads the recorded histograms: an edit that moves
        # a row boundary yet leaves a valid trie is refused by the summary only
        assert got in (("ok", "summary") if want == "ok" else ("refused", "summary", "miscounted")), \
            (name, rel, i, want, got)
        refused += got != "ok"
    assert refused, name


def test_verify_without_input_checks_in_chunks_and_reports_removals(tmp_path, capsys):
    rows = datasets.synthetic_sids(500, 4, 12, seed=1)
    path = tmp_path / "set.static"
    sc.compile_constraints(rows, 12, export_subsets=True).save(path)
    assert main(["verify", str(path)]) == 0
    out = capsys.readouterr().out
    unique = len({tuple(r) for r in rows.tolist()})
    assert f"{unique} sequences counted from the tables (checked a chunk at a time)" in out
    assert out.rstrip().endswith("OK")
    sc.update_artifact(path, remove=rows[:10])
    assert main(["verify", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"10 of them removed by updates, {unique - 10} live" in out
    # with --input the set is enumerated and compared, as before
    np.save(tmp_path / "rows.npy", rows)
    assert main(["verify", str(path), "--input", str(tmp_path / "rows.npy")]) == 1
    assert "10 sequences in the input but not live in the artifact" in capsys.readouterr().out


@pytest.fixture(scope="module")
def csr_saved(tmp_path_factory):
    """500 synthetic rows (V = 12, L = 4) compiled with csr layers and saved
    once per module; tests edit copies (`csr_copy`)."""
    rows = datasets.synthetic_sids(500, 4, 12, seed=1)
    path = tmp_path_factory.mktemp("csr") / "set.static"
    sc.compile_constraints(rows, 12, pipeline=pipeline_for("csr")).save(path)
    return path


def csr_copy(csr_saved, tmp_path):
    """A copy of the module's csr artifact at tmp_path/set.static."""
    path = tmp_path / "set.static"
    shutil.copytree(csr_saved, path)
    return path


def test_verify_refuses_an_edited_table_with_an_error_naming_the_layer(csr_saved, tmp_path,
                                                                       capsys):
    path = csr_copy(csr_saved, tmp_path)
    arr = np.load(path / "tables/layer2.tokens.npy")
    arr[1], arr[2] = 11, 11  # two equal tokens in a row
    _reseal(path, "tables/layer2.tokens.npy", arr)
    assert main(["verify", str(path)]) == 2
    assert "layer 2, state" in capsys.readouterr().err


ROW_EDITS = {
    # table, how to break one row, what the message says of that row
    "tokens not increasing": ("tables/layer2.tokens.npy",
                              lambda a: a.__setitem__(slice(1, 3), 11),
                              r"layer 2, state \d+: tokens not strictly increasing \(11 then 11\)"),
    "token outside V": ("tables/layer2.tokens.npy", lambda a: a.__setitem__(4, 12),
                        r"layer 2, state \d+: token 12 is outside \[0, 12\)"),
}


@pytest.mark.parametrize("edit", sorted(ROW_EDITS))
def test_every_verify_path_refuses_an_edited_row_with_one_message(edit, csr_saved, tmp_path,
                                                                  capsys, monkeypatch):
    """One table edited under recomputed checksums: `load(check_automaton=True)`,
    the serving loader's `load_checked` and `static-compiler
    verify` run the one table check and raise the same IRVerificationError,
    naming the layer and state; the IR rebuilt from the tables
    (`read_automaton`: `ir.verify`) says the same of the row."""
    monkeypatch.setattr(table_check, "CHECK_CHUNK", 3)  # (the row lies in a later chunk)
    rel, change, pattern = ROW_EDITS[edit]
    path = csr_copy(csr_saved, tmp_path)
    arr = np.load(path / rel)
    change(arr)
    _reseal(path, rel, arr, histograms=False)
    messages = []
    for check in (lambda: sc.load(path, check_automaton=True),
                  lambda: sc.load(path, verify_checksums=False, check_automaton=True),
                  lambda: sc.artifact.load_checked(path)):
        with pytest.raises(IRVerificationError, match=pattern) as caught:
            check()
        messages.append(str(caught.value))
    assert main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(set(messages)) == 1 and messages[0] in err, (messages, err)
    assert messages[0].startswith(f"artifact {str(path)!r}: layer")
    with pytest.raises(IRVerificationError, match=pattern) as rebuilt:
        read_automaton(path)
    assert messages[0].endswith(str(rebuilt.value))
    sc.load(path)  # (without the check, the checksums alone pass it)
