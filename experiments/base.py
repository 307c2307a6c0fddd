"""The one interface every experiment of the validation programme implements.

An experiment is a question (``question``), the seed's claim it tests (``claim``), a list
of cases per scale (``cases``), one simulated run of a case on a seed (``run``) and a
report over every run (``report``).  Adding an experiment is adding a module with a
module-level ``EXPERIMENT`` to this package (docs/validation.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcxl.emu.shape import preset
from kvcxl.emu.workloads.attention import check_choice, own_attention

SCALES = ("tiny", "ci", "mid", "s1")
VERDICTS = ("confirms", "contradicts", "cannot say")


class Experiment:
    """Base class: subclasses set the three strings and implement the three methods."""

    name: str = ""
    question: str = ""
    claim: str = ""
    #: Arms every report of the experiment needs, whatever ``--arms`` keeps (the baseline
    #: its margins are taken against, its bound).
    required_arms: tuple[str, ...] = ()

    def arm_names(self, case: dict[str, Any]) -> list[str]:
        """The arms of ``case`` that ``--arms`` chooses among: its ``policies`` and the
        labels of its ``arms`` (none: the experiment has no arms to choose)."""
        labels = [_label(a) for a in case.get("arms") or ()]
        return [*(case.get("policies") or ()), *labels]

    def with_arms(self, case: dict[str, Any], keep: set[str]) -> dict[str, Any]:
        """``case`` with only the arms in ``keep`` and the required ones (a case that
        differs, so its runs are keyed apart from the whole case's)."""
        keep = keep | set(self.required_arms)
        out = dict(case)
        if "policies" in case:
            out["policies"] = [p for p in case["policies"] if p in keep]
        if "arms" in case:
            out["arms"] = [a for a in case["arms"] if _label(a) in keep]
        return out

    def with_attention(self, case: dict[str, Any], choice: str) -> dict[str, Any]:
        """``case`` with the synthetic attention ``choice`` (``seed`` or ``fit``): a case
        that differs (field ``attention``), so its runs are keyed apart, where the choice
        is not its preset's own (a case naming no preset — the users experiments' scaled
        S1 — runs the seed's defaults); a captured trace's case unchanged (its attention
        is the real model's)."""
        if check_choice(choice) == own_attention(str(case.get("preset", ""))) or "trace" in case:
            return case
        return {**case, "attention": choice}

    def cases(self, scale: str) -> list[dict[str, Any]]:
        """Flat JSON-able cases (each with a ``"workload"``) at ``scale`` (one of SCALES)."""
        raise NotImplementedError

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        """One simulated run of ``case`` on workload seed ``seed``: flat JSON-able numbers."""
        raise NotImplementedError

    def work(self, case: dict[str, Any]) -> float:
        """A run's size relative to the others, for the progress bar's ETA: the entry reads
        it replays, steps × users × layers × KV heads × blocks read per head × arms, from the
        case's fields (its preset's shape where the case names none; one user, one arm
        where it names none).  An estimate, not a measure: override where it misleads."""
        shape = preset(str(case.get("preset", "s1"))).with_(
            **{k: case.get(k) for k in ("layers", "kv_heads", "context_tokens")}
        )
        read = str(case.get("read", "dense"))
        per_head = shape.blocks_per_context
        if read.startswith("topk:"):
            per_head = min(per_head, int(read.partition(":")[2]))
        arms = len(case.get("policies") or ()) or 1
        users = int(case.get("users", 1))
        return float(case.get("steps", 1)) * users * shape.heads_total * per_head * arms

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Tables, verdict, why and plots over rows ``{**case, "seed": s, **metrics}``.

        Returns ``{"tables": [markdown, ...], "verdict": one of VERDICTS, "why": str,
        "plots": {filename: callable(path)}}``, and ``"caption"`` (its evidence class and
        where the attention came from) when a table opens with no caption line of its own
        (``commands.render`` prints it above each such table and refuses one without).
        """
        raise NotImplementedError


Plot = Callable[[str], None]


def _label(arm: Any) -> str:
    """A case's ``arms`` item's label: the item itself, or the first of a configured arm's
    ``[label, policy, parameters]``."""
    return arm[0] if isinstance(arm, list) else arm
