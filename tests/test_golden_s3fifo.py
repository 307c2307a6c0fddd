"""The S3-FIFO golden step (firmware/golden_s3fifo.py) is the firmware's S3-FIFO.

:class:`kvcxl.rtl.slot_policy.S3FifoSlotPolicy` sends the engine's commands to the golden
step while the firmware's own S3-FIFO (firmware/policies/s3fifo.py) runs beside it
(``check``): every pass's victims, in order, must be equal.  Random request batches on a
small cache (every parameter of the policy drawn: small's share, the ghost's length, the
move threshold), then whole traces, where the victims must also equal an independent
replay with the firmware's policy alone.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_rtl_clock_golden import _stream, _victims  # the same traces and replay

from kvcxl.firmware import golden_s3fifo as gs
from kvcxl.firmware.cache import PolicyCache
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies.base import Tick
from kvcxl.firmware.table import EntryTable
from kvcxl.rtl.slot_policy import GoldenEngine, PassMismatch, S3FifoSlotPolicy

IDS = 60


def _random_run(seed: int) -> tuple[int, S3FifoSlotPolicy]:
    """Random batches (1-6 ids of 60, repeats allowed; one in 20 of more distinct ids than
    the cache holds, so that the batch alone overflows) on a cache of 12-30 entries: the
    victims the check compared, and the host policy."""
    rng = random.Random(seed)
    cfg = PolicyConfig(persistent_metadata=False).with_(
        s3fifo_small_ratio=rng.choice([0.1, 0.2, 0.35]),
        s3fifo_ghost_ratio=rng.choice([0.0, 0.5, 0.9, 2.0, 4.0]),
        s3fifo_move_threshold=rng.choice([1, 2, 3]),
    )
    capacity = rng.randint(12, 30)
    table = EntryTable(block_tokens=16)
    table.append(np.arange(IDS), 0, 0, 1 << 20)
    pol = S3FifoSlotPolicy(cfg, table, GoldenEngine(capacity + 8, "s3fifo", IDS), check=True)
    # protect_batch (even seeds): the batch's reads are not offered, as in the replay
    cache = PolicyCache(pol, capacity, protect_batch=seed % 2 == 0)
    hot = rng.sample(range(IDS), 15)  # reuse: some ids come back often
    for t in range(600):
        if rng.random() < 0.05:  # more distinct ids than the cache holds
            ids = rng.sample(range(IDS), capacity + rng.randint(1, 8))
        else:
            ids = [rng.choice(hot) if rng.random() < 0.5 else rng.randrange(IDS)
                   for _ in range(rng.randint(1, 6))]  # fmt: skip
        n = len(ids)
        cache.access(np.asarray(ids), np.ones(n), Tick(t, t))
    return pol.stats["victims"], pol


@pytest.mark.parametrize("seed", range(12))
def test_golden_step_equals_the_firmware_on_random_batches(seed):
    victims, _ = _random_run(seed)
    assert victims > 200


def test_random_batches_reach_every_rule():
    """Ghost hits, moves from small to main, passes where the batch alone overflows."""
    seen = {"ghost_hits": 0, "to_main": 0, "arrivals": 0}
    for seed in range(12):
        _, pol = _random_run(seed)
        q = pol.engine.q
        seen["ghost_hits"] += int(q.back.sum())
        seen["to_main"] += len(q.order(gs.MAIN))
        seen["arrivals"] += pol.stats["arrival_walks"]
    assert all(v > 0 for v in seen.values()), seen


CASES = ["cyclic", "zipf-sessions", "uniform", "retrieval", "multi-turn"]


def _golden(ids: int, slots: int = 1024, check: bool = True):
    def factory(cfg, table):
        return S3FifoSlotPolicy(cfg, table, GoldenEngine(slots, "s3fifo", ids), check=check)

    return factory


@pytest.mark.parametrize("workload", CASES)
def test_golden_step_equals_the_firmware_on_whole_traces(workload):
    stream = _stream(workload)
    want = _victims(stream, "s3fifo", "10%")
    got = _victims(stream, "s3fifo", "10%", 1, _golden(stream.n_entries))
    assert want.size > 100
    assert np.array_equal(got, want)


def test_a_ghost_that_keeps_nothing_is_caught(monkeypatch):
    """A planted defect (no id ever enters the ghost) fails the lockstep check, which names
    the step and the pass."""
    stream = _stream("zipf-sessions")
    monkeypatch.setattr(gs.S3Queue, "_ghost_push", lambda self, i: None)
    with pytest.raises(PassMismatch, match=r"step \d+, pass \d+ of the step, victim \d+"):
        _victims(stream, "s3fifo", "10%", 1, _golden(stream.n_entries))
