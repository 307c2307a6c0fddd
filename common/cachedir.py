"""Where kvcxl keeps what it builds once and reuses: ``$KVCXL_CACHE``, else ``~/.cache/kvcxl``.

One definition for every part that caches there (the fast engine's compiled loops, the
QEMU host); each keeps a folder of its own under it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$KVCXL_CACHE`` when set (and not empty), else ``~/.cache/kvcxl``."""
    return Path(os.environ.get("KVCXL_CACHE") or Path.home() / ".cache" / "kvcxl")
