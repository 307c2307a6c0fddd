"""The slot-queue golden step (firmware/golden_clock.py) is the firmware's CLOCK and SIEVE.

Whole traces are replayed twice: once with the firmware's own policy, once with
:class:`kvcxl.rtl.slot_policy.SlotPolicy` sending the engine's commands to the golden
step (the model every RTL check of the slot-queue engine predicts with); the victims,
in order, must be equal.  Sparse reads (top-4 per head) make reuse, and so the counters,
matter: CLOCK with 1 and 3 bits and SIEVE choose differently on these traces.

The classic fixed ring (a new entry takes its victim's slot, the hand passes every slot)
is written here from its textbook definition; on the same traces it chooses differently,
which is why the engine links its slots instead (docs/rtl.md, "CLOCK and SIEVE").
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.common.sizes import parse_size
from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.firmware import golden_clock as gc
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies.base import Policy
from kvcxl.rtl.slot_policy import GoldenEngine, PassMismatch, SlotPolicy

CASES = [("cyclic", "10%"), ("zipf-sessions", "10%"), ("uniform", "10%"), ("retrieval", "10%"),
         ("multi-turn", "10%")]  # fmt: skip


def _stream(workload: str, steps: int = 16):
    return compile_workload(make_workload(workload, PRESETS["ci"], seed=0), steps, read="topk:4")


def _victims(stream, policy: str, budget: str, bits: int = 1, factory=None) -> np.ndarray:
    cfg = PolicyConfig().with_(clock_bits=bits)
    opts = SimOptions(
        policy=policy,
        budget_bytes=parse_size(budget, stream.n_entries * stream.shape.entry_bytes),
        config=cfg,
        record_victims=True,
        engine="numpy",
    )
    dump = simulate(stream, opts, policy=factory)["_victims"]
    return np.concatenate([d[0] for d in dump]) if dump else np.zeros(0, np.int64)


def _golden(policy: str, slots: int = 1024, check: bool = False):
    def factory(cfg, table):
        return SlotPolicy(cfg, table, GoldenEngine(slots, policy), policy, check=check)

    return factory


@pytest.mark.parametrize(("workload", "budget"), CASES)
@pytest.mark.parametrize(("policy", "bits"), [("clock", 1), ("clock", 3), ("sieve", 1)])
def test_golden_step_equals_the_firmware_policy_on_whole_traces(workload, budget, policy, bits):
    stream = _stream(workload)
    want = _victims(stream, policy, budget, bits)
    got = _victims(stream, policy, budget, bits, _golden(policy))
    assert want.size > 100
    assert np.array_equal(got, want)


def test_the_traces_tell_the_policies_apart():
    """Otherwise the test above could not tell a counter from a bit or CLOCK from SIEVE."""
    stream = _stream("uniform")
    c1, c3, s = (_victims(stream, p, "10%", b) for p, b in (("clock", 1), ("clock", 3),
                                                             ("sieve", 1)))  # fmt: skip
    assert not np.array_equal(c1, c3) and not np.array_equal(c1, s)


def test_check_names_the_first_differing_pass(monkeypatch):
    """A golden walk that leaves a decremented entry in place (no move to the head) is
    caught by the lockstep check, which names the step and the pass."""

    stream = _stream("uniform")
    monkeypatch.setattr(gc.SlotQueue, "walk", _walk_without_moves)
    with pytest.raises(PassMismatch, match=r"step \d+, pass \d+ of the step, victim \d+"):
        _victims(stream, "clock", "10%", 3, _golden("clock", check=True))


def _walk_without_moves(self, k, keep_hand=False):
    """CLOCK's walk with the planted defect: a decremented entry keeps its place."""
    left, out, cur = min(int(k), self.n_offered), [], self.tail
    while left:
        if cur == gc.NONE:
            cur = self.tail
        nxt = self.newer[cur]
        if self.offered[cur]:
            if self.ref[cur] > 0:
                self.ref[cur] -= 1
            else:
                self._unlink(cur)
                self.offer(cur, False)
                self.inq[cur] = False
                out.append(cur)
                left -= 1
        cur = nxt
    return out


