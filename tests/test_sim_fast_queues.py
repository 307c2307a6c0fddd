"""The queue policies (ARC, CLOCK, S3-FIFO, SIEVE, SLRU, W-TinyLFU) on the fast engine against
the numpy engine, which runs the firmware's own walks (firmware/policies/queued.py and one
file each).

Every replay goes through both engines with the victims recorded, and the whole result
must be equal: hits, misses, bytes moved per tier pair and step, stall, cache statistics,
and the victims in order with their priorities (the closed forms of CLOCK, SIEVE and SLRU,
the walk ranks of ARC and S3-FIFO) — ``assert_same`` of tests/test_sim_fast.py.  The
sweep covers workloads and traces (entries written on first read), the three
granularities, budgets from capacity misses only to mostly hits, small CXL DRAM (spill),
metadata not persistent with pins asked for, and each policy's own parameters; a
capacity the firmware refuses (S3-FIFO's small queue under two entries) is refused alike.
W-TinyLFU's sweep covers each of its seven mains (the queue policies CLOCK, SIEVE, S3-FIFO
and ARC with their own parameters, played on layers of the main's state in the fast
engine) at every granularity and the engine's settings, sketches that collide and halve
(checked on the firmware's sketch as the sweep runs), and capacities of a few entries
(a main of none or a few entries; S3-FIFO's refused alike where its small queue would
hold one entry or less).
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
from kvcxl.firmware.policies.wtinylfu import MAINS

QUEUES = ("arc", "clock", "s3fifo", "sieve", "slru", "wtinylfu")
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
    "wtinylfu": [
        {},  # SLRU main, 1 % window, libCacheSim's sketch (10 hashes, 14.4 counters a main entry)
        {"wtinylfu_main": "lru", "wtinylfu_window": 0.2, "wtinylfu_sample": 2},
        # few counters (collisions), a halving every main-cache reuse, a wide window
        {
            "wtinylfu_main": "fifo",
            "wtinylfu_window": 0.3,
            "wtinylfu_sketch_width": 0.5,
            "wtinylfu_sketch_hashes": 2,
            "wtinylfu_sample": 1,
        },
        {
            "wtinylfu_window": 0.5,
            "wtinylfu_probation": 0.8,
            "wtinylfu_sketch_width": 0.25,
            "wtinylfu_sketch_hashes": 32,
            "wtinylfu_sample": 1,
        },
        {
            "wtinylfu_probation": 0.05,
            "wtinylfu_sketch_width": 2.0,
            "wtinylfu_sketch_hashes": 1,
            "wtinylfu_sample": 3,
        },
        # the queue policies as mains, with their own parameters
        {"wtinylfu_main": "clock", "wtinylfu_window": 0.1},
        {"wtinylfu_main": "clock", "clock_bits": 3, "wtinylfu_window": 0.3},
        {"wtinylfu_main": "sieve", "wtinylfu_window": 0.05, "wtinylfu_sample": 2},
        {"wtinylfu_main": "s3fifo", "wtinylfu_window": 0.1},
        {
            "wtinylfu_main": "s3fifo",
            "s3fifo_small_ratio": 0.3,
            "s3fifo_ghost_ratio": 0.25,
            "s3fifo_move_threshold": 1,
            "wtinylfu_window": 0.2,
        },
        {"wtinylfu_main": "arc", "wtinylfu_window": 0.1},
        {"wtinylfu_main": "arc", "wtinylfu_window": 0.02, "wtinylfu_sample": 1},
    ],
}
SKETCHES = PARAMS["wtinylfu"][2:5]  # W-TinyLFU's sketches that collide and halve
QUEUE_MAINS = ("clock", "sieve", "s3fifo", "arc")
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


def _sweep(policy: str, params: list[dict[str, Any]]) -> None:
    """Every stream and granularity, twice each, cycling budgets, the engine's settings,
    ``params``, small CXL DRAM and warm-up steps."""
    k = 0
    victims = hits = 0
    for name, stream in _sweep_streams().items():
        kv = stream.kv_bytes
        for gran in GRANULARITIES:
            for _ in range(2):
                k += 1
                budget = BUDGETS[k % len(BUDGETS)]
                cfg = {**SETTINGS[k % len(SETTINGS)], **params[k % len(params)]}
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
def test_workloads_and_traces_replay_identically(policy: str) -> None:
    _sweep(policy, PARAMS[policy])


@pytest.mark.parametrize("main", QUEUE_MAINS)
def test_wtinylfu_with_each_queue_main_replays_identically(main: str) -> None:
    """The sweep above for one queue-policy main: its parameter sets, then a sketch that
    collides and halves under it."""
    own = [p for p in PARAMS["wtinylfu"] if p.get("wtinylfu_main") == main]
    _sweep("wtinylfu", [*own, {**SKETCHES[0], "wtinylfu_main": main}])


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


@pytest.fixture
def sketch_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Each halving of a firmware sketch: (its counters, the ids it has hashed so far)."""
    from kvcxl.firmware.sketch import FrequencySketch

    seen: list[tuple[int, int]] = []
    halve = FrequencySketch.halve

    def counted(self: FrequencySketch) -> None:
        seen.append((self.n, len(self._idx)))
        halve(self)

    monkeypatch.setattr(FrequencySketch, "halve", counted)
    return seen


