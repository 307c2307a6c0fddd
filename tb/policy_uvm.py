"""pyuvm environment of PolicyCore: items, sequences, driver, monitors, scoreboard.

The scoreboard predicts every output with the firmware's integer golden step
(:mod:`kvcxl.firmware.golden_step`) and audits every pass with :class:`EvictionAudit`;
nothing of the contract is re-implemented here.  Corner cases are counted, not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyuvm import (
    ConfigDB,
    uvm_analysis_port,
    uvm_component,
    uvm_driver,
    uvm_env,
    uvm_sequence,
    uvm_sequence_item,
    uvm_sequencer,
    uvm_subscriber,
)

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware import golden_step
from kvcxl.firmware.audit import EvictionAudit

# --- sequence items ---------------------------------------------------------------------


class StepItem(uvm_sequence_item):
    """One decode step: per entry the step's (max) weight and whether it was read."""

    def __init__(self, name: str, weights: np.ndarray, read: np.ndarray):
        super().__init__(name)
        self.weights, self.read = weights, read


class RecordItem(uvm_sequence_item):
    """Overwrite the whole record table (scores, idle counters, flags)."""

    def __init__(self, name: str, scenario: str, score, idle, pinned, resident):
        super().__init__(name)
        self.scenario = scenario
        self.score, self.idle, self.pinned, self.resident = score, idle, pinned, resident


class ParamItem(uvm_sequence_item):
    """New parameters: α, touch threshold, β → decay table, decay shift, batch k."""

    def __init__(self, name: str, alpha_q: int, touch_q: int, beta: float, shift: int, k: int):
        super().__init__(name)
        self.alpha_q, self.touch_q, self.beta, self.shift, self.k = alpha_q, touch_q, beta, shift, k
        self.table = fx.decay_table(beta, shift)


# --- sequences --------------------------------------------------------------------------


SCENARIOS = ("random", "ties", "saturate", "all_pinned", "empty", "few_eligible", "tiny")


@dataclass
class Plan:
    steps: int
    entries: int
    batch: int
    seed: int
    record_every: int = 40
    param_every: int = 120


