"""The queue policies (ARC, CLOCK, S3-FIFO, SIEVE, SLRU) on the fast engine against the numpy
engine, which runs the firmware's own walks (firmware/policies/queued.py and one file each).

Every replay goes through both engines with the victims recorded, and the whole result
must be equal: hits, misses, bytes moved per tier pair and step, stall, cache statistics,
and the victims in order with their priorities (the closed forms of CLOCK, SIEVE and SLRU,
the walk ranks of ARC and S3-FIFO) — ``assert_same`` of tests/test_sim_fast.py.  The
sweep covers workloads and traces (entries written on first read), the three
granularities, budgets from capacity misses only to mostly hits, small CXL DRAM (spill),
metadata not persistent with pins asked for, and each policy's own parameters; a
capacity the firmware refuses (S3-FIFO's small queue under two entries) is refused alike.
The fast engine is also checked against the plain queues written from the docs
(tests/reference_queues.py), as tests/test_sim_differential.py checks the numpy engine.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_sim_fast import SHAPE, _both, _streams, assert_same

from kvcxl.emu.sim import fast
from kvcxl.emu.sim.simulator import GRANULARITIES, SimOptions, simulate
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import CapacityTooSmall

QUEUES = ("arc", "clock", "s3fifo", "sieve", "slru")
# Each policy's own parameters (firmware/policies/*.py `parameters`), defaults first.
PARAMS: dict[str, list[dict[str, Any]]] = {
    "arc": [{}],
    "clock": [{}, {"clock_bits": 2}, {"clock_bits": 8}],
    "s3fifo": [
        {},
        {"s3fifo_small_ratio": 0.3, "s3fifo_ghost_ratio": 0.0, "s3fifo_move_threshold": 1},
        {"s3fifo_small_ratio": 0.05, "s3fifo_ghost_ratio": 4.0, "s3fifo_move_threshold": 3},
        {"s3fifo_small_ratio": 0.5, "s3fifo_ghost_ratio": 0.25, "s3fifo_move_threshold": 16},
    ],
    "sieve": [{}],
    "slru": [{}, {"slru_segments": 1}, {"slru_segments": 3}, {"slru_segments": 8}],
}
# The engine's own settings the sweep varies (the fast engine's other rules are defaults).
SETTINGS: list[dict[str, Any]] = [
    {},
    {"persistent_metadata": False, "pinned_fraction": 0.5, "anchor_zone_size": 32},
    {"eviction_batch": 4},
]
BUDGETS = (0.05, 0.2, 0.35, 0.5, 0.7)  # of the stream's KV bytes


def _sweep_streams() -> dict[str, Any]:
    out = {
        "zipf-sessions": compile_workload(
            make_workload("zipf-sessions", SHAPE, seed=3), 30, read="topk:4"
        ),
        "cyclic": compile_workload(make_workload("cyclic", SHAPE, seed=3), 20, read="topk:4"),
        "shared-prefix": compile_workload(make_workload("shared-prefix", SHAPE, seed=3), 12),
    }
    streams = _streams()
    out["trace-v1"], out["trace-v2"] = streams["trace-v1"], streams["trace-v2"]
    return out


def _replay(stream: Any, policy: str, cfg: dict[str, Any], desc: str, **kw: Any) -> tuple[int, int]:
    """Both engines, compared; (victims, hits).  A capacity the firmware refuses must be
    refused by both, with the same message: (0, 0)."""
    config = PolicyConfig.from_mapping(cfg)
    try:
        a, b = _both(stream, policy=policy, config=config, **kw)
    except CapacityTooSmall as e:
        with pytest.raises(CapacityTooSmall) as again:
            simulate(stream, SimOptions(policy=policy, engine="fast", config=config, **kw))
        assert str(again.value) == str(e), desc
        return 0, 0
    victims = sum(v[0].size for v in a["_victims"])
    hits = a["hits"]
    assert_same(a, b, desc)
    return victims, hits


@pytest.mark.parametrize("policy", QUEUES)
def test_the_queue_policies_replay_on_the_fast_engine(policy: str) -> None:
    """At default settings every queue policy runs fast: no fallback, no notice."""
    stream = _streams()["workload"]
    opts = SimOptions(policy=policy, budget_bytes=stream.kv_bytes // 4)
    assert fast.unsupported(opts) is None
    assert (policy, "float") in fast.POLICY_CODES
    assert simulate(stream, opts)["engine"] == "fast"


@pytest.mark.parametrize("policy", QUEUES)
def test_workloads_and_traces_replay_identically(policy: str) -> None:
    k = 0
    victims = hits = 0
    for name, stream in _sweep_streams().items():
        kv = stream.kv_bytes
        for gran in GRANULARITIES:
            for _ in range(2):
                k += 1
                budget = BUDGETS[k % len(BUDGETS)]
                cfg = {**SETTINGS[k % len(SETTINGS)], **PARAMS[policy][k % len(PARAMS[policy])]}
                cxl = (None, kv // 20)[(k // 2) % 2]
                desc = f"{policy} {name} {gran} budget {budget} cxl {cxl} {cfg}"
                v, h = _replay(
                    stream, policy, cfg, desc, granularity=gran, budget_bytes=int(kv * budget),
                    cxl_bytes=cxl, warmup_steps=k % 3,
                )  # fmt: skip
                victims += v
                hits += h
    assert victims > 0 and hits > 0  # (the sweep evicts and hits: it compares walks)


@pytest.mark.parametrize("policy", QUEUES)
def test_every_parameter_replays_identically(policy: str) -> None:
    """Each of the policy's parameter sets at capacity-miss, middle and mostly-hit budgets."""
    stream = _sweep_streams()["zipf-sessions"]
    kv = stream.kv_bytes
    for params in PARAMS[policy]:
        for gran in ("layer", "step"):
            for budget in (0.05, 0.35, 0.7):
                desc = f"{policy} {params} {gran} budget {budget}"
                _replay(stream, policy, params, desc, granularity=gran,
                        budget_bytes=int(kv * budget))  # fmt: skip


