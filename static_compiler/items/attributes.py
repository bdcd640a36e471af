"""Item attributes: named columns of values, one per input row (an item),
given to `compile_constraints(attributes=...)`, kept with the item index
(`items.index.ItemIndex.attributes`), saved in the artifact
(items/attr.{name}.npy, format version 12) and appended to by additions
(`appended`). Filters (`subset(where=...)`) and priors read them.

A column is of one kind: "int" (an integer dtype, kept as given), "float"
(float32 or float64), "bool", or "category" (strings, held as codes into
its categories, first-seen order, in the narrowest of uint8, uint16 and
int32 that holds them; additions append new categories at the end, so old
codes never change, though their dtype may widen; a value with a NUL
character is refused, as numpy's strings would merge "a\\x00" into "a").
numpy and the standard library only.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
import re
from typing import Callable, Mapping, Optional

import numpy as np

from static_compiler.errors import AttributeColumnError

KINDS = ("int", "float", "bool", "category")
"""The kinds of column."""

RESERVED_NAMES = frozenset({"and", "or", "not", "in", "true", "false", "True", "False"})
"""Words of the filter grammar, which no column may be named."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CODE_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int32))
"""The dtypes a category column's codes may have, narrowest first
(`code_dtype`; format versions 1 to 13 wrote int32 only)."""


def code_dtype(num_categories: int, at_least=None) -> np.dtype:
    """The narrowest of `CODE_DTYPES` that holds the codes of
    `num_categories` categories, and no narrower than `at_least` (the codes
    a column already has): uint8 up to 256 categories (1 byte a row: a
    quarter of int32's at 1e9 rows, which a filter reads whole)."""
    for dtype in CODE_DTYPES:
        fits = num_categories <= np.iinfo(dtype).max + 1
        if fits and (at_least is None or dtype.itemsize >= np.dtype(at_least).itemsize):
            return dtype
    raise AttributeColumnError(f"{num_categories} categories: a category column holds at most "
                               f"{np.iinfo(CODE_DTYPES[-1]).max + 1}")


def kind_of_dtype(dtype) -> Optional[str]:
    """The kind of column whose values have `dtype` (a category's are its
    integer codes: "int" here), or None for a dtype no column holds."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "bool"
    if dtype.kind in "iu":
        return "int"
    if dtype in (np.float32, np.float64):
        return "float"
    return None


def check_name(name, where: str) -> str:
    """`name` when it can name a column ([A-Za-z_][A-Za-z0-9_]*, not a word
    of the filter grammar: `RESERVED_NAMES`); AttributeColumnError otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise AttributeColumnError(f"{where}: attribute name {name!r}: expected an identifier "
                                   "([A-Za-z_][A-Za-z0-9_]*)")
    if name in RESERVED_NAMES:
        raise AttributeColumnError(f"{where}: attribute name {name!r} is a word of the filter "
                                   f"grammar ({', '.join(sorted(RESERVED_NAMES))}): rename "
                                   "the column")
    return name


