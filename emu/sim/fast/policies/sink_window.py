"""StreamingLLM's sink + recent window (firmware/policies/sink_window.py): the pins are the
policy's own ``wants_pin``; every other entry goes oldest first by its age in tokens
behind its context's newest token (BY_AGE: the loop keeps the context lengths)."""

from __future__ import annotations

from typing import NamedTuple

from numba import njit

from ..hooks import Setup
from ..kernel import age_tokens

COVERS = (("sink-window", "float"),)
BY_AGE = True


class State(NamedTuple):
    none: int  # (no metadata of its own)


def build(setup: Setup) -> State:
    return State(0)


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return age_tokens(tab, e)


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    return False
