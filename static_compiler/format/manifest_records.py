"""The optional records of a manifest ("mesh", "exported_at",
"attributes", "beam_schedules", "export_plan"), each checked as it is
read, with typed errors that name the artifact, the key, what was expected
and what was found; `manifest.Manifest` reads them. Standard library and
numpy only.
"""

from __future__ import annotations

import datetime
import re
from typing import Optional

import numpy as np

from static_compiler.errors import AttributeColumnError
from static_compiler.format.spec import MANIFEST_FILE, attribute_file, format_error, require
from static_compiler.items.attributes import CODE_DTYPES, KINDS, check_name, kind_of_dtype


def mesh_record(record: Optional[dict], path) -> Optional[dict]:
    """The manifest's "mesh" value, checked (see the version history)."""
    if record is None:
        return None
    where = f"{MANIFEST_FILE}['mesh']"
    axes = require(record, "axes", list, where, path)
    if not axes or any(not isinstance(a, list) or len(a) != 2 or not isinstance(a[0], str)
                       or isinstance(a[1], bool) or not isinstance(a[1], int) or a[1] < 1
                       for a in axes) or len({a[0] for a in axes}) != len(axes):
        raise format_error(path, f"{where}['axes'] is {axes!r}: expected [[name, size >= 1], "
                                 "...] with distinct names")
    axis = require(record, "table_axis", str, where, path)
    if axis not in {a[0] for a in axes}:
        raise format_error(path, f"{where}['table_axis'] {axis!r} is not one of the axes "
                                 f"{[a[0] for a in axes]}")
    split = require(record, "split_tables", list, where, path)
    if any(not isinstance(k, str) or not re.fullmatch(r"layer\d+\.[a-z_]+", k) for k in split):
        raise format_error(path, f"{where}['split_tables'] is {split!r}: expected "
                                 "[\"layer{t}.{name}\", ...]")
    min_bytes = require(record, "min_bytes", int, where, path)
    return {"axes": [[a[0], a[1]] for a in axes], "table_axis": axis,
            "split_tables": sorted(split), "min_bytes": min_bytes}


def iso_date(value: Optional[str], path) -> Optional[str]:
    """The manifest's "exported_at" value, checked: an ISO date or null."""
    if value is not None:
        try:
            datetime.date.fromisoformat(value)
        except ValueError:
            raise format_error(path, f"{MANIFEST_FILE}['exported_at'] is {value!r}: expected an "
                                     "ISO date (YYYY-MM-DD) or null") from None
    return value


def attributes_record(attributes) -> Optional[dict]:
    """The manifest's "attributes" value (format version 12) of an
    `ItemAttributes` (None: null): {name: {"kind", "file", "dtype",
    "categories" (list of str, or None but for a category column)}}."""
    if attributes is None:
        return None
    return {name: {"kind": c.kind, "file": attribute_file(name), "dtype": str(c.dtype),
                   "categories": None if c.categories is None else list(c.categories)}
            for name, c in attributes.items()}


def checked_attributes_record(record: Optional[dict], path) -> Optional[dict]:
    """The manifest's "attributes" value, checked (see `attributes_record`):
    names that can name a column, known kinds with a dtype of theirs, and
    categories (a list of str) for a category column only."""
    if record is None:
        return None
    out = {}
    for name, entry in sorted(record.items()):
        where = f"{MANIFEST_FILE}['attributes'][{name!r}]"
        try:
            check_name(name, MANIFEST_FILE)
        except AttributeColumnError as e:
            raise format_error(path, str(e)) from None
        kind = require(entry, "kind", str, where, path)
        dtype = require(entry, "dtype", str, where, path)
        categories = require(entry, "categories", (list, type(None)), where, path)
        try:
            values_kind = kind_of_dtype(dtype)
        except TypeError:
            values_kind = None
        want = "int" if kind == "category" else kind
        if kind not in KINDS or values_kind != want or (
                kind == "category" and np.dtype(dtype) not in CODE_DTYPES):
            raise format_error(path, f"{where}: kind {kind!r} with dtype {dtype!r}: expected "
                                     f"one of {list(KINDS)} with a dtype of its kind (uint8, "
                                     "uint16 or int32 codes for a category)")
        if (kind == "category") != (categories is not None) or \
                any(not isinstance(c, str) for c in categories or ()):
            raise format_error(path, f"{where}['categories'] is {categories!r}: expected a list "
                                     "of str for a category column, null for another kind")
        out[name] = {"kind": kind, "file": require(entry, "file", str, where, path),
                     "dtype": dtype, "categories": categories}
    return out


def schedules_record(record: list, max_length: int, path,
                      key: str = "['beam_schedules']") -> tuple:
    """The manifest's "beam_schedules" (format version 13), checked: lists of
    max_length ints >= 1 (one width per step)."""
    out = []
    for i, schedule in enumerate(record):
        if not isinstance(schedule, list) or len(schedule) != max_length or \
                not all(type(m) is int and m >= 1 for m in schedule):
            raise format_error(path, f"{MANIFEST_FILE}{key}[{i}]={schedule!r}: "
                                     f"expected a list of {max_length} ints >= 1 (one width per "
                                     "step)")
        out.append(tuple(schedule))
    return tuple(out)


EXPORT_PLAN_KEYS = ("beam_sizes", "beam_schedules", "tokens_per_beam", "priors")
"""The keys of a tables-only manifest's "export_plan" (format version 15)."""


def export_plan_record(record, max_length: int, path) -> Optional[dict]:
    """The manifest's "export_plan" (format version 15), checked: null, or
    {"beam_sizes": ints >= 1, "beam_schedules": lists of max_length ints >=
    1, "tokens_per_beam": max_length ints >= 1 or nulls, "priors": bool},
    read as tuples."""
    if record is None:
        return None
    where = f"{MANIFEST_FILE}['export_plan']"
    if sorted(record) != sorted(EXPORT_PLAN_KEYS):
        raise format_error(path, f"{where} has keys {sorted(record)}, expected "
                                 f"{sorted(EXPORT_PLAN_KEYS)}")
    sizes = require(record, "beam_sizes", list, where, path)
    caps = require(record, "tokens_per_beam", list, where, path)
    priors = require(record, "priors", bool, where, path)
    schedules = require(record, "beam_schedules", list, where, path)
    if not all(type(m) is int and m >= 1 for m in sizes) or not sizes and not schedules:
        raise format_error(path, f"{where}['beam_sizes']={sizes!r}: expected ints >= 1 (with "
                                 "the schedules, at least one entry)")
    if len(caps) != max_length or not all(c is None or type(c) is int and c >= 1 for c in caps):
        raise format_error(path, f"{where}['tokens_per_beam']={caps!r}: expected {max_length} "
                                 "entries, each an int >= 1 or null (one per step)")
    return {"beam_sizes": tuple(sizes),
            "beam_schedules": schedules_record(schedules, max_length, path,
                                                "['export_plan']['beam_schedules']"),
            "tokens_per_beam": tuple(caps), "priors": priors}