@dataclasses.dataclass(frozen=True, eq=False)
class Column:
    """One attribute column over the items.

    kind: one of `KINDS`; values: (N,) numpy (possibly memory-mapped), of
    an integer dtype for "int", float32 or float64 for "float", bool for
    "bool", codes into `categories` for "category" (uint8, uint16 or int32:
    the narrowest that holds them, `code_dtype`); categories: the category
    column's strings (tuple of str, first-seen order), else None."""

    kind: str
    values: np.ndarray
    categories: Optional[tuple] = None

    @property
    def dtype(self) -> np.dtype:
        """The dtype of `values`."""
        return np.dtype(self.values.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of `values`."""
        return int(self.values.nbytes)

    def to_numpy(self) -> np.ndarray:
        """The values (N,): `values` as they are, or for a category column
        its strings (a unicode array, the codes looked up)."""
        if self.kind != "category":
            return self.values
        names = np.array(self.categories, dtype=str) if self.categories else \
            np.array([], dtype="<U1")
        return names[np.asarray(self.values)]


@dataclasses.dataclass(frozen=True, eq=False)
class ItemAttributes(collections.abc.Mapping):
    """The attribute columns of a set's items: a read-only mapping name ->
    `Column`, in sorted name order, each (num_rows,): one value per input
    row (item i is row i; added rows are N, N + 1, ...)."""

    columns: Mapping
    num_rows: int

    def __getitem__(self, name: str) -> Column:
        try:
            return self.columns[name]
        except KeyError:
            raise KeyError(f"no attribute {name!r}; the items have {list(self.columns)}") \
                from None

    def __iter__(self):
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    def __repr__(self):
        kinds = ", ".join(f"{name}: {c.kind}" for name, c in self.columns.items())
        return f"ItemAttributes({self.num_rows} rows; {kinds})"

    @classmethod
    def of(cls, columns: Mapping, num_rows: int) -> "ItemAttributes":
        """Columns {name: Column} (checked elsewhere), in sorted order."""
        return cls(columns={name: columns[name] for name in sorted(columns)},
                   num_rows=int(num_rows))

    @property
    def nbytes(self) -> int:
        """Bytes of every column's values."""
        return sum(column.nbytes for column in self.columns.values())

    def describe(self) -> list[dict]:
        """One row per column, for stats: {"name", "kind", "dtype",
        "categories" (their count, None but for a category column),
        "nbytes"}."""
        return [{"name": name, "kind": c.kind, "dtype": str(c.dtype),
                 "categories": None if c.categories is None else len(c.categories),
                 "nbytes": c.nbytes} for name, c in self.columns.items()]

    def with_values(self, convert: Callable) -> "ItemAttributes":
        """These columns with `convert` applied to each one's values."""
        return ItemAttributes(columns={name: dataclasses.replace(c, values=convert(c.values))
                                       for name, c in self.columns.items()},
                              num_rows=self.num_rows)


def checked_attributes(attributes: Mapping, num_rows: int, where: str) -> ItemAttributes:
    """`attributes` ({name: array-like (num_rows,)}) as checked columns.

    Raises AttributeColumnError naming the column for a name that is no
    identifier or a word of the filter grammar, values that are not a 1-D
    array of num_rows, an integer column holding NaN or None, a column
    mixing types (str and numbers, bools and numbers), and an unsupported
    dtype (complex, datetime, bytes objects, ...)."""
    if not isinstance(attributes, collections.abc.Mapping):
        raise AttributeColumnError(f"{where}: attributes is a {type(attributes).__name__}, "
                                   "expected a mapping {name: array (N,)} over the input rows")
    columns = {}
    for name, values in attributes.items():
        check_name(name, where)
        columns[name] = _checked_column(name, values, num_rows, where)
    return ItemAttributes.of(columns, num_rows)


def appended(attrs: ItemAttributes, added: Optional[Mapping], num_added: int, where: str,
             join: Optional[Callable] = None) -> ItemAttributes:
    """`attrs` with the rows `added` ({name: array-like (num_added,)}, every
    column of `attrs` and no other) appended: ints to an int column (in its
    dtype, which must hold them), ints or floats to a float column, bools
    to a bool column, strings to a category column (new categories after
    the old ones: old codes stay). join(old values, new values in the old
    dtype) -> the column's values (default: concatenated; an update of a
    saved artifact joins lazily). AttributeColumnError naming the column
    otherwise."""
    added = {} if added is None else added
    if not isinstance(added, collections.abc.Mapping):
        raise AttributeColumnError(f"{where}: attributes is a {type(added).__name__}, "
                                   "expected a mapping {name: array (n,)} over the added rows")
    missing, unknown = sorted(set(attrs) - set(added)), sorted(set(added) - set(attrs))
    if missing or unknown:
        problem = "; ".join(
            ([f"the set's attributes {missing} are not given"] if missing else []) +
            ([f"{unknown} are not attributes of the set"] if unknown else []))
        raise AttributeColumnError(f"{where}: {problem}: the added rows need a value of every "
                                   f"attribute of the set, {list(attrs)}, and no other")
    join = join or (lambda old, new: np.concatenate([np.asarray(old), new]))
    columns = {}
    for name, column in attrs.items():
        new = _checked_column(name, added[name], num_added, where, like=column)
        values, categories = new.values, column.categories
        if new.kind != column.kind and not (column.kind == "float" and new.kind == "int"):
            raise AttributeColumnError(f"{where}: attribute {name!r} holds {column.kind} "
                                       f"values; the added values are {new.kind} values")
        elif column.kind == "int" and values.size:
            info = np.iinfo(column.dtype)
            low, high = int(values.min()), int(values.max())
            if low < info.min or high > info.max:
                raise AttributeColumnError(f"{where}: attribute {name!r} is {column.dtype}; the "
                                           f"added values span [{low}, {high}]")
        dtype = column.dtype
        if column.kind == "category":  # (the strings: `_checked_column` with `like`)
            values, categories = _encoded(values, column.categories,
                                          f"{where}: attribute {name!r}")
            dtype = code_dtype(len(categories), at_least=column.dtype)  # (the join widens the old)
        values = np.asarray(values).astype(dtype, copy=False)
        columns[name] = Column(column.kind, join(column.values, values), categories)
    return ItemAttributes.of(columns, attrs.num_rows + num_added)


def _checked_column(name: str, values, num_rows: int, where: str,
                    like: Optional[Column] = None) -> Column:
    """One column of `values` (array-like (num_rows,)), its kind read from
    its dtype (an object array or a list: from its elements). like: the
    column an addition appends to (values of 0 rows take its kind);
    a category's values come back as strings when `like` is one (`appended`
    encodes them against its categories)."""
    what = f"{where}: attribute {name!r}"
    arr = values if isinstance(values, np.ndarray) else _object_array(values, what)
    if arr.ndim != 1 or arr.shape[0] != num_rows:
        raise AttributeColumnError(f"{what}: expected a 1-D array of {num_rows} values (one "
                                   f"per row), got shape {arr.shape}")
    if arr.dtype.kind == "O":
        if like is not None and arr.shape[0] == 0:
            arr = np.array([], "<U1") if like.kind == "category" else np.zeros(0, like.dtype)
        else:
            arr = _from_objects(arr, what)
    if arr.dtype.kind == "S":
        try:
            arr = np.char.decode(arr, "utf-8")
        except UnicodeDecodeError:
            raise AttributeColumnError(f"{what}: bytes values that are not UTF-8 text: give "
                                       "str") from None
    if arr.dtype.kind == "U":
        if like is not None and like.kind == "category":
            return Column("category", arr)  # (encoded against its categories by `appended`)
        codes, categories = _encoded(arr, (), what)
        return Column("category", codes, categories)
    if arr.dtype.kind == "f" and arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float32 if arr.dtype.itemsize < 4 else np.float64)
    kind = kind_of_dtype(arr.dtype)
    if kind is None:
        hint = (": convert it to int (e.g. days: values.astype('datetime64[D]')"
                ".astype(np.int64))" if arr.dtype.kind in "mM" else
                ": give int, float, bool or str values")
        raise AttributeColumnError(f"{what}: dtype {arr.dtype} is not supported{hint}")
    return Column(kind, arr)