# --- the classic fixed ring, for comparison -----------------------------------------------


class RingClock(Policy):
    """Textbook CLOCK over a fixed ring of slots: the hand visits every slot in slot
    order; a new entry takes its victim's slot; entries never move."""

    name = "ring-clock"  # (not registered: a model for this test only)
    columns = {"ref": (np.int64, 0), "fresh": (np.bool_, False)}
    ranks_lower_tiers = False

    def __init__(self, config, table, slots=8192, stats=None):
        super().__init__(config, table)
        self.ring = np.full(slots, -1, np.int64)
        self.hand = 0
        self.fill = 0
        self.arriving = np.zeros(0, np.int64)
        self.freed = []
        self.max = (1 << config.param("clock_bits")) - 1
        self.stats = stats if stats is not None else {}

    def on_insert(self, ids, tick):
        self._place()
        self.ref[ids] = 0
        self.fresh[ids] = True
        self.arriving = np.sort(np.asarray(ids, np.int64))

    def on_access(self, ids, weights, tick):
        for i in np.asarray(ids, np.int64).tolist():
            if self.fresh[i]:
                self.fresh[i] = False
            else:
                self.ref[i] = min(self.ref[i] + 1, self.max)

    def _place(self):
        for i in self.arriving.tolist():
            if self.freed:
                s = self.freed.pop(0)
            else:
                s = self.fill
                self.fill += 1
            self.ring[s] = i
        self.arriving = np.zeros(0, np.int64)
        self.freed = []

    def select(self, eligible, k, tick, ordered=True):
        eligible = np.asarray(eligible, np.int64)
        k = min(int(k), eligible.size)
        ok = np.zeros(self.ref.size, bool)
        ok[eligible] = True
        ok[self.arriving] = False
        kw = min(k, int(np.count_nonzero(ok)))
        out = []
        p = self.hand
        n = self.fill
        while len(out) < kw:
            i = self.ring[p]
            if i >= 0:
                if ok[i]:
                    if self.ref[i] > 0:
                        self.ref[i] -= 1
                    else:
                        out.append(i)
                        self.ring[p] = -1
                        self.freed.append(p)
                else:
                    self.stats["stepped_over"] = self.stats.get("stepped_over", 0) + 1
                    self.stats.setdefault("first_step_over_pass", self.stats.get("passes", 0))
            p = (p + 1) % n
        self.hand = p
        self.stats["passes"] = self.stats.get("passes", 0) + (1 if out else 0)
        late = eligible[np.isin(eligible, self.arriving)]
        if len(out) < k:
            extra = late[: k - len(out)]
            out += extra.tolist()
            self.arriving = self.arriving[~np.isin(self.arriving, extra)]
        self._place()
        return np.asarray(out, np.int64)

    def on_evict(self, ids, tick):
        pass

    def priority(self, ids, tick):
        return np.zeros(np.asarray(ids).size, np.int64)


def _dumps(stream, factory) -> tuple[list, list]:
    opts = SimOptions(
        policy="clock",
        budget_bytes=parse_size("10%", stream.n_entries * stream.shape.entry_bytes),
        record_victims=True,
        engine="numpy",
    )
    return simulate(stream, opts, policy=factory)["_victims"], simulate(stream, opts)["_victims"]


def test_a_fixed_ring_differs_from_the_firmware_only_after_stepping_over_an_entry():
    """The textbook ring equals the firmware's CLOCK while no walk steps over an entry it may
    not evict (multi-turn), and differs on a trace where walks do (uniform): the first
    differing pass comes after the first such step-over."""
    for workload, equal in (("multi-turn", True), ("uniform", False)):
        stats: dict = {}
        ring, fw = _dumps(_stream(workload), lambda c, t, s=stats: RingClock(c, t, stats=s))
        same = [np.array_equal(a[0], b[0]) for a, b in zip(ring, fw, strict=True)]
        assert all(same) == equal, workload
        if not equal:
            first_diff = same.index(False)
            assert stats["stepped_over"] > 0
            assert first_diff >= stats["first_step_over_pass"]
        else:
            assert "stepped_over" not in stats
