"""The audit checks the policy, not only the selection: planted defects it must catch.

The top-k audit re-ranks the policy's own priorities, so each defect below leaves
``wrong_victims`` at 0; the history audit recomputes priorities from each entry's
own history (firmware/history.py) and must flag every one of them.  On the
correct engine it reports nothing, for every policy, both modes, persistence on
and off.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.workloads import make_workload
from kvcxl.emu.workloads.stream import compile_workload
from kvcxl.firmware.audit import EvictionAudit
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import POLICIES
from kvcxl.firmware.policies.ema import EmaPolicy
from kvcxl.firmware.table import EntryTable

HISTORY_KEYS = ("priority_mismatches", "outranked_by_history", "pin_violations")
# Policies whose keys are not an entry's own history get the top-k check only, each
# saying why in its own file (``not_audited``): random and offline keys are inputs; the
# queue policies' keys are queue state (positions, hands, ghosts), checked against
# libCacheSim and the reference engine instead.
TOP_K_ONLY = tuple(n for n, c in POLICIES.items() if c.history is None)


@pytest.fixture(scope="module")
def streams():
    shape = PRESETS["ci"].with_(context_tokens=512)
    return {
        wl: compile_workload(make_workload(wl, shape, seed=3), 24)
        for wl in ("zipf-sessions", "multi-turn", "uniform")
    }


def audited(stream, policy: str, mode: str = "float", **cfg) -> dict:
    return simulate(
        stream,
        SimOptions(
            policy=policy, budget_bytes=stream.kv_bytes // 5, audit=True, mode=mode,
            config=PolicyConfig.from_mapping(cfg),
        ),
    )  # fmt: skip


def faults(r: dict) -> int:
    return sum(r[k] or 0 for k in HISTORY_KEYS) + r["wrong_victims"]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_fault_on_the_correct_engine(streams, policy):
    modes = ["float", "int"] if policy == "ema" else ["float"]
    for wl, stream in streams.items():
        for mode in modes:
            for persistent in (True, False):
                r = audited(stream, policy, mode, persistent_metadata=persistent)
                assert faults(r) == 0, (wl, mode, persistent, r["audited_victims"])
                if policy not in TOP_K_ONLY:
                    assert r["history_checked"] > r["audited_victims"] > 0, (wl, mode)
                    assert r["history_not_audited"] is None
                else:  # said, never a silent 0
                    assert r["audited_victims"] > 0, (wl, mode)
                    assert all(r[k] is None for k in ("history_checked", *HISTORY_KEYS))
                    assert r["history_not_audited"] == POLICIES[policy].not_audited


def test_a_policy_must_say_how_it_is_audited():
    """A new policy with neither a history rule nor a reason is refused at registration,
    and so is one with both; the registry holds only policies that said one."""
    from kvcxl.firmware.history import HistoryRule
    from kvcxl.firmware.policies import register
    from kvcxl.firmware.policies.lru import LruPolicy

    for attrs in ({"history": None}, {"history": HistoryRule, "not_audited": "both"}):
        cls = type("Silent", (LruPolicy,), {"name": "silent-test", **attrs})
        with pytest.raises(TypeError, match="silent-test"):
            register(cls)
    assert "silent-test" not in POLICIES
    assert all((c.history is None) != (not c.not_audited) for c in POLICIES.values())
    assert 0 < len(TOP_K_ONLY) < len(POLICIES)


def test_reports_print_not_audited_for_a_policy_without_history(streams):
    """The demo's and simulate's table cell and the audit sentence say "not audited" for a
    top-k-only policy where they print faults/victims for an audited one."""
    from kvcxl.emu.metrics import audit_cell, audit_sentence, audit_totals

    stream = streams["zipf-sessions"]
    rows = [dict(audited(stream, p), policy=p) for p in ("clock", "lru")]
    assert audit_cell(rows[0]) == "not audited"
    assert audit_cell(rows[1]) == f"0/{rows[1]['audited_victims']}"
    totals = audit_totals(rows)
    assert totals["not_audited"] == ["clock"]
    assert "Not audited from history (clock)" in audit_sentence(totals)
    # a top-k fault still shows in the cell of a policy not audited from history
    assert audit_cell({**rows[0], "audit_faults": 2}) == f"2/{rows[0]['audited_victims']} top-k"


def test_planted_idle_not_reset_on_touch(streams, monkeypatch):
    def on_access(self, ids, weights, tick):  # the touch forgets to reset idle
        np.maximum.at(self.w_step, ids, np.asarray(weights, dtype=np.float64))
        self.touched[ids[weights >= self.config.touch_threshold]] = True

    assert faults(audited(streams["zipf-sessions"], "ema")) == 0
    monkeypatch.setattr(EmaPolicy, "on_access", on_access)
    r = audited(streams["zipf-sessions"], "ema")
    assert r["wrong_victims"] == 0  # invisible to the top-k check
    assert r["priority_mismatches"] > 0


def test_planted_off_by_one_ema_step(streams, monkeypatch):
    end_step = EmaPolicy.end_step

    def twice(self, tick):  # one extra zero-weight EMA step at every step end
        end_step(self, tick)
        self.score_[: self.table.n] *= 1.0 - self.config.alpha

    monkeypatch.setattr(EmaPolicy, "end_step", twice)
    r = audited(streams["zipf-sessions"], "ema", touch_threshold=0.05)
    assert r["wrong_victims"] == 0
    assert r["priority_mismatches"] > 0


def test_planted_shrinking_context(streams, monkeypatch):
    def assign(self, ctx, tokens):  # a length report overwrites instead of raising
        c = np.asarray(ctx, dtype=np.int64)
        t = np.asarray(tokens, dtype=np.int64)
        if c.size:
            from kvcxl.firmware.table import grow

            self.ctx_tokens = grow(self.ctx_tokens, int(c.max()) + 1)
            self.ctx_tokens[c] = t
            for observe in self.observers:
                observe(c, t)

    monkeypatch.setattr(EntryTable, "raise_lengths", assign)
    # A trace whose entries are written out of block order: creating a low block after a
    # high one shrinks the context under the defect (the first bug of the differential check).
    from test_sim_regressions import run

    recs = [(0, 0, 0, 0, 0, 0.5), (0, 0, 0, 0, 7, 0.5)]
    recs += [(1, 0, 0, 0, b, 0.1) for b in range(1, 7)] + [(2, 0, 1, 0, 0, 1.0)]
    for policy in ("sink-window", "h2o"):
        r, _ = run(recs, policy, 32768, audit=True, config={"recent_tokens": 32})
        assert r["wrong_victims"] == 0, policy
        assert r["priority_mismatches"] + r["outranked_by_history"] > 0, policy


def test_planted_pin_ignored(streams, monkeypatch):
    monkeypatch.setattr(EmaPolicy, "wants_pin", lambda self, ids: np.zeros(len(ids), bool))
    r = audited(streams["multi-turn"], "ema")
    assert r["wrong_victims"] == 0
    assert r["pin_violations"] > 0


def test_audit_reports_what_it_checked():
    a = EvictionAudit()
    d = a.as_dict()
    assert d["history_checked"] is None  # nothing attached yet: no history was kept
    assert set(HISTORY_KEYS) - {"outranked_by_history"} <= set(d) | {"pin_violations"}