def _object_array(values, what: str) -> np.ndarray:
    """A list (or other array-like that is no numpy array) as a 1-D object
    array of its elements, so that mixed types are seen, not coerced."""
    if isinstance(values, (str, bytes)) or not isinstance(values, collections.abc.Iterable):
        raise AttributeColumnError(f"{what}: expected a 1-D array of values (one per row), "
                                   f"got a {type(values).__name__}")
    try:
        elements = list(values)
        arr = np.empty(len(elements), dtype=object)
        arr[:] = elements
    except (TypeError, ValueError) as e:
        raise AttributeColumnError(f"{what}: not a 1-D array of values ({e})") from None
    return arr


def _from_objects(arr: np.ndarray, what: str) -> np.ndarray:
    """An object array (N,) as the typed array its elements make: all str
    -> unicode, all bool -> bool, all int -> int64, ints and floats ->
    float64. AttributeColumnError for None, NaN among ints only, mixed
    kinds and other types."""
    kinds = {_element_kind(v) for v in arr.tolist()}
    if "none" in kinds or kinds == {"int", "nan"} or ("nan" in kinds and "str" in kinds):
        missing = "None" if "none" in kinds else "NaN"
        among = " and ".join(sorted(kinds - {"none", "nan"})) or "no other"
        fix = ("fill it (e.g. 'unknown')" if "str" in kinds else
               "an integer column holds no missing value: fill it, or give floats with NaN")
        raise AttributeColumnError(f"{what}: holds {missing} (a missing value) among {among} "
                                   f"values: {fix}")
    if kinds <= {"str"}:  # (checked first: numpy's fixed-width strings drop trailing NULs)
        _check_no_nul((v for v in arr.tolist() if "\0" in v), what)
        return np.array(arr.tolist(), dtype=str) if len(arr) else np.array([], dtype="<U1")
    if kinds == {"bool"}:
        return arr.astype(bool)
    numeric = kinds - {"nan"}
    try:
        if numeric == {"int"}:
            return np.array(arr.tolist(), dtype=np.int64)
        if numeric <= {"int", "float"}:
            return np.array(arr.tolist(), dtype=np.float64)
    except OverflowError:
        raise AttributeColumnError(f"{what}: an int outside int64") from None
    names = sorted(k for k in kinds if k != "nan") + (["float"] if "nan" in kinds else [])
    if "other" in kinds:
        others = sorted({type(v).__name__ for v in arr.tolist() if _element_kind(v) == "other"})
        raise AttributeColumnError(f"{what}: values of type {others} are not supported: give "
                                   "int, float, bool or str values (a date: as int, e.g. days)")
    raise AttributeColumnError(f"{what}: mixes types ({', '.join(sorted(set(names)))}): a "
                               "column holds one kind of value")