@pytest.mark.parametrize("main", MAINS)
def test_wtinylfu_sketches_that_halve_and_collide_replay_identically(
    main: str, sketch_events: list[tuple[int, int]]
) -> None:
    """Each main at budgets from capacity misses to mostly hits, both granularities that
    batch, with sketches narrower than the ids they hash (collisions: more ids than
    counters) and short reset periods (halvings) — both seen on the numpy engine's sketch."""
    streams = _sweep_streams()
    for name in ("zipf-sessions", "trace-v2"):
        stream = streams[name]
        kv = stream.kv_bytes
        for gran in ("layer", "step"):
            for budget in (0.05, 0.2, 0.5, 0.7):
                for params in SKETCHES:
                    cfg = {**params, "wtinylfu_main": main}
                    desc = f"wtinylfu {name} {gran} budget {budget} {cfg}"
                    _replay(stream, "wtinylfu", cfg, desc, granularity=gran,
                            budget_bytes=int(kv * budget))  # fmt: skip
    assert sketch_events, "no sketch halved"
    assert any(ids > counters for counters, ids in sketch_events), "no sketch collided"


@pytest.mark.parametrize("entries", [0, 1, 2, 3, 5, 12])
def test_wtinylfu_at_a_few_entries_replays_identically(entries: int) -> None:
    """A cache of a few entries: a window of one, a main cache of none or a few (a sketch
    of one counter, a reset period of 0 or a few reuses).  The firmware refuses none of
    these capacities but where S3-FIFO's small queue would hold one entry or less (a main
    of 2 to 10 entries at its 10 %): both engines replay each alike, or refuse it alike."""
    stream = _sweep_streams()["zipf-sessions"]
    eb = stream.shape.entry_bytes
    refused = 0
    for gran in GRANULARITIES:
        for main in MAINS:
            cfg = {"wtinylfu_main": main}
            desc = f"wtinylfu {main} {gran} at {entries} entries"
            got = _replay(stream, "wtinylfu", cfg, desc, granularity=gran,
                          budget_bytes=entries * eb)  # fmt: skip
            refused += got == (0, 0) and entries > 1
    assert refused == (len(GRANULARITIES) if 2 <= entries <= 11 else 0)


@pytest.mark.parametrize("main", MAINS)
def test_wtinylfu_with_a_narrow_sketch_matches_the_plain_reference(main: str) -> None:
    """The fast engine against tests/reference_queues.py (its own sketch: a list of
    counters over the byte form of XXH64) where the counters collide and halve, so the
    victims depend on which counters each id hashes to, not on its true counts only."""
    from test_sim_differential import _stream, compare, ref

    settings = {**PARAMS["wtinylfu"][2], "wtinylfu_main": main}
    stream = _stream("zipf-sessions", "topk:2")
    for gran, share in (("layer", 0.3), ("request", 0.3), ("step", 0.5)):
        budget = max(int(stream.n_entries * share), 12)
        eb = stream.shape.entry_bytes
        config = PolicyConfig.from_mapping({"pinned_fraction": 0.0, **settings})
        sim = simulate(
            stream,
            SimOptions(engine="fast", policy="wtinylfu", budget_bytes=budget * eb, config=config,
                       granularity=gran, record_victims=True),
        )  # fmt: skip
        assert sim["engine"] == "fast"
        want = ref.replay_stream(
            stream, policy="wtinylfu", budget_bytes=budget * eb, config=config, granularity=gran
        )
        desc = f"fast wtinylfu {settings} granularity={gran} budget={budget}"
        assert sum(len(v) for v in want["victims"].values()) > 0, desc
        compare(sim, stream, want, desc)
