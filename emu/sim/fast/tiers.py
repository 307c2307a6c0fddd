"""The tier rules of docs/policy.md the compiled loop replays, policy by policy the same.

:mod:`kvcxl.emu.sim.fast.loop` gathers what a rule reads through the policy's hooks (a
score, an idle count, a priority) and calls these functions, which decide as the firmware
does (:class:`kvcxl.firmware.session.FirmwareSession`, :mod:`kvcxl.firmware.tiering`):

* ``eviction_passes = "batched"``: the loop runs passes of ``eviction_batch`` victims;
* ``cxl_order = "policy"``: CXL DRAM's overflow goes down by the policy's own order
  (:func:`smallest` over the priorities' keys);
* ``tier_management = "managed"``: the eviction layer of an entry (:func:`layer`, what
  placement wants in HBM is evicted last), its placement value (:func:`value`), and the
  step boundary's background moves (:func:`smallest` over the values' keys).

Everything here is a pure function of the arrays it is handed (no policy hook): the loop
template, compiled once per policy, is the only place that calls hooks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from kvcxl.firmware.formulas import recency_decay

from .kernel import CXL, _heapify, _less, _push, _select

# Layers of managed tiers: 0 goes first (placement wants it out of HBM), then 1, then 2
# (weighted placement's pinned-HBM band).
LAYERS = 3


class Rules(NamedTuple):
    """The run's tier rules, read once from the firmware session."""

    batched: bool  # eviction_passes = "batched"
    cxl_policy: bool  # cxl_order = "policy"
    managed: bool  # FirmwareSession.managed (asked for, scored policy, policy placement)
    weighted: bool  # placement_mode = "weighted"
    keep: float
    evict: float
    moves: int  # background_moves per step boundary
    w_r: float
    w_e: float
    w_n: float
    cut_lo: float
    cut_hi: float
    anchor_zone: int
    rdecay: NDArray  # recency_decay of every idle count the replay can reach


def rules_of(fw: Any, n_steps: int) -> Rules:
    """The tier rules of firmware session ``fw`` for a replay of ``n_steps`` step
    boundaries (the longest idle count an entry can reach)."""
    cfg = fw.config
    w_r, w_e, w_n = (float(x) for x in cfg.placement_weights)
    lo, hi = (float(x) for x in cfg.placement_cuts)
    managed = bool(fw.managed)
    # The firmware evaluates recency_decay over an array of idle counts; its table path is
    # bit-identical to its element-wise one (formulas.recency_decay), so one table serves.
    rdecay = np.asarray(recency_decay(np.arange(n_steps + 2, dtype=np.int64), cfg.beta))
    return Rules(
        cfg.eviction_passes == "batched",
        cfg.cxl_order == "policy" and fw.policy.ranks_lower_tiers,  # else: arrival order
        managed,
        cfg.placement_mode == "weighted", float(cfg.keep_threshold),
        float(cfg.evict_threshold), int(cfg.background_moves), w_r, w_e, w_n, lo, hi,
        int(cfg.anchor_zone_size), rdecay.astype(np.float64),
    )  # fmt: skip


@njit(cache=True, inline="always")
def value(rules, s, idle, first_token):  # type: ignore[no-untyped-def]
    """FirmwareSession.placement_value of an entry of score ``s``: the score (thresholds)
    or P = wR·(1 − r) + wE·score + wN·anchor (weighted; formulas.placement_value, the same
    products summed in the same order)."""
    if not rules.weighted:
        return s
    anchor = 1.0 if first_token < rules.anchor_zone else 0.0
    return rules.w_r * (1.0 - rules.rdecay[idle]) + rules.w_e * s + rules.w_n * anchor


