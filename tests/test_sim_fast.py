"""The fast replay engine (kvcxl.emu.sim.fast) against the numpy engine and the firmware.

* Formulas: each line the compiled loop holds of ``firmware/formulas.py`` and
  ``firmware/fixedpoint.py`` is compared bit for bit with the firmware's own function —
  exhaustively over every Q0.16 score and decay-table index (integer mode), and over
  millions of random floats with the α, β of the differential test (float mode).
* The plan: the flattened batches equal ``plan_batches``' (reads, steps, tokens, order).
* Replays: every workload of the catalog, a version-1 trace (entries written on first
  read) and a version-2 trace, through both engines, under every policy and mode the
  fast engine covers, every granularity, with and without persistent metadata, small
  CXL DRAM (spill): the whole result dict must be equal (hits, misses, bytes moved per
  tier pair and per step, stall, cache statistics) and so must the victims, in order,
  with their priorities.  The same for the real model's capture (slow, model).
* Selection: an uncovered run falls back to numpy with one notice, or is refused with
  ``engine="fast"``.

tests/test_sim_differential.py replays its random traces through both engines too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numba import njit

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim import fast
from kvcxl.emu.sim.fast import kernel as K
from kvcxl.emu.sim.fast.policies import ema as EMA
from kvcxl.emu.sim.fast.policies import ema_int as EMA_INT
from kvcxl.emu.sim.fast.policies import lrfu as LRFU
from kvcxl.emu.sim.fast.policies import random as RANDOM
from kvcxl.emu.sim.simulator import GRANULARITIES, SimOptions, plan_batches, simulate
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.emu.workloads.catalog import WORKLOADS
from kvcxl.emu.workloads.stream import from_trace
from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import ema_update, eviction_priority, recency_decay

COVERED = sorted(fast.POLICY_CODES)
ALPHAS = (0.05, 0.2, 0.5, 0.3333, 1.0, 0.013)
BETAS = (0.0, 0.001, 0.1, 0.5, 1.0)


# --- the formulas, bit for bit ----------------------------------------------------------
@njit
def _ema_float_all(s, w, alpha):  # type: ignore[no-untyped-def]
    out = np.empty_like(s)
    for i in range(s.size):
        out[i] = EMA.ema_float(s[i], w[i], alpha)
    return out


@njit
def _ema_q16_all(s, w, alpha_q):  # type: ignore[no-untyped-def]
    out = np.empty(s.size, np.int64)
    for i in range(s.size):
        out[i] = EMA_INT.ema_q16(s[i], w[i], alpha_q)
    return out


@njit
def _priority_float_all(s, idle, table):  # type: ignore[no-untyped-def]
    out = np.empty(s.size, np.float64)
    for i in range(s.size):
        out[i] = EMA.priority_float(s[i], table[idle[i]])
    return out


@njit
def _priority_q16_all(s, idle, table, shift):  # type: ignore[no-untyped-def]
    out = np.empty(s.size, np.int64)
    for i in range(s.size):
        out[i] = EMA_INT.priority_q16(s[i], idle[i], table, shift)
    return out


@pytest.mark.parametrize("alpha", ALPHAS)
def test_ema_float_is_the_firmwares(alpha: float) -> None:
    rng = np.random.default_rng(1)
    s = np.concatenate([rng.random(1_000_000), rng.random(100) * 1e-300, [0.0, 1.0]])
    w = np.concatenate([rng.random(1_000_000).astype(np.float32).astype(np.float64), np.zeros(102)])
    got = _ema_float_all(s, w, alpha)
    # EmaPolicy.end_step updates in place (s *= 1 − α; s += α·w); formulas.ema_update is
    # α·w + (1 − α)·s: the same two products and one sum.
    inplace = s.copy()
    inplace *= 1.0 - alpha
    inplace += alpha * w
    assert np.array_equal(got.view(np.int64), inplace.view(np.int64))
    assert np.array_equal(got.view(np.int64), np.asarray(ema_update(s, w, alpha)).view(np.int64))


@pytest.mark.parametrize("beta", BETAS)
def test_priority_float_is_the_firmwares(beta: float) -> None:
    rng = np.random.default_rng(2)
    n = 1_000_000
    s = np.concatenate([rng.random(n), [0.0, 1.0, 1.0 + 2**-52]])
    idle = np.concatenate([rng.integers(0, 5000, n), [0, 1, 4999]]).astype(np.int64)
    # the table the engine is handed: the firmware's recency_decay of every idle count
    table = np.asarray(recency_decay(np.arange(5000, dtype=np.int64), beta))
    got = _priority_float_all(s, idle, table)
    want = np.asarray(eviction_priority(s, idle, beta))
    assert np.array_equal(got.view(np.int64), want.view(np.int64))
    # and element by element (the firmware's small-array path), on a slice
    small = np.asarray(eviction_priority(s[:1000], idle[:1000], beta))
    assert np.array_equal(got[:1000].view(np.int64), small.view(np.int64))


@pytest.mark.parametrize("alpha", ALPHAS)
def test_ema_q16_is_the_firmwares(alpha: float) -> None:
    aq = fx.alpha_to_q16(alpha)
    score = np.arange(65536, dtype=np.int64)
    # every score against every 64th weight and the extremes, then 4 M random pairs
    for w in [*range(0, 65536, 64), 1, 32767, 32768, 65534, 65535]:
        wv = np.full(65536, w, np.int64)
        want = np.asarray(fx.ema_update_q16(score.astype(np.uint32), wv.astype(np.uint32), aq))
        assert np.array_equal(_ema_q16_all(score, wv, aq), want.astype(np.int64)), w
    rng = np.random.default_rng(3)
    s, w = rng.integers(0, 65536, (2, 4_000_000))
    want = np.asarray(fx.ema_update_q16(s.astype(np.uint32), w.astype(np.uint32), aq))
    assert np.array_equal(_ema_q16_all(s, w, aq), want.astype(np.int64))


@pytest.mark.parametrize("shift", [0, 2, 4, 8])
@pytest.mark.parametrize("beta", [0.001, 0.1, 1.0])
def test_priority_q16_is_the_firmwares(beta: float, shift: int) -> None:
    table = fx.decay_table(beta, shift)
    score = np.tile(np.arange(65536, dtype=np.int64), 1)
    # every score at every table index (the idle counts that start each bin, and past the
    # table and the 16-bit saturation)
    idles = sorted({min(i << shift, 1 << 20) for i in range(257)} | {65535, 65536, 1 << 20})
    for i in idles:
        idle = np.full(65536, i, np.int64)
        want = np.asarray(
            fx.eviction_priority_q16(score.astype(np.uint32), np.minimum(idle, 65535), table, shift)
        )
        assert np.array_equal(_priority_q16_all(score, idle, table, shift), want), i


@njit
def _logaddexp2_all(x):  # type: ignore[no-untyped-def]
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = LRFU.logaddexp2(x[i], 0.0)
    return out


def test_logaddexp2_is_numpys() -> None:
    """LRFU's update (firmware/policies/lrfu.py: np.logaddexp2(decayed, 0.0))."""
    rng = np.random.default_rng(4)
    for scale in (1e-3, 1.0, 10.0, 100.0):
        x = np.concatenate([rng.normal(0, scale, 2_000_000), [-np.inf, 0.0, 1.0, -1.0, 1e300]])
        want = np.logaddexp2(x, 0.0)
        assert np.array_equal(_logaddexp2_all(x).view(np.int64), want.view(np.int64)), scale


