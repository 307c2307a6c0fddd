"""What an experiment of the validation programme is (docs/design.md, "Validation programme").

Each module of :mod:`kvcxl.emu.experiments` defines one module-level ``EXPERIMENT``, an
instance of :class:`Experiment`.
"""

from __future__ import annotations

from typing import Any


class Experiment:
    """One experiment: its cases per scale, one seeded run of a case, and the report."""

    name: str = ""  # the command-line name
    question: str = ""
    claim: str = ""  # the design's claim it tests

    def cases(self, scale: str) -> list[dict[str, Any]]:
        """Flat JSON-able dicts (each with ``"workload"``) for scale "tiny", "ci" or "mid"."""
        raise NotImplementedError

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        """One simulated run of ``case``: a flat dict of JSON-able numbers."""
        raise NotImplementedError

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Tables, verdict ("confirms", "contradicts" or "cannot say"), why, and plots."""
        raise NotImplementedError
