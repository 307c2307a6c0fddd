"""ema-floor in float mode (firmware/policies/ema_floor.py): ``ema``'s state and hooks, with
the floor baked into its recency table, ``decay = max(recency_decay(idle), ema_floor)``, so
``ema``'s priority kernel gives ``(1 − score)·max(r, floor)`` — the firmware's
``floored_priority`` bit for bit (the same kernel on the same numbers)."""

from __future__ import annotations

import numpy as np

from ..hooks import Setup
from .ema import STATIC, State, end_step, forget, idle_steps, on_access, priority, score
from .ema import build as build_ema

COVERS = (("ema-floor", "float"),)
__all__ = ["COVERS", "STATIC", "build", "end_step", "forget", "idle_steps", "on_access",
           "priority", "score"]  # fmt: skip


def build(setup: Setup) -> State:
    state = build_ema(setup)
    floor = float(setup.policy.params.ema_floor)
    return state._replace(decay=np.maximum(state.decay, floor))