@njit
def _random_all(seed, time, ids):  # type: ignore[no-untyped-def]
    out = np.empty(ids.size, np.int64)
    base = RANDOM.random_base(np.uint64(seed), time)
    for i in range(ids.size):
        out[i] = RANDOM.random_priority(base, ids[i])
    return out


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**63 - 1])
def test_random_priority_is_the_firmwares(seed: int) -> None:
    from kvcxl.firmware.policies import make_policy
    from kvcxl.firmware.policies.base import Tick
    from kvcxl.firmware.table import EntryTable

    policy = make_policy("random", PolicyConfig.from_mapping({"seed": seed}), EntryTable())
    ids = np.concatenate([np.arange(100_000), [2**40, 2**62]]).astype(np.int64)
    for time in (0, 1, 7, 10**6, 2**40):
        want = policy.priority(ids, Tick(0, time))
        assert np.array_equal(_random_all(seed, time, ids), want), time


# --- the victim selection against the firmware's ----------------------------------------
@pytest.mark.parametrize("distinct", [1, 3, 50, 5000, 1 << 40])
@pytest.mark.parametrize("m", [1, 10, 3000, 20000])
def test_select_is_the_firmwares(m: int, distinct: int) -> None:
    """kernel._select (counting, partition, tie walk and tie sort) against
    firmware.select.select_victims on the same priorities (key = −priority): the same set
    (a dump orders it afterwards; the replays below compare the order)."""
    from kvcxl.firmware.select import select_victims

    rng = np.random.default_rng(m * 7 + distinct % 97)
    ids = rng.permutation(3 * m)[:m].astype(np.int64)  # unordered, as the resident list
    keys = rng.integers(-(distinct // 2), distinct - distinct // 2, m).astype(np.int64)
    for k in sorted({1, 2, m // 3, m // 2, m - 1, m} - {0}):
        out = np.empty(m, np.int64)  # (keys and ids are scratch to it: copies)
        n = K._select(keys.copy(), ids.copy(), m, k, keys.min(), keys.max(), out)
        want = select_victims(ids, -keys, k, ordered=False)
        assert np.array_equal(np.sort(out[:n]), np.sort(want)), (m, distinct, k)


@pytest.mark.parametrize("kind", ["full", "clumps", "priorities"])
@pytest.mark.parametrize("m", [K.RADIX_MIN, 30000])
def test_radix_select_is_the_firmwares(m: int, kind: str) -> None:
    """kernel._select's radix rounds (wide keys, ``m >= RADIX_MIN``) against a sort of the
    pairs, key ascending then the lower id (the victim order; as int64 keys, which float
    priorities would round): keys over the whole int64 range (offsets from kmin past
    2^63), a wide span whose keys crowd into a few values (a bucket that is one key after
    every round: ties by id), and the keys of float priorities in [0, 1] (what the EMA's
    scans select)."""
    from kvcxl.emu.sim.fast.kernel import float_key

    rng = np.random.default_rng(m + len(kind))
    ids = rng.permutation(3 * m)[:m].astype(np.int64)
    if kind == "full":
        keys = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, m, dtype=np.int64)
        keys[:2] = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    elif kind == "clumps":
        keys = rng.choice(np.array([-(1 << 50), 7, 8, 1 << 40], np.int64), m)
    else:
        pr = np.round(rng.random(m), 3)  # (ties among equal priorities)
        keys = np.array([float_key(-p) for p in pr], np.int64)
    for k in sorted({1, 2, 255, m // 3, m // 2, m - 1}):
        out = np.empty(m, np.int64)
        n = K._select(keys.copy(), ids.copy(), m, k, keys.min(), keys.max(), out)
        want = ids[np.lexsort((ids, keys))[:k]]  # key ascending, then the lower id
        assert np.array_equal(np.sort(out[:n]), np.sort(want)), (m, kind, k)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_sort_ids_sorts_the_range_only(dtype: type) -> None:
    """kernel.sort_ids (a call's admissions, or a queue's split run, put in ascending
    order) against np.sort of the range, the ids outside it untouched: few ids (ascending,
    shuffled, one out of place at either end, repeated) over every range, and many (the
    bitmap's: distinct and close, shuffled or with one out of place, or each its word's top
    bit; repeated; spread wider than the bitmap takes)."""
    rng = np.random.default_rng(5)
    up = np.arange(40, dtype=dtype)
    few = {
        "ascending": up, "shuffled": rng.permutation(up), "last low": np.r_[up[1:], up[:1]],
        "first high": np.r_[up[-1:], up[:-1]], "repeats": rng.integers(0, 6, 40).astype(dtype),
    }  # fmt: skip
    for name, ids in few.items():
        for lo, hi in ((0, 0), (0, 1), (0, 2), (0, 17), (0, 40), (3, 3), (5, 30), (39, 40)):
            got = ids.copy()
            K.sort_ids(got, lo, hi)
            want = np.r_[ids[:lo], np.sort(ids[lo:hi]), ids[hi:]]
            assert np.array_equal(got, want), (name, lo, hi)
    m = 3 * K.BITMAP_MIN
    close = (rng.permutation(4 * m)[:m] + 777).astype(dtype)  # (a span of 4 m from 777)
    near = np.sort(close)
    near[[10, m - 10]] = near[[m - 10, 10]]
    wide = rng.permutation(m).astype(dtype) * (K.BITMAP_SPAN + 1)  # (span > BITMAP_SPAN m)
    up_m = np.arange(m - 1, dtype=dtype)  # (with 777: every other id a word's top bit)
    many = {
        "close": close, "one swap": near, "repeats": rng.integers(0, m, m).astype(dtype),
        "wide": wide, "top bits": rng.permutation(np.r_[777, 777 + 64 * up_m + 63]),
    }  # fmt: skip
    for name, ids in many.items():
        outer = rng.integers(0, 9, 2 * m + 20).astype(dtype)
        got = outer.copy()
        got[11 : 11 + m] = ids
        K.sort_ids(got, 11, 11 + m)
        assert np.array_equal(got[11 : 11 + m], np.sort(ids)), name
        assert np.array_equal(got[:11], outer[:11]), name
        assert np.array_equal(got[11 + m :], outer[11 + m :]), name


@pytest.mark.parametrize("kind", ["spread", "ties", "far"])
def test_listed_key_buckets_keep_the_key_then_id_order(kind: str) -> None:
    """loop._buckets and _bucket (the buckets a managed pass counts the listed keys in)
    against the (key, id) order they must keep: the pairs sorted by key, then id, get
    buckets that never decrease, all in range, and no bucket holds more than a 64th of
    the keys: keys over a wide span; keys nearly all tied (a prompt's fresh entries: then
    by id); and a few keys far from the rest (the EMA's outliers, which must not crowd
    the rest into one bucket)."""
    from kvcxl.emu.sim.fast import loop as L

    rng = np.random.default_rng(len(kind))
    m = 20000
    ids = rng.permutation(4 * m)[:m].astype(np.int64)
    if kind == "spread":
        keys = rng.integers(-(10**12), 10**12, m, dtype=np.int64)
    elif kind == "ties":
        keys = np.zeros(m, np.int64)
        keys[:40] = rng.integers(-5, 6, 40)
    else:
        keys = rng.integers(0, 10**9, m, dtype=np.int64)
        keys[:20] = rng.choice(np.array([-(1 << 62), 1 << 62], np.int64), 20)
    base, sh = L._buckets(keys, m, 4 * m)
    pairs = zip(keys.tolist(), ids.tolist(), strict=True)
    got = np.array([L._bucket(k, e, base, sh) for k, e in pairs])
    assert got.min() >= 0 and got.max() < L.N_BUCKETS, (kind, got.min(), got.max())
    order = np.lexsort((ids, keys))
    assert np.all(np.diff(got[order]) >= 0), kind
    assert np.bincount(got).max() <= m // 64, (kind, np.bincount(got).max())


def test_a_crowded_bucket_set_again_keeps_the_order_and_the_counts() -> None:
    """loop._count_listed, _bucket_sample and _buckets_of (a managed pass setting its
    buckets again over a crowded one) against a plain count and order.  The keys are of the
    EMA's kind: the order of ``-p`` for priorities ``p`` of which most sit in one binade and
    the rest decay over many (an equal-width bucket over float keys is a ratio of ``p``, so
    most keys crowd into one bucket: the case must happen).  The counts must equal a plain
    count of every listed entry's bucket, the call's own (``OWN``) and ``FRESH`` ones left
    out; the sample must be the crowded bucket's keys, sorted; the new buckets must keep
    the (key, id) order, and spread the crowded bucket's keys (no new bucket over a 64th
    of them)."""
    from kvcxl.emu.sim.fast import loop as L
    from kvcxl.emu.sim.fast import tiers as T

    rng = np.random.default_rng(7)
    m, n_desc = 60000, 240000
    ids = rng.permutation(n_desc)[:m].astype(np.int64)
    p = np.where(rng.random(m) < 0.85, rng.uniform(0.55, 0.6, m),
                 0.6 * 0.97 ** rng.integers(1, 20000, m))  # fmt: skip
    keys = -p.view(np.int64)  # (positive floats' bits keep their order: -bits orders as -p)
    llay = rng.integers(0, 3, m).astype(np.uint8)
    llay[rng.random(m) < 0.02] |= L.OWN
    llay[rng.random(m) < 0.02] = L.FRESH
    pairs = list(zip(keys.tolist(), ids.tolist(), strict=True))
    base, sh = L._buckets(keys, m, n_desc)
    bk = np.array([L._bucket(k, e, base, sh) for k, e in pairs])
    counted = llay < T.LAYERS
    lhist = np.zeros((T.LAYERS, L.N_BUCKETS), np.int64)
    L._count_listed(lhist, llay, keys, ids, m, base, sh)
    want = np.zeros_like(lhist)
    np.add.at(want, (llay[counted].astype(np.int64), bk[counted]), 1)
    assert np.array_equal(lhist, want)
    g, b = np.unravel_index(int(lhist.argmax()), lhist.shape)
    crowd = int(lhist[g, b])
    assert crowd > m // 4, crowd  # (crowded)
    sample = L._bucket_sample(llay, keys, ids, m, g, b, base, sh, crowd)
    members = keys[(llay == g) & (bk == b)]
    assert np.all(np.diff(sample) >= 0) and np.isin(sample, members).all()
    assert L.SAMPLE // 2 <= sample.size <= 2 * L.SAMPLE, sample.size
    base2, sh2 = L._buckets_of(sample, n_desc)
    bk2 = np.array([L._bucket(k, e, base2, sh2) for k, e in pairs])
    order = np.lexsort((ids, keys))
    assert np.all(np.diff(bk2[order]) >= 0)
    assert np.bincount(bk2[(llay == g) & (bk == b)]).max() <= crowd // 64


@pytest.mark.parametrize("seed", range(6))
def test_lru_queue_takes_the_smallest_key_then_id(seed: int) -> None:
    """The LRU/FIFO queue (kernel._enqueue, _take, _compact) against a plain reference:
    every take's victims are the k smallest (key, id) among the resident, unpinned and
    unprotected entries, each by its newest key, as sorting them says (the queue itself
    knows only versions: pinned entries are never queued, and only takes evict).  Touches join
    the tail one by one, never below the queued keys (equal batch times included, an entry
    touched again in its own batch), not in id order; takes of every size, protected
    entries staying queued, the boundary run split by id; compactions when full.  A split
    run stays sorted by id with its span kept (``run``), and the takes that reach it again
    read only what they take: prompts written at one batch time make such runs here, and
    the takes that used a kept span are counted (the case must happen)."""
    rng = np.random.default_rng(seed)
    n = 400
    cap = 2 * n + 64
    hk, hi, hv = (np.zeros(cap, np.int64) for _ in range(3))
    ver = np.zeros(n, np.int64)
    resident = np.zeros(n, np.bool_)
    pinned = rng.random(n) < 0.05
    stamp = np.zeros(n, np.int64)
    key_now = np.full(n, -1, np.int64)  # each queued entry's newest key
    head, size, t = 0, 0, 0
    out = np.empty(n, np.int64)
    run = np.zeros(2, np.int64)  # the sorted boundary run's span (kernel._take's)
    compactions = splits = spans = 0
    for call in range(1, 300):
        t += int(rng.integers(0, 2))  # equal batch times happen (a write after its read)
        # repeats: touched twice in a batch; now and then a prompt (a long run of one key)
        size_b = int(rng.integers(150, 300)) if call % 40 == 1 else int(rng.integers(1, 60))
        batch = rng.choice(n, size_b)
        for e in batch.tolist():
            resident[e] = True
            if pinned[e]:
                continue  # (the loop queues no pinned entry)
            if size == cap:
                size = K._compact(hk, hi, hv, head, size, ver)
                head = 0
                run[:] = 0
                compactions += 1
            size = K._enqueue(hk, hi, hv, size, t, e, ver)
            key_now[e] = t
        protect = bool(rng.random() < 0.7)
        stamp[batch[: batch.size // 2]] = call  # the call's own entries
        k = int(rng.integers(1, 80))
        eligible = sorted(
            (e for e in range(n) if resident[e] and not pinned[e]
             and not (protect and stamp[e] == call)),
            key=lambda e: (key_now[e], e),
        )  # fmt: skip
        want = eligible[:k]
        if k < len(eligible) and key_now[eligible[k - 1]] == key_now[eligible[k]]:
            splits += 1  # (the take ends inside a run of equal keys)
        nv, head = K._take((hk, hi, hv, ver), head, size, k, stamp, call, protect, out, run)
        assert sorted(out[:nv].tolist()) == sorted(want), (seed, call)
        if run[1] > run[0]:  # the kept span is one whole run of one key, sorted by id
            a, z = int(run[0]), int(run[1])
            assert head <= a and z < size and (hk[a:z] == hk[a]).all(), (seed, call)
            assert (a == head or hk[a - 1] < hk[a]) and hk[z] > hk[a], (seed, call)
            assert (np.diff(hi[a:z]) > 0).all(), (seed, call)
            spans += 1
        resident[out[:nv]] = False  # the victims leave
        assert all(hk[j] <= hk[j + 1] for j in range(head, size - 1))  # key order kept
    assert compactions and splits and spans  # (the cases the test is for happened)


# --- the plan ---------------------------------------------------------------------------
SHAPE = PRESETS["ci"].with_(context_tokens=256)


def _streams() -> dict[str, Any]:
    wl = compile_workload(make_workload("multi-turn", SHAPE, seed=1), 8, read="topk:2")
    return {
        "workload": wl,
        "trace-v1": from_trace(wl.to_trace(writes=False)),
        "trace-v2": from_trace(wl.to_trace(writes=True)),
    }


def _lens(plan: dict[str, Any], k: int) -> tuple[list[int], list[int]]:
    a, z = int(plan["loff"][k]), int(plan["loff"][k + 1])
    return plan["l_ctx"][a:z].tolist(), plan["l_tok"][a:z].tolist()


def _expand(plan: dict[str, Any]) -> list[tuple[Any, ...]]:
    """A request plan's layers as the loop serves them: each read on its own, the layer's
    tokens and context lengths on its first, a layer without reads none."""
    out = []
    for k in range(plan["read"].size):
        a, z = int(plan["off"][k]), int(plan["off"][k + 1])
        read, step, tok = bool(plan["read"][k]), int(plan["step"][k]), int(plan["tokens"][k])
        if not read:
            out.append((read, step, tok, plan["ids"][a:z], None, _lens(plan, k)))
            continue
        for j in range(a, z):
            first = j == a
            out.append((read, step, tok if first else 0, plan["ids"][j : j + 1],
                        plan["w"][j : j + 1], _lens(plan, k) if first else ([], [])))  # fmt: skip
    return out


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_flat_plan_is_plan_batches(granularity: str) -> None:
    for name, stream in _streams().items():
        want = plan_batches(stream, granularity)
        plan = fast.flat_plan(stream, granularity)
        if granularity == "request":
            got = _expand(plan)
        else:
            got = []
            for k in range(plan["read"].size):
                a, z = int(plan["off"][k]), int(plan["off"][k + 1])
                got.append((bool(plan["read"][k]), int(plan["step"][k]), int(plan["tokens"][k]),
                            plan["ids"][a:z], plan["w"][a:z], _lens(plan, k)))  # fmt: skip
        assert len(got) == len(want), name
        for k, (b, g) in enumerate(zip(want, got, strict=True)):
            assert (g[0], g[1], g[2]) == (b.read, b.step, b.tokens), (name, k)
            assert np.array_equal(g[3], b.ids), (name, k)
            if b.read:
                assert np.array_equal(g[4], b.w), (name, k)
            lens = ([], []) if b.lens is None else (b.lens[0].tolist(), b.lens[1].tolist())
            assert g[5] == lens, (name, k)


def test_a_streams_plan_is_built_once_and_a_changed_stream_gets_its_own(monkeypatch) -> None:
    """A sweep replays one stream many times: the fast engine flattens it once.  A stream
    changed with dataclasses.replace is a new stream, planned afresh (its own weights and
    reads reach the kernel, not the first stream's)."""
    import dataclasses

    built: list[str] = []
    real = fast.flat_plan
    monkeypatch.setattr(fast, "flat_plan", lambda s, g: built.append(g) or real(s, g))
    stream = compile_workload(make_workload("zipf-sessions", SHAPE, seed=4), 8)
    opts = SimOptions(policy="ema", budget_bytes=stream.kv_bytes // 4, engine="fast")
    first = simulate(stream, opts)
    again = simulate(stream, dataclasses.replace(opts, policy="lru"))
    assert built == ["layer"]
    assert again["policy"] == "lru" and simulate(stream, opts) == first
    # The same reads with their weights shuffled: other EMA scores, other victims.
    w = np.random.default_rng(0).permutation(stream.w)
    other = dataclasses.replace(stream, w=w)
    a, b = _both(other, policy="ema", budget_bytes=stream.kv_bytes // 4)
    assert built == ["layer", "layer"]
    va, vb = a["_victims"], b["_victims"]
    assert_same(a, b, "weights shuffled")
    _, v0 = _both(stream, policy="ema", budget_bytes=stream.kv_bytes // 4)
    assert built == ["layer", "layer"]
    assert not np.array_equal(np.concatenate([v[0] for v in va]),
                              np.concatenate([v[0] for v in v0["_victims"]]))  # fmt: skip
    assert len(va) == len(vb)


# --- replays through both engines -------------------------------------------------------
def _both(stream: Any, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    out = []
    for engine in ("numpy", "fast"):
        r = simulate(stream, SimOptions(engine=engine, record_victims=True, **kw))
        assert r.pop("engine") == engine
        out.append(r)
    return out[0], out[1]


def assert_same(a: dict[str, Any], b: dict[str, Any], desc: str) -> None:
    va, vb = a.pop("_victims"), b.pop("_victims")
    ida = np.concatenate([v[0] for v in va]) if va else np.zeros(0, np.int64)
    idb = np.concatenate([v[0] for v in vb]) if vb else np.zeros(0, np.int64)
    assert np.array_equal(ida, idb), f"{desc}: victims differ"
    if va:
        pa = np.concatenate([np.asarray(v[1], np.float64) for v in va])
        pb = np.concatenate([np.asarray(v[1], np.float64) for v in vb])
        assert np.array_equal(pa.view(np.int64), pb.view(np.int64)), f"{desc}: priorities"
        sa = np.concatenate([np.full(v[0].size, v[2]) for v in va])
        sb = np.concatenate([np.full(v[0].size, v[2]) for v in vb])
        assert np.array_equal(sa, sb), f"{desc}: victim steps"
    for key in a:
        assert a[key] == b[key], f"{desc}: {key}: numpy {a[key]!r}, fast {b[key]!r}"
    assert a.keys() == b.keys()


CONFIGS = [
    {},
    {"persistent_metadata": False, "anchor_zone_size": 32, "pinned_fraction": 0.5},
    {"alpha": 0.05, "beta": 0.1, "touch_threshold": 0.05, "evict_threshold": 0.05},
    {"placement_mode": "weighted", "beta": 0.0, "anchor_zone_size": 0},
    {"lfu_tie_break": "index", "persistent_metadata": False, "pinned_fraction": 0.0},
]


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_every_workload_replays_identically(workload: str) -> None:
    stream = compile_workload(make_workload(workload, SHAPE, seed=2), 10, read="dense")
    kv = stream.kv_bytes
    k = 0
    for policy, mode in COVERED:
        for gran in GRANULARITIES:
            k += 1
            cfg = CONFIGS[k % len(CONFIGS)]
            budget = (0.1, 0.25, 0.5)[k % 3]
            cxl = (None, kv // 20, 0)[(k // 3) % 3]
            a, b = _both(
                stream, policy=policy, mode=mode, granularity=gran, warmup_steps=k % 3,
                budget_bytes=int(kv * budget), cxl_bytes=cxl, config=PolicyConfig.from_mapping(cfg),
            )  # fmt: skip
            desc = f"{workload} {policy}/{mode} {gran} budget {budget} cxl {cxl} {cfg}"
            assert_same(a, b, desc)


def test_managed_tiers_few_victims_among_many_replay_identically() -> None:
    # Sparse reads over many resident entries: each call evicts far fewer than a sixteenth
    # of them, which the fast engine takes from its per-layer heaps (the dense replays above
    # evict too many at once and scan); passes exact and batched, both placement modes.
    shape = PRESETS["s1"].with_(layers=2, context_tokens=4096)
    stream = compile_workload(make_workload("multi-turn", shape, seed=1), 40, read="topk:16")
    for mode in ("float", "int"):
        for gran in ("layer", "request"):
            for cfg in ({}, {"eviction_passes": "batched", "eviction_batch": 8},
                        {"placement_mode": "weighted", "anchor_zone_size": 32}):  # fmt: skip
                a, b = _both(
                    stream, policy="ema", mode=mode, granularity=gran, warmup_steps=4,
                    budget_bytes=int(stream.kv_bytes * 0.3), cxl_bytes=stream.kv_bytes // 8,
                    config=PolicyConfig.from_mapping(cfg),
                )  # fmt: skip
                assert_same(a, b, f"ema/{mode} {gran} {cfg}")


def test_managed_tiers_crowded_key_buckets_replay_identically() -> None:
    # S1's 80 layers at 8 K tokens, dense, 10 %: each layer call evicts about a tenth of the
    # listed entries, and after the first step's end most of the EMA's keys sit in one
    # bucket (decayed priorities over many binades, most in one), so a pass sets the
    # buckets again over it (loop._rebucket; it does twice here, counted once in a copy of
    # the loop) and counts the listed keys again, the call's own left out.
    shape = PRESETS["s1"].with_(context_tokens=8192)
    stream = compile_workload(make_workload("retrieval", shape, seed=0, lanes=1), 3, read="dense")
    for mode in ("float", "int"):
        a, b = _both(stream, policy="ema", mode=mode, budget_bytes=int(stream.kv_bytes * 0.1))
        assert_same(a, b, f"ema/{mode} crowded buckets")


def test_managed_tiers_many_victims_from_the_listed_keys_replay_identically() -> None:
    # Layer calls that evict more than a 32nd of the listed entries read the EMA's layers
    # and keys kept beside the resident list (loop._keyed_victims): a step's later calls see
    # the keys of entries admitted or touched since its first, which the loop takes again
    # as they move (loop._touched).  Top-k reads leave entries idle for steps and touch them
    # again (a touch moves the key); dense ones evict most of a layer's entries a call.  At
    # half the entries a call evicts less than a quarter of the listed, who leave by a swap
    # with the list's last (loop._leave: the kept keys move with it); fewer, and the list is
    # compacted (loop._relist).
    for read in ("dense", "topk:8"):
        stream = compile_workload(make_workload("multi-turn", SHAPE, seed=2), 12, read=read)
        for mode in ("float", "int"):
            for budget, cfg in ((0.1, {}), (0.5, {}), (0.25, {"placement_mode": "weighted"}),
                                (0.15, {"eviction_passes": "batched", "eviction_batch": 16,
                                        "persistent_metadata": False})):  # fmt: skip
                a, b = _both(
                    stream, policy="ema", mode=mode, granularity="layer", warmup_steps=2,
                    budget_bytes=int(stream.kv_bytes * budget), cxl_bytes=stream.kv_bytes // 6,
                    config=PolicyConfig.from_mapping({"tier_management": "managed", **cfg}),
                )  # fmt: skip
                assert_same(a, b, f"ema/{mode} {read} {budget} {cfg}")


def test_entry_ids_and_stamps_kept_in_int64_replay_as_in_int32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The loop keeps ids and versions in int32 below 2**31 entries (hooks.id_dtype), and
    # each entry's call stamp in int32 while every call number fits (hooks.stamp_dtype); a
    # run above either takes int64.  Both against the numpy engine, for a queue (LRU: its
    # items), a managed policy's layers and heaps (the EMA), the spill's arrival heap (CXL
    # DRAM smaller than the entries) and a queue policy whose walk reads the stamps (S3-FIFO).
    from kvcxl.emu.sim.fast import hooks

    stream = compile_workload(make_workload("multi-turn", SHAPE, seed=3), 12, read="topk:8")
    kv = stream.kv_bytes
    runs = [("lru", "float", "layer"), ("ema", "float", "layer"), ("ema", "float", "request"),
            ("s3fifo", "float", "request")]  # fmt: skip
    for ids, stamps in ((np.int32, np.int32), (np.int64, np.int32), (np.int32, np.int64)):
        seen: list[type] = []
        took: list[type] = []
        monkeypatch.setattr(hooks, "id_dtype", lambda n, d=ids, s=seen: s.append(d) or d)
        monkeypatch.setattr(hooks, "stamp_dtype", lambda b, u, d=stamps, s=took: s.append(d) or d)
        for policy, mode, gran in runs:
            a, b = _both(
                stream, policy=policy, mode=mode, granularity=gran, budget_bytes=kv // 5,
                cxl_bytes=kv // 10,
            )  # fmt: skip
            assert_same(a, b, f"{policy}/{mode} {gran} ids {np.dtype(ids).name}, stamps "
                              f"{np.dtype(stamps).name}")  # fmt: skip
        assert seen == [ids] * len(runs) and took == [stamps] * len(runs)  # (each run's)


def test_stamps_take_int64_only_past_int32s_calls() -> None:
    # At most three calls a unit and one a step boundary (loop._batch, loop._bg_weighted).
    from kvcxl.emu.sim.fast.hooks import stamp_dtype

    assert stamp_dtype(1, 1) is np.int32
    top = (2**31 - 2) // 4  # 3 × top + top + 1 = 2**31 − 1: still an int32
    assert stamp_dtype(top, top) is np.int32
    assert stamp_dtype(top + 1, top + 1) is np.int64
    assert stamp_dtype(1, (2**31) // 3) is np.int64


@pytest.mark.parametrize("source", ["trace-v1", "trace-v2"])
def test_traces_replay_identically(source: str) -> None:
    stream = _streams()[source]
    for policy, mode in COVERED:
        for gran in GRANULARITIES:
            for cfg in (CONFIGS[0], CONFIGS[1], CONFIGS[4]):
                a, b = _both(
                    stream, policy=policy, mode=mode, granularity=gran,
                    budget_bytes=stream.kv_bytes // 5, cxl_bytes=stream.kv_bytes // 10,
                    config=PolicyConfig.from_mapping(cfg),
                )  # fmt: skip
                assert_same(a, b, f"{source} {policy}/{mode} {gran} {cfg}")


def test_a_full_nvme_fills_alike() -> None:
    # CXL DRAM has room for everything, NVMe for one entry: the step boundary sinks only
    # into NVMe's free room, the rest wait in CXL DRAM (docs/policy.md, "Room below HBM").
    stream = _streams()["workload"]
    eb = stream.shape.entry_bytes
    for cfg in ({}, {"tier_management": "static"}):
        a, b = _both(
            stream, policy="ema", budget_bytes=stream.kv_bytes // 4, cxl_bytes=stream.kv_bytes,
            nvme_bytes=eb, config=PolicyConfig.from_mapping(cfg),
        )  # fmt: skip
        assert a["occupancy_end"]["nvme"] == 1
        assert_same(a, b, f"a full NVMe {cfg}")


@pytest.mark.slow
@pytest.mark.model
def test_the_real_model_capture_replays_identically() -> None:
    from kvcxl.model.capture import capture, load_prompt, shared_model, to_trace

    m, tok = shared_model(1)
    cap = capture(m, load_prompt("chat", tok), 16, aggregation="max")
    whole = from_trace(to_trace(cap, source="test"))
    # One read per batch costs numpy about 90 us a read: the capture's 246 steps took
    # 6 minutes at that granularity, its 17 decode steps (23,490 reads) take 50 s.
    decode = from_trace(to_trace(cap, source="test", decode_only=True))
    for policy, mode in COVERED:
        for gran in GRANULARITIES:
            stream = decode if gran == "request" else whole
            for budget in (0.1, 0.3):
                a, b = _both(
                    stream, policy=policy, mode=mode, granularity=gran,
                    budget_bytes=int(stream.kv_bytes * budget), cxl_bytes=stream.kv_bytes // 10,
                )  # fmt: skip
                assert_same(a, b, f"capture {policy}/{mode} {gran} {budget}")


# --- which engine runs ------------------------------------------------------------------
def test_an_uncovered_run_falls_back_with_one_notice(capsys: pytest.CaptureFixture) -> None:
    stream = _streams()["workload"]
    fast._noticed.clear()
    for _ in range(2):  # per-event tier checks: not in the fast engine
        r = simulate(
            stream, SimOptions(policy="lru", budget_bytes=stream.kv_bytes // 4, check=True)
        )
        assert r["engine"] == "numpy"
    err = capsys.readouterr().err
    assert err.count("replaying with the numpy engine") == 1 and "tier checks" in err
    r = simulate(stream, SimOptions(policy="lru", budget_bytes=stream.kv_bytes // 4))
    assert r["engine"] == "fast"
    r = simulate(stream, SimOptions(policy="lru", budget_bytes=stream.kv_bytes // 4, audit=True))
    assert r["engine"] == "numpy" and r["audit_faults"] == 0
    with pytest.raises(ValueError, match=r"--engine fast: .*tier checks"):
        simulate(stream, SimOptions(policy="lrfu", engine="fast", check=True, budget_bytes=4096))


def test_results_sweep_is_the_same_on_both_engines(tmp_path: Any) -> None:
    """`python -m kvcxl.emu.sim.sweep --engine fast` (unaudited) gives the audited numpy
    run's rows: every question, policy, budget and variant, hit rates and bytes moved."""
    import json

    from kvcxl.emu.sim.sweep import main

    rows = {}
    for engine in ("numpy", "fast"):
        out = tmp_path / f"{engine}.json"
        main(["--workload", "flood", "--seeds", "2", "--steps", "12", "--engine", engine,
              "--backend", "serial", "--out", str(out)])  # fmt: skip
        rows[engine] = json.loads(out.read_text())["rows"]
    assert len(rows["numpy"]) == len(rows["fast"]) > 0
    for a, b in zip(rows["numpy"], rows["fast"], strict=True):
        for key in ("question", "policy", "budget", "variant", "hit_rate", "hit_rate_ci95",
                    "bytes_moved_mean", "reads", "hits"):  # fmt: skip
            assert a.get(key) == b.get(key), (key, a.get("policy"), a.get(key), b.get(key))


# --- a policy is one file per engine ----------------------------------------------------
def test_the_registry_covers_the_firmware_policies() -> None:
    """Every module of emu/sim/fast/policies is found (pkgutil) and names registered
    firmware policies and modes; the policies covered before the registry still are."""
    from kvcxl.firmware.policies import POLICIES

    codes = fast.POLICY_CODES
    assert all(p in POLICIES and m in POLICIES[p].modes for p, m in codes), codes
    before = {"lru", "fifo", "lfu", "random", "sink-window", "h2o", "belady",
              "belady-nobypass", "lrfu", "lru-anchor"}  # fmt: skip
    assert {(p, "float") for p in before} | {("ema", "float"), ("ema", "int")} <= set(codes)
    assert fast.COVERED == ", ".join(sorted({p for p, _ in codes}))


MRU_FAST = '''
"""Most recently used first, with a victim choice of its own (the select hook)."""
from typing import NamedTuple

import numpy as np
from numba import njit

COVERS = (("test-mru", "float"),)
STATIC = True


class State(NamedTuple):
    last: np.ndarray


def build(setup):
    return State(setup.column(-1, np.int64))


@njit
def priority(ps, tab, e, now):
    return ps.last[e]


@njit
def on_insert(ps, e, t):
    ps.last[e] = t


@njit
def on_access(ps, e, j, w, t):
    ps.last[e] = t
    return True


@njit
def forget(ps, e):
    ps.last[e] = -1


@njit
def select(ps, tab, cand, m, k, now, out):
    ids = cand[:m].copy()
    ids = ids[np.argsort(ids, kind="mergesort")]  # the lower id first among equals
    last = np.empty(m, np.int64)
    for j in range(m):
        last[j] = -ps.last[ids[j]]
    o = np.argsort(last, kind="mergesort")
    n = min(k, m)
    for j in range(n):
        out[j] = ids[o[j]]
    return n
'''


def test_a_new_policy_is_one_file_per_engine(tmp_path: Any, monkeypatch: Any) -> None:
    """A policy registered in the firmware and a module dropped into the fast engine's
    policies package (here from a temporary folder on its path) replay identically on
    both engines, with nothing else edited: the registry finds the module, the loop is
    composed for it, and its own ``select`` replaces the key order."""
    import sys

    import kvcxl.emu.sim.fast.policies as pkg
    from kvcxl.emu.sim.fast import compose
    from kvcxl.firmware.history import HistoryRule
    from kvcxl.firmware.policies import POLICIES
    from kvcxl.firmware.policies.base import Policy, register

    class MruHistory(HistoryRule):  # the audit's recomputation: the newest use goes first
        def priority(self, ids, time):  # type: ignore[no-untyped-def]
            return self.h.last_use[ids]

    class MruPolicy(Policy):
        name = "test-mru"
        columns = {"last": (np.int64, -1)}
        history = MruHistory

        def on_insert(self, ids, tick):  # type: ignore[no-untyped-def]
            self.last[ids] = tick.time

        def on_access(self, ids, weights, tick):  # type: ignore[no-untyped-def]
            self.last[ids] = tick.time

        def priority(self, ids, tick):  # type: ignore[no-untyped-def]
            return self.last[ids]

    (tmp_path / "test_mru.py").write_text(MRU_FAST)
    monkeypatch.setattr(pkg, "__path__", [*pkg.__path__, str(tmp_path)])
    register(MruPolicy)
    compose.modules.cache_clear()
    try:
        assert fast.POLICY_CODES[("test-mru", "float")] == "test_mru"
        stream = _streams()["workload"]
        for gran in GRANULARITIES:
            for cfg in (CONFIGS[0], CONFIGS[1]):
                a, b = _both(
                    stream, policy="test-mru", granularity=gran,
                    budget_bytes=stream.kv_bytes // 5, config=PolicyConfig.from_mapping(cfg),
                )  # fmt: skip
                assert a["_victims"]  # (victims were chosen)
                assert_same(a, b, f"test-mru {gran} {cfg}")
    finally:
        POLICIES.pop("test-mru")
        sys.modules.pop("kvcxl.emu.sim.fast.policies.test_mru", None)
        compose.modules.cache_clear()


def test_per_file_caches_of_older_sources_are_dropped(tmp_path: Any) -> None:
    """numba keys a helper's cache by its own file: tiers.py's ``smallest`` cached against
    an older kernel.py keeps the older ``_select``.  sources.drop_stale deletes the
    folders' per-file caches when the engine's hash moved, and keeps them when it did not
    (and leaves every other file alone)."""
    from kvcxl.emu.sim.fast import sources

    caches = [tmp_path / "__pycache__" / "tiers.smallest-102.py311.nbi",
              tmp_path / "policies" / "__pycache__" / "ema.score-9.py311.1.nbc"]  # fmt: skip
    other = tmp_path / "__pycache__" / "tiers.cpython-311.pyc"
    for f in [*caches, other]:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x")
    assert sources.drop_stale(tmp_path, "aaaa")  # no stamp yet: written at an unknown hash
    assert not any(f.exists() for f in caches) and other.exists()
    for f in caches:
        f.write_bytes(b"x")
    assert not sources.drop_stale(tmp_path, "aaaa")  # the same sources: kept
    assert all(f.exists() for f in caches)
    assert sources.drop_stale(tmp_path, "bbbb")  # an edit: dropped
    assert not any(f.exists() for f in caches) and other.exists()
    assert len(sources.engine_hash()) == 16