class PolicySeq(uvm_sequence):
    """Random steps, with table rewrites into corner scenarios and parameter changes mid-run."""

    def __init__(self, name: str, plan: Plan):
        super().__init__(name)
        self.plan = plan
        self.rng = np.random.default_rng(plan.seed)

    def _params(self, i: int) -> ParamItem:
        r = self.rng
        alpha_q = int(r.choice([1, fx.Q_ONE, fx.alpha_to_q16(0.2), int(r.integers(1, fx.Q_ONE))]))
        touch_q = int(r.choice([0, fx.to_q16(0.01), int(r.integers(0, fx.Q_ONE))]))
        beta = float(r.choice([0.0, 0.001, 0.05, float(r.uniform(0, 1))]))
        shift = int(r.integers(0, 9))
        k = int(r.integers(0, self.plan.batch + 1)) if i else self.plan.batch
        return ParamItem(f"param{i}", alpha_q, touch_q, beta, shift, k)

    def _records(self, i: int) -> RecordItem:
        r, n = self.rng, self.plan.entries
        sc = str(r.choice(SCENARIOS))
        score = r.integers(0, fx.Q_ONE, n)
        idle = r.integers(0, fx.IDLE_MAX + 1, n)
        pinned = r.random(n) < 0.2
        resident = r.random(n) < 0.9
        if sc == "ties":
            score = r.choice([0, fx.HALF, fx.Q_MAX], n)
            idle = r.choice([0, 15, 16, fx.IDLE_MAX], n)
        elif sc == "saturate":
            score = r.choice([fx.Q_MAX - 1, fx.Q_MAX], n)
            idle = r.choice([fx.IDLE_MAX - 1, fx.IDLE_MAX], n)
        elif sc == "all_pinned":
            pinned = np.ones(n, dtype=bool)
        elif sc == "empty":
            resident = np.zeros(n, dtype=bool)
        elif sc == "few_eligible":
            pinned = np.ones(n, dtype=bool)
            pinned[r.choice(n, size=max(1, self.plan.batch // 2), replace=False)] = False
            resident = np.ones(n, dtype=bool)
        elif sc == "tiny":
            score = r.integers(0, 4, n)
            idle = r.integers(0, 4, n)
        return RecordItem(f"rec{i}", sc, score, idle, pinned, resident)

    def _step(self, i: int) -> StepItem:
        r, n = self.rng, self.plan.entries
        kind = r.integers(0, 4)
        if kind == 0:
            w = np.zeros(n, dtype=np.int64)
        elif kind == 1:
            w = r.choice([0, fx.Q_MAX], n)
        else:
            w = r.integers(0, fx.Q_ONE, n)
        read = r.random(n) < r.uniform(0, 1)
        return StepItem(f"step{i}", w, read)

    async def body(self):
        p = self.plan
        await self._send(self._params(0))
        for i in range(p.steps):
            if i and i % p.param_every == 0:
                await self._send(self._params(i))
            if i % p.record_every == p.record_every // 2:
                await self._send(self._records(i))
            await self._send(self._step(i))

    async def _send(self, item) -> None:
        await self.start_item(item)
        await self.finish_item(item)


# --- driver and monitors ---------------------------------------------------------------


class Driver(uvm_driver):
    """Turns items into stream beats; a step ends when its eviction pass has been emitted."""

    def build_phase(self):
        self.ap = uvm_analysis_port("ap", self)  # items as applied, for the scoreboard
        self.bfm = ConfigDB().get(self, "", "BFM")

    async def run_phase(self):
        bfm = self.bfm
        while True:
            item = await self.seq_item_port.get_next_item()
            self.ap.write(item)  # predict before the DUT can answer
            if isinstance(item, ParamItem):
                bfm.queue_table(item.table)
                bfm.set_regs(alpha=item.alpha_q, touch=item.touch_q, shift=item.shift, k=item.k)
                await bfm.wait_idle()
            elif isinstance(item, RecordItem):
                bfm.queue_records(item.score, item.idle, item.pinned, item.resident)
                await bfm.wait_idle()
            else:
                bfm.queue_step(item.weights, item.read)
                await bfm.pass_done.get()
            self.seq_item_port.item_done()


class ScoredMonitor(uvm_component):
    """Every beat the scoring engine hands to the eviction engine (the ``scored`` tap)."""

    def build_phase(self):
        self.ap = uvm_analysis_port("ap", self)

    def connect_phase(self):
        ConfigDB().get(self, "", "BFM").on_scored = self.ap.write


class VictimMonitor(uvm_component):
    """Each eviction pass as the list of victims in stream order."""

    def build_phase(self):
        self.ap = uvm_analysis_port("ap", self)

    def connect_phase(self):
        ConfigDB().get(self, "", "BFM").on_pass = self.ap.write


# --- scoreboard ------------------------------------------------------------------------


class _Port(uvm_subscriber):
    """An analysis export that forwards to one method of the scoreboard."""

    def __init__(self, name, parent, fn):
        super().__init__(name, parent)
        self.fn = fn

    def write(self, t):
        self.fn(t)


class Scoreboard(uvm_component):
    """Predicts with the firmware's integer mode; counts matches, mismatches and corners."""

    def build_phase(self):
        cfg = ConfigDB().get(self, "", "CFG")
        self.n, self.lanes, self.batch = cfg["entries"], cfg["lanes"], cfg["batch"]
        n = self.n
        self.score = np.zeros(n, dtype=np.int64)
        self.idle = np.zeros(n, dtype=np.int64)
        self.pinned = np.zeros(n, dtype=bool)
        self.resident = np.zeros(n, dtype=bool)
        self.alpha_q, self.touch_q, self.shift, self.k = 1, 0, 0, self.batch
        self.table = np.zeros(fx.DECAY_TABLE_SIZE, dtype=np.int64)
        self.expect_prio = None
        self.expect_rec = None
        self.expect_victims = None
        self.audit = EvictionAudit()
        self.c = dict.fromkeys(
            [
                "entry_updates_checked",
                "entry_mismatches",
                "passes_checked",
                "pass_mismatches",
                "steps",
                "param_changes",
                "record_rewrites",
                "tie_passes",
                "score_saturations",
                "idle_saturations",
                "all_pinned_passes",
                "empty_passes",
                "batch_over_eligible_passes",
                "k_zero_passes",
            ],
            0,
        )
        self.scenarios: dict[str, int] = {}
        self.examples: list[str] = []
        self.cmd = _Port("cmd", self, self._on_item)
        self.scored = _Port("scored", self, self._on_scored)
        self.victims = _Port("victims", self, self._on_victims)

    def _fail(self, msg: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(msg)
            self.logger.error(msg)

    def _on_item(self, item) -> None:
        if isinstance(item, ParamItem):
            self.alpha_q, self.touch_q, self.shift, self.k = (
                item.alpha_q,
                item.touch_q,
                item.shift,
                item.k,
            )
            self.table = item.table
            self.c["param_changes"] += 1
        elif isinstance(item, RecordItem):
            self.score = np.asarray(item.score, dtype=np.int64).copy()
            self.idle = np.asarray(item.idle, dtype=np.int64).copy()
            self.pinned = np.asarray(item.pinned, dtype=bool).copy()
            self.resident = np.asarray(item.resident, dtype=bool).copy()
            self.c["record_rewrites"] += 1
            self.scenarios[item.scenario] = self.scenarios.get(item.scenario, 0) + 1
        else:
            self._predict_step(item)

    def _predict_step(self, item: StepItem) -> None:
        was_sat = self.idle == fx.IDLE_MAX
        eligible = self.resident & ~self.pinned
        params = golden_step.IntParams(self.alpha_q, self.touch_q, self.shift, self.table)
        r = golden_step.step(
            self.score, self.idle, item.weights, item.read, eligible, self.k, params
        )
        self.score, self.idle, prio = r.score, r.idle, r.priority
        ids = np.flatnonzero(eligible)
        self.expect_prio = prio
        self.expect_elig = eligible
        self.expect_victims = r.victims
        self.expect_ids = ids
        c = self.c
        c["steps"] += 1
        c["score_saturations"] += int(np.count_nonzero(self.score == fx.Q_MAX))
        c["idle_saturations"] += int(np.count_nonzero(was_sat & (self.idle == fx.IDLE_MAX)))
        if self.pinned.all():
            c["all_pinned_passes"] += 1
        if not self.resident.any():
            c["empty_passes"] += 1
        if 0 < ids.size < self.k:
            c["batch_over_eligible_passes"] += 1
        if self.k == 0:
            c["k_zero_passes"] += 1
        # A tie that matters: the boundary of the chosen set, or two chosen victims, share
        # a priority (so only the index tie-break decides).
        chosen = self.expect_victims
        if chosen.size:
            p = prio[chosen]
            rest = np.setdiff1d(ids, chosen)
            if np.unique(p).size < p.size or (rest.size and (prio[rest] == p[-1]).any()):
                c["tie_passes"] += 1

    def _on_scored(self, beat: dict) -> None:
        base = beat["addr"] * self.lanes
        for i, lane in enumerate(beat["lane"]):
            e = base + i
            got = (lane["score"], lane["idle"], lane["priority"], lane["eligible"])
            want = (
                int(self.score[e]),
                int(self.idle[e]),
                int(self.expect_prio[e]),
                int(self.expect_elig[e]),
            )
            self.c["entry_updates_checked"] += 1
            if got != want:
                self.c["entry_mismatches"] += 1
                self._fail(f"entry {e}: got (score, idle, prio, elig) {got}, want {want}")

    def _on_victims(self, victims: list) -> None:
        got = np.array([v[0] for v in victims], dtype=np.int64)
        want = self.expect_victims
        self.c["passes_checked"] += 1
        prio = self.expect_prio
        self.audit.check(self.expect_ids, prio[self.expect_ids], got)
        got_prio = [v[1] for v in victims]
        if got.size != want.size or (got != want).any() or got_prio != prio[got].tolist():
            self.c["pass_mismatches"] += 1
            self._fail(
                f"pass {self.c['passes_checked']}: victims {got.tolist()}, want {want.tolist()}"
            )

    def results(self) -> dict:
        return {
            **self.c,
            **self.audit.as_dict(),
            "scenarios": self.scenarios,
            "examples": self.examples,
        }


class PolicyEnv(uvm_env):
    def build_phase(self):
        self.seqr = uvm_sequencer("seqr", self)
        ConfigDB().set(None, "*", "SEQR", self.seqr)
        self.driver = Driver("driver", self)
        self.scored_mon = ScoredMonitor("scored_mon", self)
        self.victim_mon = VictimMonitor("victim_mon", self)
        self.scoreboard = Scoreboard("scoreboard", self)

    def connect_phase(self):
        self.driver.seq_item_port.connect(self.seqr.seq_item_export)
        self.driver.ap.connect(self.scoreboard.cmd.analysis_export)
        self.scored_mon.ap.connect(self.scoreboard.scored.analysis_export)
        self.victim_mon.ap.connect(self.scoreboard.victims.analysis_export)
