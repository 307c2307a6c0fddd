"""The trace format: round trip, and every malformed file refused with its message."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.trace import COLUMNS, Trace, TraceError


def small_trace(**meta) -> Trace:
    return Trace(
        step=[0, 0, 1, 1, 2],
        context=[0, 0, 0, 1, 1],
        layer=[0, 1, 0, 3, 2],
        head=[0, 1, 1, 0, 1],
        block=[0, 5, 0, 2, 7],
        weight=[0.5, 0.25, 0.0, 1.0, 0.125],
        **meta,
    )


def test_round_trip(tmp_path):
    t = small_trace(evidence="Measured", source="unit test", extra={"prompt": 3})
    path = t.save(tmp_path / "t.npz")
    u = Trace.load(path)
    for c in COLUMNS:
        np.testing.assert_array_equal(getattr(u, c), getattr(t, c))
        assert getattr(u, c).dtype == COLUMNS[c][1]
    assert u.shape == t.shape == PRESETS["ci"]
    assert (u.evidence, u.source, u.extra, u.aggregation) == (
        "Measured",
        "unit test",
        {"prompt": 3},
        "max",
    )
    info = u.info()
    assert info["records"] == 5 and info["steps"] == 3 and info["contexts"] == 2
    assert info["distinct_entries"] == 5


def test_uncompressed_and_empty(tmp_path):
    t = Trace.empty(shape=PRESETS["s1"])
    u = Trace.load(t.save(tmp_path / "e.npz", compress=False))
    assert len(u) == 0 and u.shape == PRESETS["s1"]


def test_slice_steps():
    t = small_trace()
    assert len(t.slice_steps(1, 1)) == 2
    assert len(t.slice_steps(0, 2)) == 5


def _write(path, arrays: dict, meta: dict | None):
    if meta is not None:
        arrays = {**arrays, "meta": np.array(json.dumps(meta))}
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def _good_arrays():
    t = small_trace()
    return {c: getattr(t, c) for c in COLUMNS}, t.meta()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda a, m: a.pop("weight"), "missing array 'weight'"),
        (
            lambda a, m: a.__setitem__("step", a["step"].astype(np.float64)),
            "array 'step' has dtype float64",
        ),
        (
            lambda a, m: a.__setitem__("weight", a["weight"].astype(np.int32)),
            "array 'weight' has dtype int32",
        ),
        (
            lambda a, m: a.__setitem__("layer", np.array([0, -1, 0, 0, 0])),
            "negative layer id -1 at record 1",
        ),
        (
            lambda a, m: a.__setitem__("step", np.array([0, 2, 1, 3, 4])),
            "steps out of order: record 2 has step 1 after step 2",
        ),
        (
            lambda a, m: a.__setitem__("weight", np.array([0.1, np.nan, 0, 0, 0], np.float32)),
            "weight at record 1 is nan",
        ),
        (
            lambda a, m: a.__setitem__("weight", np.array([0.1, 0, -0.5, 0, 0], np.float32)),
            "negative weight -0.5 at record 2",
        ),
        (lambda a, m: m.__setitem__("version", 99), "unknown trace version 99"),
        (lambda a, m: m.__setitem__("evidence", "Guessed"), "evidence 'Guessed' is unknown"),
        (lambda a, m: m.__setitem__("format", "other"), "metadata 'format' is not 'kvcxl-trace'"),
        (
            lambda a, m: a.__setitem__("block", np.array([0, 1])),
            "array 'block' has 2 values, 'step' has 5",
        ),
        (
            lambda a, m: a.__setitem__("layer", np.array([0, 1, 0, 4, 0])),
            "layer id 4 at record 3 is out of range",
        ),
        (lambda a, m: m["shape"].__setitem__("layers", 0), "layers = 0 is out of range"),
    ],
)
def test_malformed_refused(tmp_path, mutate, message):
    arrays, meta = _good_arrays()
    mutate(arrays, meta)
    path = _write(tmp_path / "bad.npz", arrays, meta)
    with pytest.raises(TraceError, match=message.replace("(", r"\(")) as exc:
        Trace.load(path)
    assert str(path) in str(exc.value)


def test_missing_meta_and_not_npz(tmp_path):
    arrays, _ = _good_arrays()
    with pytest.raises(TraceError, match="missing array 'meta'"):
        Trace.load(_write(tmp_path / "nometa.npz", arrays, None))
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file at all")
    with pytest.raises(TraceError, match="not a kvcxl trace"):
        Trace.load(junk)
    with pytest.raises(FileNotFoundError):
        Trace.load(tmp_path / "absent.npz")


def test_in_memory_constructor_validates():
    with pytest.raises(TraceError, match="head id 2 at record 0 is out of range"):
        Trace(step=[0], context=[0], layer=[0], head=[2], block=[0], weight=[0.1])
    with pytest.raises(TraceError, match="aggregation 'median'"):
        small_trace(aggregation="median")


# --- version 2: writes, lengths, event order ------------------------------------------------
def small_v2(**kw) -> Trace:
    """Step 0 writes block 0 of context 0 in layers 0 and 1 (20 tokens) and reads layer 0;
    step 1 reads layer 1, writes one more token into the block (an existing entry: a length
    update), and reads block 3 of context 1 (never written: created on first read)."""
    return Trace(
        step=[0, 0, 0, 1, 1, 1],
        op=[1, 1, 0, 0, 1, 0],
        context=[0, 0, 0, 0, 0, 1],
        layer=[0, 1, 0, 1, 0, 0],
        head=[0, 0, 0, 0, 0, 1],
        block=[0, 0, 0, 0, 0, 3],
        weight=[0, 0, 0.5, 0.25, 0, 1.0],
        tokens=[20, 20, 0, 0, 21, 0],
        **kw,
    )


def test_v2_round_trip_and_versions(tmp_path):
    t = small_v2(prefixes=[(2, 0, 1)])
    assert t.version == 2 and small_trace().version == 1
    u = Trace.load(t.save(tmp_path / "t2.npz"))
    for c in ("op", "tokens", *COLUMNS):
        np.testing.assert_array_equal(getattr(u, c), getattr(t, c))
    assert u.op.dtype == np.int8 and u.tokens.dtype == np.int64
    assert u.prefixes == [(2, 0, 1)] and u.meta()["version"] == 2
    info = u.info()
    assert (info["records"], info["write_records"], info["read_bytes"]) == (
        3, 3, 3 * PRESETS["ci"].entry_bytes,
    )  # fmt: skip
    # A trace without op and prefixes is still written as version 1 (v1 readers read it).
    v1 = small_trace().save(tmp_path / "t1.npz")
    with np.load(v1) as z:
        assert json.loads(str(z["meta"][()]))["version"] == 1 and "op" not in z.files
    assert len(small_v2().slice_steps(1, 1).op) == 3


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"op": [0, 0, 2, 0, 0]}, "op 2 at record 2 is unknown: must be 0 (read) or 1 (write)"),
        ({"op": [0, 0, 0, 0, 0], "tokens": [0, 5, 0, 0, 0]},
         "tokens 5 at record 1 is on a read record: must be 0"),
        ({"op": [1, 0, 0, 0, 0]}, "weight 0.5 at record 0 is on a write record: must be 0"),
        ({"tokens": [0, 0, 0, 0, 0]}, "array 'tokens' without 'op'"),
        ({"op": [0, 0, 0, 0, -1]}, "negative op -1 at record 4"),
        ({"prefixes": [(1, 1, 2)]}, r"prefix \(1, 1, 2\): context and parent must be distinct"),
    ],
)  # fmt: skip
def test_v2_malformed_refused(kw, message):
    with pytest.raises(TraceError, match=message.replace("(read)", r"\(read\)").replace(
            "(write)", r"\(write\)")):  # fmt: skip
        small_trace(**kw)


def test_v2_columns_refused_in_a_version_1_file(tmp_path):
    arrays, meta = _good_arrays()
    arrays["op"] = np.zeros(5, np.int8)
    with pytest.raises(TraceError, match="array 'op' in a version 1 file"):
        Trace.load(_write(tmp_path / "bad.npz", arrays, meta))
    meta["version"] = 3
    with pytest.raises(TraceError, match=r"unknown trace version 3 \(this build reads versions 1"):
        Trace.load(_write(tmp_path / "v3.npz", arrays, meta))


def test_v2_events_writes_and_lazy_creation():
    from kvcxl.emu.workloads.stream import CREATE, READ, from_trace

    s = from_trace(small_v2())
    # Events in file order: write (2 entries), read l0, read l1, write (a length only),
    # a lazy CREATE for context 1's block 3 (never written), read l0.
    assert s.ev_kind.tolist() == [CREATE, READ, READ, CREATE, CREATE, READ]
    assert s.ev_layer.tolist() == [-1, 0, 1, -1, -1, 0]
    assert s.n_entries == 3 and s.ids.tolist() == [0, 1, 0, 1, 2, 2]
    lens = [
        list(zip(s.len_ctx[a:z].tolist(), s.len_tokens[a:z].tolist(), strict=True))
        for a, z in zip(s.len_off[:-1], s.len_off[1:], strict=True)
    ]
    assert lens == [[(0, 20)], [], [], [(0, 21)], [(1, 64)], []]  # lazy: (block + 1) × 16
    assert s.lazy_creates.tolist() == [False, False, False, False, True, False]
    assert not s.create_on_first_read
    # Tokens decoded: step 0 has no write after its first read, so the contexts it reads
    # count (v1's rule); step 1 counts context 0, which writes after reading (not context 1).
    assert s.ev_tokens[s.ev_kind == READ].tolist() == [1, 1, 0]
    # A version-1 trace keeps its reading: every CREATE is a lazy one.
    v1 = from_trace(small_trace())
    assert v1.create_on_first_read and v1.lazy_creates.tolist() == (v1.ev_kind == CREATE).tolist()


# --- a saved workload replays like the workload ----------------------------------------------
WL_SHAPE = PRESETS["ci"].with_(context_tokens=256)


def _replays(stream, trace_stream, options) -> None:
    from kvcxl.emu.sim.simulator import simulate

    for o in options:
        a, b = simulate(stream, o), simulate(trace_stream, o)
        va = [(i.tolist(), p.tolist(), st) for i, p, st in a.pop("_victims")]
        vb = [(i.tolist(), p.tolist(), st) for i, p, st in b.pop("_victims")]
        assert va == vb, (o.policy, o.granularity)
        assert a == b, (o.policy, o.granularity, [k for k in a if a[k] != b.get(k)])


@pytest.mark.parametrize(
    ("workload", "read"),
    [("zipf-sessions", "dense"), ("cyclic", "topk:2"), ("shared-prefix", "dense"),
     ("multi-turn", "threshold:0.2"), ("uniform", "dense")],
)  # fmt: skip
def test_exported_workload_replays_identically(tmp_path, workload, read):
    from kvcxl.cli.main import main
    from kvcxl.emu.sim.simulator import SimOptions
    from kvcxl.emu.workloads import compile_workload, make_workload
    from kvcxl.emu.workloads.stream import from_trace
    from kvcxl.firmware.policies import POLICIES

    path = tmp_path / "w.npz"
    assert main(["trace", "export", "--workload", workload, "--seed", "3", "--steps", "24",
                 "--context-tokens", "256", "--read", read, "-o", str(path)]) == 0  # fmt: skip
    stream = compile_workload(make_workload(workload, WL_SHAPE, seed=3), 24, read=read)
    trace = Trace.load(path)
    assert trace.version == 2 and trace.info()["write_records"] > 0
    again = from_trace(trace)
    for f in ("e_ctx", "e_layer", "e_head", "e_block", "ev_kind", "ev_step", "ev_layer",
              "ev_off", "ev_tokens", "ids", "w"):  # fmt: skip
        np.testing.assert_array_equal(getattr(again, f), getattr(stream, f), err_msg=f)
    for c, g in stream.grids.items():  # shared prefixes included (prefetch proposes them)
        np.testing.assert_array_equal(again.grids[c], g)
    budget = stream.kv_bytes // 5
    options = [
        SimOptions(policy=p, budget_bytes=budget, granularity=g, warmup_steps=3,
                   record_victims=True)
        for p in sorted(POLICIES) for g in ("layer", "step", "request")
    ] + [
        SimOptions(policy=p, budget_bytes=budget, prefetch=True, warmup_steps=3,
                   record_victims=True)
        for p in ("ema", "lru")
    ]  # fmt: skip
    _replays(stream, again, options)
    # The reads alone (version 1) replay differently: writes and exact lengths are lost.
    reads_only = tmp_path / "r.npz"
    assert main(["trace", "export", "--workload", workload, "--seed", "3", "--steps", "24",
                 "--context-tokens", "256", "--read", read, "--reads-only",
                 "-o", str(reads_only)]) == 0  # fmt: skip
    assert Trace.load(reads_only).version == 1


# --- entries no write record creates: written just before the batch that first reads them ----
TINY = __import__("kvcxl.emu.shape", fromlist=["ModelShape"]).ModelShape(
    name="tiny", layers=2, q_heads=4, kv_heads=2, d_head=64, dtype_bytes=2,
    block_tokens=16, context_tokens=1024,
)  # fmt: skip
R, W = 0, 1
# (step, op, context, layer, head, block, weight, tokens); steps that read never-written
# entries begin with a read, so moving their writes in front of a batch merges no writes.
MIXED = [
    (0, R, 0, 0, 0, 0, .5, 0), (0, R, 0, 0, 0, 1, .2, 0), (0, R, 0, 1, 0, 0, .5, 0),
    (0, W, 0, 0, 0, 2, 0, 40), (0, W, 0, 1, 0, 2, 0, 40),
    (1, R, 0, 0, 0, 0, .3, 0), (1, R, 1, 0, 0, 0, .6, 0), (1, R, 0, 0, 0, 2, .1, 0),
    (1, R, 1, 1, 0, 1, .4, 0), (1, R, 0, 1, 0, 2, .2, 0), (1, R, 1, 1, 1, 0, .2, 0),
    (1, W, 1, 0, 0, 2, 0, 45),
    (2, R, 1, 0, 0, 2, .5, 0), (2, R, 2, 0, 0, 0, .3, 0), (2, R, 0, 0, 0, 1, .3, 0),
    (2, R, 2, 0, 1, 0, .3, 0), (2, R, 2, 1, 0, 1, .5, 0), (2, R, 1, 1, 0, 1, .5, 0),
    (2, R, 0, 1, 0, 0, .5, 0),
    (3, W, 2, 0, 0, 3, 0, 60), (3, W, 0, 0, 0, 2, 0, 47),
    (3, R, 2, 0, 0, 3, .5, 0), (3, R, 0, 0, 0, 0, .5, 0), (3, R, 1, 0, 0, 0, .5, 0),
    (3, R, 2, 1, 0, 1, .5, 0),
]  # fmt: skip


def _v2(recs) -> Trace:
    c = list(zip(*recs, strict=True))
    return Trace(step=c[0], op=np.array(c[1]), context=c[2], layer=c[3], head=c[4], block=c[5],
                 weight=np.array(c[6], np.float32), tokens=np.array(c[7]), shape=TINY)  # fmt: skip


def _written_where_replayed(recs, granularity: str):
    """MIXED with an explicit write (tokens 0: blocks full) of every never-written entry
    where the replay creates it: before its layer's reads, its step's reads, or its read."""
    out: list = []
    written = {r[2:6] for r in recs if r[1] == W}
    for r in recs:
        if r[1] == R and r[2:6] not in written:
            pos = len(out)
            if granularity == "step":
                pos = next(k for k, x in enumerate([*out, r]) if x[0] == r[0] and x[1] == R)
            elif granularity == "layer":
                while pos and out[pos - 1][0] == r[0] and out[pos - 1][1] == R and (
                        out[pos - 1][3] == r[3]):  # fmt: skip
                    pos -= 1
            out.insert(pos, (r[0], W, *r[2:6], 0.0, 0))
            written.add(r[2:6])
        out.append(r)
    return out


@pytest.mark.parametrize("granularity", ["layer", "step", "request"])
def test_never_written_entries_are_created_on_first_read(granularity):
    from kvcxl.emu.sim.simulator import SimOptions, simulate
    from kvcxl.emu.workloads.stream import from_trace

    explicit = _written_where_replayed(MIXED, granularity)
    for policy in ("lru", "fifo", "lfu", "belady", "sink-window"):
        for cap in (3, 4, 5):
            o = SimOptions(policy=policy, budget_bytes=cap * TINY.entry_bytes,
                           granularity=granularity, record_victims=True)  # fmt: skip
            a, b = simulate(from_trace(_v2(MIXED)), o), simulate(from_trace(_v2(explicit)), o)
            va = [i for v, _, _ in a["_victims"] for i in v.tolist()]
            vb = [i for v, _, _ in b["_victims"] for i in v.tolist()]
            assert va == vb, (policy, cap)
            for k in ("hits", "misses", "reads", "bytes_moved"):
                assert a[k] == b[k], (policy, cap, k)
            assert a["per_step"]["hits"] == b["per_step"]["hits"]