def _element_kind(value) -> str:
    """"str", "bool", "int", "float", "nan", "none" or "other"."""
    if isinstance(value, str):
        return "str"
    if value is None:
        return "none"
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, numbers.Integral):
        return "int"
    if isinstance(value, numbers.Real) and not isinstance(value, (np.datetime64,
                                                                  np.timedelta64)):
        return "nan" if math.isnan(value) else "float"
    return "other"


def _check_no_nul(with_nul, what: str) -> None:
    """AttributeColumnError naming the first of the strings `with_nul` (an
    iterable of those holding a NUL character), if any: a category value
    holds no NUL, as numpy's fixed-width strings drop trailing ones ("a"
    and "a\\x00" would be one category); filters refuse them too."""
    for value in with_nul:
        raise AttributeColumnError(f"{what}: category value {value!r} holds a NUL character "
                                   "('\\x00'): category values hold none (numpy's strings drop "
                                   "a trailing one, which would merge it with another value)")


def _encoded(strings: np.ndarray, categories: tuple, what: str) -> tuple[np.ndarray, tuple]:
    """(codes (N,), categories) of the unicode array `strings`: `categories`
    first (their codes kept), the new strings appended in first-seen order;
    the codes in `code_dtype` of the categories' count. AttributeColumnError
    naming `what` for a value with a NUL character."""
    unique, first, inverse = np.unique(strings, return_index=True, return_inverse=True)
    _check_no_nul((str(u) for u in unique.tolist() if "\0" in u), what)
    code_of = {c: i for i, c in enumerate(categories)}
    codes = np.empty(unique.shape[0], np.int64)
    new = list(categories)
    for u in np.argsort(first, kind="stable").tolist():  # first-seen order
        text = str(unique[u])
        if text not in code_of:
            code_of[text] = len(new)
            new.append(text)
        codes[u] = code_of[text]
    return codes.astype(code_dtype(len(new)))[inverse.reshape(-1)], tuple(new)
