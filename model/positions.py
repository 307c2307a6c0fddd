"""A capture replayed one step per position through the firmware session (calibration).

Each step writes its new block (every ``block_tokens`` positions) and then reads the
entries whose full-cache attention weight is at least ``read_threshold``; the caller
makes the read, so it can look at the session before and after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware.session import FirmwareSession


def session_for(
    weights: NDArray, policy: str, config: Any, budget_tokens: int, block_tokens: int,
    *, audit: bool, placement: str,
) -> FirmwareSession:  # fmt: skip
    """A session sized for ``weights`` (steps, layers, kv_heads, blocks) at the budget."""
    _S, L, H, NB = weights.shape
    capacity = (budget_tokens // block_tokens) * L * H
    fw = FirmwareSession(
        policy, capacity, config, block_tokens=block_tokens, audit=audit, placement=placement
    )
    fw.ensure(NB * L * H)
    return fw


def position_steps(
    fw: FirmwareSession, weights: NDArray, block_tokens: int, read_threshold: float
) -> Iterator[tuple[int, NDArray, NDArray]]:
    """Per step: (step, ids to read, their weights), after the step's write; the step
    boundary after the last step is closed when the loop ends."""
    S, L, H, NB = weights.shape
    lay, hd = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    lay, hd = lay.ravel(), hd.ravel()
    ctx = np.zeros(L * H, dtype=np.int64)
    flat = weights.transpose(0, 3, 1, 2).reshape(S, NB * L * H)  # entry id = b·L·H + l·H + h
    for s in range(S):
        fw.at(s)
        fw.lengths(0, s + 1)
        if s % block_tokens == 0:
            fw.write(s, fw.describe(ctx, lay, hd, np.full(L * H, s // block_tokens)))
        w = flat[s, : fw.table.n]
        ids = np.flatnonzero(w >= read_threshold)
        yield s, ids, w[ids]
    fw.end_step()
