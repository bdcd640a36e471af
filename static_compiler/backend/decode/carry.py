"""Per-beam model state (KV caches, positions) declared by the user, never
guessed: each carry leaf is either per beam, with its beams at a declared axis
(flattened B*M, as serving engines lay out caches, or split as (B, M)), or not
per beam and never touched. After every step, per-beam leaves are reordered by
the step's parent beams.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from static_compiler.errors import DecodeInputError


@dataclasses.dataclass(frozen=True)
class BeamAxis:
    """Where a carry leaf holds its beams.

    A leaf's spec in `carry_axes` (of `beam_search`): after every step the
    search reorders the leaf's beams by the step's parent beams, parent
    int32 (B, M) (B = batch, M = beams). In `carry_axes` a plain int `a` is
    short for ``BeamAxis(a)``.

    Parameters
    ----------
    axis : int
        The leaf's axis (negative counts from the end).
    split : bool, default False
        False for one axis of size B*M, beam m of batch row b at index
        b * M + m (the layout of serving engines' KV caches, e.g.
        (B*M, heads, T, d) with axis=0 or layers-first (L, 2, B*M, ...) with
        axis=2); True for two axes (axis, axis + 1) of sizes (B, M).

    Attributes
    ----------
    axis : int
        As given.
    split : bool
        As given.

    Raises
    ------
    DecodeInputError
        If `axis` is not an int (a bool is not). Whether the leaf has the
        axis, of size B*M (or B and M), is checked when decoding starts.

    Examples
    --------
    >>> import static_compiler as sc
    >>> sc.BeamAxis(0)
    BeamAxis(axis=0, split=False)
    >>> carry_axes = {"kv": sc.BeamAxis(2), "bias": sc.BeamAxis(0, split=True), "pos": None}
    """

    axis: int
    split: bool = False

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise DecodeInputError(f"BeamAxis(axis={self.axis!r}): expected an int axis")


class _Undeclared:
    def __repr__(self):
        return "UNDECLARED"


UNDECLARED = _Undeclared()
"""The default of `carry_axes`: nothing declared (see `resolve_carry_axes`)."""

CARRY_HELP = ("declare which axis of each carry leaf holds the beams, like jax.vmap's in_axes: "
              "carry_axes={'kv': 0, 'pos': None} (an int: beams flattened as B*M on that axis; "
              "sc.BeamAxis(a, split=True): (B, M) on axes a, a+1; None: not per beam, never "
              "reordered), or pass reorder=fn(carry, parent int32 (B, M)) -> carry")


def _is_spec(x) -> bool:
    return x is None or isinstance(x, (int, BeamAxis))


def _as_axis(spec) -> Optional[BeamAxis]:
    if spec is None:
        return None
    if isinstance(spec, bool):
        raise DecodeInputError(f"carry_axes entry {spec!r}: expected an int, a BeamAxis or None")
    return spec if isinstance(spec, BeamAxis) else BeamAxis(int(spec))


def resolve_carry_axes(carry, carry_axes, batch_size: int, beam_size: int,
                       reorder: Optional[Callable] = None, widest: Optional[int] = None
                       ) -> tuple[Optional[BeamAxis], ...]:
    """One entry per leaf of `carry` (in tree_flatten order): its normalized
    BeamAxis (axis >= 0) or None, checked against the leaf's shape.

    carry_axes: a pytree prefix of `carry` whose leaves are ints, BeamAxis or
    None (None for the whole carry: no leaf is per beam), or `UNDECLARED`.
    beam_size: the beams of the carry given (a beam schedule's first
    width); widest: the most beams a step keeps (default beam_size). An
    undeclared carry with leaves is an error when beams can be reordered
    (widest > 1) and no `reorder` function is given."""
    leaves, _ = jax.tree_util.tree_flatten(carry)
    if reorder is not None:
        if carry_axes is not UNDECLARED:
            raise DecodeInputError("pass either carry_axes or reorder, not both")
        if not callable(reorder):
            raise DecodeInputError(f"reorder={reorder!r}: expected a callable "
                                   "(carry, parent int32 (B, M)) -> carry")
        return (None,) * len(leaves)
    if carry_axes is UNDECLARED:
        if leaves and max(beam_size, widest or 0) > 1:
            paths = _leaf_paths(carry)
            raise DecodeInputError(f"carry has {len(leaves)} leaves ({', '.join(paths[:6])}"
                                   f"{', ...' if len(paths) > 6 else ''}) but no declaration of "
                                   f"which hold beams: {CARRY_HELP}")
        return (None,) * len(leaves)
    try:
        per_leaf = jax.tree_util.tree_map(
            lambda spec, sub: [_as_axis(spec)] * len(jax.tree_util.tree_leaves(sub)),
            carry_axes, carry, is_leaf=_is_spec)
    except (ValueError, TypeError) as e:
        raise DecodeInputError(f"carry_axes={carry_axes!r} is not a prefix of the carry's "
                               f"structure {jax.tree_util.tree_structure(carry)} ({e}); "
                               f"{CARRY_HELP}") from None
    specs = [s for group in jax.tree_util.tree_leaves(per_leaf, is_leaf=lambda x: isinstance(x, list))
             for s in group]
    paths = _leaf_paths(carry)
    out = []
    for path, leaf, spec in zip(paths, leaves, specs):
        out.append(None if spec is None else _check_leaf(path, leaf, spec, batch_size, beam_size))
    return tuple(out)


def _leaf_paths(tree) -> list[str]:
    """The key path of every leaf of `tree` (tree_flatten order), for messages."""
    return [jax.tree_util.keystr(p) or "carry"
            for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _check_leaf(path: str, leaf, spec: BeamAxis, B: int, M: int) -> BeamAxis:
    shape = tuple(jnp.shape(leaf))
    width = 2 if spec.split else 1
    axis = spec.axis + len(shape) if spec.axis < 0 else spec.axis
    if not 0 <= axis <= len(shape) - width:
        raise DecodeInputError(f"carry leaf {path} has shape {shape}: beam axis {spec.axis} "
                               f"{'(split, two axes) ' if spec.split else ''}is out of range")
    want = (B, M) if spec.split else (B * M,)
    if shape[axis:axis + width] != want:
        what = f"axes {axis}, {axis + 1}" if spec.split else f"axis {axis}"
        raise DecodeInputError(f"carry leaf {path} has shape {shape}: {what} should hold the "
                               f"beams, of size {want} (batch {B} x beams {M}), found "
                               f"{shape[axis:axis + width]}")
    return BeamAxis(axis, spec.split)


def check_same_structure(old, new, where: str) -> None:
    """The carry returned by logits_fn must keep the carry's structure,
    shapes and dtypes: it is loop state."""
    old_def, new_def = jax.tree_util.tree_structure(old), jax.tree_util.tree_structure(new)
    if old_def != new_def:
        raise DecodeInputError(f"{where}: logits_fn returned a carry with structure {new_def}, "
                               f"expected {old_def} (the structure given as carry=)")
    paths = _leaf_paths(old)
    for path, a, b in zip(paths, jax.tree_util.tree_leaves(old), jax.tree_util.tree_leaves(new)):
        if jnp.shape(a) != jnp.shape(b) or jnp.result_type(a) != jnp.result_type(b):
            raise DecodeInputError(f"{where}: logits_fn returned carry leaf {path} as "
                                   f"{jnp.result_type(b)}{list(jnp.shape(b))}, expected "
                                   f"{jnp.result_type(a)}{list(jnp.shape(a))}: carry shapes and "
                                   "dtypes stay fixed across steps")


def _reorder_leaf(x, spec: BeamAxis, parent):
    B = parent.shape[0]
    if spec.split:
        moved = jnp.moveaxis(x, (spec.axis, spec.axis + 1), (0, 1))
        picked = moved[jnp.arange(B)[:, None], parent]
        return jnp.moveaxis(picked, (0, 1), (spec.axis, spec.axis + 1))
    # the leaf's beams before this step (a beam schedule may keep more or fewer)
    M_in = x.shape[spec.axis] // B
    flat = (jnp.arange(B, dtype=parent.dtype)[:, None] * M_in + parent).reshape(-1)
    return jnp.take(x, flat, axis=spec.axis)


def reorder_carry(carry, parent, axes: tuple[Optional[BeamAxis], ...],
                  reorder: Optional[Callable] = None):
    """`carry` with every per-beam leaf (axes, from `resolve_carry_axes`)
    reordered by parent int32 (B, M) (M the beams kept: a leaf holding M'
    beams before comes back with M); other leaves untouched. With a user
    `reorder` function, that function does it."""
    if reorder is not None:
        return reorder(carry, parent)
    leaves, treedef = jax.tree_util.tree_flatten(carry)
    return jax.tree_util.tree_unflatten(
        treedef, [x if spec is None else _reorder_leaf(x, spec, parent)
                  for x, spec in zip(leaves, axes)])
