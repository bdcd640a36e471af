"""The pass base class: a frozen dataclass with a `name`, typed options and a
pure `run(ir) -> ir`.

Options are the dataclass fields; their annotated type (int, float, bool, str,
`ByteSize`, or a tuple of these) decides how a pipeline spec's text is parsed.
Option names are spelled with dashes in specs (`memory-budget`) and with
underscores in Python (`memory_budget`).
"""

from __future__ import annotations

import abc
import dataclasses
import re
from typing import Callable, ClassVar, Collection, Sequence, get_type_hints

from static_compiler.errors import PipelineError
from static_compiler.ir import Automaton, Layer, Layout

_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12}


class ByteSize(int):
    """A byte count written as `2GiB`, `512MiB`, `1.5GB` or a plain integer."""

    @classmethod
    def parse(cls, text: str) -> "ByteSize":
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*", str(text))
        if not m:
            raise ValueError(f"{text!r} is not a byte size such as 64MiB, 2GiB or 1000000")
        return cls(int(float(m.group(1)) * _UNITS[m.group(2) or ""]))

    def __str__(self) -> str:
        for unit in ("TiB", "GiB", "MiB", "KiB"):
            if self and self % _UNITS[unit] == 0:
                return f"{self // _UNITS[unit]}{unit}"
        return str(int(self))

    __repr__ = __str__


def _parse_scalar(text: str, typ, where: str):
    try:
        if typ is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ValueError(f"{text!r} is not a bool (true/false)")
        if typ is ByteSize:
            return ByteSize.parse(text)
        if typ is int:
            return int(text)
        if typ is float:
            return float(text)
        if typ is str:
            return text
    except ValueError as e:
        raise PipelineError(f"{where}: expected {typ.__name__}, got {text!r} ({e})") from None
    raise PipelineError(f"{where}: unsupported option type {typ!r}")


def _format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "(" + ",".join(_format_value(v) for v in value) + ")"
    return str(value)


@dataclasses.dataclass(frozen=True)
class Pass(abc.ABC):
    """Base class of compiler passes. Subclasses set `name` and `run`.

    layout_only: the pass reads layers only as the cost model does (counts,
    branch histogram, accepting, targets) and changes only their layouts, so
    it runs on an `ir.AutomatonSummary` too (`pipeline.plan_layouts`)."""

    name: ClassVar[str] = ""
    layout_only: ClassVar[bool] = False

    @abc.abstractmethod
    def run(self, ir: Automaton) -> Automaton:
        """Returns the transformed IR; never changes `ir` (it is immutable)."""

    def wired(self, later: Sequence["Pass"]) -> "Pass":  # noqa: ARG002 (overridden)
        """This pass as it runs in a pipeline where `later` run after it. A
        pass may leave an option to the pipeline and take it from a later
        pass here (split-heavy plans for the multiple of the pad-branches
        after it); the spec text stays the one written. Default: unchanged."""
        return self

    def map_layouts(self, ir: Automaton, new_layout: Callable[[int, Layer, Layout], Layout]
                    ) -> Automaton:
        """`ir` with each layer t's layout replaced by new_layout(t, layer, layout),
        for passes that refine layouts; PipelineError if a layer has none yet."""
        layers = []
        for t, layer in enumerate(ir.layers):
            if layer.layout is None:
                raise PipelineError(f"{self.name}: layer {t} has no layout; run choose-layout first")
            layout = new_layout(t, layer, layer.layout)
            layers.append(layer if layout == layer.layout else layer.replace(layout=layout))
        return ir.with_layers(layers)

    @classmethod
    def option_types(cls) -> dict[str, type]:
        hints = get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    @classmethod
    def from_options(cls, options: dict) -> "Pass":
        """Builds the pass from spec text options {dashed-name: text}."""
        types = cls.option_types()
        kwargs = {}
        for key, text in options.items():
            attr = key.replace("-", "_")
            if attr not in types:
                known = ", ".join(k.replace("_", "-") for k in types) or "none"
                raise PipelineError(f"pass {cls.name!r} has no option {key!r} (options: {known})")
            typ = types[attr]
            where = f"option {key!r} of pass {cls.name!r}"
            if getattr(typ, "__origin__", None) is tuple:
                inner = typ.__args__[0]
                body = text.strip()
                if not (body.startswith("(") and body.endswith(")")):
                    raise PipelineError(f"{where}: expected a tuple like (1,2), got {text!r}")
                items = [s for s in body[1:-1].split(",") if s.strip()]
                kwargs[attr] = tuple(_parse_scalar(s.strip(), inner, where) for s in items)
            else:
                kwargs[attr] = _parse_scalar(text, typ, where)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise PipelineError(f"pass {cls.name!r}: {e}") from None

    def spec(self, spell_out: Collection[str] = ()) -> str:
        """The pass as pipeline spec text: options that differ from their
        default, and the options named in `spell_out` (Python names) even at
        their default."""
        unknown = set(spell_out) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"pass {self.name!r} has no option {sorted(unknown)}")
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in spell_out and f.default is not dataclasses.MISSING \
                    and value == f.default:
                continue
            parts.append(f"{f.name.replace('_', '-')}={_format_value(value)}")
        return self.name + ("{" + ",".join(parts) + "}" if parts else "")
