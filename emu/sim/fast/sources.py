"""The fast engine's sources, their hash, and the per-file compiled caches kept in step.

numba caches each ``cache=True`` function by its own file's stamp, not by the functions it
calls: a function of ``tiers.py`` compiled against ``kernel.py``'s ``_select`` keeps that
machine code after ``kernel.py`` changes, and so does every loop compiled against it.
The loops' own files are named by :func:`engine_hash` (:mod:`.compose`); :func:`drop_stale`
drops the per-file caches of the engine's folders whenever that hash has changed since they
were written, so that every function is compiled against its callees' current source.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import kvcxl.firmware as firmware

HERE = Path(__file__).resolve().parent
#: Sources outside the engine's folder that a compiled loop bakes in: the timeline log's
#: column numbers and move codes, and the firmware (policy constants and the sketch's
#: functions the modules call or read at compile time).
BAKED_IN = (
    *(HERE.parent.parent / "timeline" / f for f in ("log.py", "resources.py")),
    *sorted(Path(firmware.__file__).parent.rglob("*.py")),
)
_STAMP = "kvcxl-engine-sources"  # the hash the folder's per-file caches were compiled at


@cache
def engine_hash() -> str:
    """The hash of every source of the engine (loop, kernel, hooks, policies) and of what
    it bakes in: a compiled loop embeds all of them, and numba would not notice a change
    outside its own file."""
    h = hashlib.sha256()
    for path in [*sorted(HERE.rglob("*.py")), *BAKED_IN]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def drop_stale(root: Path = HERE, current: str | None = None) -> bool:
    """Delete numba's per-file caches (``*.nbi``, ``*.nbc``) under ``root`` and
    ``root/policies`` unless they were written at the ``current`` engine hash (default
    :func:`engine_hash`); returns whether it dropped them.  Run at the package's import,
    before anything of it is compiled in the process.  A folder numba cannot write (a
    read-only install) is left alone: numba then caches elsewhere or not at all."""
    current = current or engine_hash()
    stamp = root / "__pycache__" / _STAMP
    try:
        if stamp.read_text() == current:
            return False
    except OSError:
        pass
    try:
        for folder in (root, root / "policies"):
            for f in (folder / "__pycache__").glob("*.nb[ci]"):
                f.unlink(missing_ok=True)
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(current)
    except OSError:
        return False
    return True
