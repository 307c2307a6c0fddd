"""The replay bugs an independent reference found, each as the few-record trace that showed it.

Shape of every trace: 2 layers, 4 query heads, 2 KV heads, d_head 64, 2-byte values,
16-token blocks, 1,024-token contexts: one entry = 4,096 bytes, so a budget of
32,768 B holds 8 entries.  Records are ``(step, context, layer, head, block, weight)``.
Each test fails on the engine before its fix (noted per test).
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.emu.shape import ModelShape
from kvcxl.emu.sim.simulator import SimOptions, simulate, victims_table
from kvcxl.emu.trace import Trace
from kvcxl.emu.workloads.stream import from_trace
from kvcxl.firmware.config import PolicyConfig

SHAPE = ModelShape(
    name="tiny", layers=2, q_heads=4, kv_heads=2, d_head=64, dtype_bytes=2,
    block_tokens=16, context_tokens=1024,
)  # fmt: skip
ENTRY = 4096


def trace(records: list[tuple[int, int, int, int, int, float]]) -> Trace:
    cols = list(zip(*records, strict=True))
    return Trace(
        step=np.array(cols[0]), context=np.array(cols[1]), layer=np.array(cols[2]),
        head=np.array(cols[3]), block=np.array(cols[4]), weight=np.array(cols[5]),
        shape=SHAPE, source="hand-written",
    )  # fmt: skip


def run(records, policy: str, budget: int, **kw):
    cfg = PolicyConfig.from_mapping(kw.pop("config", {}))
    opts = SimOptions(policy=policy, budget_bytes=budget, config=cfg, record_victims=True, **kw)
    r = simulate(from_trace(trace(records)), opts)
    return r, victims_table(from_trace(trace(records)), r["_victims"])


def victims(vt) -> list[tuple[int, int]]:
    """(layer, block) of every victim, in eviction order (head and context are 0 here)."""
    return list(zip(vt["layer"].tolist(), vt["block"].tolist(), strict=True))


# 1. Before: each new entry set its context's length to its own block's end, so creating
# (layer 1, block 0) shrank context 0 from 128 to 16 tokens and sink-window evicted block 7.
def test_context_length_never_shrinks_in_trace_replay():
    recs = [(0, 0, 0, 0, 0, 0.5), (0, 0, 0, 0, 7, 0.5)]
    recs += [(1, 0, 0, 0, b, 0.1) for b in range(1, 7)]
    recs += [(2, 0, 1, 0, 0, 1.0)]
    for pol in ("sink-window", "h2o"):
        _, vt = run(recs, pol, 32768, config={"recent_tokens": 32})
        if pol == "sink-window":
            assert victims(vt) == [(0, 1)], pol  # the oldest non-sink block, not the newest
        else:  # blocks 6 and 7 are in the window; 1…5 tie on accumulated weight 0.1
            assert victims(vt) == [(0, 1)], pol


# 2. Before: h2o had no pinned sink, and evicted block 0 (weight 0, outside the window).
def test_h2o_never_evicts_the_attention_sink():
    recs = [(0, 0, 0, 0, 0, 0.0)] + [(0, 0, 0, 0, b, 0.2) for b in range(1, 5)]
    recs += [(1, 0, 0, 0, 5, 1.0)]
    for pol in ("h2o", "sink-window"):
        r, vt = run(recs, pol, 20480, config={"recent_tokens": 16})
        assert (0, 0) not in victims(vt), pol
        assert victims(vt) == [(0, 1)], pol
        assert r["cache"]["pinned"] == 1


# 3. Before: a step that began by creating entries booked its reads under the previous step
# (step 0's under the last one), so --warmup excluded the wrong reads: 55 counted, not 40.
def test_warmup_excludes_exactly_the_first_steps():
    recs = [(s, 0, 0, 0, b, 0.1) for s in range(10) for b in range(s + 1)]
    for gran in ("layer", "step", "request"):
        r, _ = run(recs, "lru", 1 << 20, warmup_steps=5, granularity=gran)
        assert r["reads"] == sum(s + 1 for s in range(5, 10)) == 40, gran
        assert r["per_step"]["reads"] == [s + 1 for s in range(10)], gran
        assert r["steps"] == 5
    # Bytes moved after the warm-up: the host writes of steps 5…9 (one new block each).
    assert r["bytes_moved"] == {"host->hbm": 5 * ENTRY}


def test_warmup_on_a_workload_counts_the_last_step_only():
    from kvcxl.emu.shape import PRESETS
    from kvcxl.emu.workloads import make_workload
    from kvcxl.emu.workloads.stream import READ, compile_workload

    stream = compile_workload(make_workload("zipf-sessions", PRESETS["ci"], seed=0), 12)
    # Expected from the stream's events themselves: the read records of each step.
    sizes = np.diff(stream.ev_off)
    rd = stream.ev_kind == READ
    per_step = [int(sizes[rd & (stream.ev_step == s)].sum()) for s in np.unique(stream.ev_step[rd])]
    warm = simulate(stream, SimOptions(policy="lru", budget_bytes=stream.kv_bytes, warmup_steps=11))
    assert warm["per_step"]["reads"] == per_step
    assert warm["reads"] == per_step[-1]


# 4. Before: a trace's CREATE event for an entry first read in layer 1 split the step in two,
# so --granularity step served layer 0 and layer 1 as separate batches.
def test_granularity_step_is_one_batch_per_step():
    recs = [(0, 0, 1, 0, 0, 0.5), (1, 0, 0, 0, 5, 0.5), (1, 0, 1, 0, 6, 0.5),
            (1, 0, 1, 0, 0, 0.5), (2, 0, 0, 0, 7, 0.5)]  # fmt: skip
    _, vt = run(recs, "lru", 12288, granularity="step")
    assert victims(vt) == [(1, 0)]  # all three read in step 1's one batch: lowest id goes
    _, vt = run(recs, "lru", 12288, granularity="layer")
    assert victims(vt) == [(0, 5)]  # layer 0's batch of step 1 is older than layer 1's


# Before: the write creating (block 2) evicted it at once under LFU and h2o (count 0 / weight 0).
@pytest.mark.parametrize("policy", ["lru", "fifo", "lfu", "lrfu", "h2o", "sink-window", "ema"])
def test_a_write_never_evicts_the_entry_it_creates(policy):
    recs = [(0, 0, 0, 0, 0, 0.5), (0, 0, 0, 0, 1, 0.5), (1, 0, 0, 0, 2, 0.5)]
    r, vt = run(
        recs, policy, 8192, config={"recent_tokens": 0, "sink_tokens": 0, "anchor_zone_size": 0}
    )
    assert (0, 2) not in victims(vt)
    assert r["hits"] == 3  # every first read follows its write; nothing read was lost


def test_request_granularity_is_one_batch_per_read():
    recs = [(0, 0, 0, 0, b, 0.5) for b in range(4)] + [(1, 0, 0, 0, 0, 0.5)]
    r, vt = run(recs, "lru", 3 * ENTRY, granularity="request")
    # Reads 0,1,2 fit; creating 3 evicts the least recent (0); reading 0 again evicts 1.
    assert victims(vt) == [(0, 0), (0, 1)]
    assert r["reads"] == 5 and r["hits"] == 4


def test_granularity_is_validated():
    with pytest.raises(ValueError, match="granularity 'token'"):
        SimOptions(granularity="token")