@njit(cache=True, inline="always")
def layer(rules, s, v):  # type: ignore[no-untyped-def]
    """FirmwareSession._layer of an entry of score ``s``, placement value ``v``: thresholds
    0 (score < keep) or 1; weighted 0 (P < low), 1 (low ≤ P < high) or 2 (P ≥ high)."""
    if not rules.weighted:
        return 1 if s >= rules.keep else 0
    if v >= rules.cut_hi:
        return 2
    return 1 if v >= rules.cut_lo else 0


@njit(cache=True, inline="always")
def wants_cxl(rules, v):  # type: ignore[no-untyped-def]
    """Weighted placement sends an entry of value ``v`` to CXL DRAM (P < low)."""
    return v < rules.cut_lo


@njit(cache=True)
def smallest(keys, ids, m, k, out):  # type: ignore[no-untyped-def]
    """The ``k`` smallest (key, id) of ``keys[:m]``/``ids[:m]`` into ``out`` (unordered);
    returns how many (tiering.select_victims' set: key ascending, then the lower id)."""
    if m == 0 or k <= 0:
        return 0
    kmin = keys[0]
    kmax = keys[0]
    for j in range(1, m):
        kmin = min(kmin, keys[j])
        kmax = max(kmax, keys[j])
    return _select(keys, ids, m, k, kmin, kmax, out)


@njit(cache=True, inline="always")
def keep(keys, ids, m, k, key, e):  # type: ignore[no-untyped-def]
    """Offer (``key``, ``e``) to the ``k`` smallest (key, id) offered so far, kept in
    ``keys[:m]``/``ids[:m]`` as a heap whose root is the largest of them; returns the new
    ``m``.  Once ``k`` are kept most offers cost one compare: a step boundary offers every
    entry of a tier, where gathering them all to select ``k`` cost it a pass over millions
    (an S1 context)."""
    if m < k:  # (room: the offer joins, the larger ones sift up)
        pos = m
        while pos > 0:
            parent = (pos - 1) >> 1
            if not _less(keys[parent], ids[parent], key, e):
                break
            keys[pos], ids[pos] = keys[parent], ids[parent]
            pos = parent
        keys[pos], ids[pos] = key, e
        return m + 1
    if m == 0 or not _less(key, e, keys[0], ids[0]):
        return m
    pos = 0  # (it replaces the largest kept, sifting down past the larger children)
    while True:
        ch = 2 * pos + 1
        if ch >= m:
            break
        if ch + 1 < m and _less(keys[ch], ids[ch], keys[ch + 1], ids[ch + 1]):
            ch += 1
        if not _less(key, e, keys[ch], ids[ch]):
            break
        keys[pos], ids[pos] = keys[ch], ids[ch]
        pos = ch
    keys[pos], ids[pos] = key, e
    return m


@njit(cache=True)
def move(ids, m, src, dst, t, tier, since, tcount, moved, pos):  # type: ignore[no-untyped-def]
    """``ids[:m]`` (all in tier ``src``) move to ``dst`` at batch time ``t``: Tiers.move
    and LowerTiers.arrive."""
    for j in range(m):
        e = ids[j]
        tier[e] = dst
        if since.size:
            since[e] = t
    moved[pos, src, dst] += m
    tcount[src] -= m
    tcount[dst] += m


@njit(cache=True)
def fifo_push(e, t, n_desc, tier, since, cxl_k, cxl_i, cxl_v, cxl_ver, size):  # type: ignore[no-untyped-def]
    """``e`` arrived in CXL DRAM at time ``t``: into the arrivals heap by (since, id) that
    ``cxl_order = "fifo"`` spills from (rebuilt from the tier column when full); returns
    the heap's size."""
    if size >= cxl_k.size:
        size = 0
        for x in range(n_desc):
            if tier[x] == CXL:
                cxl_k[size] = since[x]
                cxl_i[size] = x
                cxl_v[size] = cxl_ver[x]
                size += 1
        _heapify(cxl_k, cxl_i, cxl_v, size)
        return size
    cxl_ver[e] += 1
    return _push(cxl_k, cxl_i, cxl_v, size, t, e, cxl_ver[e])
