"""The libCacheSim exports: our LRU replay and libCacheSim's LRU agree on the exported trace."""

from __future__ import annotations

import numpy as np
import pytest
from kvcxl.emu.export import next_access, requests, write_csv, write_oracle_general
from kvcxl.emu.shape import PRESETS
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.replay import replay

lcs = pytest.importorskip("libcachesim")


def test_next_access():
    obj = np.array([5, 3, 5, 5, 3, 9])
    assert next_access(obj).tolist() == [3, 5, 4, -1, -1, -1]


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
