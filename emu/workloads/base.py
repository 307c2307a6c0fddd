"""What a workload is: a seeded sequence of *turns*, run in parallel *lanes*.

A turn is one visit of a session (context): an optional prefill (the prompt, or the
user's next message, appended without decode reads) followed by ``decode`` decode
steps, each of which reads the context's KV entries and appends one token.
``lanes`` turns run at once (the serving batch); a session busy in one lane is
not started in another.  Sessions that are not in a lane are idle: their entries
stay wherever the tiers put them, and they may return later.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..shape import ModelShape


@dataclass(frozen=True)
class Turn:
    session: int
    prefill: int  # tokens appended before decoding (0: none)
    decode: int  # decode steps
    parent: int | None = None  # a shared-prefix context this session starts from


@dataclass
class StepPlan:
    """One decode step: prefills that happen first, then the contexts that decode."""

    step: int
    prefill: list[tuple[int, int, int | None]] = field(default_factory=list)  # ctx, tokens, parent
    decode: list[int] = field(default_factory=list)


class Workload:
    """Base class: subclasses yield turns from :meth:`turns`; scheduling is shared."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    read_mode: ClassVar[str | None] = None  # a workload may impose its read pattern
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, shape: ModelShape, seed: int = 0, **params: Any) -> None:
        unknown = [k for k in params if k not in self.defaults]
        if unknown:
            raise ValueError(
                f"workload {self.name!r} has no parameter {unknown[0]!r}; "
                f"known: {', '.join(self.defaults) or 'none'}"
            )
        self.shape = shape
        self.seed = seed
        self.params = {**self.defaults, **params}
        for k, v in self.params.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise ValueError(f"workload {self.name!r}: {k} = {v!r} must be >= 0")
        self.rng = np.random.default_rng([seed, 0x5E55])
        self.lanes = int(self.params.get("lanes", 1))
        if self.lanes < 1:
            raise ValueError(f"workload {self.name!r}: lanes = {self.lanes} must be >= 1")

    # --- to be provided by subclasses --------------------------------------------------
    def turns(self) -> Iterator[Turn]:
        raise NotImplementedError

    def needle_blocks(self, session: int) -> np.ndarray | None:
        """Blocks a retrieval head attends in this session (None: the model picks)."""
        return None

    def shared_contexts(self) -> list[tuple[int, int]]:
        """(context, tokens) created before step 0 (a shared system prompt)."""
        return []

    def shared_tokens(self, session: int) -> int | None:
        """Tokens a session with a ``parent`` shares from the parent's start (whole blocks);
        None: all of the parent's tokens at that point."""
        return None

    # --- shared scheduler ------------------------------------------------------------------
    def plans(self, steps: int) -> Iterator[StepPlan]:
        """``steps`` decode steps of the workload, lanes filled from :meth:`turns`."""
        source = self.turns()
        pending: list[Turn] = []
        lanes: list[list] = [[None, 0] for _ in range(self.lanes)]  # [turn, steps left]
        for step in range(steps):
            plan = StepPlan(step)
            busy = {lane[0].session for lane in lanes if lane[0] is not None and lane[1] > 0}
            for lane in lanes:
                if lane[0] is not None and lane[1] > 0:
                    continue
                turn = _next_free(pending, source, busy)
                if turn is None:
                    lane[0], lane[1] = None, 0
                    continue
                busy.add(turn.session)
                lane[0], lane[1] = turn, max(turn.decode, 1)
                if turn.prefill > 0:
                    plan.prefill.append((turn.session, turn.prefill, turn.parent))
            for lane in lanes:
                if lane[0] is not None and lane[1] > 0:
                    plan.decode.append(lane[0].session)
                    lane[1] -= 1
            yield plan


def _next_free(pending: list[Turn], source: Iterator[Turn], busy: set[int]) -> Turn | None:
    for i, t in enumerate(pending):
        if t.session not in busy:
            return pending.pop(i)
    for _ in range(10_000):
        t = next(source, None)
        if t is None:
            return None
        if t.session not in busy:
            return t
        pending.append(t)
    return None
