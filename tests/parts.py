"""The project's part folders, as setup.py lists them (bottom to top): read, not copied.

setup.py runs ``setup()`` when imported, so its ``FOLDERS`` literal is read from its source.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _folders() -> tuple[str, ...]:
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FOLDERS" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    raise LookupError("setup.py has no FOLDERS")


FOLDERS: tuple[str, ...] = _folders()