@pytest.mark.parametrize("params", PARAMS["s3fifo"])
def test_a_capacity_too_small_is_refused_alike(params: dict[str, Any]) -> None:
    """S3-FIFO refuses a small queue of at most one entry (CapacityTooSmall, naming the
    values) on both engines, with the same message; one entry more replays identically."""
    stream = _sweep_streams()["zipf-sessions"]
    eb = stream.shape.entry_bytes
    ratio = params.get("s3fifo_small_ratio", 0.10)
    too_small = int(1 / ratio)  # capacity × ratio <= 1
    msgs = []
    for engine in ("numpy", "fast"):
        opts = SimOptions(policy="s3fifo", engine=engine, budget_bytes=too_small * eb,
                          config=PolicyConfig.from_mapping(params))  # fmt: skip
        with pytest.raises(CapacityTooSmall, match="s3fifo: the small queue holds") as e:
            simulate(stream, opts)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    for gran in GRANULARITIES:
        _replay(stream, "s3fifo", params, f"s3fifo {params} {gran} at {too_small + 1} entries",
                granularity=gran, budget_bytes=(too_small + 1) * eb)  # fmt: skip


@pytest.mark.parametrize("policy", QUEUES)
def test_the_fast_engine_matches_the_plain_reference(policy: str) -> None:
    """The fast engine against the second implementation written from the docs
    (tests/reference_queues.py through tests/reference_engine.py), as
    tests/test_sim_differential.py checks the numpy engine: victims step by step."""
    from test_sim_differential import QUEUE_WORKLOADS, WL_SHAPE, _stream, compare, ref

    for workload in QUEUE_WORKLOADS:
        stream = _stream(workload, "topk:2")
        eb = WL_SHAPE.entry_bytes
        for gran, share in (("layer", 0.3), ("step", 0.5), ("request", 0.3)):
            budget = max(int(stream.n_entries * share), 12)
            config = PolicyConfig.from_mapping({"pinned_fraction": 0.0})
            sim = simulate(
                stream,
                SimOptions(engine="fast", policy=policy, budget_bytes=budget * eb, config=config,
                           granularity=gran, record_victims=True),
            )  # fmt: skip
            assert sim["engine"] == "fast"
            want = ref.replay_stream(
                stream, policy=policy, budget_bytes=budget * eb, config=config, granularity=gran
            )
            desc = f"fast policy={policy} workload={workload} granularity={gran} budget={budget}"
            assert sum(len(v) for v in want["victims"].values()) > 0, desc
            compare(sim, stream, want, desc)
