"""Files generated from the vocabulary (``docs/reference.md``, ``examples/alerts``, ``examples/dashboards``): each
generator's command line writes them, or with ``--check`` says which committed ones are stale (what the tests and
CI run)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def write_or_check(folder: Path, files: Mapping[str, str], argv: Sequence[str] | None, description: str) -> int:
    """Write ``files`` (name -> text) into ``folder``, or with ``--check`` in ``argv`` exit 1 naming the stale ones."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file is stale")
    args = parser.parse_args(argv)
    if not args.check:
        for name, text in files.items():
            (folder / name).write_text(text)
            print(f"wrote {folder.name}/{name}")
        return 0
    stale = [
        name for name, text in files.items() if not (folder / name).exists() or (folder / name).read_text() != text
    ]
    if stale:
        print(f"stale generated files in {folder.name}/ (run {sys.argv[0]}): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0
