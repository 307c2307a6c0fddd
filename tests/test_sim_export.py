"""The libCacheSim exports: dense object ids in first-request order, and our LRU replay and
libCacheSim's LRU agree on the exported trace."""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.export import (
    ORACLE_DTYPE,
    dense_ids,
    next_access,
    requests,
    write_csv,
    write_oracle_general,
)
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.replay import replay

lcs = pytest.importorskip("libcachesim")


def test_next_access():
    obj = np.array([5, 3, 5, 5, 3, 9])
    assert next_access(obj).tolist() == [3, 5, 4, -1, -1, -1]
    assert dense_ids(obj).tolist() == [0, 1, 0, 0, 1, 2]


def _first_appearances(obj: np.ndarray) -> np.ndarray:
    """Object ids in the order each is first requested."""
    _, first = np.unique(obj, return_index=True)
    return obj[np.sort(first)]


def test_exported_ids_are_dense_in_first_request_order(tmp_path):
    from kvcxl.cli.main import main

    # topk reads leave entries created but never read, and a workload's ids are in creation
    # order: its own ids have holes and are not in first-read order.
    shape = PRESETS["ci"].with_(context_tokens=256)
    stream = compile_workload(make_workload("zipf-sessions", shape, seed=2), 30, read="topk:2")
    own = requests(stream)
    assert np.unique(own).size < own.max() + 1
    assert np.any(np.diff(_first_appearances(own)) < 0)
    og, csv = tmp_path / "t.bin", tmp_path / "t.csv"
    args = ["trace", "export", "--workload", "zipf-sessions", "--seed", "2", "--steps", "30",
            "--context-tokens", "256", "--read", "topk:2"]  # fmt: skip
    assert main([*args, "--format", "oracle-general", "-o", str(og)]) == 0
    assert main([*args, "--format", "csv", "-o", str(csv)]) == 0
    rec = np.fromfile(og, dtype=ORACLE_DTYPE)
    lines = np.loadtxt(csv, delimiter=",", dtype=np.int64, ndmin=2)
    np.testing.assert_array_equal(lines[:, 1], rec["obj"])
    obj = rec["obj"].astype(np.int64)
    assert obj.size == own.size
    assert np.unique(obj).size == obj.max() + 1  # dense: 0 … distinct − 1
    np.testing.assert_array_equal(_first_appearances(obj), np.arange(obj.max() + 1))
    # The same request sequence, relabelled.
    np.testing.assert_array_equal(next_access(obj), next_access(own))
    np.testing.assert_array_equal(rec["next"], next_access(own))


@pytest.mark.parametrize("fmt", ["oracle-general", "csv"])
def test_lru_hits_equal_libcachesim(tmp_path, fmt):
    shape = PRESETS["ci"].with_(context_tokens=256)
    stream = compile_workload(make_workload("multi-turn", shape, seed=5), steps=30)
    obj = requests(stream)
    cap = stream.n_entries * 3 // 4
    path = tmp_path / "t"
    if fmt == "csv":
        write_csv(stream, path)
        params = lcs.ReaderInitParam()
        params.time_field, params.obj_id_field, params.obj_size_field = 1, 2, 3
        params.has_header, params.delimiter = False, ","
        reader = lcs.TraceReader(str(path), lcs.TraceType.CSV_TRACE, params)
    else:
        write_oracle_general(stream, path)
        reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    miss_ratio = lcs.LRU(cap * shape.entry_bytes).process_trace(reader)[0]
    theirs = round(obj.size * (1 - miss_ratio))
    ours = replay("lru", [obj[i : i + 1] for i in range(obj.size)], cap,
                  config=PolicyConfig(persistent_metadata=False), audit=False)  # fmt: skip
    assert 0 < ours.hits < obj.size
    assert ours.hits == theirs
