"""A numeric setting's range, checked in one place for the command line and for the settings object alike.

On the command line (and from a variable or a configuration file) a value outside it is argparse's one-line
usage error naming the option (exit 2); in the settings objects (``AggregatorConfig``, ``CollectorOptions``) it
is a ValueError naming the field. Bounds are inclusive and finite: a window of 1e30
seconds parses as a float, but no export can carry a timestamp that far away.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Generic, TypeVar

import attrs

N = TypeVar("N", int, float)


def _number(text: str, kind: type[N]) -> N:
    try:
        return kind(text.strip())
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _shown(value: float) -> str:
    """``86,400``, ``0.05``: digits grouped, no exponent (``2.592e+06`` reads badly in a range)."""
    if isinstance(value, int) or value.is_integer():
        return f"{int(value):,}"
    return f"{value:g}"


@attrs.frozen
class Bound(Generic[N]):
    """``minimum`` <= value <= ``maximum``, both included, of ``kind`` (int or float); ``unit`` for messages."""

    kind: type[N]
    minimum: N
    maximum: N
    unit: str = ""

    def describe(self) -> str:
        """The range in words, e.g. ``1 to 86400 s``."""
        unit = f" {self.unit}" if self.unit else ""
        return f"{_shown(self.minimum)} to {_shown(self.maximum)}{unit}"

    def problem(self, value: object) -> str | None:
        """Why ``value`` is outside the range, or None when it is inside."""
        if self.kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if ok and self.minimum <= value <= self.maximum:  # type: ignore[operator]
            return None
        kind = "a whole number" if self.kind is int else "a number"
        return f"must be {kind} from {self.describe()}, got {value!r}"

    def check(self, name: str, value: object) -> None:
        """ValueError, naming ``name``, when ``value`` is outside the range."""
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(f"{name} {problem}")

    def validate(self, _instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        """An attrs ``validator=``: ValueError, naming the field, when ``value`` is outside the range."""
        self.check(attribute.name, value)

    def parse(self, text: str) -> N:
        """An argparse ``type=``: the text's value, or ArgumentTypeError saying the range."""
        value = _number(text, self.kind)
        if self.problem(value) is not None:
            kind = "a whole number" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind} from {self.describe()}, got {text!r}")
        return value
