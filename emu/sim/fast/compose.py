"""The fast engine's policy registry and the replay loop compiled for each policy module.

:func:`modules` walks :mod:`kvcxl.emu.sim.fast.policies` (pkgutil): every module there is a
policy (its ``COVERS`` say which firmware policies and modes it replays), so adding one is
adding a file.  :func:`replay_for` gives the loop of :mod:`kvcxl.emu.sim.fast.loop`
compiled for one module.  numba keys its on-disk cache by a function's source file and
code, not by the globals it calls, and a closure over a policy's functions misses the cache
in every new process; so the loop's source is written, with its import of the policy
module replaced, to a file of its own under ``$KVCXL_CACHE/fast`` (default
``~/.cache/kvcxl/fast``), named by the hash of the engine's sources: a later process (a
sweep's worker) loads the compiled loop from numba's cache beside it, and an edit of any
engine source makes new files, compiled afresh (and :mod:`.sources` drops the per-file
caches of the engine's helpers, compiled against the older sources of their callees).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pkgutil
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from kvcxl.common.cachedir import cache_root

from . import hooks
from . import policies as _package
from .sources import engine_hash

HERE = Path(__file__).resolve().parent
_BINDING = re.compile(r"^from kvcxl\.emu\.sim\.fast\.policies import (\w+) as P\b.*$", re.M)


@cache
def modules() -> dict[tuple[str, str], ModuleType]:
    """(firmware policy, mode) → the fast-engine module that replays it, every module of the
    policies package (one pair claimed twice is refused)."""
    out: dict[tuple[str, str], ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(_package.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{_package.__name__}.{info.name}")
        hooks.check(mod)
        for pair in mod.COVERS:
            if pair in out:
                raise ValueError(
                    f"{pair} is replayed by both {out[pair].__name__} and {mod.__name__}"
                )
            out[pair] = mod
    return out


def cache_dir() -> Path:
    """Where the per-policy loop sources (and numba's cache of them) live."""
    return cache_root() / "fast"


def _hash(module: ModuleType) -> str:
    """The engine's hash and the policy module's own source (which may live outside it)."""
    h = hashlib.sha256(engine_hash().encode())
    h.update(Path(module.__file__ or "").read_bytes())
    return h.hexdigest()[:16]


def loop_source(module: ModuleType) -> str:
    """The loop's source with ``P`` bound to ``module``."""
    text = (HERE / "loop.py").read_text()
    name = module.__name__.rsplit(".", 1)[1]
    line = f"from kvcxl.emu.sim.fast.policies import {name} as P  # sources {_hash(module)}"
    out, k = _BINDING.subn(line, text)
    if k != 1:
        raise RuntimeError("loop.py must import its policy module exactly once")
    return out


def _write(path: Path, text: str) -> None:
    """Write ``text`` unless the file holds it already, atomically, its mtime derived from the
    text: two processes writing the same text leave the same stamp (numba's cache and
    Python's bytecode cache check mtime and size)."""
    data = text.encode()
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    stamp = 1_000_000_000 + int(hashlib.sha256(data).hexdigest()[:7], 16)
    os.utime(tmp, (stamp, stamp))
    os.replace(tmp, path)


@cache
def replay_for(module: ModuleType) -> Any:
    """The replay loop compiled (or loaded from numba's cache) for ``module``."""
    name = module.__name__.rsplit(".", 1)[1]
    source = loop_source(module)
    path = cache_dir() / f"replay_{name}_{_hash(module)}.py"
    _write(path, source)
    mod_name = f"kvcxl_fast_loop_{name}_{_hash(module)}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    loop = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = loop
    spec.loader.exec_module(loop)
    return loop.replay
