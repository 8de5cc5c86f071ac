"""What the tests of examples/alerts and examples/dashboards share: load a generator, ask datadog-api-client."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from otel_ofu import names

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# Every attribute key of the vocabulary (dotted OTel keys, and the quantile keys): what a generated query
# may group or filter by.
ATTRIBUTE_KEYS = {
    value
    for key, value in vars(names).items()
    if key.isupper()
    and isinstance(value, str)
    and re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+|quantile|ofu_quantile", value)
}


def load_generator(folder: str) -> ModuleType:
    """``examples/<folder>/generate.py`` as a module (examples/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"{folder}_generate", EXAMPLES / folder / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unparsed_paths(node: Any, path: str) -> list[str]:
    """Paths of every part the datadog-api-client could keep only as an unparsed object."""
    from datadog_api_client.model_utils import OpenApiModel, UnparsedObject

    if isinstance(node, UnparsedObject) or getattr(node, "_unparsed", False):
        return [path]
    found: list[str] = []
    if isinstance(node, OpenApiModel):
        for key, value in node._data_store.items():
            found += unparsed_paths(value, f"{path}.{key}")
        for index, instance in enumerate(getattr(node, "_composed_instances", ())):
            found += unparsed_paths(instance, f"{path}<{index}>")
    elif isinstance(node, list | tuple):
        for index, item in enumerate(node):
            found += unparsed_paths(item, f"{path}[{index}]")
    elif isinstance(node, dict):
        for key, value in node.items():
            found += unparsed_paths(value, f"{path}.{key}")
    return found
