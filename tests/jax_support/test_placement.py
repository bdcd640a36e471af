"""The placement rule (`static_compiler.jax_support.placement`): which tables split
across a mesh axis, the per-device bytes it gives (`layer_stats(devices=)`,
`show-ir --stats --devices`), and the mesh checks of `serving.load`. The
decoding side runs on 8 host devices in tests/backend/test_sharded_tables.py."""

from __future__ import annotations

import types

import numpy as np
import pytest

import static_compiler as sc
from static_compiler import errors, report
from static_compiler.cli import main
from static_compiler.frontend import datasets
from static_compiler.jax_support import placement

BIG = placement.PACKED_TABLE_ENTRIES + 8  # rows; divisible by 8


def fake_mesh(**axes):
    """An object with a Mesh's `shape` (an ordered name -> size mapping)."""
    return types.SimpleNamespace(shape=dict(axes))


@pytest.mark.parametrize("name, shape, dtype, devices, min_bytes, split", [
    ("tokens", (BIG,), np.uint16, 8, 0, True),
    ("tokens", (BIG,), np.uint16, 1, 0, False),              # one device: nothing to split
    ("tokens", (placement.PACKED_TABLE_ENTRIES,), np.int32, 2, 0, False),  # may be packed
    ("tokens", (BIG + 1,), np.int32, 8, 0, True),            # padded to a multiple of D
    ("indptr", (BIG + 1,), np.int32, 8, 0, True),
    ("tokens", (BIG,), np.uint16, 8, 2 * BIG + 1, False),    # under min_bytes
    ("next", (2048, 64), np.int32, 8, 0, True),              # 2-D: entries count, rows split
    ("accepting", (BIG,), np.bool_, 4, 0, True),
])
def test_which_tables_split(name, shape, dtype, devices, min_bytes, split):
    assert placement.is_split(name, shape, dtype, devices, min_bytes) is split


@pytest.mark.parametrize("name, dtype, fill", [
    ("indptr", np.int32, 7), ("tokens", np.uint16, 0), ("accepting", np.bool_, False),
    ("ex_states", np.int32, placement.PAST_EVERY_STATE), ("ex_states", np.uint16, 65535),
    ("ex_branch", np.uint8, 0)])
def test_split_tables_are_padded_with_rows_no_decode_reads(name, dtype, fill):
    arr = np.arange(5, dtype=np.int64).astype(dtype)
    if name == "indptr":
        arr[-1] = 7
    out = placement.padded(name, arr, 8)
    assert out.dtype == arr.dtype and out.shape == (8,)
    np.testing.assert_array_equal(out[:5], arr)
    assert (out[5:] == fill).all()
    rows = placement.padded("next", np.zeros((3, 4), np.int16), 8)
    assert rows.shape == (8, 4) and (rows[3:] == -1).all()
    with pytest.raises(errors.DecodeInputError, match="rows"):
        placement.padded("tokens", arr, 4)


def test_bytes_per_device_are_split_bytes_over_d_plus_replicated():
    tabs = {"indptr": np.zeros(BIG + 1, np.int32), "tokens": np.zeros(BIG, np.uint16),
            "ex_states": np.zeros(10, np.int32)}
    padded = (BIG + 8) * 4  # row pointers padded to a multiple of 8
    assert placement.bytes_per_device(tabs, 8, 0) == padded // 8 + BIG * 2 // 8 + 40
    assert placement.bytes_per_device(tabs, 1, 0) == sum(a.nbytes for a in tabs.values())
    assert placement.bytes_per_device(tabs, 8, 1 << 30) == sum(a.nbytes for a in tabs.values())


def test_padding_extends_never_cuts():
    arr = np.array([0, 2, 5], np.int32)
    assert placement.padded("indptr", arr, 4).tolist() == [0, 2, 5, 5]
    assert placement.padded("tokens", arr, 3) is arr
    with pytest.raises(errors.DecodeInputError, match="table 'tokens' has 3 rows, its placement "
                                                      "wants 2"):
        placement.padded("tokens", arr, 2)


