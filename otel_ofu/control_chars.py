"""Control characters in text that came from outside: found (the collector refuses them in identity values) and
written out visibly (wherever a terminal or a Prometheus page shows such text).

A job id is whatever a producer, a scheduler or a pod label said. Printed raw, ``ESC ] 2 ; ... BEL`` retitles the
terminal running ``otel-ofu top``, ``ESC [ 2 J`` clears it, a newline forges a log line; a C1 control (U+0080 to
U+009F) is one-byte CSI on some terminals. So the C0 controls, DEL and the C1 controls are never printed as they
are: each is written as ``\\xNN``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

CONTROL: Final = re.compile("[\x00-\x1f\x7f-\x9f]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (C0, DEL or C1)."""
    return CONTROL.search(text) is not None


def _written_out(found: re.Match[str]) -> str:
    return f"\\x{ord(found.group()):02x}"


def escaped(text: str) -> str:
    """``text`` with every control character written as ``\\xNN`` (text without one is returned as it is)."""
    return CONTROL.sub(_written_out, text) if CONTROL.search(text) else text


def escape_controls(value: Any) -> Any:
    """``value`` with every string in it ``escaped``: through attrs instances, mappings (keys too), lists and tuples.
    What holds no control character is returned as it is, the same object."""
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, bool | int | float) or value is None:
        return value
    if attrs.has(type(value)):
        changes = {}
        for field in attrs.fields(type(value)):
            if not field.init:
                continue
            current = getattr(value, field.name)
            fresh = escape_controls(current)
            if fresh is not current:
                changes[field.alias or field.name.lstrip("_")] = fresh
        return attrs.evolve(value, **changes) if changes else value
    if isinstance(value, Mapping):
        items = [(escape_controls(key), escape_controls(item)) for key, item in value.items()]
        if all(
            new_key is key and new is item for (new_key, new), (key, item) in zip(items, value.items(), strict=True)
        ):
            return value
        return dict(items)
    if isinstance(value, list | tuple):
        fresh_items = [escape_controls(item) for item in value]
        if all(new is old for new, old in zip(fresh_items, value, strict=True)):
            return value
        return fresh_items if isinstance(value, list) else tuple(fresh_items)
    return value
