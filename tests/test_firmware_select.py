"""Exact victim selection equals the brute-force ranking; the audit notices when it does not."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcxl.firmware.audit import EvictionAudit
from kvcxl.firmware.select import reference_order, select_victims


@settings(max_examples=300, deadline=None)
@given(
    prios=st.lists(st.integers(0, 5), min_size=0, max_size=300),
    k=st.integers(0, 320),
    seed=st.integers(0, 2**32 - 1),
)
def test_select_is_top_k_of_reference_with_many_ties(prios, k, seed):
    rng = np.random.default_rng(seed)
    ids = rng.permutation(10_000)[: len(prios)]
    p = np.asarray(prios, dtype=np.int64)
    got = select_victims(ids, p, k)
    assert got.tolist() == reference_order(ids, p)[:k].tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=200), st.integers(1, 50))
def test_select_float_priorities(prios, k):
    ids = np.arange(len(prios))[::-1].copy()
    p = np.asarray(prios)
    assert select_victims(ids, p, k).tolist() == reference_order(ids, p)[:k].tolist()


def test_tie_break_lower_index_first():
    ids = np.array([7, 3, 9, 1])
    assert select_victims(ids, np.array([0.5, 0.5, 0.9, 0.5]), 3).tolist() == [9, 1, 3]


def test_audit_counts_wrong_and_misordered():
    a = EvictionAudit()
    ids = np.arange(5)
    p = np.array([0.1, 0.9, 0.5, 0.7, 0.2])
    assert a.check(ids, p, np.array([1, 3])) == 0
    assert a.check(ids, p, np.array([3, 1])) == 0 and a.misordered == 2
    assert a.check(ids, p, np.array([1, 0])) == 1
    assert a.check(ids, p, np.array([1, 1])) == 1  # the same victim chosen twice
    assert a.checked == 8 and a.wrong == 2


def test_sampled_threshold_path_is_exact_on_large_tables():
    rng = np.random.default_rng(11)
    n = 300_000
    ids = rng.permutation(n)
    cases = [
        rng.random(n),  # distinct floats
        rng.integers(0, 3, n),  # massive ties
        np.sort(rng.random(n)),  # sorted: the strided sample sees a skewed picture
        np.where(np.arange(n) % 1000 == 0, 1.0, 0.0),  # sparse maxima
    ]
    for p in cases:
        for k in (1, 64, 4000):
            assert select_victims(ids, p, k).tolist() == reference_order(ids, p)[:k].tolist()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(4096, 20_000),
    span=st.integers(1, 70_000),
    frac=st.floats(0.0, 1.0),
    kind=st.sampled_from(["int", "float", "uint"]),
    ascending=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_large_selections_fast_paths_equal_the_reference(n, span, frac, kind, ascending, seed):
    """Ascending ids (tie shortcut, radix or stable ordering) and the unordered set."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(3 * n, n, replace=False)) if ascending else rng.permutation(3 * n)[:n]
    if kind == "float":
        p = rng.integers(0, span, n) / max(span, 1)  # many exact ties
    else:
        p = rng.integers(0, span, n).astype(np.uint32 if kind == "uint" else np.int64)
    k = int(frac * n)
    ref = reference_order(ids, p)[:k]
    assert select_victims(ids, p, k).tolist() == ref.tolist()
    unordered = select_victims(ids, p, k, ordered=False)
    assert unordered.size == k and np.array_equal(np.sort(unordered), np.sort(ref))


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 12_000),
    span=st.integers(1, 200_000),
    lo=st.integers(-(10**6), 10**6),
    seed=st.integers(0, 2**32 - 1),
)
def test_unique_ids_equals_np_unique(n, span, lo, seed):
    from kvcxl.firmware.table import unique_ids

    a = np.random.default_rng(seed).integers(lo, lo + span, n)
    got = unique_ids(a)
    assert got.dtype == np.int64 and np.array_equal(got, np.unique(a))


def test_audit_of_an_unordered_selection_checks_membership_only():
    a = EvictionAudit()
    ids = np.arange(10)
    p = np.array([9, 8, 7, 6, 5, 4, 3, 2, 1, 0])
    assert a.check(ids, p, np.array([2, 0, 1]), ordered=False) == 0
    assert a.check(ids, p, np.array([3, 0, 1]), ordered=False) == 1
    assert a.misordered == 0 and a.as_dict()["misordered_victims"] is None
