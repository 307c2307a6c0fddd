"""The one interface every experiment of the validation programme implements.

An experiment is a question (``question``), the seed's claim it tests (``claim``), a list
of cases per scale (``cases``), one simulated run of a case on a seed (``run``) and a
report over every run (``report``).  Adding an experiment is adding a module with a
module-level ``EXPERIMENT`` to this package (docs/validation.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SCALES = ("tiny", "ci", "mid")
VERDICTS = ("confirms", "contradicts", "cannot say")


class Experiment:
    """Base class: subclasses set the three strings and implement the three methods."""

    name: str = ""
    question: str = ""
    claim: str = ""

    def cases(self, scale: str) -> list[dict[str, Any]]:
        """Flat JSON-able cases (each with a ``"workload"``) at ``scale`` (one of SCALES)."""
        raise NotImplementedError

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        """One simulated run of ``case`` on workload seed ``seed``: flat JSON-able numbers."""
        raise NotImplementedError

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Tables, verdict, why and plots over rows ``{**case, "seed": s, **metrics}``.

        Returns ``{"tables": [markdown, ...], "verdict": one of VERDICTS, "why": str,
        "plots": {filename: callable(path)}}``, and ``"caption"`` (its evidence class and
        where the attention came from) when a table opens with no caption line of its own
        (``commands.render`` prints it above each such table and refuses one without).
        """
        raise NotImplementedError


Plot = Callable[[str], None]
