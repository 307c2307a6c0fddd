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
