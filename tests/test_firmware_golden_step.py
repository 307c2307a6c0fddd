"""The integer golden step (firmware/golden_step.py) against a plain per-entry reference
written from docs/policy.md's Q0.16 contract, and its users against it.

The reference below uses Python integers, one entry at a time, and a full sort on
(−priority, index): nothing of :mod:`kvcxl.firmware.fixedpoint` or
:mod:`kvcxl.firmware.select` is reused, so a change to the golden step that the
contract does not allow fails here, while the firmware's integer mode, the board
host's check and the scoreboards (which all call the golden step) move with it.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kvcxl.firmware import golden_step
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import make_policy
from kvcxl.firmware.policies.base import Tick
from kvcxl.firmware.table import EntryTable


def plain_table(beta: float, shift: int) -> list[int]:
    """DECAY[i] = round-half-even(65536 · (1 − e^(−β·i·2^shift))), saturated to 65535."""
    return [
        min(65535, max(0, round(-math.expm1(-beta * i * (1 << shift)) * 65536))) for i in range(256)
    ]


def plain_step(score, idle, weights, read, eligible, k, alpha_q, touch_q, beta, shift):
    """docs/policy.md, integer mode, per entry."""
    table = plain_table(beta, shift)
    s2, i2, prio = [], [], []
    for s, i, w, r in zip(score, idle, weights, read, strict=True):
        w = int(w) if r else 0
        s = (alpha_q * w + (65536 - alpha_q) * int(s) + 32768) >> 16
        i = 0 if (r and w >= touch_q) else min(int(i) + 1, 65535)
        d = table[min(i >> shift, 255)]
        s2.append(s)
        i2.append(i)
        prio.append(((65535 - s) * d + 32768) >> 16)
    order = sorted((e for e in range(len(score)) if eligible[e]), key=lambda e: (-prio[e], e))
    return s2, i2, prio, order[:k]


def random_case(rng: random.Random, n: int):
    score = [rng.choice([0, 7, 65535, rng.randrange(65536)]) for _ in range(n)]
    idle = [rng.choice([0, 1, 15, 16, 300, 65534, 65535]) for _ in range(n)]
    read = [rng.random() < 0.4 for _ in range(n)]
    weights = [rng.choice([0, 300, 655, 65535, rng.randrange(65536)]) if r else 0 for r in read]
    eligible = [rng.random() < 0.8 for _ in range(n)]
    return score, idle, weights, read, eligible


@pytest.mark.parametrize("seed", range(6))
def test_the_golden_step_is_the_documented_contract(seed: int) -> None:
    rng = random.Random(seed)
    cfg = PolicyConfig().with_(alpha=rng.choice([0.05, 0.2, 1.0]), decay_shift=rng.choice([0, 4]))
    p = golden_step.IntParams.from_config(cfg)
    for _ in range(20):
        n, k = rng.randrange(1, 40), rng.randrange(0, 10)
        score, idle, weights, read, eligible = random_case(rng, n)
        got = golden_step.step(score, idle, weights, read, eligible, k, p)
        s, i, prio, vict = plain_step(
            score, idle, weights, read, eligible, k, p.alpha_q, p.touch_q, cfg.beta, cfg.decay_shift
        )
        assert got.score.tolist() == s
        assert got.idle.tolist() == i
        assert got.priority.tolist() == prio
        assert got.victims.tolist() == vict
        assert got.pairs() == [(v, prio[v]) for v in vict]


def test_evaluate_ranks_within_the_step_and_writes_nothing_back() -> None:
    rng = random.Random(7)
    p = golden_step.IntParams.from_config(PolicyConfig(), touch_q=0)
    score, idle, weights, read, eligible = random_case(rng, 30)
    got = golden_step.evaluate(score, idle, weights, read, eligible, 5, p)
    assert got.score.tolist() == score and got.idle.tolist() == idle
    # the contract's priority of the stored score with idle 0 where read (touch_q 0)
    table = plain_table(PolicyConfig().beta, p.shift)
    want = [
        ((65535 - s) * table[min((0 if r else i) >> p.shift, 255)] + 32768) >> 16
        for s, i, r in zip(score, idle, read, strict=True)
    ]
    assert got.priority.tolist() == want
    order = sorted((e for e in range(30) if eligible[e]), key=lambda e: (-want[e], e))
    assert got.victims.tolist() == order[:5]


def test_the_firmwares_integer_mode_is_the_golden_step() -> None:
    """EmaPolicy(mode="int") over several steps gives the golden step's priorities and victims
    (weights as the host reports them: floats, quantised to Q0.16 by the policy)."""
    cfg = PolicyConfig()
    rng = np.random.default_rng(3)
    n = 48
    table = EntryTable(block_tokens=16)
    table.append(0, 0, 0, np.arange(n) + 10)  # no anchors: every entry eligible
    pol = make_policy("ema", cfg, table, mode="int")
    pol.ensure(n)
    p = golden_step.IntParams.from_config(cfg)
    score = np.zeros(n, dtype=np.int64)
    idle = np.zeros(n, dtype=np.int64)
    ids = np.arange(n)
    for step in range(30):
        read = rng.random(n) < 0.3
        w = np.where(read, rng.choice([0.0, 0.004, 0.01, 0.3, 1.0], n), 0.0)
        pol.on_access(ids[read], w[read], Tick(step, step))
        pol.end_step(Tick(step, step))
        want = golden_step.step(score, idle, golden_step_q16(w), read, np.ones(n, bool), 8, p)
        score, idle = want.score, want.idle
        assert pol.priority(ids, Tick(step + 1, step + 1)).tolist() == want.priority.tolist()
        assert pol.select(ids, 8, Tick(step + 1, step + 1)).tolist() == want.victims.tolist()


def golden_step_q16(w: np.ndarray) -> np.ndarray:
    """The host's float weights in Q0.16 (round half to even, as the policy quantises)."""
    return np.minimum(np.rint(w * 65536), 65535).astype(np.int64)


@pytest.mark.hdl
def test_the_board_hosts_check_is_the_golden_step() -> None:
    from kvcxl.rtl.host import Golden

    rng = random.Random(5)
    p = golden_step.IntParams.from_config(PolicyConfig())
    score, idle, _, _, eligible = random_case(rng, 24)
    pinned = np.array([not e for e in eligible])
    gold = Golden(np.array(score), np.array(idle), pinned, np.ones(24, bool), p, 6)
    s, i = list(score), list(idle)
    for _ in range(10):
        _, _, weights, read, _ = random_case(rng, 24)
        s, i, prio, vict = plain_step(s, i, weights, read, eligible, 6, p.alpha_q, p.touch_q,
                                      PolicyConfig().beta, p.shift)  # fmt: skip
        assert gold.step(weights, read) == [(v, prio[v]) for v in vict]
