"""The options of ``otel-ofu collector``, each declared once, and what is made of them.

    option.py     Option (name, section, default, range, parser, help), the settings field it fills
                  (``OPTION.field()``) and ``settings_from``, which fills every such field from a command line
    declared.py   every option, in its section: the one place a new one is added
    file.py       ``--config FILE`` (YAML, under the flags and variables) and ``--print-config``

From one declaration come the command line's flag in its ``--help`` group (``command.py``), its variable
``OTEL_OFU_COLLECTOR_<NAME>``, its key in a configuration file, its row in docs/reference.md (docs/generate.py),
and the default and range of the settings field it fills in ``AggregatorConfig`` or ``CollectorOptions``. A flag
wins over its variable, a variable over the file, the file over the default.
"""

from __future__ import annotations

from otel_ofu_collector.options.declared import OPTIONS, SECTIONS, in_section
from otel_ofu_collector.options.option import Option, Section, option_of, settings_from

__all__ = ["OPTIONS", "SECTIONS", "Option", "Section", "in_section", "option_of", "settings_from"]
