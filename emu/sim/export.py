"""Export a read stream as libCacheSim request traces: CSV and the oracleGeneral binary.

One request per entry read, in stream order; object id = the entry's dense id in order
of first appearance among the requests (0, 1, 2, … as objects are first requested:
entries a stream creates but never reads leave no holes), object size = entry bytes,
time = the request's index.  ``oracleGeneral`` records (little-endian ``<IQIq``:
uint32 time, uint64 object id, uint32 size, int64 next access) carry the 1-based
index of the object's next request (−1 for none): the next-access times libCacheSim's
Belady needs (its CSV reader does not compute them correctly; see
docs/trace-format.md).  Writes (a workload's prefills and new blocks) are not requests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ..workloads.stream import ReadStream

ORACLE_DTYPE = np.dtype([("time", "<u4"), ("obj", "<u8"), ("size", "<u4"), ("next", "<i8")])


def requests(stream: ReadStream) -> NDArray:
    """The stream's entry id of every read, in order (CREATE events are writes, not requests)."""
    rm = np.flatnonzero(stream.read_mask)
    if rm.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([stream.ids[stream.ev_off[i] : stream.ev_off[i + 1]] for i in rm])


def dense_ids(obj: NDArray) -> NDArray:
    """``obj`` relabelled 0, 1, 2, … in order of first appearance."""
    obj = np.asarray(obj, dtype=np.int64)
    if obj.size == 0:
        return obj.copy()
    srt = np.argsort(obj, kind="stable")
    s = obj[srt]
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] != s[:-1]
    first = srt[new]  # first request of each distinct object (a stable sort: the earliest)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    out = np.empty(obj.size, dtype=np.int64)
    out[srt] = rank[np.cumsum(new) - 1]
    return out


def object_ids(stream: ReadStream) -> NDArray:
    """The exported object id of every request: dense, in order of first appearance."""
    return dense_ids(requests(stream))


def next_access(obj: NDArray) -> NDArray:
    """For each request, the 1-based index of the same object's next request, or −1."""
    n = obj.size
    order = np.lexsort((np.arange(n), obj))
    nxt = np.full(n, -1, dtype=np.int64)
    same = obj[order[1:]] == obj[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same] + 1
    return nxt


def write_csv(stream: ReadStream, path: str | Path) -> int:
    """``time,obj_id,obj_size`` lines, no header; returns the request count."""
    obj = object_ids(stream)
    data = np.column_stack(
        [np.arange(obj.size, dtype=np.int64), obj, np.full(obj.size, stream.shape.entry_bytes)]
    )
    np.savetxt(path, data, fmt="%d", delimiter=",")
    return int(obj.size)


def write_oracle_general(stream: ReadStream, path: str | Path) -> int:
    """libCacheSim's oracleGeneral binary format; returns the request count."""
    obj = object_ids(stream)
    if obj.size >= 2**32:
        raise ValueError(f"{obj.size} requests do not fit oracleGeneral's 32-bit time field")
    rec = np.empty(obj.size, dtype=ORACLE_DTYPE)
    rec["time"] = np.arange(obj.size, dtype=np.uint32)
    rec["obj"] = obj
    rec["size"] = stream.shape.entry_bytes
    rec["next"] = next_access(obj)
    rec.tofile(path)
    return int(obj.size)
