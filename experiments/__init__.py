"""The design's validation programme as experiments (docs/validation.md).

Every module here except ``base``, ``stats``, ``runner`` and names starting
with ``_`` defines one module-level ``EXPERIMENT`` (a :class:`base.Experiment`); this
registry finds them, so adding an experiment is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Experiment

_NOT_EXPERIMENTS = {"base", "stats", "runner"}


def _discover() -> dict[str, Experiment]:
    found: dict[str, Experiment] = {}
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if m.name in _NOT_EXPERIMENTS or m.name.startswith("_"):
            continue
        exp = importlib.import_module(f"{__name__}.{m.name}").EXPERIMENT
        if exp.name in found:
            raise ValueError(f"experiment name {exp.name!r} defined twice")
        found[exp.name] = exp
    return found


EXPERIMENTS: dict[str, Experiment] = _discover()


def get(name: str) -> Experiment:
    """An experiment by name, with a clear error naming the known ones."""
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise ValueError(
            f"unknown experiment {name!r}; choose from: all, {', '.join(EXPERIMENTS)}"
        ) from None


__all__ = ["EXPERIMENTS", "Experiment", "get"]
