"""Float against integer mode (docs/results.md): the comparison's own arithmetic, and a
small run whose integer side is the Q0.16 contract."""

from __future__ import annotations

import numpy as np

from kvcxl.emu.sim import modes


def _table(rows: list[tuple[int, int, int, int, int]]) -> dict[str, np.ndarray]:
    a = np.array(rows, dtype=np.int64).reshape(-1, 5)
    return {k: a[:, j] for j, k in enumerate(("step", "context", "layer", "head", "block"))}


def test_victims_differ_counts_multisets_not_order() -> None:
    f = _table([(1, 0, 0, 0, 3), (1, 0, 0, 0, 4), (2, 0, 1, 0, 3)])
    same_reordered = _table([(1, 0, 0, 0, 4), (1, 0, 0, 0, 3), (2, 0, 1, 0, 3)])
    assert modes.victims_differ(f, same_reordered) == 0.0
    other_step = _table([(1, 0, 0, 0, 3), (1, 0, 0, 0, 4), (3, 0, 1, 0, 3)])
    assert modes.victims_differ(f, other_step) == 1 - 2 / 3
    fewer = _table([(1, 0, 0, 0, 3)])
    assert modes.victims_differ(f, fewer) == 1 - 1 / 3
    assert modes.victims_differ(_table([]), _table([])) == 0.0


def test_a_small_comparison_runs_both_modes_audited() -> None:
    rows = modes.compare(["cyclic"], ["10%"], [0, 1], steps=30, jobs=1)
    assert [r["policy"] for r in rows] == modes.INT_POLICIES == ["ema"]
    r = rows[0]
    assert r["audit_faults"] == 0 and r["seeds"] == 2
    diff = r["hit_float"]["mean"] - r["hit_int"]["mean"]
    assert abs(r["float_minus_int"]["mean"] - diff) < 1e-12
    assert "| cyclic | ema | 10% |" in modes.markdown(rows)
