"""What the EMA policy knows about every entry before every step of a capture.

The per-parameter calibrations (:mod:`.calibrate_keep`, :mod:`.calibrate_weights`,
:mod:`.calibrate_prefetch`, :mod:`.calibrate_anchor`) all look at the same quantities of
a one-step-per-position capture replayed as :func:`.positions.position_steps` replays it:
each step reads the entries whose weight is at least ``read_threshold``, and only those
reads reach the policy.  Per step ``t`` and entry (flat id ``b·L·H + l·H + h``, as in
:mod:`.positions`):

* ``present``: the entry was written at an earlier step, so placement decided about it
  at the boundary before ``t`` (an entry written at ``t`` is in HBM by its write);
* ``scores``: its EMA at the start of ``t`` (firmware float mode, from the read weights);
* ``idle``: ``steps_since_access`` at the start of ``t`` with the firmware's rule
  (docs/policy.md: admission and a touch at ``t'`` make it 0 at ``t'``/``t' + 1``);
* ``reads``: it is read at ``t`` (the label every fit predicts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware.formulas import ema_update


@dataclass(frozen=True)
class Trajectory:
    """Per (step, entry) state of one capture; arrays are (steps, entries)."""

    weights: NDArray  # read weight (0 where not read)
    scores: NDArray  # EMA before the step
    idle: NDArray  # steps since the last touch before the step (0 where not present)
    present: NDArray  # written before the step
    reads: NDArray  # read at the step
    layers: int
    heads: int
    block_tokens: int

    @property
    def steps(self) -> int:
        return int(self.weights.shape[0])

    @property
    def entries(self) -> int:
        return int(self.weights.shape[1])

    @property
    def block(self) -> NDArray:
        """Block index of every entry."""
        return np.arange(self.entries) // (self.layers * self.heads)

    @property
    def layer(self) -> NDArray:
        return (np.arange(self.entries) // self.heads) % self.layers

    @property
    def head(self) -> NDArray:
        return np.arange(self.entries) % self.heads

    def first_token(self) -> NDArray:
        return self.block * self.block_tokens


def trajectory(
    weights: NDArray,
    alpha: float,
    touch_threshold: float,
    read_threshold: float,
    block_tokens: int,
) -> Trajectory:
    """The :class:`Trajectory` of dense capture ``weights`` (steps, layers, kv_heads, blocks)."""
    S, L, H, NB = weights.shape
    flat = weights.transpose(0, 3, 1, 2).reshape(S, NB * L * H).astype(np.float64)
    reads = flat >= read_threshold
    w = np.where(reads, flat, 0.0)
    created = (np.arange(NB * L * H) // (L * H)) * block_tokens  # the step that writes it
    scores = np.zeros_like(w)
    idle = np.zeros(w.shape, dtype=np.int64)
    present = created[None, :] < np.arange(S)[:, None]
    base = created.astype(np.int64).copy()  # idle = t − base (firmware ``idle_base``)
    s = np.zeros(w.shape[1])
    for t in range(S):
        scores[t] = s
        idle[t] = np.where(present[t], t - base, 0)
        touch = reads[t] & (w[t] >= touch_threshold)
        base[touch] = t + 1
        s = np.asarray(ema_update(s, w[t], alpha))
    return Trajectory(w, scores, idle, present, reads, L, H, block_tokens)
