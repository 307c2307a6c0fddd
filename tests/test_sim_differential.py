"""Differential test: the simulator against tests/reference_engine.py, step by step.

The reference engine is a second implementation of docs/simulator.md ("Replay,
exactly") and docs/policy.md, written from the documentation alone.  Hypothesis
generates small traces (1–3 contexts, growing blocks with gaps, dense and sparse
reads, weights at and around the touch threshold, 2–12 steps) and random
configurations (every policy, EMA float and Q0.16, every granularity, persistent
metadata on and off, pinning, small CXL DRAM, warm-up); a second test replays
short real workload streams, and one more replays them through the queue policies
(CLOCK, SIEVE, S3-FIFO, SLRU, ARC; plain versions in tests/reference_queues.py).  Per
step the victim multiset, the reads, the hits and the bytes moved per tier pair must
agree, and so must the warm-up totals.

Readings the reference took where the documentation is silent or ambiguous are
marked ``READING:`` in tests/reference_engine.py.  Two disagreements with the
simulator it found (placement after a non-persistent policy forgot the score, and
duplicate records reordering a request batch) are fixed and kept as regression
tests (``KNOWN_*`` below steer the random cases if one ever needs pinning again).
A failure prints the first differing step, both victim sets and the case (records
and configuration), which hypothesis shrinks.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcxl.emu.shape import PRESETS, ModelShape
from kvcxl.emu.sim.fast import POLICY_CODES
from kvcxl.emu.sim.simulator import SimOptions, simulate, victims_table
from kvcxl.emu.trace import Trace
from kvcxl.emu.workloads import make_workload
from kvcxl.emu.workloads.stream import compile_workload, from_trace
from kvcxl.firmware.config import PolicyConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_engine as ref

SHAPE = ModelShape(
    name="tiny",
    layers=2,
    q_heads=4,
    kv_heads=2,
    d_head=64,
    dtype_bytes=2,
    block_tokens=16,
    context_tokens=1024,
)
EB = SHAPE.entry_bytes  # 4096
PAIRS = ref.PAIRS


# --- comparison ---------------------------------------------------------------------------
def _sim_victims(stream: Any, r: dict[str, Any]) -> dict[int, Counter]:
    vt = victims_table(stream, r["_victims"])
    out: dict[int, Counter] = {}
    for s, c, l, h, b in zip(
        vt["step"], vt["context"], vt["layer"], vt["head"], vt["block"], strict=True
    ):
        out.setdefault(int(s), Counter())[(int(c), int(l), int(h), int(b))] += 1
    return out


def _bytes(d: dict[str, Any]) -> dict[str, int]:
    return {k: int(d.get(k, 0)) for k in PAIRS}


def _fmt(c: Counter) -> str:
    return "{" + ", ".join(f"{k}" + (f"×{n}" if n > 1 else "") for k, n in sorted(c.items())) + "}"


def compare(sim: dict[str, Any], stream: Any, want: dict[str, Any], desc: str) -> None:
    """Assert step by step; the message names the first differing step."""
    got_v = _sim_victims(stream, sim)
    want_v = want["victims"]
    read_steps = want["read_steps"]
    ps = sim["per_step"]
    n_sim = len(ps["reads"])
    assert n_sim == len(read_steps), (
        f"{desc}\nread steps: simulator lists {n_sim}, reference {len(read_steps)} ({read_steps})"
    )
    steps = sorted(set(got_v) | set(want_v) | set(read_steps))
    index = {s: k for k, s in enumerate(read_steps)}
    for s in steps:
        gv, wv = got_v.get(s, Counter()), want_v.get(s, Counter())
        if gv != wv:
            raise AssertionError(
                f"{desc}\nstep {s}: victims differ\n  simulator: {_fmt(gv)}\n"
                f"  reference: {_fmt(wv)}\n  simulator only: {_fmt(gv - wv)}\n"
                f"  reference only: {_fmt(wv - gv)}"
            )
        k = index.get(s)
        if k is None:
            continue
        for key in ("reads", "hits"):
            g, w = int(ps[key][k]), want["per_step"][key][k]
            assert g == w, f"{desc}\nstep {s}: {key} simulator {g}, reference {w}"
        gb, wb = _bytes(ps["bytes_moved"][k]), want["per_step"]["bytes_moved"][k]
        assert gb == wb, f"{desc}\nstep {s}: bytes moved\n  simulator: {gb}\n  reference: {wb}"
    for key in ("reads", "hits"):
        assert int(sim[key]) == want[key], (
            f"{desc}\ntotal {key} after warm-up: simulator {sim[key]}, reference {want[key]}"
        )
    gb, wb = _bytes(sim["bytes_moved"]), want["bytes_moved"]
    assert gb == wb, (
        f"{desc}\ntotal bytes moved after warm-up\n  simulator: {gb}\n  reference: {wb}"
    )


EXAMPLES_PER_POLICY = 150  # x 10 policy variants; the file runs in about half a minute

# Disagreements found by this test, each reproduced by a strict xfail below; the random
# cases steer clear of them so that everything else stays compared.  When the simulator
# (or the docs) is fixed, drop the xfail and set the flag to False.
KNOWN_PLACEMENT_DIVERGENCE = False  # fixed: test_placement_uses_score_at_eviction
KNOWN_REQUEST_ORDER_DIVERGENCE = False  # fixed: test_request_order_ignores_duplicate_records


# --- random traces ------------------------------------------------------------------------
@dataclass
class Case:
    records: list[tuple[int, int, int, int, int, float]]
    policy: str
    mode: str
    granularity: str
    budget_bytes: int
    cxl_entries: int | None
    warmup: int
    cfg: dict[str, Any]

    def describe(self) -> str:
        cfg = ", ".join(f"{k}={v!r}" for k, v in self.cfg.items())
        return (
            f"policy={self.policy} mode={self.mode} granularity={self.granularity} "
            f"budget={self.budget_bytes} B ({self.budget_bytes // EB} entries) "
            f"cxl_entries={self.cxl_entries} warmup={self.warmup}\n"
            f"config: {cfg}\nrecords (step, context, layer, head, block, weight): "
            f"{self.records!r}"
        )


def _weights(thr: float) -> st.SearchStrategy[float]:
    near = [thr, thr * (1 - 1e-7), thr * (1 + 1e-7), thr - 4e-6, thr + 4e-6, thr - 1e-5]
    return st.one_of(
        st.just(0.0),
        st.sampled_from([max(x, 0.0) for x in near] + [0.009995, 0.5, 1.0]),
        st.floats(0.0, 1.0, width=32),
    )


@st.composite
def cases(draw: st.DrawFn, policy: str | None = None, mode: str | None = None) -> Case:
    thr = draw(st.sampled_from([0.0, 0.01, 0.05, 0.3]))
    weight = _weights(thr)
    n_steps = draw(st.integers(2, 12))
    step_no = draw(st.integers(0, 2))
    contexts = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True))
    start = {c: draw(st.integers(0, n_steps - 1)) for c in contexts}
    start[contexts[0]] = 0
    blocks = {c: list(range(draw(st.integers(1, 3)))) for c in contexts}
    records: list[tuple[int, int, int, int, int, float]] = []
    for k in range(n_steps):
        recs: list[tuple[int, int, int, int, int, float]] = []
        for c in contexts:
            if k < start[c]:
                continue
            if k > start[c]:
                grow = draw(st.sampled_from([0, 0, 1, 2]))  # 2: a block is skipped (a gap)
                if grow:
                    blocks[c].append(blocks[c][-1] + grow)
                if not draw(st.integers(0, 4)):
                    continue  # the context is idle this step
            dense = k == start[c] or draw(st.booleans())
            for layer in range(SHAPE.layers):
                for head in range(SHAPE.kv_heads):
                    if dense:
                        bs = list(blocks[c])
                    else:
                        bs = draw(st.lists(st.sampled_from(blocks[c]), max_size=len(blocks[c]) + 1))
                    for b in bs:
                        recs.append((step_no, c, layer, head, b, draw(weight)))
        # Within a step the record order is free.
        perm = draw(st.permutations(range(len(recs))))
        records += [recs[i] for i in perm]
        step_no += draw(st.sampled_from([1, 1, 1, 2, 5]))
    n_entries = len({r[1:5] for r in records})

    if policy is None:
        policy = draw(st.sampled_from(ref.POLICIES))
    if mode is None:
        mode = draw(st.sampled_from(["float", "int"])) if policy == "ema" else "float"
    granularity = draw(st.sampled_from(["layer", "step", "request"]))
    if granularity == "request" and KNOWN_REQUEST_ORDER_DIVERGENCE:
        # See test_request_order_with_duplicates: one record per entry and (step, layer).
        seen: set[tuple[int, int, int, int, int]] = set()
        records = [r for r in records if r[:5] not in seen and not seen.add(r[:5])]
    budget = draw(st.integers(1, n_entries + 2)) * EB + draw(st.sampled_from([0, 0, 1, EB - 1]))
    cxl = draw(st.one_of(st.none(), st.integers(0, 6)))
    warmup = draw(st.integers(0, n_steps))
    # 0.04 and 0.15 round down in Q0.16 (q16 compare and float compare can differ).
    evict_t = draw(st.sampled_from([0.02, 0.04, 0.05, 0.1, 0.15, 0.3]))
    cfg = {
        "alpha": draw(st.sampled_from([0.05, 0.2, 0.5, 0.3333, 1.0])),
        "beta": draw(st.sampled_from([0.0, 0.001, 0.1, 0.5, 1.0])),
        "touch_threshold": thr,
        "anchor_zone_size": draw(st.sampled_from([0, 16, 17, 32, 100])),
        "sink_tokens": draw(st.sampled_from([0, 4, 16, 17, 40])),
        "recent_tokens": draw(st.sampled_from([0, 1, 16, 32, 128])),
        "pinned_fraction": draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
        "persistent_metadata": draw(st.booleans()),
        "decay_shift": draw(st.sampled_from([0, 2, 4])),
        "lrfu_lambda": draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
        "seed": draw(st.sampled_from([0, 1, 12345])),
        "evict_threshold": evict_t,
        "keep_threshold": min(evict_t + draw(st.sampled_from([0.01, 0.2])), 1.0),
        "placement_mode": draw(st.sampled_from(["thresholds", "thresholds", "weighted"])),
    }
    if policy == "ema" and not cfg["persistent_metadata"] and KNOWN_PLACEMENT_DIVERGENCE:
        # See test_placement_uses_score_at_eviction: keep the rest of the case comparable.
        cfg["evict_threshold"] = 0.0
    return Case(records, policy, mode, granularity, budget, cxl, warmup, cfg)


def _run_sim(stream: Any, c: Case, config: PolicyConfig, engine: str = "numpy") -> dict[str, Any]:
    return simulate(
        stream,
        SimOptions(
            engine=engine,
            policy=c.policy,
            budget_bytes=c.budget_bytes,
            config=config,
            cxl_bytes=None if c.cxl_entries is None else c.cxl_entries * EB,
            warmup_steps=c.warmup,
            granularity=c.granularity,
            mode=c.mode,
            record_victims=True,
        ),
    )


def check_trace_lengths(stream: Any, desc: str) -> None:
    """The context lengths a trace's stream records (docs/simulator.md, "Context length").

    A trace's length is (highest block created so far + 1) × block_tokens and never
    shrinks: every length the stream sets must be that value at the event setting it.
    (The simulator recomputes a trace's lengths through a running maximum, so a wrong
    value here would not show in the replay; it would in any other stream consumer.)
    """
    bt = stream.shape.block_tokens
    top: dict[int, int] = {}
    for e in range(stream.n_events):
        if int(stream.ev_kind[e]) == ref.CREATE:
            for i in stream.ids[stream.ev_off[e] : stream.ev_off[e + 1]]:
                ctx, block = int(stream.e_ctx[i]), int(stream.e_block[i])
                top[ctx] = max(top.get(ctx, -1), block)
        a, z = int(stream.len_off[e]), int(stream.len_off[e + 1])
        for ctx, tok in zip(stream.len_ctx[a:z], stream.len_tokens[a:z], strict=True):
            want = (top.get(int(ctx), -1) + 1) * bt
            assert int(tok) == want, (
                f"{desc}\nevent {e} (step {int(stream.ev_step[e])}) sets context {int(ctx)}'s "
                f"length to {int(tok)} tokens; its highest block so far ends at {want}"
            )


def check_case(c: Case, engine: str = "numpy") -> None:
    config = PolicyConfig.from_mapping(c.cfg)
    cols = list(zip(*c.records, strict=True))
    trace = Trace(
        step=list(cols[0]),
        context=list(cols[1]),
        layer=list(cols[2]),
        head=list(cols[3]),
        block=list(cols[4]),
        weight=[float(w) for w in cols[5]],
        shape=SHAPE,
    )
    stream = from_trace(trace)
    check_trace_lengths(stream, c.describe())
    sim = _run_sim(stream, c, config, engine)
    want = ref.replay_trace(
        c.records,
        SHAPE,
        policy=c.policy,
        budget_bytes=c.budget_bytes,
        config=config,
        cxl_entries=c.cxl_entries,
        warmup_steps=c.warmup,
        granularity=c.granularity,
        mode=c.mode,
    )
    compare(sim, stream, want, c.describe())


TRACE_POLICIES = [(p, "float") for p in ref.POLICIES] + [("ema", "int")]
# Both engines: the numpy one for every policy, the fast one (kvcxl.emu.sim.fast) for those
# it covers.
ENGINE_RUNS = [(p, m, "numpy") for p, m in TRACE_POLICIES] + [
    (p, m, "fast") for p, m in TRACE_POLICIES if (p, m) in POLICY_CODES
]


@pytest.mark.parametrize(("policy", "mode", "engine"), ENGINE_RUNS)
def test_traces_match_reference(policy: str, mode: str, engine: str) -> None:
    @settings(
        max_examples=EXAMPLES_PER_POLICY,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(cases(policy, mode))
    def run(c: Case) -> None:
        check_case(c, engine)

    run()


# --- the known disagreements, minimal -------------------------------------------------------
def _sim_trace(
    records: list[tuple], policy: str, granularity: str, budget_entries: int, cfg: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    cols = list(zip(*records, strict=True))
    trace = Trace(
        step=list(cols[0]),
        context=list(cols[1]),
        layer=list(cols[2]),
        head=list(cols[3]),
        block=list(cols[4]),
        weight=list(cols[5]),
        shape=SHAPE,
    )
    stream = from_trace(trace)
    c = Case(list(records), policy, "float", granularity, budget_entries * EB, None, 0, cfg)
    return stream, _run_sim(stream, c, PolicyConfig.from_mapping(cfg))


# Found by this test: placement ran after a non-persistent policy forgot the victim's score,
# so every victim went to NVMe.  Placement now happens as the victim leaves.
def test_placement_uses_score_at_eviction() -> None:
    # Entry A is read with weight 0.5 at step 0 (score 0.2·0.5 = 0.1 ≥ evict_threshold
    # 0.02, = keep_threshold); at step 1 a new entry evicts it from a 1-entry HBM.
    # docs/simulator.md "Tiers": a victim goes to CXL DRAM unless its score is below
    # evict_threshold.  The simulator sends A to NVMe (with persistent metadata on: CXL).
    records = [(0, 0, 0, 0, 0, 0.5), (1, 0, 0, 0, 1, 0.5)]
    cfg = {"anchor_zone_size": 0, "persistent_metadata": False}
    check_case(Case(records, "ema", "float", "layer", EB, None, 0, cfg))


# Found by this test: merging a duplicate record sorted the batch by id, which reordered
# one-request-per-read replay.  The merged read now keeps its first record's place.
def test_request_order_ignores_duplicate_records() -> None:
    # docs/trace-format.md: records of the same entry in the same (step, layer) are one
    # read with the largest of their weights, so a duplicate with the same weight must
    # change nothing.  At step 1 the layer batch lists B (new) then A: with the
    # duplicate, the simulator serves A first (hit) and keeps both; without it, B is
    # written first and A is evicted, then missed.
    records = [(0, 0, 0, 0, 0, 0.0), (1, 0, 0, 0, 1, 0.0), (1, 0, 0, 0, 0, 0.0)]
    duplicated = [*records, (1, 0, 0, 0, 1, 0.0)]
    cfg = {"anchor_zone_size": 0, "pinned_fraction": 0.0}
    s1, r1 = _sim_trace(records, "lru", "request", 1, cfg)
    s2, r2 = _sim_trace(duplicated, "lru", "request", 1, cfg)
    assert r1["per_step"]["hits"] == r2["per_step"]["hits"]
    assert _sim_victims(s1, r1) == _sim_victims(s2, r2)


# --- real workload streams ----------------------------------------------------------------
WL_SHAPE = PRESETS["ci"].with_(context_tokens=256)
WL_STEPS = 10
WORKLOADS = ("zipf-sessions", "cyclic", "shared-prefix", "multi-turn", "uniform")
WL_POLICIES = [(p, "float") for p in ref.POLICIES] + [("ema", "int")]


@cache
def _stream(workload: str, read: str) -> Any:
    return compile_workload(make_workload(workload, WL_SHAPE, seed=3), WL_STEPS, read=read)


def _wl_runs(n: int) -> list[tuple[str, str, str, int, int | None, dict[str, Any]]]:
    """(policy, mode, granularity, budget entries, CXL entries, config) per run."""
    runs = []
    k = 0
    for gran in GRANULARITIES:
        for policy, mode in WL_POLICIES:
            k += 1
            persistent = k % 3 != 0
            cfg = {
                "persistent_metadata": persistent,
                "anchor_zone_size": (0, 16, 32)[k % 3],
                "sink_tokens": (16, 4, 0)[k % 3],
                "recent_tokens": (48, 16, 128)[k % 3],
                "pinned_fraction": (0.25, 0.1, 0.5)[k % 3],
                "alpha": (0.2, 0.05, 0.5)[k % 3],
                "beta": (0.05, 0.001, 0.3)[k % 3],
                "touch_threshold": (0.01, 0.05, 0.0)[k % 3],
                "lrfu_lambda": (0.1, 0.5, 1.0)[k % 3],
                "seed": k,
            }
            if policy == "ema" and not persistent and KNOWN_PLACEMENT_DIVERGENCE:
                cfg["evict_threshold"] = 0.0
            budget = max(int(n * (0.15, 0.3, 0.5)[k % 3]), 1)
            cxl = (None, max(n // 10, 1), 0)[k % 3]
            runs.append((policy, mode, gran, budget, cxl, cfg))
    return runs


GRANULARITIES = ref.GRANULARITIES


@pytest.mark.parametrize("engine", ["numpy", "fast"])
@pytest.mark.parametrize("read", ["dense", "topk:2"])
@pytest.mark.parametrize("workload", WORKLOADS)
def test_workloads_match_reference(workload: str, read: str, engine: str) -> None:
    stream = _stream(workload, read)
    eb = WL_SHAPE.entry_bytes
    for policy, mode, gran, budget, cxl, cfg in _wl_runs(stream.n_entries):
        if engine == "fast" and (policy, mode) not in POLICY_CODES:
            continue
        config = PolicyConfig.from_mapping(cfg)
        sim = simulate(
            stream,
            SimOptions(
                engine=engine,
                policy=policy,
                budget_bytes=budget * eb,
                config=config,
                cxl_bytes=None if cxl is None else cxl * eb,
                warmup_steps=2,
                granularity=gran,
                mode=mode,
                record_victims=True,
            ),
        )
        want = ref.replay_stream(
            stream,
            policy=policy,
            budget_bytes=budget * eb,
            config=config,
            cxl_entries=cxl,
            warmup_steps=2,
            granularity=gran,
            mode=mode,
        )
        desc = (
            f"engine={engine} workload={workload} read={read} steps={WL_STEPS} "
            f"entries={stream.n_entries} "
            f"policy={policy} mode={mode} granularity={gran} budget={budget} entries "
            f"cxl_entries={cxl} config={cfg}"
        )
        compare(sim, stream, want, desc)


# --- the queue policies (plain versions: tests/reference_queues.py) -------------------------
QUEUE_WORKLOADS = ("zipf-sessions", "multi-turn", "uniform")


@pytest.mark.parametrize("policy", ref.QUEUE_POLICIES)
def test_queue_policies_match_reference(policy: str) -> None:
    # Layer granularity (batches of many reads, arrivals placed after the walk, the
    # batch's entries protected) and request granularity, on short workload streams at
    # two budgets; victims compared step by step.
    for workload in QUEUE_WORKLOADS:
        stream = _stream(workload, "topk:2")
        eb = WL_SHAPE.entry_bytes
        for gran, share in (("layer", 0.3), ("layer", 0.5), ("request", 0.3)):
            budget = max(int(stream.n_entries * share), 12)
            config = PolicyConfig.from_mapping({"pinned_fraction": 0.0})
            sim = simulate(
                stream,
                SimOptions(
                    engine="numpy",
                    policy=policy,
                    budget_bytes=budget * eb,
                    config=config,
                    granularity=gran,
                    record_victims=True,
                ),
            )
            want = ref.replay_stream(
                stream, policy=policy, budget_bytes=budget * eb, config=config, granularity=gran
            )
            desc = f"policy={policy} workload={workload} granularity={gran} budget={budget}"
            assert sum(len(v) for v in want["victims"].values()) > 0, desc
            compare(sim, stream, want, desc)
