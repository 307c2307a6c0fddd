"""A second implementation of the transfer timeline, written from docs/timeline.md with SimPy.

It shares only the input (the transfer log's records, the resources' numbers) with
``kvcxl.emu.timeline``: the stages, classes, the dispatcher and the compute chain are
written again here, as SimPy processes.  "Decisions at an instant are taken after
everything else at that instant": the dispatcher runs as an event of a priority below
SimPy's NORMAL, so it follows every other event of its instant.
"""

from __future__ import annotations

import math

import simpy

LAST = 2  # an event priority after simpy's URGENT (0) and NORMAL (1)


def stage_table(move, n, res, half_duplex=False):
    """docs/timeline.md, "Transfers and their stages"."""
    r = math.ceil(n / res.nvme_queue_depth)
    wr = "link_rd" if half_duplex else "link_wr"
    return {
        "cxl->hbm": [(res.dram_latency_ns, ("dram", "link_rd"))],
        "nvme->hbm": [(r * res.nvme_latency_ns, ("nvme",)), (0.0, ("link_rd",))],
        "hbm->cxl": [(res.dram_latency_ns, (wr, "dram"))],
        "hbm->nvme": [(0.0, (wr,)), (r * res.nvme_latency_ns, ("nvme",))],
        "cxl->nvme": [(res.dram_latency_ns, ("dram",)), (r * res.nvme_latency_ns, ("nvme",))],
        "nvme->cxl": [(r * res.nvme_latency_ns, ("nvme",)), (res.dram_latency_ns, ("dram",))],
    }[move]


class Dispatcher:
    def __init__(self, env, res):
        self.env = env
        self.free = {"link_rd": 1, "link_wr": 1, "dram": res.dram_servers, "nvme": 1}
        self.bw = {"link_rd": res.link_gbps, "link_wr": res.link_gbps, "dram": res.dram_gbps,
                   "nvme": res.nvme_gbps}  # fmt: skip
        self.waiting = []
        self.pending = False

    def _wake(self):
        if self.pending:
            return
        self.pending = True
        ev = self.env.event()
        ev._ok, ev._value = True, None
        ev.callbacks.append(self._decide)
        self.env.schedule(ev, LAST)

    def request(self, key, held):
        grant = self.env.event()
        self.waiting.append((key, held, grant))
        self._wake()
        return grant

    def release(self, held):
        for r in held:
            self.free[r] += 1
        self._wake()

    def _decide(self, _ev):
        self.pending = False
        self.waiting.sort(key=lambda x: x[0])
        rest = []
        for key, held, grant in self.waiting:
            if all(self.free[r] > 0 for r in held):
                for r in held:
                    self.free[r] -= 1
                grant.succeed()
            else:
                rest.append((key, held, grant))
        self.waiting = rest


def simulate(records, entry_bytes, res, *, half_duplex=False, demand_class=0, prefetch_class=1):
    """Stages (transfer, stage, ready, start, end) and per-record (a, r, c), from the docs."""
    env = simpy.Environment()
    disp = Dispatcher(env, res)
    stages_out = []
    transfers = []
    a, r, c = {}, {}, {}

    def transfer(tid, move, n, cls):
        b = n * entry_bytes
        for k, (lat, held) in enumerate(stage_table(move, n, res, half_duplex)):
            if lat:
                yield env.timeout(lat)
            ready = env.now
            yield disp.request((cls, ready, tid, k), held)
            start = env.now
            yield env.timeout(b / min(disp.bw[x] for x in held))
            stages_out.append((tid, k, ready, start, env.now))
            disp.release(held)

    def issue(rec_i, moves, keys, role_cls):
        procs = []
        for m in keys:
            n = moves.get(m, 0)
            if n:
                cls = 2 if m == "cxl->nvme" else role_cls
                tid = len(transfers)
                transfers.append((rec_i, m, n, cls))
                p = env.process(transfer(tid, m, n, cls))
                if cls != 2:  # background gates nothing
                    procs.append(p)
        return procs

    evict = ("hbm->cxl", "hbm->nvme", "cxl->nvme")
    fetch = ("cxl->hbm", "nvme->hbm")
    boundary = ("hbm->cxl", "cxl->nvme", "nvme->cxl")

    def chain():
        pending_wb = []
        groups = {}
        for i, rec in enumerate(records):
            if not rec.read:
                pending_wb += issue(i, rec.evict, evict, demand_class)
                issue(i, getattr(rec, "background", {}), boundary, 2)  # a step boundary's
                continue
            a[i] = env.now
            gate = issue(i, rec.demand, fetch, demand_class)
            gate += issue(i, rec.evict, evict, demand_class)
            gate += pending_wb
            pending_wb = []
            for j, _n in rec.waits:
                gate += groups.get(j, [])
            yield env.all_of(gate)
            r[i] = env.now
            grp = issue(i, rec.prefetch, fetch + evict, prefetch_class)
            if grp:
                groups[i] = grp
            yield env.timeout(rec.compute_ns)
            c[i] = env.now

    env.process(chain())
    env.run()
    return sorted(stages_out), transfers, a, r, c
