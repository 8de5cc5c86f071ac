"""One option of ``otel-ofu collector``, and what is made of it: its flag, variable, key in a file, settings field.

An ``Option`` is the one declaration of a setting: its name (``max_streams``: the flag ``--max-streams``, the variable
``OTEL_OFU_COLLECTOR_MAX_STREAMS``, the key ``max_streams`` under its section ``state:`` in a ``--config`` file),
its default, its range (a ``Bound``), the text parser every source goes through, and its help. The settings objects
(``AggregatorConfig``, ``CollectorOptions``) declare the field an option fills with ``OPTION.field()``: the field
takes the option's default and is checked against the same range, and ``settings_from`` fills every such field
from a command line's values without naming any.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Generic, TypeVar

import attrs

from otel_ofu_collector.option_bounds import Bound

T = TypeVar("T")

# The key of an option in the metadata of the settings field it fills.
_LINK: Final = "otel_ofu_collector.option"


@attrs.frozen
class Section:
    """A group of options: ``key`` in a configuration file, ``title`` in ``--help`` and the reference."""

    key: str
    title: str


@attrs.frozen(eq=False)  # compared by identity: two options are never the same one
class Option(Generic[T]):
    """One setting of the collector, declared once (see the module's doc).

    ``parse`` reads the setting from text, whichever source the text comes from (a flag, a variable, a file's
    value), raising ``argparse.ArgumentTypeError`` with the reason; a number's parser is its ``bound``'s. A
    ``switch`` is ``--name``/``--no-name``. A ``secret`` is never printed (``--print-config``)."""

    name: str
    section: Section
    default: T
    help: str
    parse: Callable[[str], T]
    metavar: str | None = None
    bound: Bound[Any] | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    secret: bool = False

    def __attrs_post_init__(self) -> None:
        if self.bound is not None and self.default is not None:
            self.bound.check(self.name, self.default)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """Where the option stands in a configuration file: ``section.name``."""
        return f"{self.section.key}.{self.name}"

    @property
    def described(self) -> str:
        """The help with the range, as ``--help`` and the reference show it."""
        return self.help if self.bound is None else f"{self.help} [{self.bound.describe()}]"

    @property
    def shown_default(self) -> str | None:
        """The default as ``--help`` and the reference show it; None where there is none to show."""
        if self.switch:
            return "on" if self.default else None
        return as_text(self.default)

    def field(self, *, minimum: Any = None, maximum: Any = None, validator: Any = None, **kwargs: Any) -> Any:
        """The settings field this option fills: its default, its range checked, and a link back to the option.

        ``minimum``/``maximum`` widen the range where the settings take more than the command line (a local
        screen's sub-second windows); ``validator`` adds a check of the field's own."""
        checks: list[Any] = []
        if self.bound is not None:
            bound = self.bound
            if minimum is not None or maximum is not None:
                bound = attrs.evolve(
                    bound,
                    minimum=bound.minimum if minimum is None else minimum,
                    maximum=bound.maximum if maximum is None else maximum,
                )
            checks.append(bound.validate)
        if self.choices is not None:
            checks.append(_one_of(self.choices))
        if self.default is None:
            checks = [attrs.validators.optional(check) for check in checks]
        if validator is not None:
            checks.append(validator)
        return attrs.field(default=self.default, validator=checks or None, metadata={_LINK: self}, **kwargs)


def _one_of(choices: Sequence[str]) -> Callable[[object, attrs.Attribute[Any], Any], None]:
    def check(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {', '.join(choices)}, got {value!r}")

    return check


def as_text(value: object) -> str | None:
    """A value as the text its flag takes (None for none): a list joined by commas, a mapping as KEY=VALUE pairs,
    true and false as on and off (which every switch and every listener that can be turned off reads)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ",".join(str(as_text(item)) for item in value)
    if isinstance(value, Mapping):
        return ",".join(f"{key}={as_text(item)}" for key, item in value.items())
    return str(value)


def option_of(field: attrs.Attribute[Any]) -> Option[Any] | None:
    """The option a settings field is filled by (``Option.field``), or None for a field no option fills."""
    option: Option[Any] | None = field.metadata.get(_LINK)
    return option


def settings_from(settings: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of the settings class ``settings`` that options fill, from ``values`` by option name."""
    found = {}
    for field in attrs.fields(settings):
        option = option_of(field)
        if option is not None:
            found[field.name] = values[option.name]
    return found


def optional_text(text: str) -> str | None:
    """A free text (a file, an id) where nothing given is none: an empty one is no value."""
    return text or None
