"""cocotb entry point: the pyuvm test of PolicyCore (run through :mod:`kvcxl.tb.runner`).

Configuration arrives in the environment variable KVCXL_TB_CONFIG (JSON: entries,
lanes, batch, steps, seed, defect, results path); the figures go to the results
file as JSON.  Without a planted defect the test fails on any mismatch; with one it
fails if the scoreboard did *not* catch it.
"""

from __future__ import annotations

import json
import os
import random
import time

import cocotb
import pyuvm
from pyuvm import ConfigDB, uvm_root, uvm_test

from kvcxl.tb.bfm import PolicyCoreBfm
from kvcxl.tb.policy_uvm import Plan, PolicyEnv, PolicySeq


def _config() -> dict:
    return json.loads(os.environ["KVCXL_TB_CONFIG"])


@pyuvm.test()
class PolicyCoreTest(uvm_test):
    def build_phase(self):
        cfg = _config()
        self.cfg = cfg
        self.bfm = PolicyCoreBfm(
            cocotb.top, cfg["lanes"], cfg["entries"], cfg["batch"], random.Random(cfg["seed"])
        )
        ConfigDB().set(None, "*", "BFM", self.bfm)
        ConfigDB().set(None, "*", "CFG", cfg)
        self.env = PolicyEnv("env", self)

    async def run_phase(self):
        self.raise_objection()
        cfg = self.cfg
        self.logger.info(f"PolicyCore test seed={cfg['seed']} config={cfg}")
        await self.bfm.start()
        plan = Plan(
            steps=cfg["steps"], entries=cfg["entries"], batch=cfg["batch"], seed=cfg["seed"]
        )
        prof = None
        if os.environ.get("KVCXL_TB_PROFILE"):  # where the testbench's own time goes
            import cProfile  # lazy: only when profiling

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        await PolicySeq("seq", plan).start(self.env.seqr)
        self.wall = time.perf_counter() - t0
        if prof is not None:
            prof.disable()
            prof.dump_stats(os.environ["KVCXL_TB_PROFILE"])
        self.drop_objection()

    def check_phase(self):
        cfg = self.cfg
        res = self.env.scoreboard.results()
        cnt = vars(self.bfm.count).copy()
        cnt.pop("extra", None)
        res.update({f"bus_{k}": v for k, v in cnt.items()})
        res["wall_s"] = round(self.wall, 3)
        res["cycles_per_s"] = round(cnt["cycles"] / self.wall, 1) if self.wall else None
        res["config"] = cfg
        res["simulator"] = cocotb.SIM_NAME
        with open(cfg["results"], "w") as f:
            json.dump(res, f, indent=2)
        bad = res["entry_mismatches"] + res["pass_mismatches"] + res["wrong_victims"]
        if cfg.get("defect"):
            assert bad > 0, f"planted defect {cfg['defect']!r} was not caught"
        else:
            assert bad == 0, f"{bad} mismatches: {res['examples'][:3]}"
        assert res["passes_checked"] == res["steps"], "an eviction pass went missing"


__all__ = ["PolicyCoreTest", "uvm_root"]