def test_layer_stats_and_show_ir_report_bytes_per_device(tmp_path, capsys):
    sids = datasets.synthetic_sids(600_000, 4, 256, seed=3)
    compiled = sc.compile_constraints(sids, 256, capacity=1.0)
    one = compiled.layer_stats()
    four = compiled.layer_stats(devices=4)
    assert [r["bytes_per_device"] for r in one] == [r["bytes"] for r in one]
    for row, tabs in zip(four, compiled.lowered.tables):
        want = 0
        for name, arr in tabs.items():
            if placement.is_split(name, arr.shape, arr.dtype, 4, placement.DEFAULT_MIN_BYTES):
                want += placement.padded_rows(arr.shape[0], 4) * arr.itemsize * \
                    int(np.prod(arr.shape[1:])) // 4
            else:
                want += arr.nbytes
        assert row["bytes_per_device"] == want
    total, per_device = sum(r["bytes"] for r in four), sum(r["bytes_per_device"] for r in four)
    assert per_device < 0.5 * total  # the deep layers split
    assert f"bytes per device: {per_device} ({per_device / total:.3f}x" in \
        report.stats_table(compiled, devices=4)
    np.save(tmp_path / "sids.npy", sids)
    code = main(["show-ir", str(tmp_path / "sids.npy"), "--vocab-size", "256", "--stats",
                 "--devices", "4"])
    out = capsys.readouterr().out
    assert code == 0 and "bytes/dev" in out
    assert out == report.stats_table(sc.compile_constraints(sids, 256), devices=4)


@pytest.mark.parametrize("argv, message", [
    (["--stats", "--devices", "0"], "--devices 0: expected an int >= 1, with --stats"),
    (["--devices", "2"], "--devices 2: expected an int >= 1, with --stats"),
])
def test_show_ir_devices_bad_input(tmp_path, capsys, argv, message):
    np.save(tmp_path / "s.npy", np.array([[1, 2], [2, 3]]))
    code = main(["show-ir", str(tmp_path / "s.npy"), "--vocab-size", "4", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("devices", [0, -1, 1.5, True])
def test_layer_stats_refuses_bad_devices(devices):
    compiled = sc.compile_constraints([[1, 2], [2, 3]], 4)
    with pytest.raises(errors.DecodeInputError, match=r"layer_stats: devices=.*expected an int"):
        compiled.layer_stats(devices=devices)


def test_placement_of_bad_meshes():
    tables = ({"tokens": np.zeros(BIG, np.int32)},)
    with pytest.raises(errors.DecodeInputError, match=r"mesh=3: expected a jax.sharding.Mesh"):
        placement.MeshPlacement.of(3, "d", tables)
    with pytest.raises(errors.DecodeInputError, match=r"mesh has axes \['x'\], not 'd'"):
        placement.MeshPlacement.of(fake_mesh(x=2), "d", tables)
    with pytest.raises(errors.DecodeInputError, match=r"min_bytes=-1: expected an int >= 0"):
        placement.MeshPlacement.of(fake_mesh(d=2), "d", tables, min_bytes=-1)
    where = placement.MeshPlacement.of(fake_mesh(d=2), "d", tables, min_bytes=0)
    assert where.split == {(0, "tokens")} and where.devices == 2
    assert where.to_json() == {"axes": [["d", 2]], "table_axis": "d",
                               "split_tables": ["layer0.tokens"], "min_bytes": 0}


def test_a_saved_mesh_must_match_the_loading_mesh():
    record = {"axes": [["data", 2], ["d", 4]], "table_axis": "d",
              "split_tables": ["layer3.tokens"], "min_bytes": 0}
    where = placement.placement_for(record, fake_mesh(data=2, d=4), "load")
    assert where.split == {(3, "tokens")} and where.devices == 4
    with pytest.raises(errors.DecodeInputError,
                       match=r"exported for a mesh \{data: 2, d: 4\} \(8 devices\); got a mesh "
                             r"\{d: 8\} \(8 devices\)"):
        placement.placement_for(record, fake_mesh(d=8), "load")
    with pytest.raises(errors.DecodeInputError, match=r"got mesh=None: expected a "
                                                      r"jax.sharding.Mesh with those axes"):
        placement.placement_for(record, None, "load")
