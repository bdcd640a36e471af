"""What the vLLM tests share besides fixtures (conftest.py): the tiny
model's end of sequence, a compiled catalogue, the persistent batch's
condense step."""

from __future__ import annotations

import dataclasses
import pathlib
import random
import zoneinfo

import numpy as np

EOS = 1  # the tiny model's end of sequence (tools/tiny_llama.py)


def timezone_names() -> list:
    """The IANA time-zone names of this Python, sorted."""
    return sorted(zoneinfo.available_timezones())


def made_up_names(n: int, seed: int) -> list:
    """`n` distinct made-up names ("Karo Tiven 12"), deterministic for a seed."""
    rng, syllables = random.Random(seed), ("ka", "ro", "ti", "ve", "nu", "sa", "lo", "mi")
    names: dict = {}
    while len(names) < n:
        words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))).capitalize()
                 for _ in range(rng.randint(1, 2))]
        names[" ".join(words) + f" {rng.randint(1, 99)}"] = None
    return list(names)


def condense(batch: list, free: list, unidirectional) -> list:
    """What vLLM's input batch does after removals (`InputBatch.condense`):
    the last requests of `batch` (index -> request or None) fill the empty
    indices `free` (sorted), the trailing empties go. Returns the moves
    (from, to, `unidirectional`)."""
    moved = []
    while free:
        last = max((i for i, entry in enumerate(batch) if entry is not None), default=-1)
        if free[0] >= last:
            break
        empty = free.pop(0)
        batch[empty], batch[last] = batch[last], None
        moved.append((last, empty, unidirectional))
    while batch and batch[-1] is None:
        batch.pop()
    return moved


@dataclasses.dataclass
class Catalogue:
    """A compiled set's names, their token ids and the saved artifact."""

    path: pathlib.Path
    names: list
    ids: list

    def items(self, keep=None) -> set:
        """The token tuples of the items `keep` (bool per name) picks."""
        return {tuple(ids) for i, ids in enumerate(self.ids) if keep is None or keep[i]}


def compile_names(tiny_model, names, path, **options) -> Catalogue:
    """`names` compiled with the tiny model's tokenizer (attributes: america,
    bool; idx, int), saved to `path` (tables only)."""
    from tokenizers import Tokenizer

    import static_compiler as sc
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    attributes = {"america": np.array([n.startswith("America/") for n in names]),
                  "idx": np.arange(len(names))}
    compiled = sc.compile_constraints(names, tokenizer=tokenizer, export_subsets=True,
                                      attributes=attributes, **options)
    compiled.save(path, modules=False)
    return Catalogue(path, list(names), [tokenizer.encode(n).ids for n in names])
