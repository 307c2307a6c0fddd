"""The one JSON writer of every ``kvcxl`` command: the document to a file, and a note that
says so.

The note ("wrote PATH") goes to stderr: several commands print their result as JSON on
stdout as well (``kvcxl rtl formal``, ``kvcxl device stats``), and a script that pipes that
into a JSON reader must get the document alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def dumps(doc: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """``doc`` as the project's JSON text (two-space indent)."""
    return json.dumps(doc, indent=2, default=default)


def write_json(
    path: str | Path | None, doc: Any, *, default: Callable[[Any], Any] | None = None
) -> None:
    """Write ``doc`` to ``path`` (nothing when ``path`` is None or empty) and note it on
    stderr."""
    if not path:
        return
    Path(path).write_text(dumps(doc, default=default))
    wrote(path)


def wrote(what: str | Path) -> None:
    """The note every command prints when it has written a file: ``wrote WHAT`` on stderr."""
    print(f"wrote {what}", file=sys.stderr)


def emit(doc: Any, path: str | Path | None = None) -> None:
    """Print ``doc`` on stdout as the command's result, and write it to ``path`` if given."""
    print(dumps(doc))
    write_json(path, doc)
